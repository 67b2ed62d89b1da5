"""What every rule reads: the trace, the matching, the wait graph and the hosts, with the lookups and
the phrases the findings share (a rank and its host, a group, how many wait)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property

import polars as pl

from flightrec.analysis.entry_facts import written_only_active
from flightrec.analysis.matching import Matching
from flightrec.analysis.timing.options import TimingResult
from flightrec.analysis.wait_graph import Waits
from flightrec.model.topology import Topology
from flightrec.model.trace import Trace, format_ranks
from flightrec.model.wording import listed
from flightrec.report.model import ProcessGroupRef


class Context:
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
        # nothing of: each may be blocked in one, on another stopped rank (`root_findings` decides)
        self.went_on = _went_on_past_last_entry(trace, m, w) if _runs_unrecorded_ops(trace, m) else set()
        # those of them `root_findings` holds (not named), and whether beside another cause (or several, none)
        self.held_in_transfers: set[int] = set()
        self.held_beside_cause = False
        # missing ranks `root_findings` does not name, as every rank waiting on them also waits on a missing
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


def _gloo_ranks(m: Matching) -> pl.DataFrame:
    """(rank): ranks with a whole dump whose recorder reports no completion (Gloo's)."""
    return m.progress.filter(~pl.col("tracks_completion") & pl.col("has_dump")).select("rank").unique()


def _runs_unrecorded_ops(trace: Trace, m: Matching) -> bool:
    """Some Gloo rank ran ops its recorder kept no entry of (Gloo records no send or receive): it made a group
    it never recorded in (`ranks_with_unrecorded_groups`), or a counter runs past the last collective it recorded in a
    group (Gloo counts every op in `last_enqueued`, while entries number collectives only: the real fixture
    straggler_pipeline's sends on the world group)."""
    gloo = _gloo_ranks(m)
    if gloo.height == 0:
        return False   # (no Gloo rank: the entries are not scanned)
    if ranks_with_unrecorded_groups(trace, m):
        return True
    recorded = (trace.entries.lazy().select("rank", "pg_id", "collective_seq_id", "is_p2p")
                .join(gloo.lazy(), on="rank", how="semi").filter(~pl.col("is_p2p"))
                .group_by("rank", "pg_id").agg(pl.col("collective_seq_id").max().alias("_seq")).collect())
    return (trace.pg_status.join(recorded, on=["rank", "pg_id"])
            .filter(pl.col("last_enqueued") > pl.col("_seq")).height > 0)


def ranks_with_unrecorded_groups(trace: Trace, m: Matching) -> list[int]:
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


def kind_of(ctx: Context, group: str) -> str:
    """A group's kind, for telling apart the same point of the program in groups of one kind: its desc where it
    names one (not PyTorch's default "undefined", nor the default group's), else the group itself."""
    g = ctx.groups.get(group)
    desc = g.desc if g else ""
    return f"desc:{desc}" if desc and desc not in ("undefined", "default_pg") else f"group:{group}"


def _groups_label(ctx: Context, groups: list[str]) -> str:
    """'group 73 (desc 'X')', or for several groups of one kind 'groups 73, 74 (desc 'X')'."""
    if len(groups) == 1:
        g = ctx.groups.get(groups[0])
        return g.label() if g else f"group {groups[0]}"
    refs = [ctx.groups.get(x) for x in groups]
    names = ", ".join(r.name if r else x for r, x in zip(refs, groups))
    desc = refs[0].desc if refs[0] else ""
    return f"groups {names}" + (f" (desc '{desc}')" if desc and desc != "undefined" else "")


def never_joined(ctx: Context, ranks: list[int], groups: str | list[str], seq: int,
                  waiting: list[int]) -> tuple[str, str]:
    """(op, "ranks X never joined <op> #<seq> in <group>; N ranks wait on them"): the not_joined headline.
    `groups`: one group, or several of one kind (the same seq of each)."""
    groups = [groups] if isinstance(groups, str) else groups
    op = ctx.op_at(groups[0], seq) or "collective"
    return op, (f"{ctx.ranks_label(ranks)} never joined {op} #{seq} in {_groups_label(ctx, groups)}; "
                f"{n_wait(len(waiting))} on {'it' if len(ranks) == 1 else 'them'}")


def n_wait(n: int) -> str:
    """'1 rank waits' / '1,024 ranks wait'."""
    return f"{n:,} rank waits" if n == 1 else f"{n:,} ranks wait"


def counted_only(ctx: Context, ranks: list[int], group: str) -> dict:
    """`{"last_seq_from_pg_status": {rank: seq}}` for the `ranks` whose ring buffer holds no entry of
    `group`: how far they got there is their pg_status counter (`match._rolled_out_status`), which a reader
    of their dump would not find in it. Empty otherwise."""
    rows = ctx.m.progress.filter((pl.col("group") == group) & pl.col("rank").is_in(ranks)
                                 & pl.col("first_seq").is_null() & pl.col("last_enqueued").is_not_null())
    if rows.height == 0:
        return {}
    return {"last_seq_from_pg_status": {str(r): q for r, q in rows.select("rank", "last_enqueued").iter_rows()}}


def stopped_note(ctx: Context, rank: int, doing: str) -> str:
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


def whole_host(ctx: Context, ranks: list[int], at_least: int = 2) -> bool:
    """`ranks`' host holds `at_least` ranks and none left a dump: silent together, as a host that went down is
    (by default two or more: one lost file on a host of one rank says no more than any other lost file)."""
    host = ctx.topo.host_of.get(ranks[0])
    on_host = ctx.topo.ranks_on(host) if host else []
    return len(on_host) >= at_least and set(on_host) <= set(ctx.trace.missing_ranks)
