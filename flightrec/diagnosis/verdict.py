"""From matching, the wait-for graph and the hosts to the verdict: each rule family's findings, then the
symptoms and warnings, then one verdict and its one-line summary.

Loops here run over the few findings (roots, divergent groups, cycles), never over entries."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import polars as pl

from flightrec.analysis.dump_times import Waited
from flightrec.analysis.gpu_position import never_began
from flightrec.analysis.localize import Location
from flightrec.analysis.matching import Matching
from flightrec.analysis.timing.options import TimingOptions, TimingResult
from flightrec.analysis.wait_graph import Waits
from flightrec.diagnosis.actions import headline
from flightrec.diagnosis.collection import (
    mixed_incidents_finding,
    no_entries_finding,
    warning_findings,
    without_unreadable,
    world_size_finding,
)
from flightrec.diagnosis.context import Context, n_wait, ranks_with_unrecorded_groups
from flightrec.diagnosis.deadlock import deadlock_findings
from flightrec.diagnosis.hardware import never_began_findings, switch_findings, with_gpu_stalls
from flightrec.diagnosis.late import behind_while_running, in_flight_at_dump, late_findings, stuck_in_flight_findings
from flightrec.diagnosis.mismatch import mismatch_findings
from flightrec.diagnosis.not_joined import held_in_transfers_finding, root_findings
from flightrec.diagnosis.p2p import p2p_findings
from flightrec.model.schema import MISMATCH_STATUSES
from flightrec.model.topology import Topology
from flightrec.model.trace import Trace
from flightrec.report.model import Finding

# (how a healthy summary ends before its caveats: `api.analyze` puts a timing warning in their place)
NOTHING_WRONG = "none behind, nothing stuck"


def _symptom_findings(ctx: Context, culprits: set[int]) -> list[Finding]:
    edges = ctx.w.edges.filter(pl.col("src").str.starts_with("r:")).with_columns(
        pl.col("src").str.slice(2).cast(pl.Int64).alias("rank"))
    edges = edges.filter(~pl.col("rank").is_in(list(culprits)))
    if edges.height == 0:
        return []
    descs = ctx.trace.groups.select("group", pl.col("pg_desc").fill_null(""), "pg_name")
    per = (edges.join(descs, on="group", how="left")
           .group_by("pg_desc").agg(pl.col("rank").unique().sort(), pl.col("group").n_unique().alias("n_groups"),
                                    pl.col("kind").cast(pl.String).unique().alias("kinds"))
           .sort(pl.col("rank").list.len(), "pg_desc", descending=[True, False]))   # (ties in a stable order)
    out = []
    for desc, ranks, n_groups, kinds in per.iter_rows():
        # (a member seen behind is what they wait on; a member with no dump only may be one, where membership
        # is inferred: named only when nothing else is seen)
        kind = next(k for k in ("behind", "p2p", "missing") if k in kinds)
        label = f"desc '{desc}'" if desc else "unnamed groups"
        unread = set(ctx.trace.unreadable_ranks)
        lost = ("whose dumps could not be read" if unread and set(ctx.trace.missing_ranks) <= unread
                else "with no dump read" if unread else "that left no dump")
        how = {"behind": "for members that have not joined", "missing": f"for members {lost}",
               "p2p": "for a send/recv peer"}[kind]
        out.append(Finding(
            kind="waiting", role="symptom", ranks=ranks,
            message=f"{n_wait(len(ranks))} in {n_groups:,} group{'s' if n_groups != 1 else ''} ({label}) {how}",
            evidence={"groups": n_groups, "ranks": ranks},
        ))
    return out


@dataclass
class _Causes:
    """The rule families' findings, before symptoms and warnings are added."""
    roots: list[Finding]
    explained: set[int]            # ranks a finding accounts for: never named again as symptoms
    stuck: set[int]                # ranks stuck in a collective in flight on every member
    stuck_findings: list[Finding]
    live: list[Finding]            # what a snapshot of a running job shows instead of a hang


def diagnose(trace: Trace, m: Matching, w: Waits, loc: Location | None, topo: Topology,
             timing: TimingResult | Callable[[], TimingResult] | None = None,
             timing_options: TimingOptions | None = None,
             waited: Waited | None = None) -> tuple[str, str, list[Finding]]:
    """Return (verdict, one-line summary, findings ordered root causes, symptoms, warnings).
    With `timing`, a member that joined a stuck collective past its timeout is named as its cause, and the
    hosts' clock offsets are taken out where enqueue times are compared. `timing` may be a function that
    returns it (a future's `result`): it is called only where it is needed, after the findings that don't
    need it, so the timing analysis can still be running on another thread until then (`api.analyze`).
    `waited` (`dump_times.waited`): how long the ops in flight had waited when the dumps were written. Where it
    does not read "hung", collectives in flight on every member are no hang these dumps can show, and where it
    reads "running", a rank behind its peers is no fault: a running job's snapshot shows both."""
    waited = waited or Waited("hung", None, None, "timeout")
    ctx = Context(trace, m, w, topo, timing if callable(timing) else lambda: timing)
    causes = _root_causes(ctx, loc, waited, timing_options or TimingOptions())
    verdict, summary, findings = _verdict(ctx, causes, waited)
    mixed = mixed_incidents_finding(trace)
    if mixed is not None:   # (the summary says it too: `actions.summary_line`)
        first_warning = next((k for k, f in enumerate(findings) if f.role == "warning"), len(findings))
        findings.insert(first_warning, mixed)
    return verdict, summary, findings


def _root_causes(ctx: Context, loc: Location | None, waited: Waited, timing_options: TimingOptions) -> _Causes:
    """Each rule family in turn, each leaving out the ranks those before it explain."""
    m, w = ctx.m, ctx.w
    roots: list[Finding] = []
    roots += mismatch_findings(ctx)
    # ranks stuck in a mismatched collective are explained by it, whichever side they are on
    mismatched = m.divergences.filter(pl.col("status").is_in(MISMATCH_STATUSES)).select("group", "collective_seq_id")
    explained = set(m.units.lazy().select("group", "collective_seq_id", "rank")
                    .join(mismatched.lazy(), on=["group", "collective_seq_id"]).collect()["rank"].to_list())
    roots += p2p_findings(ctx)
    explained |= {r for f in roots for r in f.ranks}
    # (the peer a mismatched send or receive was posted toward waits elsewhere: it is no cause of its own)
    explained |= {f.evidence["never_traded_with"] for f in roots if "never_traded_with" in f.evidence}
    p2p_culprits = {r for f in roots if f.kind == "p2p_unmatched" for r in f.ranks}
    # a wrong-peer send closes a loop of pipeline waits: that loop is its symptom, not a deadlock
    p2p_cycle = {r for ranks, _ in w.cycles if p2p_culprits & set(ranks) for r in ranks}
    dead = deadlock_findings(ctx, explained)   # (a cycle through a mismatched collective is its symptom)
    roots += dead
    explained |= {r for f in dead for r in f.evidence.get("deadlock", {}).get("ranks", f.ranks)} | p2p_cycle
    late, waited_on_late = late_findings(ctx, loc, ctx.timing(), timing_options)
    roots += late
    explained |= waited_on_late
    stuck = set(loc.stuck_ranks) if loc else set()
    stuck_at = {g: seq for g, seq in loc.seqs.items() if seq >= 0} if loc else {}
    # (a rank whose GPU stopped is in the collectives stuck on it: it is still named, `with_gpu_stalls`)
    stalled = set(m.gpu_stalls["rank"].to_list())
    roots += root_findings(ctx, explained, stuck - stalled, stuck_at)
    roots = with_gpu_stalls(ctx, roots)
    explained |= stalled | set(w.waiters_of(sorted(stalled)))
    if waited.reading == "hung":
        # (a GPU that never began what its peers began, with nothing older on it: in a hang only, as a running
        # job's GPU a moment behind reads the same)
        idle = never_began_findings(ctx, never_began(m), explained | {r for f in roots for r in f.ranks})
        roots += idle
        explained |= {r for f in idle for r in f.ranks}
    in_flight = stuck_in_flight_findings(ctx, loc, explained)
    live: list[Finding] = []
    if in_flight and waited.reading != "hung":
        # (in flight on every member, and nothing says for how long: a snapshot of a running job reads the same)
        live.append(in_flight_at_dump(ctx, loc, waited))
        in_flight = []
    if waited.reading == "running":
        # (a rank behind in a job that was running when dumped: its peers had waited less than their timeout)
        live += [behind_while_running(f, waited) for f in roots if f.kind == "not_joined"]
        roots = [f for f in roots if f.kind != "not_joined"]
    return _Causes(roots, explained, stuck, in_flight, live)


def _verdict(ctx: Context, causes: _Causes, waited: Waited) -> tuple[str, str, list[Finding]]:
    """The findings in their order (root causes, symptoms, warnings), the verdict and its summary."""
    trace, explained, live = ctx.trace, causes.explained, causes.live
    roots, unreadable = without_unreadable(ctx, causes.roots)
    findings = ([f for f in roots if f.role == "root_cause"]
                + [f for f in causes.stuck_findings if f.role == "root_cause"])
    findings += switch_findings(ctx, findings)
    culprits = {r for f in findings for r in f.ranks}
    # ranks stuck in a mismatched collective are counted in the mismatch's evidence, not again as symptoms
    waiting = ([] if live and not findings and waited.reading == "running"
               else _symptom_findings(ctx, culprits | explained))
    symptoms = [f for f in causes.stuck_findings if f.role == "symptom"] + waiting
    if ctx.held_in_transfers:
        symptoms.insert(len(symptoms) if ctx.held_beside_cause else 0, held_in_transfers_finding(ctx))
    reported_missing = {r for f in findings if f.kind == "missing_dump" for r in f.ranks} | set(trace.unreadable_ranks)
    warnings = warning_findings(ctx, reported_missing, explained, culprits, causes.stuck)
    if unreadable is not None:
        (findings if unreadable.role == "root_cause" else warnings).insert(0, unreadable)
    no_entries = no_entries_finding(trace)
    named = any(f.role == "root_cause" and (f.ranks or f.hosts or f.links) for f in findings)
    recollect = unreadable is not None and unreadable.role == "root_cause"
    # (said where the world was read from the groups, as that is a reading; and where nothing is named, or a
    # host or link is named from groups stuck in flight: a lost last host may be what those dumps leave
    # unexplained, or what their groups wait on)
    from_stuck = any(f.kind == "stuck_in_flight" and f.role == "root_cause" for f in findings)
    world_unknown = (None if named and not from_stuck and trace.world_size_from == "seen"
                     else world_size_finding(trace))
    findings += symptoms + live + warnings + [f for f in (no_entries, world_unknown) if f]
    unrecorded = [] if symptoms or named else ranks_with_unrecorded_groups(trace, ctx.m)
    if unrecorded:
        findings.append(_unrecorded_groups_warning(ctx, unrecorded))

    if recollect and not named:
        return "inconclusive", "INCONCLUSIVE: " + headline(unreadable), findings
    if named:
        n_roots = len([f for f in findings if f.role == "root_cause"])
        first = next(f for f in findings if f.role == "root_cause" and (f.ranks or f.hosts or f.links))
        more = f" (+{n_roots - 1} more root cause(s))" if n_roots > 1 else ""
        return "fault", "FAULT: " + first.message + more, findings
    if live and not symptoms and not trace.missing_ranks:
        return "healthy", "HEALTHY: " + headline(live[0]), findings
    if (symptoms or trace.missing_ranks or any(f.evidence.get("empty_host_folders") for f in warnings)
            or (no_entries and not no_entries.evidence["idle"])
            or (world_unknown and world_unknown.evidence.get("unseen_groups"))):
        first = symptoms[0] if symptoms else warnings[0] if warnings else no_entries or world_unknown
        return "inconclusive", "INCONCLUSIVE: " + headline(first), findings
    if no_entries:
        return "healthy", "HEALTHY: " + headline(no_entries), findings
    n_groups = ctx.m.progress["group"].n_unique()
    return "healthy", (
        f"HEALTHY: {'both' if trace.world_size == 2 else f'all {trace.world_size:,}'} ranks agree on "
        f"every collective in {n_groups:,} group{'s' if n_groups != 1 else ''}; {NOTHING_WRONG}"
        + ("; a Gloo send/recv hang would not show" if unrecorded else "")
        + (f"; a lost rank past {trace.world_size - 1:,} would not show (--world-size)"
           if world_unknown and trace.world_size_from == "seen" else "")), findings


def _unrecorded_groups_warning(ctx: Context, ranks: list[int]) -> Finding:
    """A warning, not a verdict: jobs make groups they never use, one-rank ones among them, and a healthy job's
    dumps read the same. But a hang in a pipeline transfer would read the same too."""
    return Finding(
        kind="unrecorded_groups", role="warning", ranks=ranks, hosts=ctx.topo.hosts(ranks),
        message=(f"Gloo records no send or receive, and {ctx.ranks_label(ranks)} made process "
                 "groups they recorded nothing in (a group used only for sends and receives, or never used): a "
                 "hang in a send or receive would not show in these dumps"),
        evidence={"ranks": ranks})
