"""Ranks others wait on that left no dump (or none that could be read), and whole hosts gone silent."""

from __future__ import annotations

from collections import defaultdict

import polars as pl

from flightrec.diagnosis.context import Context, n_wait, whole_host
from flightrec.model.trace import format_ranks
from flightrec.report.model import Finding


def missing_findings(ctx: Context, missing: list[int], edges: pl.DataFrame) -> list[Finding]:
    if not missing:
        return []
    by_host: dict[str | None, list[int]] = defaultdict(list)
    for r in missing:
        by_host[ctx.topo.host_of.get(r)].append(r)
    waiters = {host: frozenset(ctx.w.waiters_of(ranks)) for host, ranks in by_host.items()}
    whole = {host: host is not None and whole_host(ctx, ranks) for host, ranks in by_host.items()}
    # Units with the same waiters, none a whole host of two or more ranks gone silent, are alike: each stuck
    # collective needs one of them to be why, and nothing in the dumps says which (8 findings, one per host,
    # for 11 dumps lost beside a dead link at 128 ranks). One finding names them together.
    alike: dict[frozenset[int], list[str | None]] = defaultdict(list)
    for host in by_host:
        if not whole[host] and host is not None:   # (ranks with no known host: one unit, as `_missing_units`)
            alike[waiters[host]].append(host)
    units = [[host] for host in by_host if whole[host] or len(alike[waiters[host]]) < 2]
    units += [hosts for hosts in alike.values() if len(hosts) > 1]
    # (the strongest first, as the headline: a whole host silent, then the one most ranks wait on)
    units.sort(key=lambda hosts: (not whole[hosts[0]] or len(hosts) > 1, -len(waiters[hosts[0]]),
                                  min(by_host[hosts[0]])))

    def groups_of(hosts) -> list[str]:
        ranks = [f"r:{r}" for h in hosts for r in by_host[h]]
        return sorted(set(edges.filter(pl.col("dst").is_in(ranks))["group"].to_list()))

    return [_missing_finding(ctx, by_host[hosts[0]], hosts[0], groups_of(hosts), waiters[hosts[0]])
            if len(hosts) == 1 else
            _alike_finding(ctx, sorted(r for h in hosts for r in by_host[h]), groups_of(hosts),
                           [by_host[h] for h in hosts], waiters[hosts[0]])
            for hosts in units]


def _missing_finding(ctx: Context, ranks: list[int], host: str | None, groups: list[str],
                     waiting: frozenset[int]) -> Finding:
    """One missing unit (`waiting`: who waits on it). A host of one rank that left no dump reads as down here,
    as it is named alone."""
    labels = [ctx.groups[g].label() for g in groups[:3] if g in ctx.groups]
    if len(groups) > 3:
        labels[-1] += f", ... ({len(groups)} groups in all)"
    on_host = ctx.topo.ranks_on(host) if host else []
    damaged = [] if host is not None and whole_host(ctx, ranks, at_least=1) else [r for r in ranks if r in ctx.damaged]
    host_gone = host is not None and whole_host(ctx, ranks, at_least=1)
    if host_gone:
        msg = (f"host {host} is down: none of its {len(on_host)} ranks ({format_ranks(on_host)}) left a dump, "
               f"and {n_wait(len(waiting))} on them in {', '.join(labels)}")
    else:
        what = ("left no dump," if not damaged else
                "left a dump cut short (or with no entry), so how far it got is unknown," if len(ranks) == 1 else
                f"left no dump or a damaged one ({format_ranks(damaged)}),")
        msg = (f"{ctx.ranks_label(ranks)} {what} and {n_wait(len(waiting))} "
               f"on {'it' if len(ranks) == 1 else 'them'} in {', '.join(labels)}")
    return Finding(
        # (a host down is all its ranks, those no one is seen waiting on too: they left no dump either)
        kind="missing_dump", role="root_cause", message=msg, ranks=sorted(on_host) if host_gone else ranks,
        hosts=[host] if host else [],
        process_group=ctx.groups.get(groups[0]) if len(groups) == 1 else None,
        evidence={"waiting_ranks": len(waiting), "groups": groups, "whole_host_missing": host_gone,
                  **({"damaged_dumps": damaged} if damaged else {})},
    )


def all_with_a_dump_joined(progress: pl.DataFrame, groups: list[str]) -> bool:
    """Every member with a dump of each of `groups` enqueued the group's furthest collective (its frontier)."""
    prog = progress.filter(pl.col("group").cast(pl.String).is_in(groups) & pl.col("has_dump"))
    return prog.height > 0 and bool((prog["last_enqueued"] >= prog["frontier"]).fill_null(False).all())


def _alike_finding(ctx: Context, ranks: list[int], groups: list[str], units: list[list[int]],
                   waiting: frozenset[int]) -> Finding:
    """Missing units with the same waiters (`missing_findings`): one of them is why, or, where every member
    with a dump of the groups waiting on them joined those groups' furthest collective, none may be (their dumps
    were lost) and the hang is below the software there."""
    labels = [ctx.groups[g].label() for g in groups[:3] if g in ctx.groups]
    if len(groups) > 3:
        labels[-1] += f", ... ({len(groups)} groups in all)"
    joined = all_with_a_dump_joined(ctx.m.progress, groups)
    below = ("; or none is, their dumps only lost, and the hang is below the software (every rank with a dump "
             "joined)" if joined else "")
    damaged = [r for r in ranks if r in ctx.damaged]
    what = "left no dump" if not damaged else f"left no dump or a damaged one ({format_ranks(damaged)})"
    return Finding(
        kind="missing_dump", role="root_cause", ranks=ranks, hosts=ctx.topo.hosts(ranks),
        process_group=ctx.groups.get(groups[0]) if len(groups) == 1 else None,
        message=(f"{ctx.ranks_label(ranks)} {what}, and {n_wait(len(waiting))} on them alike in "
                 f"{', '.join(labels)}: the dumps can't say which of them is why{below}"),
        evidence={"waiting_ranks": len(waiting), "groups": groups, "whole_host_missing": False, "ambiguous": True,
                  "alike": [format_ranks(unit) for unit in units], "all_others_joined": joined},
    )
