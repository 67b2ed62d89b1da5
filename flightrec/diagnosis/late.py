"""Lateness and collectives in flight: a member that joined past its timeout, a collective stuck on every
member (a link below it), and what a snapshot of a running job shows instead."""

from __future__ import annotations

from dataclasses import replace

import polars as pl

from flightrec.analysis.dump_times import Waited
from flightrec.analysis.localize import Location
from flightrec.analysis.timing.options import TimingOptions, TimingResult
from flightrec.analysis.timing.stragglers import late_joiners
from flightrec.diagnosis.context import Context
from flightrec.model.schema import GroupId
from flightrec.model.wording import listed
from flightrec.report.model import Finding


def _duration(ms: float) -> str:
    if ms < 10:
        return f"{ms:.1f} ms"
    return f"{ms:,.0f} ms" if ms < 1000 else f"{ms / 1e3:,.1f} s"


def late_findings(ctx: Context, loc: Location | None, timing: TimingResult | None,
                   opts: TimingOptions) -> tuple[list[Finding], set[int]]:
    """A collective every member joined and none finished, where one member joined a timeout late: the others
    timed out waiting for it. It was late, not absent, so the wait graph sees nobody missing.
    Returns the findings and the members of those collectives (explained by them)."""
    if loc is None or timing is None:
        return [], set()
    stuck = pl.DataFrame({"group": [g for g, q in loc.seqs.items() if q >= 0],
                          "collective_seq_id": [q for q in loc.seqs.values() if q >= 0]},
                         schema={"group": GroupId, "collective_seq_id": pl.Int64})
    late = late_joiners(timing.lateness, stuck, opts)
    chronic = {r: row for r, *row in timing.per_rank.filter(pl.col("straggler")).select(
        "rank", "median_late_ms", "late_fraction", "n").iter_rows()}
    out, explained = [], set()
    for group, seq, rank, late_ms, next_ms, timeout_ms in late.sort("late_ms", descending=True).iter_rows():
        g = ctx.groups.get(group)
        op = ctx.op_at(group, seq) or "collective"
        members = ctx.m.units.filter((pl.col("group") == group) & (pl.col("collective_seq_id") == seq))["rank"]
        explained |= set(members.to_list())
        habit = ""
        evidence = {"late_ms": round(late_ms, 1), "next_latest_ms": round(next_ms or 0.0, 1), "timeout_ms": timeout_ms,
                    "members": members.len()}
        if rank in chronic:
            med, frac, n = chronic[rank]
            habit = f"; it was already late on {frac:.0%} of its last {n} collectives (median {med:,.0f} ms)"
            evidence.update(median_late_ms=round(med, 3), late_fraction=round(frac, 3))
        others = ("its peer timed out waiting for it" if members.len() == 2 else
                  f"the other {members.len() - 1} members, within {_duration(next_ms or 0.0)} of the first, timed out "
                  "waiting for it")
        msg = (f"{ctx.rank_label(rank)} joined {op} #{seq} in {g.label() if g else group} {_duration(late_ms)} after "
               f"its first peer, past the {_duration(timeout_ms)} timeout: {others}{habit}")
        out.append(Finding(kind="straggler", role="root_cause", message=msg, ranks=[rank],
                           hosts=ctx.topo.hosts([rank]), process_group=g, collective_seq_id=seq, op=op,
                           evidence=evidence, stacks=ctx.stack_of(rank, ctx.describe_last(rank))))
    return out, explained


def _stuck_label(ctx: Context, key: str) -> str:
    """A stuck test's name: a group, or a pipeline pair "<group>:<src>-><dst>" (`locate.stuck_tests`)."""
    if key in ctx.groups:
        return ctx.groups[key].label()
    group, sep, pair = key.rpartition(":")
    if sep and group in ctx.groups:
        return f"ranks {pair.replace('->', ' -> ')} in {ctx.groups[group].label()}"
    return f"group {key}"


def stuck_in_flight_findings(ctx: Context, loc: Location | None, explained: set[int]) -> list[Finding]:
    if loc is None or not set(loc.stuck_ranks) - explained:
        return []
    n = len(loc.stuck_groups)
    evidence = {"stuck_groups": loc.stuck_groups[:50], "stuck_group_count": n, "healthy_groups": loc.healthy_groups,
                "hosts_in_every_stuck_group": loc.candidates}
    labels = [_stuck_label(ctx, g) for g in loc.stuck_groups[:3]]
    p2p = sum(g not in ctx.groups for g in loc.stuck_groups)
    noun = ("collective" if p2p == 0 else "pipeline send/recv" if p2p == n else "operation") + ("s" if n != 1 else "")
    what = f"{n} {noun} ({', '.join(labels)}{f', ... ({n} in all)' if n > 3 else ''})"
    stuck = ("are in flight at both ends and completed at neither" if p2p == n else
             "are in flight on every member and completed on none")
    each = "group" if p2p == 0 else "pair" if p2p == n else "group or pair"
    if loc.links:
        a, b = loc.links[0]
        healthy = (f" and none of the {loc.healthy_groups:,} groups that kept completing does"
                   if loc.healthy_groups else "")
        # (a hung GPU or a dead NIC at either end stops the same collectives: the dumps can't tell them apart)
        msg = (f"link {a} <-> {b}: {what} {stuck}; every stuck {each} spans both hosts{healthy} (or a GPU or NIC "
               "at either end)")
        return [Finding(kind="stuck_in_flight", role="root_cause", message=msg, links=loc.links, evidence=evidence)]
    if loc.hosts:
        ranks = [r for r in loc.stuck_ranks if ctx.topo.host_of.get(r) in loc.hosts]
        healthy = f" and in none of the {loc.healthy_groups:,} that kept completing" if loc.healthy_groups else ""
        msg = f"host {', '.join(loc.hosts)}: {what} {stuck}; the host is in every stuck {each}{healthy}"
        return [Finding(kind="stuck_in_flight", role="root_cause", message=msg, ranks=ranks, hosts=loc.hosts,
                        evidence=evidence)]
    reason = "no host mapping (pass --hosts or --ranks-per-host)" if not ctx.topo.host_of else (
        f"{len(loc.candidates)} hosts are in every stuck group")
    msg = (f"{what} {stuck} ({ctx.ranks_label(loc.stuck_ranks)}): a hang below the collective (GPU, NIC or link), "
           f"not narrowed to one host or link: {reason}")
    return [Finding(kind="stuck_in_flight", role="symptom", message=msg, ranks=loc.stuck_ranks, evidence=evidence)]


def in_flight_at_dump(ctx: Context, loc: Location, waited: Waited) -> Finding:
    """Collectives in flight on every member, where `waited` does not read "hung": a running job's snapshot, or
    (where the dumps can't say for how long) a hang below them the dumps can't tell from one."""
    n = len(loc.stuck_groups)
    labels = listed([_stuck_label(ctx, g) for g in loc.stuck_groups[:4]], 3) if n <= 4 else (
        ", ".join(_stuck_label(ctx, g) for g in loc.stuck_groups[:3]) + f", ... ({n} in all)")
    what = f"{n} collective{'s' if n != 1 else ''} ({labels}) {'was' if n == 1 else 'were'}"
    if waited.reading == "running":
        msg = (f"the job was running when dumped: {what} in flight on every member, {waited.describe()}, and "
               "nothing else is wrong")
    else:
        msg = (f"{what} in flight on every member when the dumps were written, and no time in them says for how "
               "long: a running job's snapshot, or a hang below the collectives (GPU, NIC or link); if the job "
               "hung, analyze again with --trigger timeout")
    return Finding(kind="in_flight_at_dump", role="warning", message=msg, ranks=loc.stuck_ranks,
                   evidence={"stuck_groups": loc.stuck_groups[:50], "waited": waited.reading,
                             "longest_wait_ms": None if waited.longest_ms is None else round(waited.longest_ms, 1)})


def behind_while_running(f: Finding, waited: Waited) -> Finding:
    """A not_joined root in a job that was running when dumped (`waited` reads "running"): its peers had waited
    less than their timeout for it. A warning: it may have joined a moment later."""
    _, _, rest = f.message.partition(" never joined ")
    msg = (f"{f.message.split(' never joined ')[0]} had not yet joined {rest.split(';')[0]} when the dumps were "
           f"written, and the job was running ({waited.describe()}): not a hang")
    return replace(f, kind="behind_at_dump", role="warning", message=msg,
                   evidence={**f.evidence, "longest_wait_ms": waited.longest_ms})
