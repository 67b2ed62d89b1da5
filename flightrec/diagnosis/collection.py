"""What the dumps themselves leave open: unreadable or lost files, a world size read from the groups,
dumps with no entry, and the warnings beside a verdict."""

from __future__ import annotations

import os
from datetime import datetime, timezone

import polars as pl

from flightrec.diagnosis.context import Context, n_wait, whole_host
from flightrec.model.trace import Trace, format_ranks
from flightrec.model.wording import listed
from flightrec.report.model import Finding


def without_path(problem: str, path: str, root: str) -> str:
    """A file's problem as said beside the file's name: without the path its reader began it with."""
    relative = os.path.relpath(path, root) if os.path.isdir(root) else os.path.basename(path)
    for prefix in (f"{path}: ", f"{relative}: "):
        if problem.startswith(prefix):
            return problem[len(prefix):]
    return problem.replace(str(root).rstrip("/") + "/", "")


def without_unreadable(ctx: Context, roots: list[Finding]) -> tuple[list[Finding], Finding | None]:
    """Dumps that are there and could not be read (permissions, an I/O error; or in a folder that could not be
    listed) are no rank that left no dump: the root causes that rest on them (a `missing_dump` of their ranks)
    are taken out, and one `unreadable` finding says which files, why, and to collect them again. It is a root
    cause where it replaced one (naming no culprit: nobody is to be drained for it), else a warning."""
    unread = set(ctx.trace.unreadable_ranks)
    files = ctx.trace.dumps.filter(pl.col("unreadable").fill_null(False))
    if not unread and ctx.trace.unlisted.height == 0:
        return roots, None
    kept, rested = [], []
    for f in roots:
        if f.kind == "missing_dump" and set(f.ranks) & unread:
            rested.append(f)
        else:
            kept.append(f)
    where = [(ctx.trace.relative(p), r) for p, r in ctx.trace.unlisted.select("path", "reason").iter_rows()]
    where += [(ctx.trace.relative(p), (problems[0].rsplit("(", 1)[-1].rstrip(")") if problems else "unreadable"))
              for p, problems in files.select("path", "problems").iter_rows()]
    shown = "; ".join(f"{p}: {why}" for p, why in where[:3]) + (f"; ... ({len(where)} in all)" if len(where) > 3 else "")
    ranks = sorted(unread)
    what = (f"the dump of {ctx.ranks_label(ranks)}" if len(ranks) == 1 else
            f"the dumps of {ctx.ranks_label(ranks)}" if ranks else "some dumps")
    if rested:
        waiting = len(ctx.w.waiters_of(ranks))
        msg = (f"{what} could not be read ({shown}), and {n_wait(waiting)} on {'it' if len(ranks) == 1 else 'them'}: "
               "the verdict rests on what they hold")
        role = "root_cause"
    else:
        msg = f"{what} could not be read ({shown}): the rest of the job is analysed without them"
        role = "warning"
        waiting = 0
    return kept, Finding(kind="unreadable", role=role, message=msg,
                         evidence={"unreadable_ranks": ranks, "paths": [{"path": p, "reason": r} for p, r in where],
                                   "waiting_ranks": waiting})


def world_size_finding(trace: Trace) -> Finding | None:
    """No dump lists the job's ranks and none was given: Gloo writes its unnamed group config with the world's
    ranks only while the job has no other group (`fixtures/dead_rank`), and with none once it makes subgroups
    (`fixtures/host_down`). Read from the groups left in flight ("groups", said as it is a reading), or as the
    highest rank seen + 1 ("seen"): then ranks past it that left no dump (the last host, down) are not known to
    be missing, and their groups read as groups of the ranks that are there."""
    read_as = {"groups": ("as many as its groups need (groups left in flight lack members no dump shows)",
                          "groups left in flight"),
               "seen": (f"up to rank {trace.world_size - 1:,}, the highest seen; ranks past it that left no dump (a "
                        "last host that went down) would not show", "highest rank seen")}.get(trace.world_size_from)
    if read_as is None:
        return None
    said, source = read_as
    unseen = unseen_group_names(trace)
    if unseen:
        # (every process makes every group, in one order, and names it by its place in it: a name skipped is a
        # group none of the ranks read is in, so the job had more ranks than these dumps show)
        names = ", ".join(f"'{n}'" for n in unseen[:5]) + (f", ... ({len(unseen)} in all)" if len(unseen) > 5 else "")
        return Finding(
            kind="world_size_unknown", role="warning",
            message=(f"the job had more ranks than the {trace.world_size:,} read: process group"
                     f"{'s' if len(unseen) > 1 else ''} {names} {'has' if len(unseen) == 1 else 'have'} none of them; "
                     "other hosts' dumps are missing (down, or not collected)"),
            evidence={"world_size": trace.world_size, "from": source, "unseen_groups": unseen})
    return Finding(
        kind="world_size_unknown", role="warning",
        message=(f"no dump lists the job's ranks (Gloo writes none once a job makes subgroups): read as "
                 f"{trace.world_size:,} ranks, {said}: pass --world-size to check"),
        evidence={"world_size": trace.world_size, "from": source})


def unseen_group_names(trace: Trace) -> list[str]:
    """Group names (the numbers `new_group` gives, in creation order) below the highest seen that no dump read
    shows: groups none of the ranks read is in. Empty where names are not all numbers (hashed names say nothing
    of order)."""
    names = trace.groups["pg_name"].to_list()
    if not names or not all(isinstance(n, str) and n.isdigit() for n in names):
        return []
    # (not where a rank read is in a group it recorded nothing in: its pg_status lacks a local id below one it
    # has. Such a group, used only for sends and receives Gloo does not record, is unseen too: fixtures/
    # pipeline_group_stall)
    gaps = trace.pg_status.group_by("rank").agg((pl.col("pg_id").max() + 1 > pl.col("pg_id").n_unique()).alias("_gap"))
    if gaps["_gap"].any():
        return []
    seen = {int(n) for n in names}
    return [str(n) for n in range(max(seen)) if n not in seen]


def no_entries_finding(trace: Trace) -> Finding | None:
    """No dump holds an entry while their counters count collectives: written without them
    (`includeCollectives=False`), or with only unfinished ones (`TORCH_INCLUDE_ONLY_ACTIVE`) when none was. No
    collective can be matched and no rank said to wait on another. What the counters still say: who has a
    collective in flight (enqueued more than it completed, in any group), and in the default group (local id 0
    on every rank) who enqueued fewer than the others. `evidence["idle"]`: neither, as a job that stopped
    cleanly leaves them."""
    status = trace.pg_status
    if trace.entries.height or status.height == 0 or not (status["last_enqueued"] > 0).any():
        return None
    # (local id 0 is the default group's where the recorder's backend runs it, as its group list says, or
    # Gloo's with no list: else another group's, rank by rank)
    listed = trace.groups.filter(pl.col("source") == "pg_config")
    default_is_0 = listed.height == 0 or bool((listed["pg_desc"] == "default_pg").any())
    default = status.filter((pl.col("pg_id") == 0) & default_is_0).select("rank", "last_enqueued")
    top = default["last_enqueued"].max() if default.height else None
    behind = default.filter(pl.col("last_enqueued") < top)["rank"].to_list() if top is not None else []
    in_flight = sorted(set(status.filter(pl.col("last_completed") < pl.col("last_enqueued"))["rank"].to_list()))
    said = ""
    if behind:
        said += (f"; in the default group {format_ranks(behind)} enqueued fewer collectives than the others "
                 f"(up to #{top})")
    if in_flight:
        said += f"; {format_ranks(in_flight)} had a collective in flight"
    if not said:
        said = "; they show every rank done with every collective it enqueued, all alike in the default group"
    return Finding(
        kind="no_entries", role="warning",
        message=("no dump holds an entry (written without them, `includeCollectives=False`, or with only unfinished "
                 "ones, `TORCH_INCLUDE_ONLY_ACTIVE`, and none was), so no collective can be matched and no rank said "
                 "to wait on another; only their pg_status counters are left" + said),
        evidence={"default_group": {"ranks_behind": behind, "enqueued_up_to": top}, "ranks_in_flight": in_flight,
                  "idle": not behind and not in_flight},
    )


def warning_findings(ctx: Context, reported_missing: set[int], explained: set[int],
                      culprits: set[int] = frozenset(), stuck: set[int] = frozenset()) -> list[Finding]:
    out = []
    shadowed = sorted(r for r in ctx.overshadowed if r not in reported_missing)
    if shadowed:
        over = sorted({r for s in shadowed for r in ctx.overshadowed[s]})
        one = len(shadowed) == 1
        out.append(Finding(
            kind="missing_dump", role="warning", ranks=shadowed, hosts=ctx.topo.hosts(shadowed),
            message=(f"{ctx.ranks_label(shadowed)} left no dump; every rank waiting on {'it' if one else 'them'} "
                     f"also waits on {ctx.ranks_label(over)}, named above as the likelier cause: "
                     f"{'it' if one else 'they'} may be down too, or only {'its dump' if one else 'their dumps'} lost"),
            evidence={"missing_ranks": shadowed, "overshadowed_by": over}))
    missing = [r for r in ctx.trace.missing_ranks if r not in reported_missing and r not in ctx.overshadowed]
    if missing:
        waited_on = [r for r in missing if ctx.w.waiters_of([r])]
        waiters = set(ctx.w.waiters_of(waited_on))
        behind = sorted(culprits & ctx.has_dump)
        why = ("the ranks waiting on it are stuck in the root cause above" if waited_on and waiters <= explained else
               f"the ranks waiting on it wait on {ctx.ranks_label(behind)} too, whose dump shows it behind"
               if waited_on and behind and waiters <= set(ctx.w.waiters_of(behind)) | set(behind) else
               "the ranks waiting on it wait too on ranks stuck in a collective in flight on every member (above)"
               if waited_on and stuck and waiters <= set(ctx.w.waiters_of(sorted(stuck))) | stuck else
               f"no loaded rank is provably waiting on {'it' if len(missing) == 1 else 'them'}")
        gone = [h for h in ctx.topo.hosts(missing) if whole_host(ctx, ctx.topo.ranks_on(h))]
        if gone and not waited_on:
            # (a host none of whose ranks left a dump, and none proven waited on: down, or its dumps not collected)
            on = sorted(r for h in gone for r in ctx.topo.ranks_on(h))
            message = (f"host{'s' if len(gone) > 1 else ''} {', '.join(gone)} gone: none of {ctx.ranks_label(on)} "
                       f"left a dump (down, or {'its' if len(gone) == 1 else 'their'} dumps not collected); {why}")
        else:
            message = f"{ctx.ranks_label(missing)} left no dump; {why}"
        out.append(Finding(kind="missing_dump", role="warning", ranks=missing, hosts=ctx.topo.hosts(missing),
                           message=message, evidence={"missing_ranks": missing, "hosts_gone": gone}))
    known = set(ctx.topo.host_of.values())
    empty = [h for h in ctx.trace.empty_hosts if h not in known]
    if empty:
        # (a host folder beside the others with no dump in it: its ranks wrote nothing there, and which ranks
        # they are is not known where the job's size is not)
        one = len(empty) == 1
        out.append(Finding(
            kind="missing_dump", role="warning", hosts=empty,
            message=(f"host folder{'' if one else 's'} {listed(empty, 5)} "
                     f"hold{'s' if one else ''} no dump: {'that host is' if one else 'those hosts are'} gone (down, "
                     f"or {'its' if one else 'their'} dumps not collected), with ranks these dumps don't show "
                     "(--world-size shows them)"),
            evidence={"missing_ranks": [], "hosts_gone": empty, "empty_host_folders": empty}))
    versions = sorted(v for v in ctx.trace.dumps["version"].drop_nulls().unique().to_list())
    if len(versions) > 1:
        out.append(Finding(kind="mixed_versions", role="warning",
                           message=f"dumps come from different recorder versions ({', '.join(versions)}): a partial "
                                   "PyTorch rollout? Analysed together.", evidence={"versions": versions}))
    # (an unreadable file is the `unreadable` finding's: said once)
    with_problems = (ctx.trace.dumps.filter((pl.col("problems").list.len() > 0) & ~pl.col("unreadable").fill_null(False))
                     .select("path", "problems"))
    for full, problems in with_problems.iter_rows():
        path = ctx.trace.relative(full)
        problems = [without_path(p, full, ctx.trace.root) for p in problems]
        out.append(Finding(kind="dump_problem", role="warning", message=f"{path}: {'; '.join(problems)}",
                           evidence={"path": path, "problems": problems}))
    later = ctx.m.divergences.filter(pl.col("later_mismatches") > 0)
    for group, n in later.select("group", "later_mismatches").iter_rows():
        g = ctx.groups.get(group)
        out.append(Finding(kind="later_mismatches", role="warning", process_group=g,
                           message=f"{n} more collective{'s' if n != 1 else ''} after the first divergence in "
                                   f"{g.label() if g else group} also disagree", evidence={"count": n}))
    states = ctx.m.collectives.filter(pl.col("status") == "state_mismatch")
    if states.height:
        out.append(Finding(kind="state_mismatch", role="warning",
                           message=f"{states.height} collective(s) completed on some members but not on others "
                                   "(a watchdog that stopped polling, or a dump taken mid-flight)",
                           evidence={"groups": sorted(states["group"].unique().to_list())[:20]}))
    return out


# Ranks of one incident record their newest entries within a step or two of each other (the rank that stopped
# first, then its peers, each blocked in its next collective): seconds in every real dump checked
# (fixtures: 5.5 s at most). Dumps whose newest entries fall apart by this much are of two incidents.
MIXED_INCIDENTS_GAP_NS = 3600 * 10**9


def mixed_incidents_finding(trace: Trace) -> Finding | None:
    """Dumps of two incidents in one folder (an earlier run's left beside this one's, shards of two jobs in one
    OUT): the ranks' newest entries fall into groups more than an hour apart. The analysis matches them as one
    job, so its verdict can't be trusted until each incident is analysed alone."""
    newest = (trace.entries.lazy().filter(pl.col("time_created_ns") > 0)
              .group_by("rank").agg(pl.col("time_created_ns").max().alias("ns")).sort("ns").collect())
    if newest.height < 2:
        return None
    gaps = newest["ns"].diff()
    at = gaps.arg_max()
    if at is None or gaps[at] < MIXED_INCIDENTS_GAP_NS:
        return None
    older, newer = sorted(newest["rank"][:at].to_list()), sorted(newest["rank"][at:].to_list())

    def when(ns: int) -> str:
        return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    hours = gaps[at] / 3.6e12
    return Finding(
        kind="mixed_incidents", role="warning", ranks=older,
        message=(f"the dumps look like two incidents: the newest entries of {_ranks(older)} end by "
                 f"{when(newest['ns'][at - 1])}, those of {_ranks(newer)} from {when(newest['ns'][at])}, "
                 f"{hours:,.1f} h later; this analysis matched them as one job"),
        evidence={"older_ranks": older, "newer_ranks": newer, "gap_hours": round(hours, 1)})


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) != 1 else ''} {format_ranks(ranks)}"
