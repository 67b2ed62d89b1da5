"""From matching, the wait-for graph and group testing to findings: root causes, symptoms, warnings.

Loops here run over the few findings (roots, divergent groups, cycles), never over entries.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import replace
from functools import cached_property
from typing import Callable

import polars as pl

from flightrec.analysis import deadlock_blame as cycles
from flightrec.analysis.dump_times import Waited
from flightrec.analysis.gpu_position import never_began
from flightrec.analysis.localize import Location
from flightrec.analysis.matching import Matching, written_only_active
from flightrec.analysis.timing.stragglers import TimingOptions, TimingResult, late_joiners
from flightrec.analysis.wait_graph import Waits
from flightrec.diagnosis.actions import headline
from flightrec.ingest.load import Trace, format_ranks
from flightrec.model.schema import MISMATCH_STATUSES, GroupId
from flightrec.model.topology import Topology
from flightrec.model.wording import listed
from flightrec.report.model import Finding, ProcessGroupRef

_FIELD_WORDS = {"type_mismatch": "called", "dtype_mismatch": "used dtype", "size_mismatch": "used shape"}


class _Context:
    """Lookups over the small frames the findings need."""

    def __init__(self, trace: Trace, m: Matching, w: Waits, topo: Topology,
                 timing: Callable[[], TimingResult | None] = lambda: None):
        self.trace, self.m, self.w, self.topo = trace, m, w, topo
        self.timing = timing   # (called where a finding needs it: it may still be being worked out)
        self.groups = {
            g: ProcessGroupRef(name or "", desc or "", int(size))
            for g, name, desc, size in trace.groups.select("group", "pg_name", "pg_desc", "size").iter_rows()
        }
        loaded = set(trace.dumps.filter(pl.col("loaded"))["rank"].to_list())
        # a dump cut short (or with no entry though it ran collectives) tells nothing of how far its rank got:
        # matching counts it as no dump (progress.has_dump), and so does the root cause
        self.damaged = loaded & set(m.progress.filter(~pl.col("has_dump"))["rank"].to_list())
        self.has_dump = loaded - self.damaged
        # the groups matched (all, or those `--pg` selected)
        self.analysed_groups = set(m.progress["group"].cast(pl.String).unique().to_list())
        # Gloo ranks others wait on that went on past their last entry, where the job runs ops Gloo records
        # nothing of: each may be blocked in one, on another stopped rank (`_root_findings` decides)
        self.went_on = _went_on_past_last_entry(trace, m, w) if _runs_unrecorded_ops(trace, m) else set()
        # those of them `_root_findings` holds (not named), and whether beside another cause (or several, none)
        self.held_in_transfers: set[int] = set()
        self.held_beside_cause = False
        # missing ranks `_root_findings` does not name, as every rank waiting on them also waits on a missing
        # unit more ranks wait on (`_overshadowed`): rank -> that unit's ranks
        self.overshadowed: dict[int, list[int]] = {}
        # the writer kept only unfinished entries: a rank with none had finished everything it enqueued
        self.only_active = written_only_active(trace.dumps)

    @cached_property
    def clock_shift(self) -> pl.DataFrame:
        """(rank, _shift_ns): how far each rank's host clock is ahead, where timing found it off (else empty)."""
        timing = self.timing()
        offsets = (timing.clock_offsets.filter(pl.col("clock_offset_ms") != 0)
                   .with_columns(pl.col("host").cast(pl.String)) if timing is not None
                   else pl.DataFrame(schema={"host": pl.String, "clock_offset_ms": pl.Float64}))
        return (self.topo.frame().with_columns(pl.col("host").cast(pl.String)).join(offsets, on="host")
                .select("rank", (pl.col("clock_offset_ms") * 1e6).cast(pl.Int64).alias("_shift_ns")))

    def rank_label(self, rank: int) -> str:
        host = self.topo.host_of.get(rank)
        return f"rank {rank} (host {host})" if host else f"rank {rank}"

    def ranks_label(self, ranks: list[int]) -> str:
        if len(ranks) == 1:
            return self.rank_label(ranks[0])
        hosts = self.topo.hosts(ranks)
        where = f" (host{'s' if len(hosts) > 1 else ''} {listed(hosts, 4)})" if hosts else ""
        return f"ranks {format_ranks(ranks)}{where}"

    def op_at(self, group: str, seq: int | None) -> str | None:
        if seq is None:
            return None
        row = self.m.collectives.filter((pl.col("group") == group) & (pl.col("collective_seq_id") == seq))
        if row.height:
            return str(row["op"][0])
        row = self.m.units.filter((pl.col("group") == group) & (pl.col("collective_seq_id") == seq))
        return str(row["op"][0]) if row.height else None

    def last_entry(self, rank: int) -> dict | None:
        mine = self.trace.entries.filter(pl.col("rank") == rank)
        if mine.height == 0:
            return None
        return mine.sort("record_id").row(-1, named=True)

    def stack_of(self, rank: int, what: str) -> list[dict]:
        last = self.last_entry(rank)
        if last is None or last["stack_id"] is None:
            return []
        frames = self.trace.stacks.filter(pl.col("stack_id") == last["stack_id"])["frames"].to_list()
        return [{"rank": rank, "what": what, "frames": frames[0]}] if frames else []

    def describe_last(self, rank: int) -> str:
        e = self.last_entry(rank)
        if e is None:
            return "none unfinished" if self.only_active else "no entry recorded"
        g = self.groups.get(e["group"])
        where = g.label() if g else f"group {e['pg_name']}"
        seq = f" #{e['collective_seq_id']}" if not e["is_p2p"] else ""
        return f"{e['op']}{seq} in {where}, {e['state']}"


def _mismatch_findings(ctx: _Context) -> list[Finding]:
    out = []
    div = ctx.m.divergences.filter(pl.col("status").is_in(MISMATCH_STATUSES))
    for row in div.iter_rows(named=True):
        g = ctx.groups[row["group"]]
        seq, op, status = row["collective_seq_id"], str(row["op"]), row["status"]
        word = _FIELD_WORDS[status]
        present = ctx.m.units.filter((pl.col("group") == row["group"]) & (pl.col("collective_seq_id") == seq))
        ranks = row["ranks"]
        if row["ambiguous"] and op == "all_to_all" and status == "size_mismatch":
            ranks = sorted(present["rank"].to_list())
            msg = (f"members of {g.label()} disagree at {op} #{seq}: {row['majority']}, {row['minority']} "
                   f"({ctx.ranks_label(ranks)}); the dumps hold no split sizes to say which member is wrong")
        elif row["ambiguous"]:
            ranks = sorted(present["rank"].to_list())
            msg = (f"members of {g.label()} disagree at {op} #{seq}: {row['majority']} vs {row['minority']} "
                   f"({ctx.ranks_label(ranks)}); with {len(ranks)} members it can't be said which side is wrong")
        elif len(present) == len(ranks) and row["peer_groups"]:
            # (its other members left no dump or a cut one: what they did is unknown, the peer groups settle it)
            n, kind = row["peer_groups"], f"'{g.desc}'" if g.desc else "same-kind"
            msg = (f"{ctx.ranks_label(ranks)} {word} {row['minority']} in {op} #{seq} of {g.label()}, where every "
                   f"member of the {n:,} other {kind} group{'s' if n != 1 else ''} {word} {row['majority']} (its "
                   "other members' dumps are lost or cut short)")
        else:
            others = len(present) - len(ranks)
            msg = (f"{ctx.ranks_label(ranks)} {word} {row['minority']} in {op} #{seq} of {g.label()}, where the "
                   f"other {others:,} member{'s' if others != 1 else ''} {word} {row['majority']}")
            if row["peer_groups"]:
                n = row["peer_groups"]
                kind = f"'{g.desc}'" if g.desc else "same-kind"
                msg += (f", as did every member of the {n:,} other {kind} group{'s' if n != 1 else ''} at #{seq} "
                        "(one member against one can't say who is wrong: its peer groups can)")
        members = present["rank"].to_list()
        waiting = (set(members) | set(ctx.w.waiters_of(members))) - set(ranks)
        out.append(Finding(
            kind="mismatch", role="root_cause", message=msg, ranks=ranks, hosts=ctx.topo.hosts(ranks),
            process_group=g, collective_seq_id=seq, op=op,
            evidence={"mismatch": status, "majority": row["majority"], "minority": row["minority"],
                      "ambiguous": row["ambiguous"], "later_mismatches_in_group": row["later_mismatches"],
                      **({"peer_groups": row["peer_groups"]} if row["peer_groups"] else {}),
                      "waiting_ranks": len(waiting)},
            stacks=[s for r in ranks[:2] for s in ctx.stack_of(r, ctx.describe_last(r))],
        ))
    return out


def _p2p_findings(ctx: _Context) -> list[Finding]:
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


def _never_traded_findings(ctx: _Context) -> list[Finding]:
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


def _any_source_findings(ctx: _Context) -> list[Finding]:
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


def _receives_from(ctx: _Context, rank: int, peer: int) -> bool:
    """Whether `rank`'s dump records a receive from `peer`: the program has that channel."""
    return ctx.trace.entries.lazy().filter(
        (pl.col("rank") == rank) & pl.col("is_p2p") & (pl.col("peer") == peer) & (pl.col("op") == "recv")
    ).select(pl.len()).collect().item() > 0


def _wrong_peer_finding(ctx: _Context, row: dict, b: int) -> Finding:
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


def _deadlock_findings(ctx: _Context, explained: set[int]) -> list[Finding]:
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


def _odd_one_out(ctx: _Context, ranks: list[int], groups: list[str]) -> Finding | None:
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
    op, text = _never_joined(ctx, [rank], group, seq, waiting)
    msg = (f"{text}. It went on to {doing}, which {ctx.ranks_label(others)} can't reach while waiting on it: a "
           "deadlock of its order against everyone else's")
    return Finding(
        kind="not_joined", role="root_cause", message=msg, ranks=[rank], hosts=ctx.topo.hosts([rank]),
        process_group=g, collective_seq_id=seq, op=op,
        evidence={"last_entry": doing, "waiting_ranks": len(waiting), "note": _stopped_note(ctx, rank, doing),
                  "deadlock": {"ranks": ranks, "groups": groups}, **_counted_only(ctx, [rank], group)},
        stacks=ctx.stack_of(rank, doing),
    )


def _preceded(ctx: _Context, edges: pl.DataFrame) -> pl.DataFrame:
    """(dst, group, seq): collectives a root is waited on in that another one it is waited on comes before, in
    some rank's program order: that rank recorded both, the other first, or recorded the other and never
    reached this one. Enqueue times can't say it across hosts, whose clocks disagree. Where the order goes
    both ways (ranks disagree), nothing is dropped for that root."""
    cands = edges.filter(pl.col("kind") != "p2p").select("dst", "group", "seq").drop_nulls().unique()
    none = cands.clear()
    if cands.height < 2:
        return none
    rows = (ctx.m.units.lazy().select("group", pl.col("collective_seq_id").alias("seq"), "rank", "record_id")
            .join(cands.lazy().select("group", "seq").unique(), on=["group", "seq"]).collect())
    pairs = (cands.join(cands, on="dst", suffix="_b")
             .filter((pl.col("group") != pl.col("group_b")) | (pl.col("seq") != pl.col("seq_b"))))
    if pairs.height == 0:
        return none
    first = pairs.join(rows, on=["group", "seq"])   # a rank that recorded the earlier candidate, A
    recorded_first = (first.join(rows.rename({"group": "group_b", "seq": "seq_b", "record_id": "_rec_b"}),
                                 on=["group_b", "seq_b", "rank"])
                      .filter(pl.col("record_id") < pl.col("_rec_b")))
    never_reached = (first.join(ctx.m.progress.select(pl.col("group").alias("group_b"), "rank", "last_enqueued"),
                                on=["group_b", "rank"])
                     .filter(pl.col("last_enqueued") < pl.col("seq_b")))
    before = pl.concat([f.select("dst", "group", "seq", "group_b", "seq_b") for f in (recorded_first, never_reached)])
    before = before.unique()
    # (a pair ordered both ways is no evidence: drop both directions)
    both = before.join(before.select(pl.col("group_b").alias("group"), pl.col("seq_b").alias("seq"),
                                     pl.col("group").alias("group_b"), pl.col("seq").alias("seq_b"), "dst"),
                       on=["dst", "group", "seq", "group_b", "seq_b"], how="semi")
    before = before.join(both, on=["dst", "group", "seq", "group_b", "seq_b"], how="anti")
    preceded = before.select("dst", pl.col("group_b").alias("group"), pl.col("seq_b").alias("seq")).unique()
    # never drop every candidate of a root (an order that goes round in a circle says nothing)
    left = cands.join(preceded, on=["dst", "group", "seq"], how="anti").select("dst").unique()
    return preceded.join(left, on="dst", how="semi")


def _gloo_ranks(m: Matching) -> pl.DataFrame:
    """(rank): ranks with a whole dump whose recorder reports no completion (Gloo's)."""
    return m.progress.filter(~pl.col("tracks_completion") & pl.col("has_dump")).select("rank").unique()


def _runs_unrecorded_ops(trace: Trace, m: Matching) -> bool:
    """Some Gloo rank ran ops its recorder kept no entry of (Gloo records no send or receive): it made a group
    it never recorded in (`_unrecorded_groups`), or a counter runs past the last collective it recorded in a
    group (Gloo counts every op in `last_enqueued`, while entries number collectives only: the real fixture
    straggler_pipeline's sends on the world group)."""
    gloo = _gloo_ranks(m)
    if gloo.height == 0:
        return False   # (no Gloo rank: the entries are not scanned)
    if _unrecorded_groups(trace, m):
        return True
    recorded = (trace.entries.lazy().select("rank", "pg_id", "collective_seq_id", "is_p2p")
                .join(gloo.lazy(), on="rank", how="semi").filter(~pl.col("is_p2p"))
                .group_by("rank", "pg_id").agg(pl.col("collective_seq_id").max().alias("_seq")).collect())
    return (trace.pg_status.join(recorded, on=["rank", "pg_id"])
            .filter(pl.col("last_enqueued") > pl.col("_seq")).height > 0)


def _unrecorded_groups(trace: Trace, m: Matching) -> list[int]:
    """Gloo ranks (with a whole dump) that made a process group they never recorded an entry in: their
    pg_status, keyed by local pg id (their groups counted in the order they made them), lacks a key below one
    it has. torch makes a key at a group's first recorded entry, so a group used only for sends and receives
    has none (fixtures/record_p2p_keys.py); nor has one never used, which the dumps can't tell apart."""
    gaps = (trace.pg_status.join(_gloo_ranks(m), on="rank", how="semi").group_by("rank")
            .agg((pl.col("pg_id").max() + 1 > pl.col("pg_id").n_unique()).alias("_gap")).filter(pl.col("_gap")))
    return sorted(gaps["rank"].to_list())


def _went_on_past_last_entry(trace: Trace, m: Matching, w: Waits) -> set[int]:
    """Gloo ranks others wait on (roots of the wait graph, with a whole dump) whose last entry left the work
    queue: they went on past it, into host code or into an op Gloo does not record."""
    gloo = set(_gloo_ranks(m)["rank"].to_list())
    roots = [r for r in w.roots if r in gloo]
    if not roots:
        return set()
    last = (trace.entries.lazy().select("rank", "record_id", "retired").filter(pl.col("rank").is_in(roots))
            .sort("record_id").group_by("rank").agg(pl.col("retired").last()).collect())
    return set(last.filter(pl.col("retired").fill_null(False))["rank"].to_list())


# (how a healthy summary ends before its caveats: `api.analyze` puts a timing warning in their place)
NOTHING_WRONG = "none behind, nothing stuck"


def _held_in_transfers_finding(ctx: _Context) -> Finding:
    """The ranks `_root_findings` held as maybe blocked in a send or receive Gloo does not record: beside
    another cause (`held_beside_cause`), or, with none, as the suspects one of which holds the others."""
    ranks = sorted(ctx.held_in_transfers)
    beside_cause = ctx.held_beside_cause
    one = len(ranks) == 1
    went = (f"{ctx.ranks_label(ranks)} {'is' if one else 'are'} waited on, but had finished every op "
            f"{'it' if one else 'they'} recorded")
    if beside_cause:
        message = (f"{went}: in a job running ops Gloo does not record (sends and receives), likely blocked in one, "
                   "held by another cause (above, or a rank that left no dump)")
    else:
        hosts = ctx.topo.hosts(ranks)
        link = f", or a link between their hosts ({listed(hosts, 4)})," \
            if len(hosts) > 1 else ""
        message = (f"{went}, and nothing else holds the job: Gloo records no send or receive, and this job ran some "
                   "(groups its ranks recorded nothing in, or counters past their recorded collectives), so one of "
                   f"them{link} may hold the others in a transfer these dumps can't show")
    return Finding(kind="waiting", role="symptom", ranks=ranks, hosts=ctx.topo.hosts(ranks), message=message,
                   evidence={"ranks": ranks, "in_unrecorded_transfers": "held" if beside_cause else "suspects"})


def _missing_waits(ctx: _Context) -> list[tuple[int, str, int | None]]:
    """(rank, group, seq) of each rank waiting in a group on a member that left no dump (or is guessed lost)."""
    return (ctx.w.edges.filter((pl.col("kind") == "missing") & pl.col("src").str.starts_with("r:"))
            .select(pl.col("src").str.slice(2).cast(pl.Int64), pl.col("group").cast(pl.String), "seq").rows())


def _beside_stuck(ctx: _Context, stuck_at: dict[str, int]) -> set[int]:
    """Ranks waiting on a missing member in a collective in flight on every member with a dump, where a group of
    the same kind is stuck in flight at the same seq with every dump there (`stuck_at`: group -> seq): the hang
    below the collectives holds both groups, and the missing one need not be why (a dead link's dp groups)."""
    if not stuck_at:
        return set()
    kind = {g: ref.desc for g, ref in ctx.groups.items()}
    stuck_kinds = {(kind.get(g), seq) for g, seq in stuck_at.items()}
    in_flight = set(ctx.m.collectives.filter(pl.col("status") == "in_flight")
                    .select(pl.col("group").cast(pl.String), "collective_seq_id").iter_rows())
    return {rank for rank, group, seq in _missing_waits(ctx)
            if (group, seq) in in_flight and group not in stuck_at and (kind.get(group), seq) in stuck_kinds}


def _still_unexplained(ctx: _Context, missing: list[int], holding: set[int]) -> list[int]:
    """The `missing` ranks not explained by the `holding` ranks: some rank waits on it and on none of those
    (directly or through others), and in no group of its smaller than the world are its peers with a dump all
    held so (its tp peers stuck in a mismatched all_gather: it is likely where they are)."""
    if not missing or not holding:
        return missing
    covered = set(ctx.w.waiters_of(sorted(holding))) | holding
    missing = [r for r in missing if not set(ctx.w.waiters_of([r])) <= covered]
    if not missing:
        return missing
    # (one pass over the small progress table for every missing rank: not a filter a rank)
    small = [name for name, g in ctx.groups.items() if g.size and g.size < ctx.trace.world_size]
    prog = ctx.m.progress.filter(pl.col("group").cast(pl.String).is_in(small))
    held_groups = (prog.filter(pl.col("has_dump"))
                   .group_by("group").agg(pl.len().alias("_n"), pl.col("rank").is_in(list(covered)).all().alias("_in"))
                   .filter((pl.col("_n") >= 2) & pl.col("_in")).select("group"))
    beside = set(prog.filter(pl.col("rank").is_in(missing)).join(held_groups, on="group")["rank"].to_list())
    return [r for r in missing if r not in beside]


def _silent_hosts(ctx: _Context, gone: set[int]) -> set[str | None]:
    """Hosts all of whose ranks are `gone` (left no file at all: one cut short or unreadable was written by a
    rank alive to write it), and None (a rank whose host is unknown)."""
    hosts = {ctx.topo.host_of.get(r) for r in gone} - {None}
    return {h for h in hosts if set(ctx.topo.ranks_on(h)) <= gone} | {None}


def _beside_held(ctx: _Context) -> set[int]:
    """Ranks waiting on a missing member at seq s of a group, where a group of the same kind waits at s only on
    members that are held by something else themselves (they wait on someone, or in a send or receive Gloo
    didn't record): the missing one, in the same place as those, may well be held the same way (the last
    stage of a pipeline behind a dead NIC, its dumps lost for one replica)."""
    edges = ctx.w.edges
    behind = edges.filter((pl.col("kind") == "behind") & pl.col("src").str.starts_with("g:"))
    if behind.height == 0:
        return set()
    held_ranks = [f"r:{r}" for r in set(ctx.w.waiting) | ctx.went_on]
    kind = {g: ref.desc for g, ref in ctx.groups.items()}
    # (a group -> laggard edge carries the seq its peers wait in: the laggard's next)
    held = (behind.group_by(pl.col("group").cast(pl.String), "seq")
            .agg(pl.col("dst").is_in(held_ranks).all().alias("_held")).filter(pl.col("_held")))
    held_at = {(kind.get(g), seq) for g, seq in held.select("group", "seq").iter_rows()}
    if not held_at:
        return set()
    return {rank for rank, group, seq in _missing_waits(ctx)
            if kind.get(group) not in (None, "", "default_pg") and (kind.get(group), seq) in held_at}


def _root_findings(ctx: _Context, explained: set[int], stuck: set[int],
                   stuck_at: dict[str, int] | None = None) -> list[Finding]:
    """Roots of the wait graph: ranks that others wait for and that wait for nobody."""
    roots = [r for r in ctx.w.roots if r not in explained and r not in stuck]
    edges = ctx.w.edges.filter(pl.col("dst").is_in([f"r:{r}" for r in roots]))
    # A missing dump whose waiters are all stuck in a mismatched collective is explained by the mismatch.
    missing = [r for r in roots if r not in ctx.has_dump and not set(ctx.w.waiters_of([r])) <= explained]
    # So is one whose waiters all wait on a rank whose own dump shows it behind, or on ranks stuck in a
    # collective in flight on every member (a hang below the collectives: a dead link): those explain the hang,
    # while how far the missing one got is unknown (a warning names it, `_warning_findings`). A bystander's
    # lost dump took the blame for a dead link.
    provable = [r for r in roots if r in ctx.has_dump]
    # (and ranks a root cause found above explains, a mismatch's or a deadlock's: their waiters wait on them)
    strict = set(provable) | stuck | _beside_stuck(ctx, stuck_at or {}) | explained
    missing = _still_unexplained(ctx, missing, strict)
    # Weaker: Gloo ranks that went on past their last entry (maybe blocked in a send or receive Gloo didn't
    # record: their last entry, maybe in the missing one's group, only looks like where they stopped), and ranks
    # beside same-kind groups whose laggards are held elsewhere (`_beside_held`). Those may be waiting on the
    # missing rank itself (its pipeline neighbours): they don't clear one that left no file at all where its
    # whole host left none, or where no host is known (a crashed rank is the likelier reason it went silent).
    loose = ctx.went_on | (_beside_held(ctx) if missing else set())
    cleared: list[int] = []   # missing ranks only those loose ones explain: they may wait on them, or they on it
    if missing and loose:
        silent_ranks = set(ctx.trace.missing_ranks) - set(ctx.trace.dumps["rank"].to_list())
        silent = _silent_hosts(ctx, silent_ranks)
        kept = [r for r in missing if ctx.topo.host_of.get(r, None) in silent and r in silent_ranks]
        still = sorted(kept + _still_unexplained(ctx, [r for r in missing if r not in kept], strict | loose))
        cleared, missing = [r for r in missing if r not in still], still
    missing, ctx.overshadowed = _overshadowed(ctx, missing)
    roots = [r for r in roots if r in ctx.has_dump or r in missing]
    # Which of those are held. A rank that went on past its last entry, in a job running ops Gloo does not
    # record, stopped in host code (a cause) or in a send or receive, on a stopped peer: the dumps can't say.
    # Beside a cause they can show (a mismatch, a deadlock, a hang in flight, a silent rank, a rank stopped in
    # an op it recorded) it is held; so beside a lost rank it cleared above (it may be waiting on that one: a
    # stage whose sender died). Several of them and nothing else can hold one another through transfers (a
    # stage that never sends stops its neighbours' stages, whose peers wait on them all): none is named,
    # `_held_in_transfers_finding` lists them. One alone is named.
    went_on = ctx.went_on & set(roots)
    ctx.held_beside_cause = bool(explained or stuck or missing or cleared or set(roots) - went_on)
    if went_on and (ctx.held_beside_cause or len(went_on) > 1):
        ctx.held_in_transfers = went_on
        roots = [r for r in roots if r not in went_on]
    out: list[Finding] = []
    edges = _in_program_order(ctx, edges)
    # Roots that never joined the same collective of groups of one kind (the same seq of each expert-parallel
    # group: two ranks stopped at one point of the program) are one finding; else one per (group, seq, kind).
    by_instance: dict[tuple, list[int]] = defaultdict(list)   # (group or kind, seq, edge kind) -> roots
    groups_of: dict[tuple, list[str]] = defaultdict(list)
    mine_of: dict[int, pl.DataFrame] = {}
    for r in roots:
        if r in missing:
            continue
        mine = edges.filter(pl.col("dst") == f"r:{r}").sort("_t", "kind", "group", nulls_last=True)
        if mine.height == 0:
            continue
        first = mine.row(0, named=True)
        seq = first["seq"] if first["kind"] != "p2p" else None
        # (only ranks that stopped alike: the same note on their last entry)
        alike = _stopped_note(ctx, r, ctx.describe_last(r)) if len(roots) > 1 else ""
        key = (_kind_of(ctx, first["group"]) if seq is not None else first["group"], seq, first["kind"], alike)
        by_instance[key].append(r)
        if first["group"] not in groups_of[key]:
            groups_of[key].append(first["group"])
        mine_of[r] = mine
    for key, ranks in sorted(by_instance.items(), key=lambda kv: kv[1][0]):
        _, seq, kind, _ = key
        group, *more = groups_of[key]
        g = ctx.groups.get(group)
        waiting = ctx.w.waiters_of(ranks)
        doing = ctx.describe_last(ranks[0])
        if kind == "p2p":
            msg = (f"{ctx.ranks_label(ranks)} never posted the send/recv its pipeline peer waits for in "
                   f"{g.label() if g else group}; {_n_wait(len(waiting))} on it")
            op = "send/recv"
        else:
            op, msg = _never_joined(ctx, ranks, groups_of[key], seq, waiting)
        counted: dict = {}
        for each in groups_of[key]:
            counted |= _counted_only(ctx, ranks, each).get("last_seq_from_pg_status", {})
        out.append(Finding(
            kind="not_joined", role="root_cause", message=msg, ranks=ranks, hosts=ctx.topo.hosts(ranks),
            process_group=g, collective_seq_id=seq, op=op,
            evidence={"last_entry": doing, "waiting_ranks": len(waiting), "note": _stopped_note(ctx, ranks[0], doing),
                      **({"also_waited_on_in": also} if (also := _other_waits(ctx, mine_of[ranks[0]])) else {}),
                      **({"groups": groups_of[key]} if more else {}),
                      **({"last_seq_from_pg_status": counted} if counted else {})},
            stacks=[s for r in ranks[:2] for s in ctx.stack_of(r, ctx.describe_last(r))],
        ))
    # (ranks whose dumps prove them behind come first: how far a rank with no dump got is unknown)
    return out + _missing_findings(ctx, missing, edges)


def _never_began_findings(ctx: _Context, idle: pl.DataFrame, explained: set[int]) -> list[Finding]:
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


def _with_gpu_stalls(ctx: _Context, roots: list[Finding]) -> list[Finding]:
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


def _gpu_stall_finding(ctx: _Context, ranks: list[int], joined: Finding | None = None) -> Finding:
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


def _in_program_order(ctx: _Context, edges: pl.DataFrame) -> pl.DataFrame:
    """The wait edges into roots, with `_t` (when its peers enqueued the op waited for) and without those another
    one precedes: a root is often waited on in several groups, and the op it should have run first is, of those
    no other precedes in some rank's program order (`_preceded`: clock-free), the one its peers enqueued earliest
    (on one clock: the hosts' offsets timing found are taken out)."""
    # (lazy, over the three columns it reads: an eager join copies every column of the matched units)
    when = (ctx.m.units.lazy().select("group", "collective_seq_id", "rank", "time_created_ns")
            .join(edges.lazy().select("group", pl.col("seq").alias("collective_seq_id")).unique(),
                  on=["group", "collective_seq_id"])
            .join(ctx.clock_shift.lazy(), on="rank", how="left")
            .group_by("group", "collective_seq_id")
            .agg((pl.col("time_created_ns") - pl.col("_shift_ns").fill_null(0)).min().alias("_t")).collect())
    edges = edges.join(when.rename({"collective_seq_id": "seq"}), on=["group", "seq"], how="left")
    return edges.join(_preceded(ctx, edges), on=["dst", "group", "seq"], how="anti")


def _other_waits(ctx: _Context, mine: pl.DataFrame) -> list[str]:
    """Where else others wait on a root (its wait edges, in order, after the first: the one its headline names),
    one label each: 'send/recv in group 10 (desc 'pp')', 'all_reduce #3 in group 18 (desc 'dp')'. A rank stopped
    before its pipeline send is also what its tp peers wait for at their next collective. (Per finding, not per
    root: reading an op can scan the units.)"""
    first = mine.row(0, named=True)
    out = []
    for group, seq, kind in mine.slice(1).select("group", "seq", "kind").unique(maintain_order=True).iter_rows():
        if (group, kind) == (first["group"], first["kind"]):
            continue
        g = ctx.groups.get(group)
        where = g.label() if g else f"group {group}"
        what = "send/recv" if kind == "p2p" else f"{ctx.op_at(group, seq) or 'collective'} #{seq}"
        label = f"{what} in {where}"
        if label not in out:
            out.append(label)
    return out[:4]


def _kind_of(ctx: _Context, group: str) -> str:
    """A group's kind, for telling apart the same point of the program in groups of one kind: its desc where it
    names one (not PyTorch's default "undefined", nor the default group's), else the group itself."""
    g = ctx.groups.get(group)
    desc = g.desc if g else ""
    return f"desc:{desc}" if desc and desc not in ("undefined", "default_pg") else f"group:{group}"


def _groups_label(ctx: _Context, groups: list[str]) -> str:
    """'group 73 (desc 'X')', or for several groups of one kind 'groups 73, 74 (desc 'X')'."""
    if len(groups) == 1:
        g = ctx.groups.get(groups[0])
        return g.label() if g else f"group {groups[0]}"
    refs = [ctx.groups.get(x) for x in groups]
    names = ", ".join(r.name if r else x for r, x in zip(refs, groups))
    desc = refs[0].desc if refs[0] else ""
    return f"groups {names}" + (f" (desc '{desc}')" if desc and desc != "undefined" else "")


def _never_joined(ctx: _Context, ranks: list[int], groups: str | list[str], seq: int,
                  waiting: list[int]) -> tuple[str, str]:
    """(op, "ranks X never joined <op> #<seq> in <group>; N ranks wait on them"): the not_joined headline.
    `groups`: one group, or several of one kind (the same seq of each)."""
    groups = [groups] if isinstance(groups, str) else groups
    op = ctx.op_at(groups[0], seq) or "collective"
    return op, (f"{ctx.ranks_label(ranks)} never joined {op} #{seq} in {_groups_label(ctx, groups)}; "
                f"{_n_wait(len(waiting))} on {'it' if len(ranks) == 1 else 'them'}")


def _n_wait(n: int) -> str:
    """'1 rank waits' / '1,024 ranks wait'."""
    return f"{n:,} rank waits" if n == 1 else f"{n:,} ranks wait"


def _counted_only(ctx: _Context, ranks: list[int], group: str) -> dict:
    """`{"last_seq_from_pg_status": {rank: seq}}` for the `ranks` whose ring buffer holds no entry of
    `group`: how far they got there is their pg_status counter (`match._rolled_out_status`), which a reader
    of their dump would not find in it. Empty otherwise."""
    rows = ctx.m.progress.filter((pl.col("group") == group) & pl.col("rank").is_in(ranks)
                                 & pl.col("first_seq").is_null() & pl.col("last_enqueued").is_not_null())
    if rows.height == 0:
        return {}
    return {"last_seq_from_pg_status": {str(r): q for r, q in rows.select("rank", "last_enqueued").iter_rows()}}


def _stopped_note(ctx: _Context, rank: int, doing: str) -> str:
    last = ctx.last_entry(rank)
    if last is not None and last["group"] not in ctx.analysed_groups:
        # (--pg: the rank went on to a group left out, and may be blocked there, behind someone else)
        return ("its last entry is in a group left out of this analysis (--pg): it may be waiting there, on "
                "another rank; analyze without --pg to follow it")
    tracks = ctx.m.progress.filter(pl.col("rank") == rank)["tracks_completion"].any()
    if not tracks:
        # (Gloo retires work that finished or failed at its timeout; and records no send or receive)
        if last is not None and last.get("retired"):
            return ("its last recorded op finished (Gloo retired it): it went on past it, into host code or a send "
                    "or receive (which Gloo does not record)")
        return "its last recorded op had not finished (Gloo had not retired it)"
    if doing.endswith("completed"):
        return "its last recorded op finished: it is stuck outside any collective (host code, data loader, GPU)"
    if last is None and ctx.only_active:
        return ("every op it enqueued had finished (its dump, of unfinished entries only, lists none): it stopped "
                "outside any collective, in host code (Python, a held GIL, data loading, I/O)")
    return "its last recorded op did not finish"


def _missing_units(ctx: _Context, missing: list[int]) -> list[list[int]]:
    """The missing ranks of each known host. (Ranks with no known host are left out: a host down is then seen
    rank by rank, each waited on by its own peers, and the ranks fewer wait on would read as overshadowed by
    the others, the host named without them: --no-hosts sweep, seed 7, job 6.)"""
    by_host: dict[str, list[int]] = defaultdict(list)
    for r in missing:
        host = ctx.topo.host_of.get(r)
        if host is not None:
            by_host[host].append(r)
    return list(by_host.values())


def _whole_host(ctx: _Context, ranks: list[int], at_least: int = 2) -> bool:
    """`ranks`' host holds `at_least` ranks and none left a dump: silent together, as a host that went down is
    (by default two or more: one lost file on a host of one rank says no more than any other lost file)."""
    host = ctx.topo.host_of.get(ranks[0])
    on_host = ctx.topo.ranks_on(host) if host else []
    return len(on_host) >= at_least and set(on_host) <= set(ctx.trace.missing_ranks)


def _overshadowed(ctx: _Context, missing: list[int]) -> tuple[list[int], dict[int, list[int]]]:
    """Of the missing ranks others wait on, those a stronger missing unit explains: every rank waiting on them
    waits on that unit too (directly or through others, as `_still_unexplained` asks of ranks with a dump), and
    that unit has more waiters, or as many and is a whole host gone silent (a host that went down), where they
    are not. At scale dumps go missing beside a real fault (a full disk, a job killed before every rank wrote):
    20 lost files beside a host down named 15 root causes, the host seventh. Each stuck collective with several
    members missing needs only one of them to be why; the one every waiter waits on is the likelier reading.
    Units with the same waiters, both plain, are kept (`_missing_findings` names them together: nothing tells
    them apart). Returns (the ranks still named, rank -> the ranks of the units that overshadow it)."""
    if len(missing) < 2:
        return missing, {}
    units = [(ranks, frozenset(ctx.w.waiters_of(ranks)), _whole_host(ctx, ranks))
             for ranks in _missing_units(ctx, missing)]

    def stronger(a, b) -> bool:
        return len(a[1]) > len(b[1]) or (len(a[1]) == len(b[1]) and a[2] and not b[2])

    # (stronger first: a unit can only be overshadowed by one before it)
    order = sorted(range(len(units)), key=lambda i: (-len(units[i][1]), not units[i][2]))
    over: dict[int, list[int]] = {}
    for pos, i in enumerate(order):
        unit = units[i]
        if unit[1]:
            over[i] = [j for j in order[:pos] if unit[1] <= units[j][1] and stronger(units[j], unit)]
    # (named by the units they leave standing: one that overshadows another is itself overshadowed only by a
    # stronger one through a superset, which then covers the first too)
    shadowed = {i for i, by in over.items() if by}
    by_ranks = {r: sorted(r2 for j in over[i] if j not in shadowed for r2 in units[j][0])
                for i in shadowed for r in units[i][0]}
    return [r for r in missing if r not in by_ranks], by_ranks


def _missing_findings(ctx: _Context, missing: list[int], edges: pl.DataFrame) -> list[Finding]:
    if not missing:
        return []
    by_host: dict[str | None, list[int]] = defaultdict(list)
    for r in missing:
        by_host[ctx.topo.host_of.get(r)].append(r)
    waiters = {host: frozenset(ctx.w.waiters_of(ranks)) for host, ranks in by_host.items()}
    whole = {host: host is not None and _whole_host(ctx, ranks) for host, ranks in by_host.items()}
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


def _missing_finding(ctx: _Context, ranks: list[int], host: str | None, groups: list[str],
                     waiting: frozenset[int]) -> Finding:
    """One missing unit (`waiting`: who waits on it). A host of one rank that left no dump reads as down here,
    as it is named alone."""
    labels = [ctx.groups[g].label() for g in groups[:3] if g in ctx.groups]
    if len(groups) > 3:
        labels[-1] += f", ... ({len(groups)} groups in all)"
    on_host = ctx.topo.ranks_on(host) if host else []
    damaged = [] if host is not None and _whole_host(ctx, ranks, at_least=1) else [r for r in ranks if r in ctx.damaged]
    whole_host = host is not None and _whole_host(ctx, ranks, at_least=1)
    if whole_host:
        msg = (f"host {host} is down: none of its {len(on_host)} ranks ({format_ranks(on_host)}) left a dump, "
               f"and {_n_wait(len(waiting))} on them in {', '.join(labels)}")
    else:
        what = ("left no dump," if not damaged else
                "left a dump cut short (or with no entry), so how far it got is unknown," if len(ranks) == 1 else
                f"left no dump or a damaged one ({format_ranks(damaged)}),")
        msg = (f"{ctx.ranks_label(ranks)} {what} and {_n_wait(len(waiting))} "
               f"on {'it' if len(ranks) == 1 else 'them'} in {', '.join(labels)}")
    return Finding(
        # (a host down is all its ranks, those no one is seen waiting on too: they left no dump either)
        kind="missing_dump", role="root_cause", message=msg, ranks=sorted(on_host) if whole_host else ranks,
        hosts=[host] if host else [],
        process_group=ctx.groups.get(groups[0]) if len(groups) == 1 else None,
        evidence={"waiting_ranks": len(waiting), "groups": groups, "whole_host_missing": whole_host,
                  **({"damaged_dumps": damaged} if damaged else {})},
    )


def all_with_a_dump_joined(progress: pl.DataFrame, groups: list[str]) -> bool:
    """Every member with a dump of each of `groups` enqueued the group's furthest collective (its frontier)."""
    prog = progress.filter(pl.col("group").cast(pl.String).is_in(groups) & pl.col("has_dump"))
    return prog.height > 0 and bool((prog["last_enqueued"] >= prog["frontier"]).fill_null(False).all())


def _alike_finding(ctx: _Context, ranks: list[int], groups: list[str], units: list[list[int]],
                   waiting: frozenset[int]) -> Finding:
    """Missing units with the same waiters (`_missing_findings`): one of them is why, or, where every member
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
        message=(f"{ctx.ranks_label(ranks)} {what}, and {_n_wait(len(waiting))} on them alike in "
                 f"{', '.join(labels)}: the dumps can't say which of them is why{below}"),
        evidence={"waiting_ranks": len(waiting), "groups": groups, "whole_host_missing": False, "ambiguous": True,
                  "alike": [format_ranks(unit) for unit in units], "all_others_joined": joined},
    )


def _duration(ms: float) -> str:
    if ms < 10:
        return f"{ms:.1f} ms"
    return f"{ms:,.0f} ms" if ms < 1000 else f"{ms / 1e3:,.1f} s"


def _late_findings(ctx: _Context, loc: Location | None, timing: TimingResult | None,
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


def _stuck_label(ctx: _Context, key: str) -> str:
    """A stuck test's name: a group, or a pipeline pair "<group>:<src>-><dst>" (`locate.stuck_tests`)."""
    if key in ctx.groups:
        return ctx.groups[key].label()
    group, sep, pair = key.rpartition(":")
    if sep and group in ctx.groups:
        return f"ranks {pair.replace('->', ' -> ')} in {ctx.groups[group].label()}"
    return f"group {key}"


def _stuck_findings(ctx: _Context, loc: Location | None, explained: set[int]) -> list[Finding]:
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


def _in_flight_at_dump(ctx: _Context, loc: Location, waited: Waited) -> Finding:
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


def _behind_while_running(f: Finding, waited: Waited) -> Finding:
    """A not_joined root in a job that was running when dumped (`waited` reads "running"): its peers had waited
    less than their timeout for it. A warning: it may have joined a moment later."""
    _, _, rest = f.message.partition(" never joined ")
    msg = (f"{f.message.split(' never joined ')[0]} had not yet joined {rest.split(';')[0]} when the dumps were "
           f"written, and the job was running ({waited.describe()}): not a hang")
    return replace(f, kind="behind_at_dump", role="warning", message=msg,
                   evidence={**f.evidence, "longest_wait_ms": waited.longest_ms})


def without_path(problem: str, path: str, root: str) -> str:
    """A file's problem as said beside the file's name: without the path its reader began it with."""
    relative = os.path.relpath(path, root) if os.path.isdir(root) else os.path.basename(path)
    for prefix in (f"{path}: ", f"{relative}: "):
        if problem.startswith(prefix):
            return problem[len(prefix):]
    return problem.replace(str(root).rstrip("/") + "/", "")


def _without_unreadable(ctx: _Context, roots: list[Finding]) -> tuple[list[Finding], Finding | None]:
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
        msg = (f"{what} could not be read ({shown}), and {_n_wait(waiting)} on {'it' if len(ranks) == 1 else 'them'}: "
               "the verdict rests on what they hold")
        role = "root_cause"
    else:
        msg = f"{what} could not be read ({shown}): the rest of the job is analysed without them"
        role = "warning"
        waiting = 0
    return kept, Finding(kind="unreadable", role=role, message=msg,
                         evidence={"unreadable_ranks": ranks, "paths": [{"path": p, "reason": r} for p, r in where],
                                   "waiting_ranks": waiting})


def _switch_findings(ctx: _Context, roots: list[Finding]) -> list[Finding]:
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


def _symptom_findings(ctx: _Context, culprits: set[int]) -> list[Finding]:
    edges = ctx.w.edges.filter(pl.col("src").str.starts_with("r:")).with_columns(
        pl.col("src").str.slice(2).cast(pl.Int64).alias("rank"))
    edges = edges.filter(~pl.col("rank").is_in(list(culprits)))
    if edges.height == 0:
        return []
    descs = ctx.trace.groups.select("group", pl.col("pg_desc").fill_null(""), "pg_name")
    per = (edges.join(descs, on="group", how="left")
           .group_by("pg_desc").agg(pl.col("rank").unique().sort(), pl.col("group").n_unique().alias("n_groups"),
                                    pl.col("kind").mode().first())
           .sort(pl.col("rank").list.len(), "pg_desc", descending=[True, False]))   # (ties in a stable order)
    out = []
    for desc, ranks, n_groups, kind in per.iter_rows():
        label = f"desc '{desc}'" if desc else "unnamed groups"
        unread = set(ctx.trace.unreadable_ranks)
        lost = ("whose dumps could not be read" if unread and set(ctx.trace.missing_ranks) <= unread
                else "with no dump read" if unread else "that left no dump")
        how = {"behind": "for members that have not joined", "missing": f"for members {lost}",
               "p2p": "for a send/recv peer"}[kind]
        out.append(Finding(
            kind="waiting", role="symptom", ranks=ranks,
            message=f"{_n_wait(len(ranks))} in {n_groups:,} group{'s' if n_groups != 1 else ''} ({label}) {how}",
            evidence={"groups": n_groups, "ranks": ranks},
        ))
    return out


def _world_size_finding(trace: Trace) -> Finding | None:
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


def _no_entries_finding(trace: Trace) -> Finding | None:
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


def _warning_findings(ctx: _Context, reported_missing: set[int], explained: set[int],
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
        gone = [h for h in ctx.topo.hosts(missing) if _whole_host(ctx, ctx.topo.ranks_on(h))]
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
    ctx = _Context(trace, m, w, topo, timing if callable(timing) else lambda: timing)
    roots: list[Finding] = []
    roots += _mismatch_findings(ctx)
    # ranks stuck in a mismatched collective are explained by it, whichever side they are on
    mismatched = m.divergences.filter(pl.col("status").is_in(MISMATCH_STATUSES)).select("group", "collective_seq_id")
    explained = set(m.units.lazy().select("group", "collective_seq_id", "rank")
                    .join(mismatched.lazy(), on=["group", "collective_seq_id"]).collect()["rank"].to_list())
    roots += _p2p_findings(ctx)
    explained |= {r for f in roots for r in f.ranks}
    # (the peer a mismatched send or receive was posted toward waits elsewhere: it is no cause of its own)
    explained |= {f.evidence["never_traded_with"] for f in roots if "never_traded_with" in f.evidence}
    p2p_culprits = {r for f in roots if f.kind == "p2p_unmatched" for r in f.ranks}
    # a wrong-peer send closes a loop of pipeline waits: that loop is its symptom, not a deadlock
    p2p_cycle = {r for ranks, _ in w.cycles if p2p_culprits & set(ranks) for r in ranks}
    dead = _deadlock_findings(ctx, explained)   # (a cycle through a mismatched collective is its symptom)
    roots += dead
    explained |= {r for f in dead for r in f.evidence.get("deadlock", {}).get("ranks", f.ranks)} | p2p_cycle
    late, waited_on_late = _late_findings(ctx, loc, ctx.timing(), timing_options or TimingOptions())
    roots += late
    explained |= waited_on_late
    stuck = set(loc.stuck_ranks) if loc else set()
    stuck_at = {g: seq for g, seq in loc.seqs.items() if seq >= 0} if loc else {}
    # (a rank whose GPU stopped is in the collectives stuck on it: it is still named, `_with_gpu_stalls`)
    stalled = set(m.gpu_stalls["rank"].to_list())
    roots += _root_findings(ctx, explained, stuck - stalled, stuck_at)
    roots = _with_gpu_stalls(ctx, roots)
    explained |= stalled | set(w.waiters_of(sorted(stalled)))
    if waited.reading == "hung":
        # (a GPU that never began what its peers began, with nothing older on it: in a hang only, as a running
        # job's GPU a moment behind reads the same)
        idle = _never_began_findings(ctx, never_began(m), explained | {r for f in roots for r in f.ranks})
        roots += idle
        explained |= {r for f in idle for r in f.ranks}
    stuck_findings = _stuck_findings(ctx, loc, explained)
    live: list[Finding] = []
    if stuck_findings and waited.reading != "hung":
        # (in flight on every member, and nothing says for how long: a snapshot of a running job reads the same)
        live.append(_in_flight_at_dump(ctx, loc, waited))
        stuck_findings = []
    if waited.reading == "running":
        # (a rank behind in a job that was running when dumped: its peers had waited less than their timeout)
        live += [_behind_while_running(f, waited) for f in roots if f.kind == "not_joined"]
        roots = [f for f in roots if f.kind != "not_joined"]

    roots, unreadable = _without_unreadable(ctx, roots)
    findings = [f for f in roots if f.role == "root_cause"] + [f for f in stuck_findings if f.role == "root_cause"]
    findings += _switch_findings(ctx, findings)
    culprits = {r for f in findings for r in f.ranks}
    # ranks stuck in a mismatched collective are counted in the mismatch's evidence, not again as symptoms
    waiting = ([] if live and not findings and waited.reading == "running"
               else _symptom_findings(ctx, culprits | explained))
    symptoms = [f for f in stuck_findings if f.role == "symptom"] + waiting
    if ctx.held_in_transfers:
        symptoms.insert(len(symptoms) if ctx.held_beside_cause else 0, _held_in_transfers_finding(ctx))
    reported_missing = {r for f in findings if f.kind == "missing_dump" for r in f.ranks} | set(trace.unreadable_ranks)
    warnings = _warning_findings(ctx, reported_missing, explained, culprits, stuck)
    if unreadable is not None:
        if unreadable.role == "root_cause":
            findings.insert(0, unreadable)
        else:
            warnings.insert(0, unreadable)
    no_entries = _no_entries_finding(trace)
    named = any(f.role == "root_cause" and (f.ranks or f.hosts or f.links) for f in findings)
    recollect = unreadable is not None and unreadable.role == "root_cause"
    # (said where the world was read from the groups, as that is a reading; and where nothing is named, or a
    # host or link is named from groups stuck in flight: a lost last host may be what those dumps leave
    # unexplained, or what their groups wait on)
    from_stuck = any(f.kind == "stuck_in_flight" and f.role == "root_cause" for f in findings)
    world_unknown = (None if named and not from_stuck and trace.world_size_from == "seen"
                     else _world_size_finding(trace))
    findings += symptoms + live + warnings + [f for f in (no_entries, world_unknown) if f]

    unrecorded_groups = [] if symptoms or named else _unrecorded_groups(trace, m)
    if unrecorded_groups:
        # (A warning, not a verdict: jobs make groups they never use, one-rank ones among them, and a healthy
        # job's dumps read the same. But a hang in a pipeline transfer would read the same too.)
        findings.append(Finding(
            kind="unrecorded_groups", role="warning", ranks=unrecorded_groups, hosts=topo.hosts(unrecorded_groups),
            message=(f"Gloo records no send or receive, and {ctx.ranks_label(unrecorded_groups)} made process "
                     "groups they recorded nothing in (a group used only for sends and receives, or never used): a "
                     "hang in a send or receive would not show in these dumps"),
            evidence={"ranks": unrecorded_groups}))
    if recollect and not named:
        verdict = "inconclusive"
        summary = "INCONCLUSIVE: " + headline(unreadable)
    elif named:
        verdict = "fault"
        summary = "FAULT: " + next(f for f in findings if f.role == "root_cause" and (f.ranks or f.hosts or f.links)
                                   ).message
        if len([f for f in findings if f.role == "root_cause"]) > 1:
            summary += f" (+{len([f for f in findings if f.role == 'root_cause']) - 1} more root cause(s))"
    elif live and not symptoms and not trace.missing_ranks:
        verdict = "healthy"
        summary = "HEALTHY: " + headline(live[0])
    elif (symptoms or trace.missing_ranks or any(f.evidence.get("empty_host_folders") for f in warnings)
          or (no_entries and not no_entries.evidence["idle"])
          or (world_unknown and world_unknown.evidence.get("unseen_groups"))):
        verdict = "inconclusive"
        first = symptoms[0] if symptoms else warnings[0] if warnings else no_entries or world_unknown
        summary = "INCONCLUSIVE: " + headline(first)
    elif no_entries:
        verdict = "healthy"
        summary = "HEALTHY: " + headline(no_entries)
    else:
        verdict = "healthy"
        n_groups = m.progress["group"].n_unique()
        summary = (f"HEALTHY: {'both' if trace.world_size == 2 else f'all {trace.world_size:,}'} ranks agree on "
                   f"every collective in {n_groups:,} group{'s' if n_groups != 1 else ''}; {NOTHING_WRONG}"
                   + ("; a Gloo send/recv hang would not show" if unrecorded_groups else "")
                   + (f"; a lost rank past {trace.world_size - 1:,} would not show (--world-size)"
                      if world_unknown and trace.world_size_from == "seen" else ""))
    return verdict, summary, findings
