"""Faults below the collectives: a GPU that stopped or never began what its peers began, a switch under
every implicated host."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import polars as pl

from flightrec.diagnosis.context import Context
from flightrec.model.wording import listed
from flightrec.report.model import Finding


def never_began_findings(ctx: Context, idle: pl.DataFrame, explained: set[int]) -> list[Finding]:
    """Ranks whose GPU never began the oldest op left on it, which its peers began (`gpu_position.never_began`),
    in a hang: nothing older held it, so it stopped (a GPU frozen, or stuck in a kernel of its own)."""
    out = []
    for rank, group, seq, began in idle.filter(~pl.col("rank").is_in(list(explained))).iter_rows():
        g = ctx.groups.get(group)
        op = ctx.op_at(group, seq) or "collective"
        waiting = ctx.w.waiters_of([rank])
        msg = (f"GPU of {ctx.rank_label(rank)} stopped: it never began {op} #{seq} in {g.label() if g else group}, "
               f"which {began} of its peers began, and nothing older was unfinished on it")
        out.append(Finding(kind="gpu_stalled", role="root_cause", message=msg, ranks=[rank],
                           hosts=ctx.topo.hosts([rank]), process_group=g, collective_seq_id=seq, op=op,
                           evidence={"never_began": f"{op} #{seq}", "peers_that_began": began,
                                     "waiting_ranks": len(waiting)},
                           stacks=ctx.stack_of(rank, ctx.describe_last(rank))))
    return out


def with_gpu_stalls(ctx: Context, roots: list[Finding]) -> list[Finding]:
    """Ranks whose GPU stopped (`Matching.gpu_stalls`: their peers finished collectives with them that they never
    saw finish) named as such. A root that never joined the op others wait in, all of whose ranks stalled, is
    that: its CPU stopped at a sync point behind its GPU (NVIDIA's gpu_error dumps). The stalled ranks no root
    names get a finding of their own."""
    stalls = ctx.m.gpu_stalls
    if stalls.height == 0:
        return roots
    stalled = set(stalls["rank"].to_list())
    out, named = [], set()
    for f in roots:
        if f.kind == "not_joined" and f.ranks and set(f.ranks) <= stalled:
            out.append(_gpu_stall_finding(ctx, f.ranks, joined=f))
            named |= set(f.ranks)
        else:
            out.append(f)
    rest = sorted(stalled - named - {r for f in out for r in f.ranks})
    if rest:
        out.append(_gpu_stall_finding(ctx, rest))
    return out


def _gpu_stall_finding(ctx: Context, ranks: list[int], joined: Finding | None = None) -> Finding:
    """One finding for `ranks`, whose GPUs stopped; `joined`: the not_joined finding of the same ranks, whose op
    others wait in it carries on."""
    mine = ctx.m.gpu_stalls.filter(pl.col("rank").is_in(ranks))
    per_group = (mine.group_by("group").agg(pl.col("first_unacked").min(), pl.col("last_unacked").max(),
                                            pl.col("unacked").max())
                 .sort("unacked", "group", descending=[True, False]))
    unacked = int(mine.group_by("rank").agg(pl.col("unacked").sum())["unacked"].max())
    where = {}
    for group, first, last, _n in per_group.iter_rows():
        g = ctx.groups.get(group)
        where[g.label() if g else f"group {group}"] = f"#{first}" if first == last else f"#{first}-{last}"
    one = len(ranks) == 1
    label = ctx.ranks_label(ranks)
    head = (f"GPU of {label} stopped" if one else f"GPUs of {label} stopped")
    says = (f"{'its' if one else 'their'} peers finished {unacked:,} collective{'s' if unacked != 1 else ''} with "
            f"{'it' if one else 'them'} that {'it' if one else 'they'} never saw finish")
    evidence = {"unacked_collectives": unacked, "unacked_in": where}
    if joined is not None:
        evidence |= {k: v for k, v in joined.evidence.items() if k != "note"}
        # ("ranks X never joined <op> #<seq> in <group>; N ranks wait on it": from "never joined" on)
        _, _, rest = joined.message.partition(" never joined ")
        msg = f"{head}: {says}; {'it' if one else 'they'} never joined {rest}"
        return replace(joined, kind="gpu_stalled", message=msg, evidence=evidence)
    first_group = next(iter(where.items()))
    msg = f"{head}: {says} ({first_group[0]} {first_group[1]}" + (
        f", and {len(where) - 1} more group{'s' if len(where) > 2 else ''})" if len(where) > 1 else ")")
    return Finding(kind="gpu_stalled", role="root_cause", message=msg, ranks=list(ranks),
                   hosts=ctx.topo.hosts(ranks), evidence=evidence,
                   stacks=[s for r in ranks[:2] for s in ctx.stack_of(r, ctx.describe_last(r))])


def switch_findings(ctx: Context, roots: list[Finding]) -> list[Finding]:
    """With a topology file: when every host under one leaf switch is implicated, the switch is the suspect."""
    if not ctx.topo.switch_of:
        return []
    implicated = {h for f in roots for h in f.hosts} | {h for f in roots for link in f.links for h in link}
    under: dict[str, list[str]] = defaultdict(list)
    for host, switch in ctx.topo.switch_of.items():
        under[switch].append(host)
    out = []
    for switch, hosts in sorted(under.items()):
        if len(hosts) > 1 and set(hosts) <= implicated:
            ranks = sorted(r for h in hosts for r in ctx.topo.ranks_on(h))
            out.append(Finding(
                kind="switch", role="root_cause", hosts=sorted(hosts), ranks=ranks,
                message=f"switch {switch}: all {len(hosts)} hosts under it ({listed(sorted(hosts), 6)}) are "
                        "implicated above: suspect the switch",
                evidence={"switch": switch, "hosts": sorted(hosts)},
            ))
    return out
