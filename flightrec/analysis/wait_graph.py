"""Who waits for whom, across every process group: the wait-for graph and its roots.

Rank A waits for rank B when A is inside a group op that B has not joined: A enqueued a later collective in
the group than B did (a collective can't finish without every member), or A is blocked in a group whose
member B left no dump, or A's send/recv has no counterpart posted by B. Edges are built per group through a
group node (A -> group -> B), so a group of 16,384 behind one member is a star, not a clique.

The roots are the ranks that are waited on and wait for nobody; a cycle is a deadlock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import polars as pl

from flightrec.analysis.entry_facts import last_group_per_rank
from flightrec.analysis.gpu_position import oldest_pending
from flightrec.analysis.matching import Matching
from flightrec.model.schema import of_a_kind

if TYPE_CHECKING:
    import networkx as nx

WAIT_EDGES = pl.Schema({
    "src": pl.String,        # "r:<rank>" or "g:<group>"
    "dst": pl.String,
    "kind": pl.Enum(["behind", "missing", "p2p"]),
    "group": pl.Categorical(),
    "seq": pl.Int64,         # the collective (or p2p ordinal) the waiter is in
})


# The node a receive from any source waits on ("any:<group>:<rank>")
ANY_SOURCE_NODE = "any:"


def rank_node(rank: int) -> str:
    return f"r:{rank}"


@dataclass(frozen=True)
class Waits:
    """The wait-for graph.

    Attributes:
        edges: one row per edge (schema WAIT_EDGES), the input the graph is built from.
        graph: networkx DiGraph over rank nodes "r:<rank>" and group nodes "g:<group>" (made when first asked
            for: the analysis itself reads the edges).
        roots: ranks that someone waits for (directly or through a group) and that wait for nobody.
        cycles: each a sorted list of ranks that wait for each other (a deadlock), with its groups.
        waiting: ranks that wait on something (have an outgoing edge).
    """

    edges: pl.DataFrame
    roots: list[int]
    cycles: list[tuple[list[int], list[str]]]
    waiting: list[int]
    # (the edges are not changed once found: each set of ranks is walked once, though the root cause asks of
    # the same lost ranks in several rules)
    _waiters: dict = field(default_factory=dict, repr=False, compare=False)

    @cached_property
    def graph(self) -> nx.DiGraph:
        import networkx as nx  # (~70 ms to import: only for who asks for the graph, or a cycle to find)

        graph = nx.DiGraph()
        graph.add_edges_from(zip(self.edges["src"].to_list(), self.edges["dst"].to_list()))
        return graph

    @cached_property
    def _waiting_on(self) -> dict[str, list[str]]:
        """Each node's predecessors: who waits on it."""
        grouped = self.edges.group_by("dst").agg(pl.col("src").unique())
        return dict(zip(grouped["dst"].to_list(), grouped["src"].to_list()))

    def waiters_of(self, ranks: list[int]) -> list[int]:
        """Every rank that transitively waits on any of `ranks`."""
        key = tuple(sorted(ranks))
        if key not in self._waiters:
            self._waiters[key] = self._walk_waiters(ranks)
        return list(self._waiters[key])

    def _walk_waiters(self, ranks: list[int]) -> list[int]:
        waiting_on = self._waiting_on
        seen: set[str] = set()
        stack = [rank_node(r) for r in ranks]
        while stack:
            node = stack.pop()
            for pred in waiting_on.get(node, ()):
                if pred not in seen:
                    seen.add(pred)
                    stack.append(pred)
        return sorted(int(n[2:]) for n in seen if n.startswith("r:") and int(n[2:]) not in ranks)


def _lost_members(prog: pl.DataFrame, groups: pl.DataFrame | None, missing_ranks: Iterable[int] = ()) -> pl.DataFrame:
    """(group, rank): for each group whose members are not all known, the ranks without a dump that could be
    the missing ones. A group read from who used it (Gloo declares none: `inferred_groups`) lacks the members
    that left no dump and no entry names; where ranks without a dump are in no group of its kind (tp, dp, ...),
    each may be a member of any of its groups shorter than the others (when only one was, they were placed
    there), or of any of them when they are all alike (a host down took a member of each). Such a group's
    ranks are then not all known, and one stuck in it may wait on them. `missing_ranks`: the world's ranks
    without a dump, which may be in no group the dumps name (a whole host down on Gloo: its ranks' groups
    are known only from the other ends, as groups of one). Empty where every group is whole."""
    empty = pl.DataFrame(schema={"group": prog.schema["group"], "rank": pl.Int64})
    if groups is None or "source" not in groups.columns:
        return empty
    kinds = of_a_kind(groups)
    lost = pl.concat([prog.filter(~pl.col("has_dump")).select("rank"),
                      pl.DataFrame({"rank": list(missing_ranks)}, schema={"rank": pl.Int64})]).unique()
    if kinds.height == 0 or lost.height == 0:
        return empty
    held = kinds.select("pg_desc", pl.col("ranks").alias("rank")).explode("rank")
    candidates = lost.join(kinds.select("pg_desc").unique(), how="cross").join(held, on=["pg_desc", "rank"],
                                                                              how="anti")
    # Of a kind whose groups differ in size, the largest are whole: only the shorter ones lack members. Where
    # they are all alike, each lacks members unless the lost ranks could make whole groups of their own (a tp
    # group whose every dump is lost): groups of one member, or lost ranks that don't divide into groups; or
    # ranks spaced evenly (a data-parallel group: 8, 16 of 0, 8, 16) whose next place, before or after, is a
    # lost candidate in every group of the kind: a host down took a member of each (held-out sweep, seed 202:
    # 8 lost ranks also divide into 4 groups of 2, and a link between the live hosts was named).
    known = pl.col("ranks").list.len()
    spare = candidates.group_by("pg_desc").agg(pl.len().alias("_spare"))
    # (and where they differ, the largest lack members too when every group of two or more known ranks extends
    # to a lost one: the host down took a member of each, and a lost bystander one more of one: seed 7, job 274)
    extend_all = (pl.col("_extends").drop_nulls().all() & (pl.col("_extends").drop_nulls().len() >= 2)).over("pg_desc")
    short = (kinds.join(spare, on="pg_desc").join(_extends_to_lost(kinds, candidates), on="group", how="left")
             .filter((known < known.max().over("pg_desc"))
                     | ((known.min().over("pg_desc") == known.max().over("pg_desc"))
                        & ((known == 1) | (pl.col("_spare") % known != 0)
                           | pl.col("_extends").fill_null(False).all().over("pg_desc")))
                     | extend_all))
    pairs = (short.group_by("pg_desc").len().join(spare, on="pg_desc")
             .select((pl.col("len") * pl.col("_spare")).sum()).item()) or 0
    if pairs > MAX_GUESSED_MEMBERS:
        # (thousands of lost ranks spread over thousands of groups: the guess names nobody, and its edges would
        # be millions; the groups then read as the dumps show them)
        return empty
    return (short.select("group", "pg_desc").join(candidates, on="pg_desc")
            .select(pl.col("group").cast(prog.schema["group"]), "rank"))


def _extends_to_lost(kinds: pl.DataFrame, candidates: pl.DataFrame) -> pl.DataFrame:
    """(group, _extends): the group's known ranks are evenly spaced (two or more) and the place one step
    before the first or after the last is a lost candidate of its kind; or, of two known ranks, the place
    halfway between them (dp 3 across three hosts, the middle one down: 0, 16 of 0, 8, 16; sweep seed 7, job
    274, where the dp groups read complete and stuck, and a link between the live hosts was named)."""
    spaced = (kinds.select("group", "pg_desc", pl.col("ranks").list.sort().alias("_r"))
              .filter(pl.col("_r").list.len() >= 2)
              .with_columns(pl.col("_r").list.diff(null_behavior="drop").alias("_d"))
              .filter((pl.col("_d").list.n_unique() == 1) & (pl.col("_d").list.first() > 0))
              .with_columns(pl.col("_d").list.first().alias("_step")))
    halves = spaced.filter((pl.col("_r").list.len() == 2) & (pl.col("_step") % 2 == 0))
    ends = pl.concat([spaced.select("group", "pg_desc", (pl.col("_r").list.first() - pl.col("_step")).alias("rank")),
                      spaced.select("group", "pg_desc", (pl.col("_r").list.last() + pl.col("_step")).alias("rank")),
                      halves.select("group", "pg_desc", (pl.col("_r").list.first() + pl.col("_step") // 2)
                                    .alias("rank"))])
    return (ends.join(candidates, on=["pg_desc", "rank"], how="semi").select("group").unique()
            .with_columns(pl.lit(True).alias("_extends"))
            .join(spaced.select("group"), on="group", how="right").select("group", pl.col("_extends").fill_null(False)))


# Beyond this many (group, lost rank) pairs `_lost_members` guesses nothing (a 16K-rank Gloo job with every
# third rank lost would make 7.5M wait-for edges).
MAX_GUESSED_MEMBERS = 200_000


def wait_edges(m: Matching, entries: pl.DataFrame, groups: pl.DataFrame | None = None,
               missing_ranks: Iterable[int] = ()) -> pl.DataFrame:
    """The wait-for edges (WAIT_EDGES). `groups` (the trace's): groups short of members (inferred, their lost
    members unnamed) are waited in too, on the ranks without a dump (of `missing_ranks`, the world's, and the
    groups' members) that could be their members."""
    prog = m.progress
    known = prog.filter(pl.col("last_enqueued").is_not_null())
    low = known.group_by("group").agg(pl.col("last_enqueued").min().alias("_min"))
    prog_low = known.join(low, on="group").filter(pl.col("_min") < pl.col("frontier"))
    behind_in = prog_low.filter(pl.col("last_enqueued") > pl.col("_min")).select(
        pl.format("r:{}", "rank").alias("src"), pl.format("g:{}", "group").alias("dst"),
        pl.lit("behind").alias("kind"), "group", pl.col("last_enqueued").alias("seq"))
    behind_out = prog_low.filter(pl.col("last_enqueued") == pl.col("_min")).select(
        pl.format("g:{}", "group").alias("src"), pl.format("r:{}", "rank").alias("dst"),
        pl.lit("behind").alias("kind"), "group", (pl.col("last_enqueued") + 1).alias("seq"))

    # Members with no dump: a waiter is a member provably blocked in the group (its op there is unfinished);
    # when its recorder can't say (Gloo), the group holding its last entry is where it stopped, unless it is
    # behind there and its pg_status says all it enqueued there finished: it skipped the collective the others
    # wait in, and is idle, not waiting (it was hidden behind the missing dump). (Gloo counts failed work as
    # finished: at the frontier, a collective that failed because the missing rank died still counts.)
    lost_members = _lost_members(prog, groups, missing_ranks)
    # (not a member whose cut dump shows it enqueued the group's frontier, by an entry kept or its pg_status: it
    # joined all the others can wait in, and a collective it is in with everyone is stuck below them, `locate`)
    absent = prog.filter(~pl.col("has_dump") & ~(pl.col("enqueued_at_least") >= pl.col("frontier")).fill_null(False)
                         ).select("group", "rank")
    has_missing = pl.concat([absent.select("group"), lost_members.select("group")]).unique()
    last = (last_group_per_rank(entries) if has_missing.height
            else pl.DataFrame(schema={"rank": pl.Int64, "_last_group": entries.schema["group"]}))
    # (in a group whose lost members are only guessed, `_lost_members`, a Gloo rank whose pg_status says all
    # it enqueued there finished is not held there: its last op there completed with whoever its members are)
    guessed = (lost_members.select("group").unique()
               .join(prog.filter(~pl.col("has_dump")).select("group"), on="group", how="anti")
               .with_columns(pl.lit(True).alias("_guessed")))
    done = (pl.col("last_completed") >= pl.col("last_enqueued")).fill_null(False)
    blocked = (
        prog.filter(pl.col("has_dump")).join(has_missing, on="group").join(last, on="rank", how="left")
        .join(guessed, on="group", how="left")
        .filter(pl.when(pl.col("tracks_completion")).then(pl.col("pending_seq").is_not_null())
                .otherwise((pl.col("_last_group") == pl.col("group"))
                           & ~(done & ((pl.col("last_enqueued") < pl.col("frontier"))
                                       | pl.col("_guessed").fill_null(False)))))
        .drop("_guessed")
    )
    missing_in = blocked.select(
        pl.format("r:{}", "rank").alias("src"), pl.format("g:{}", "group").alias("dst"),
        pl.lit("missing").alias("kind"), "group",
        # (where it waits: without completion states (Gloo) every entry reads pending, the oldest first)
        pl.when(pl.col("tracks_completion")).then(pl.coalesce("pending_seq", "last_enqueued"))
        .otherwise(pl.col("last_enqueued")).alias("seq"))
    missing_out = (
        pl.concat([absent, lost_members])
        .join(blocked.select("group").unique(), on="group")
        .select(pl.format("g:{}", "group").alias("src"), pl.format("r:{}", "rank").alias("dst"),
                pl.lit("missing").alias("kind"), "group", pl.lit(None, pl.Int64).alias("seq"))
    )

    p2p = m.p2p
    # (a receive from any source no send took waits on whichever member sends: a node of its own, no rank, so
    # the receiver is waiting and not a root, and no member is named for it here: `rootcause` names it)
    recv_waits = p2p.filter((pl.col("status") == "unmatched_recv") & pl.col("recv_pending")).select(
        pl.format("r:{}", "recv_rank").alias("src"),
        pl.coalesce(pl.format("r:{}", "src"), pl.format("{}{}:{}", pl.lit(ANY_SOURCE_NODE), "group", "recv_rank"))
        .alias("dst"),
        pl.lit("p2p").alias("kind"), "group", pl.col("ordinal").alias("seq"))
    send_waits = p2p.filter((pl.col("status") == "unmatched_send") & pl.col("send_pending")).select(
        pl.format("r:{}", "send_rank").alias("src"), pl.format("r:{}", "dst").alias("dst"),
        pl.lit("p2p").alias("kind"), "group", pl.col("ordinal").alias("seq"))

    parts = [behind_in, behind_out, missing_in, missing_out, recv_waits, send_waits, _behind_on_its_gpu(m)]
    return pl.concat([p.cast(WAIT_EDGES) for p in parts]).unique().sort("src", "dst", "group")


def _behind_on_its_gpu(m: Matching) -> pl.DataFrame:
    """A send/recv posted at both ends whose one end is its rank's run-ahead: an older op of that rank is unfinished,
    so its GPU is not at this transfer yet. The other end waits on that rank (on its GPU), not on the link."""
    pairs = m.p2p.filter((pl.col("status") == "in_flight") & pl.col("send_pending") & pl.col("recv_pending"))
    if pairs.height == 0:
        return pl.DataFrame(schema=WAIT_EDGES)
    oldest = oldest_pending(m)
    at = {end: pl.col(f"{end}_rank").replace_strict(oldest["rank"], oldest["_oldest"], default=None)
          for end in ("send", "recv")}
    behind = {end: (at[end] < pl.col(f"{end}_record")).fill_null(False) for end in ("send", "recv")}
    return pl.concat([
        pairs.filter(behind[end] & ~behind[other]).select(
            pl.format("r:{}", f"{other}_rank").alias("src"), pl.format("r:{}", f"{end}_rank").alias("dst"),
            pl.lit("p2p").alias("kind"), "group", pl.col("ordinal").alias("seq"))
        for end, other in (("send", "recv"), ("recv", "send"))]).cast(WAIT_EDGES)


def build_waits(m: Matching, entries: pl.DataFrame, groups: pl.DataFrame | None = None,
                missing_ranks: Iterable[int] = ()) -> Waits:
    return waits_from_edges(wait_edges(m, entries, groups, missing_ranks))


def waits_from_edges(edges: pl.DataFrame) -> Waits:
    """The graph's roots, waiting ranks and cycles, from its edges (WAIT_EDGES)."""
    sources, targets = edges["src"].unique(), edges["dst"].unique()
    rank = pl.col("node").str.starts_with("r:")
    as_ranks = pl.col("node").str.slice(2).cast(pl.Int64)
    waiting = pl.DataFrame({"node": sources}).filter(rank).select(as_ranks)["node"].sort().to_list()
    roots = (pl.DataFrame({"node": targets}).filter(rank & ~pl.col("node").is_in(sources.implode()))
             .select(as_ranks)["node"].sort().to_list())
    return Waits(edges=edges, roots=roots, cycles=_cycles(edges), waiting=waiting)


def _cycles(edges: pl.DataFrame) -> list[tuple[list[int], list[str]]]:
    """Each set of ranks that wait for each other (a strongly connected component with more than one rank),
    with its groups. Only nodes both waited on and waiting can be in a cycle: edges touching any other node are
    dropped until none is left (at 8,192 ranks behind one, all of them: networkx's components took 70 ms, and
    its import as much again); networkx finds the components among what remains."""
    core = edges.select("src", "dst")
    while core.height:
        kept = core.filter(pl.col("src").is_in(core["dst"].implode()) & pl.col("dst").is_in(core["src"].implode()))
        if kept.height == core.height:
            break
        core = kept
    if not core.height:
        return []
    import networkx as nx

    graph = nx.DiGraph()
    graph.add_edges_from(zip(core["src"].to_list(), core["dst"].to_list()))
    cycles = []
    for comp in nx.strongly_connected_components(graph):
        ranks = sorted(int(n[2:]) for n in comp if n.startswith("r:"))
        if len(ranks) > 1:
            groups = sorted(n[2:] for n in comp if not n.startswith("r:"))
            p2p_groups = edges.filter(
                pl.col("src").is_in(list(comp)) & pl.col("dst").is_in(list(comp)) & (pl.col("kind") == "p2p")
            )["group"].unique().to_list()
            cycles.append((ranks, sorted(set(groups) | set(p2p_groups))))
    return sorted(cycles)
