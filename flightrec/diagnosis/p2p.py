"""Sends and receives with no partner: a send to the wrong peer, a receive from any source, a pair that
never traded."""

from __future__ import annotations

import polars as pl

from flightrec.diagnosis.context import Context
from flightrec.model.trace import format_ranks
from flightrec.report.model import Finding


def p2p_findings(ctx: Context) -> list[Finding]:
    """A send to the wrong peer closes a loop of waits: A sends to C, which expects nothing from A, while
    somebody else waits to receive from A. An unmatched send outside a loop is only a rank whose
    peer has not got there yet (the wait graph follows it)."""
    p2p = ctx.m.p2p
    sends = p2p.filter((pl.col("status") == "unmatched_send") & pl.col("send_pending"))
    recvs = p2p.filter((pl.col("status") == "unmatched_recv") & pl.col("recv_pending"))
    out = []
    for cycle, _groups in ctx.w.cycles:
        in_cycle = sends.filter(pl.col("src").is_in(cycle) & pl.col("dst").is_in(cycle))
        wrong = []
        for row in in_cycle.iter_rows(named=True):
            a, c = row["src"], row["dst"]
            expecting = recvs.filter((pl.col("src") == a) & (pl.col("recv_rank") != c))
            if expecting.height:
                wrong.append((row, int(expecting["recv_rank"][0])))
        if len(wrong) > 1:
            # Both directions of a pipeline wait at once (2 sends forward to 4 while 0 waits for 2's backward
            # send): the wrong send is to a rank that never receives from the sender at all in its dump.
            wrong = [(row, b) for row, b in wrong if not _receives_from(ctx, row["dst"], row["src"])]
        if len(wrong) == 1:
            out.append(_wrong_peer_finding(ctx, *wrong[0]))
    named = {r for f in out for r in f.ranks}
    out += [f for f in _never_traded_findings(ctx) if not set(f.ranks) & named]
    out += _any_source_findings(ctx)
    for row in p2p.filter(pl.col("status") == "size_mismatch").iter_rows(named=True):
        a, b = row["send_rank"], row["recv_rank"]
        g = ctx.groups.get(row["group"])
        out.append(Finding(
            kind="p2p_unmatched", role="root_cause", ranks=[a, b], hosts=ctx.topo.hosts([a, b]), process_group=g,
            op="send", message=(f"rank {a} sends {row['send_sizes']} to rank {b}, which receives {row['recv_sizes']} "
                                f"(transfer {row['ordinal']} in {g.label() if g else row['group']})"),
            evidence={"send_shape": str(row["send_sizes"]), "recv_shape": str(row["recv_sizes"])},
        ))
    return out


def _never_traded_findings(ctx: Context) -> list[Finding]:
    """A send or receive left waiting in a cycle of waits, posted toward a peer its rank never traded with in that
    direction in the window, while it traded with others: the odd one of a cycle of pipeline waits (a receive posted from the wrong
    stage), not the ordinary traffic its peers wait in. Its peer, waiting on something else, is no cause."""
    if ctx.only_active:
        return []   # (the writer left out every finished transfer: no history to tell odd from usual)
    p2p = ctx.m.p2p
    # (history: transfers that finished; pairs only posted, maybe run-ahead, are no trade yet)
    traded = p2p.filter(pl.col("status") == "matched").select("group", "src", "dst").unique()
    waiting = pl.concat([
        p2p.filter((pl.col("status") == "unmatched_send") & pl.col("send_pending"))
        .select("group", "src", "dst", pl.col("send_rank").alias("rank"), pl.lit("send").alias("_op"),
                pl.col("dst").alias("_peer")),
        p2p.filter((pl.col("status") == "unmatched_recv") & pl.col("recv_pending") & pl.col("src").is_not_null())
        .select("group", "src", "dst", pl.col("recv_rank").alias("rank"), pl.lit("recv").alias("_op"),
                pl.col("src").alias("_peer")),
    ])
    odd = waiting.join(traded, on=["group", "src", "dst"], how="anti")
    if odd.height == 0:
        return []
    # (only ranks that traded the same way in the group with others: a first transfer ever has no history either)
    usual = pl.concat([traded.select("group", pl.col("src").alias("rank"), pl.col("dst").alias("_with"),
                                     pl.lit("send").alias("_op")),
                       traded.select("group", pl.col("dst").alias("rank"), pl.col("src").alias("_with"),
                                     pl.lit("recv").alias("_op"))])
    # (only where it closes a cycle of waits: outside one, the waits lead on to what stopped, and a pipeline's first
    # backward receive, from the stage it only ever sent to, is ordinary; tests/test_properties.py found it)
    in_cycle = {r for cycle, _groups in ctx.w.cycles for r in cycle}
    out = []
    for group, src, dst, rank, op, peer in odd.iter_rows():
        if rank not in in_cycle:
            continue
        others = sorted(set(usual.filter((pl.col("group") == group) & (pl.col("rank") == rank)
                                         & (pl.col("_op") == op))["_with"].to_list()))
        if not others or peer in ctx.w.roots and peer not in ctx.w.waiting:
            continue   # (no history, or a peer stopped: the wait graph names it)
        g = ctx.groups.get(group)
        where = g.label() if g else f"group {group}"
        posted = f"a receive from rank {peer}" if op == "recv" else f"a send to rank {peer}"
        never = "never sent to it" if op == "recv" else "never received from it"
        usually = f"received only from {format_ranks(others)}" if op == "recv" else f"sent only to {format_ranks(others)}"
        msg = (f"{ctx.rank_label(rank)} posted {posted} in {where}, which {never} in any transfer the dumps hold; "
               f"it {usually} before: a send/recv peer mismatch")
        out.append(Finding(
            kind="p2p_unmatched", role="root_cause", message=msg, ranks=[rank], hosts=ctx.topo.hosts([rank]),
            process_group=g, op=op,
            evidence={"posted": f"{op} {'<-' if op == 'recv' else '->'} {peer}", "usual_peers": others,
                      "never_traded_with": peer, "waiting_ranks": len(ctx.w.waiters_of([rank]))},
            stacks=ctx.stack_of(rank, ctx.describe_last(rank))))
    return out


def _any_source_findings(ctx: Context) -> list[Finding]:
    """A rank blocked in a receive from any source (`recv 1<-?`, the c10d hook writer's, on backends that have
    it) that no send to it matched: stuck, whoever was to send. Named, with the members that could have sent."""
    stuck = ctx.m.p2p.filter((pl.col("status") == "unmatched_recv") & pl.col("recv_pending") & pl.col("src").is_null())
    out = []
    for group, ranks in stuck.group_by("group").agg(pl.col("recv_rank").unique().sort()).sort("group").iter_rows():
        g = ctx.groups.get(group)
        members = ctx.m.progress.filter(pl.col("group") == group)["rank"].to_list()
        senders = sorted(set(members) - set(ranks))
        lost = sorted(set(senders) & set(ctx.trace.missing_ranks))
        where = g.label() if g else f"group {group}"
        one = len(ranks) == 1
        msg = (f"{ctx.ranks_label(ranks)} {'is' if one else 'are'} stuck in a receive from any source in {where}: "
               f"none of the ranks that could have sent ({format_ranks(senders) or 'none'}) sent to "
               f"{'it' if one else 'them'}" + (f"; {format_ranks(lost)} left no dump" if lost else ""))
        out.append(Finding(
            kind="p2p_unmatched", role="root_cause", message=msg, ranks=ranks, hosts=ctx.topo.hosts(ranks),
            process_group=g, op="recv",
            evidence={"any_source": True, "could_have_sent": senders, **({"left_no_dump": lost} if lost else {}),
                      "waiting_ranks": len(ctx.w.waiters_of(ranks))},
            stacks=[s for r in ranks[:2] for s in ctx.stack_of(r, ctx.describe_last(r))]))
    return out


def _receives_from(ctx: Context, rank: int, peer: int) -> bool:
    """Whether `rank`'s dump records a receive from `peer`: the program has that channel."""
    return ctx.trace.entries.lazy().filter(
        (pl.col("rank") == rank) & pl.col("is_p2p") & (pl.col("peer") == peer) & (pl.col("op") == "recv")
    ).select(pl.len()).collect().item() > 0


def _wrong_peer_finding(ctx: Context, row: dict, b: int) -> Finding:
    a, c = row["src"], row["dst"]
    g = ctx.groups.get(row["group"])
    msg = (f"{ctx.rank_label(a)} sends to rank {c}, which expects nothing from it, while rank {b} "
           f"waits for a receive from rank {a} in {g.label() if g else row['group']}: a send/recv peer mismatch")
    return Finding(
        kind="p2p_unmatched", role="root_cause", message=msg, ranks=[a], hosts=ctx.topo.hosts([a]),
        process_group=g, op="send",
        evidence={"sent_to": c, "expected_by": b, "shape": str(row["send_sizes"]),
                  "hosts_of_the_two_ends": ctx.topo.hosts([a]) + ctx.topo.hosts([b]),
                  "waiting_ranks": len(ctx.w.waiters_of([a]))},
        stacks=ctx.stack_of(a, ctx.describe_last(a)),
    )
