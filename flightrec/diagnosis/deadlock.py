"""A cycle of waits across groups: the ranks that broke the order the others kept."""

from __future__ import annotations

from flightrec.analysis import deadlock_blame as cycles
from flightrec.diagnosis.context import Context, counted_only, never_joined, stopped_note
from flightrec.report.model import Finding


def deadlock_findings(ctx: Context, explained: set[int]) -> list[Finding]:
    out = []
    for ranks, groups in ctx.w.cycles:
        if explained & set(ranks):
            continue
        odd = _odd_one_out(ctx, ranks, groups)
        if odd is not None:
            out.append(odd)
            continue
        labels = [ctx.groups[g].label() if g in ctx.groups else f"group {g}" for g in groups]
        doing = {r: ctx.describe_last(r) for r in ranks[:6]}
        msg = (f"deadlock: {ctx.ranks_label(ranks)} wait for each other across {', '.join(labels)}: "
               "they entered these groups' collectives in different orders")
        out.append(Finding(
            kind="deadlock", role="root_cause", message=msg, ranks=ranks, hosts=ctx.topo.hosts(ranks),
            evidence={"groups": groups, "last_entries": {str(r): d for r, d in doing.items()},
                      "waiting_ranks": len(ctx.w.waiters_of(ranks))},
            stacks=[s for r in ranks[:2] for s in ctx.stack_of(r, ctx.describe_last(r))],
        ))
    return out


def _odd_one_out(ctx: Context, ranks: list[int], groups: list[str]) -> Finding | None:
    """A wait cycle one rank broke (`cycles.odd_one_out`: it ran the groups' collectives in another order than
    everyone else, or skipped one and went on): a not_joined finding that names the deadlock, or None."""
    odd = cycles.odd_one_out(ctx.m.progress, ctx.trace.groups, ctx.m.units, ctx.w.edges, ranks, groups)
    if odd is None or odd[0] not in ctx.has_dump:
        return None
    rank, group, seq = odd
    g = ctx.groups.get(group)
    waiting = ctx.w.waiters_of([rank])
    others = [r for r in ranks if r != rank]
    doing = ctx.describe_last(rank)
    op, text = never_joined(ctx, [rank], group, seq, waiting)
    msg = (f"{text}. It went on to {doing}, which {ctx.ranks_label(others)} can't reach while waiting on it: a "
           "deadlock of its order against everyone else's")
    return Finding(
        kind="not_joined", role="root_cause", message=msg, ranks=[rank], hosts=ctx.topo.hosts([rank]),
        process_group=g, collective_seq_id=seq, op=op,
        evidence={"last_entry": doing, "waiting_ranks": len(waiting), "note": stopped_note(ctx, rank, doing),
                  "deadlock": {"ranks": ranks, "groups": groups}, **counted_only(ctx, [rank], group)},
        stacks=ctx.stack_of(rank, doing),
    )
