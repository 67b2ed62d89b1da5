"""Who is late only because they wait on someone: the rules that keep a straggler's echoes out of the findings.

A straggler delays everyone who waits on it: its tensor-parallel peers reach their other collectives late, its
pipeline neighbours receive late, and a slow link between two stages delays both pipelines' stages. `timing`
flags ranks and hosts late on most collectives; these rules clear the ones whose lateness another explains.
Each works on the few flagged ranks or hosts and on aggregated edges (who sends to whom), never per entry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from flightrec.analysis.entry_facts import is_p2p_closer
from flightrec.model.schema import WATCHDOG_POLL_MS
from flightrec.model.topology import Topology

if TYPE_CHECKING:
    from flightrec.analysis.timing.options import TimingOptions


def drop_rank_echoes(per_rank: pl.DataFrame, late: pl.DataFrame, threshold: float, opts: TimingOptions,
                      clocks_known: bool = True) -> pl.DataFrame:
    """A straggler is late in every group it is in; a rank that only waits on one is not. Waiting spreads the
    delay: the straggler's tensor-parallel peers wait for it, then reach their data-parallel collectives late;
    pipeline neighbours receive late, and so on (a 150 ms straggler made eleven other ranks 20-840 ms late in a
    4 x 4 x 8 job). But in the group it shares with the straggler, a waiting rank arrives on time: its peers
    were delayed as much. So a flagged rank stays a straggler only if its median lateness is over half the
    threshold in each of its groups where it has `min_collectives` collectives that another member recorded
    too (alone in a collective, a rank whose peers left no dump is 0 ms late against itself).

    Without `clocks_known` (no completion times, as with Gloo) lateness across hosts is clock
    offset too: a host whose clock runs ahead makes the straggler look on time in its cross-host groups, and
    its own ranks look late. Then a rank with such groups on its own host is judged on those only."""
    flagged = per_rank.filter(pl.col("straggler")).select("rank")
    if flagged.height == 0:
        return per_rank
    key = ["group", "collective_seq_id"]
    theirs = late.join(flagged, on="rank", how="semi")
    shared = (late.join(theirs.select(key).unique(), on=key, how="semi").group_by(key).len()
              .filter(pl.col("len") >= 2).select(key))
    by_group = (theirs.join(shared, on=key, how="semi").group_by("rank", "group")
                .agg(pl.len().alias("_n"), pl.col("late_ms").median().alias("_med"),
                     (~pl.col("cross").any() | clocks_known).alias("_clock_safe"))
                .filter(pl.col("_n") >= opts.min_collectives))
    judged = by_group.filter(pl.col("_clock_safe").any().over("rank").not_() | pl.col("_clock_safe"))
    verdict = judged.group_by("rank").agg((pl.col("_med") > threshold / 2).all().alias("_everywhere"))
    return (per_rank.join(verdict, on="rank", how="left")
            .with_columns(pl.col("straggler") & pl.col("_everywhere").fill_null(True)).drop("_everywhere"))


def _sends_and_receives(entries: pl.DataFrame) -> pl.DataFrame:
    """(rank, peer): who sends to or receives from whom."""
    return (entries.lazy().filter(pl.col("is_p2p") & pl.col("peer").is_not_null())
            .select("rank", "peer").unique().collect())


def _with_hosts(pairs: pl.LazyFrame, topo: Topology) -> pl.LazyFrame:
    """`pairs` (rank, peer, ...) with `host` and `peer_host`, between different hosts only."""
    hosts = topo.frame().lazy()
    return (pairs.join(hosts, on="rank").join(hosts.rename({"rank": "peer", "host": "peer_host"}), on="peer")
            .filter(pl.col("host") != pl.col("peer_host")))


# Pipeline neighbours that are this close to the latest can't be told from it: both are kept.
_TIE = 0.95


def _latest_per_pipeline(lateness: dict, edges) -> dict:
    """Of the late nodes (ranks or hosts: median lateness), the latest in each set joined by point-to-point
    traffic, directly or through nodes that are not late (the first and last stages of a pipeline wait on a
    slow middle or end stage), with any within `_TIE` of it (a slow host holding two stages can be as late as
    the stage before it). Late nodes with no traffic path between them are each kept; a second, independent
    straggler on a path from the first is not named (when hosts hold ranks of several pipelines, paths can
    join the whole job: then only the latest host is named). Returns each kept node's ties."""
    import networkx as nx  # (~70 ms to import: only where timing finds late nodes)

    graph = nx.Graph()
    graph.add_nodes_from(lateness)
    graph.add_edges_from((a, b) for a, b in edges if a != b)
    keep = {}
    for component in nx.connected_components(graph):
        late = component & lateness.keys()
        if late:
            latest = max(lateness[n] for n in late)
            tied = sorted(n for n in late if lateness[n] >= _TIE * latest)
            keep.update({n: [t for t in tied if t != n] for n in tied})
    return keep


def drop_pipeline_echoes(per_rank: pl.DataFrame, per_host: pl.DataFrame, entries: pl.DataFrame | None,
                          topo: Topology) -> tuple[pl.DataFrame, pl.DataFrame]:
    """A pipeline stage waits on the stage before it (forward) and after it (backward): a straggler makes its
    whole pipeline late. Of late ranks, and of late hosts, joined by sends and receives only the latest is a
    straggler (a slow stage made the other three hosts of its replica 620-1,100 ms late against 1,390 ms; with
    one rank per stage, tensor parallelism can't tell a waiting rank on time beside the straggler). Who talks
    to whom is read from the `entries`' sends and receives, only when two or more ranks or hosts are late.
    Adds `tied_with` to both frames: the kept neighbours as late as each one."""
    per_rank = per_rank.with_columns(pl.lit([], pl.List(pl.Int64)).alias("tied_with"))
    per_host = per_host.with_columns(pl.lit([], pl.List(pl.String)).alias("tied_with"))
    if entries is None or (per_rank["straggler"].sum() < 2 and per_host["straggler"].sum() < 2):
        return per_rank, per_host
    links = _sends_and_receives(entries)
    if per_rank["straggler"].sum() >= 2:
        late = dict(per_rank.filter(pl.col("straggler")).select("rank", "median_late_ms").iter_rows())
        per_rank = _mark_kept(per_rank, "rank", _latest_per_pipeline(late, links.iter_rows()), pl.Int64)
    # (with a rank-level straggler, late hosts are its echo and are cleared anyway: not worth the graph)
    if per_host["straggler"].sum() >= 2 and not per_rank["straggler"].any():
        edges = _with_hosts(links.lazy(), topo).select("host", "peer_host").unique().collect()
        late = dict(per_host.filter(pl.col("straggler")).select("host", "median_late_ms").iter_rows())
        per_host = _mark_kept(per_host, "host", _latest_per_pipeline(late, edges.iter_rows()), pl.String)
    return per_rank, per_host


def _mark_kept(frame: pl.DataFrame, key: str, kept: dict, dtype: pl.DataType) -> pl.DataFrame:
    """`straggler` only for the kept keys (ranks: Int64, hosts: as text), with their ties in `tied_with`."""
    ties = pl.DataFrame({"_key": list(kept), "_ties": list(kept.values())},
                        schema={"_key": dtype, "_ties": pl.List(dtype)})
    return (frame.with_columns(pl.col(key).cast(dtype).alias("_key")).join(ties, on="_key", how="left")
            .with_columns((pl.col("straggler") & pl.col("_ties").is_not_null()).alias("straggler"),
                          pl.col("_ties").fill_null(pl.lit([], pl.List(dtype))).alias("tied_with"))
            .drop("_key", "_ties"))


def p2p_link_speeds(entries: pl.DataFrame, topo: Topology) -> pl.DataFrame:
    """Per pair of hosts that exchange sends and receives, per end (`host` -> `peer_host`): the median time
    from a rank creating a send/receive batch to the batch completing. An end that waits for a late peer is
    slow too, but only the waiting end: a slow link is slow at both ends. Needs completion times (NCCL)."""
    # A batch that also talks to another host counts toward both pairs (interleaved schedules send forward and
    # receive backward in one batch): its slow end is only one end, so the both-ends rule still holds.
    key = ("rank", "group", "p2p_seq_id")
    rows = (entries.lazy()
            .select(*key, "is_p2p", "peer", "time_created_ns", "time_completed_ns",
                    is_p2p_closer().alias("_closer"))   # (a batch's state and times are its closer's)
            # (without a p2p_seq_id, older recorders, a rank's batches can't be told apart: not timed)
            .filter((pl.col("is_p2p") | pl.col("_closer")) & pl.col("p2p_seq_id").is_not_null())
            # A batch's entries are recorded one after another (entries are in rank, record order): a batch is a
            # run of rows with one key. Its times are reduced over the run by position: a hashed group_by over
            # 860K batches cost 0.5 s at 16K ranks, which the straggler and slow-link checks paid each time.
            .with_columns(pl.any_horizontal(pl.col(c).to_physical() != pl.col(c).to_physical().shift(1) for c in key)
                          .fill_null(True).alias("_starts"))
            .select("rank", "peer", "time_created_ns", "time_completed_ns", "_starts")
            .collect())
    is_start = rows["_starts"].to_numpy()
    starts = np.flatnonzero(is_start)
    if len(starts) == 0:
        host = topo.frame().schema["host"]
        return pl.DataFrame(schema={"host": host, "peer_host": host, "ms": pl.Float64, "n": pl.UInt32})
    big, small = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    created = np.minimum.reduceat(rows["time_created_ns"].fill_null(big).to_numpy(), starts)
    done = np.maximum.reduceat(rows["time_completed_ns"].fill_null(small).to_numpy(), starts)
    batch = np.cumsum(is_start) - 1
    timed = (created != big) & (done != small)
    batches = pl.DataFrame({"_b": np.arange(len(starts))[timed], "rank": rows["rank"].to_numpy()[starts][timed],
                            "ms": (done[timed] - created[timed]) / 1e6})
    peers = (pl.DataFrame({"_b": batch, "peer": rows["peer"]}).lazy().filter(pl.col("peer").is_not_null())
             .unique())
    pairs = batches.lazy().join(peers, on="_b").select("rank", "peer", "ms")
    return (_with_hosts(pairs, topo).group_by("host", "peer_host")
            .agg(pl.col("ms").median(), pl.len().alias("n")).collect())


_SLOW_PAIRS = {"a": pl.String, "b": pl.String, "a_ms": pl.Float64, "b_ms": pl.Float64, "baseline_ms": pl.Float64}


def slow_p2p_links(speeds: pl.DataFrame, opts: TimingOptions) -> pl.DataFrame:
    """Host pairs slow at both ends: each end's median `slow_factor` x the lower quartile of every end's
    median and `min_slow_ms` above it (the quartile, so a few slow pairs don't drag the baseline up), and a
    watchdog poll above it: the times are completion times, stamped at the watchdog's next 100 ms poll, and
    with the poll's phase pinned by regular steps an end can read ~90 ms slow for no reason (a false link
    beside a slow host in 2 of 50 random jobs, ends 93 and 449 ms over a 77 ms baseline)."""
    empty = pl.DataFrame(schema=_SLOW_PAIRS)
    ends = speeds.filter(pl.col("n") >= opts.min_collectives).select(
        pl.col("host").cast(pl.String).alias("a"), pl.col("peer_host").cast(pl.String).alias("b"), "ms")
    if ends.height < 4:   # two pairs at least, both ends each: else there is no baseline
        return empty
    baseline = ends["ms"].quantile(0.25, "lower")
    slow = ((pl.col("a_ms") >= opts.slow_factor * baseline) & (pl.col("b_ms") >= opts.slow_factor * baseline)
            & (pl.min_horizontal("a_ms", "b_ms") - baseline >= max(opts.min_slow_ms, WATCHDOG_POLL_MS)))
    return (ends.rename({"ms": "a_ms"})
            .join(ends.select(pl.col("b").alias("a"), pl.col("a").alias("b"), pl.col("ms").alias("b_ms")),
                  on=["a", "b"])
            .filter((pl.col("a") < pl.col("b")) & slow)
            .with_columns(pl.lit(baseline, pl.Float64).alias("baseline_ms"))
            .select(empty.columns).sort("a", "b"))


def waiting_on_links(per_host: pl.DataFrame, speeds: pl.DataFrame, slow: pl.DataFrame, threshold: float) -> list[str]:
    """The hosts that wait on a slow point-to-point link, so whose lateness (or their ranks') is the link's
    echo: its ends, and the hosts joined to them by sends and receives through hosts that are late too (median
    over half the threshold: the stages before and after the link wait on it), unless later than the link's
    latest end (by more than `_TIE`): a host that waits on the link is no later than the link makes its ends.
    A late host joined to the link only through on-time hosts (another pipeline, when hosts hold stages of
    several) is not waiting on it."""
    ends = set(slow["a"].to_list()) | set(slow["b"].to_list())
    late_ms = dict(per_host.select(pl.col("host").cast(pl.String), "median_late_ms").iter_rows())
    nodes = ends | {h for h, ms in late_ms.items() if ms is not None and ms > threshold / 2}
    import networkx as nx

    graph = nx.Graph()
    graph.add_nodes_from(nodes)
    graph.add_edges_from((a, b) for a, b in speeds.select(pl.col("host", "peer_host").cast(pl.String)).iter_rows()
                         if a in nodes and b in nodes)
    waiting = set()
    for component in nx.connected_components(graph):
        if component & ends:
            latest_end = max((late_ms.get(h) or 0.0) for h in component & ends)
            waiting |= {h for h in component if (late_ms.get(h) or 0.0) * _TIE <= latest_end}
    return sorted(waiting)


def drop_link_echoes(frame: pl.DataFrame, waiting: list[str]) -> pl.DataFrame:
    """`frame` (per_rank or per_host) with no straggler on a host that waits on a slow link (`waiting_on_links`):
    the ranks at a slow link's ends arrive late at their next collectives, beside on-time peers."""
    return frame.with_columns(pl.col("straggler") & ~pl.col("host").cast(pl.String).is_in(waiting).fill_null(False))


def drop_p2p_link_echoes(per_rank: pl.DataFrame, per_host: pl.DataFrame, entries: pl.DataFrame, groups: pl.DataFrame,
                         topo: Topology, threshold: float,
                         opts: TimingOptions) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Stragglers that only wait on a slow point-to-point link, cleared; returns (per_rank, per_host, the slow
    host pairs). With late hosts: the hosts waiting on a slow pair (`waiting_on_links`) and their ranks. With
    only late ranks: the two ends of a slow link between pipeline stages are late (they wait on it), but so are
    two ranks that both wait on a straggler (its tensor-parallel peer and that peer's pipeline neighbour): their
    pair is slow at both ends too. So a pair counts only with a flagged rank at both ends, and clears only the
    flagged ranks at its ends. A pair with an end behind a host still named (`behind_stragglers`) is its echo."""
    speeds = p2p_link_speeds(entries, topo)
    slow = slow_p2p_links(speeds, opts)
    if per_host["straggler"].any():
        if slow.height:
            waiting = waiting_on_links(per_host, speeds, slow, threshold)
            per_host, per_rank = drop_link_echoes(per_host, waiting), drop_link_echoes(per_rank, waiting)
            behind = behind_stragglers(per_host, groups, topo)
            slow = slow.filter(~pl.col("a").is_in(behind) & ~pl.col("b").is_in(behind))
        return per_rank, per_host, slow
    flagged_hosts = per_rank.filter(pl.col("straggler"))["host"].cast(pl.String).drop_nulls().to_list()
    slow = slow.filter(pl.col("a").is_in(flagged_hosts) & pl.col("b").is_in(flagged_hosts))
    if slow.height:
        per_rank = drop_link_echoes(per_rank, sorted(set(slow["a"]) | set(slow["b"])))
    return per_rank, per_host, slow


def late_p2p_links(per_rank: pl.DataFrame, entries: pl.DataFrame, topo: Topology, threshold: float,
                   opts: TimingOptions) -> pl.DataFrame:
    """With no straggler named: the host pairs whose sends and receives are slow at both ends, where each end
    holds a rank late on its collectives (median over the threshold). The ends of a slow link between two
    pipeline stages wait on it, so their next collectives start late; when no other group spans both hosts
    (tp within a host, dp across replicas of the same stage) the sends and receives are the only place the
    link shows. Both ends must be late: a pair of hosts that is only slow to talk (a stage that waits on its
    own compute) delays nobody, and is not named."""
    late = per_rank.filter((pl.col("median_late_ms") > threshold) & (pl.col("n") >= opts.min_collectives))
    hosts = late["host"].cast(pl.String).drop_nulls().unique().to_list()
    if len(hosts) < 2:   # (a link has two ends: without two late hosts the sends and receives are not read)
        return pl.DataFrame(schema=_SLOW_PAIRS)
    slow = slow_p2p_links(p2p_link_speeds(entries, topo), opts)
    return slow.filter(pl.col("a").is_in(hosts) & pl.col("b").is_in(hosts))


def behind_stragglers(per_host: pl.DataFrame, groups: pl.DataFrame, topo: Topology) -> list[str]:
    """The hosts named stragglers, and the hosts sharing a collective group with one (the world group aside).
    A GPU runs its stream in order: a rank's send waits for the collective before it, which waits for the
    straggler, and its receiving peer waits for the send, so the pair reads slow at both ends like a slow link
    (a false link beside a slow host in 1 of 50 random jobs, both ends 115-145 ms over the baseline)."""
    named = set(per_host.filter(pl.col("straggler"))["host"].cast(pl.String).to_list())
    if not named:
        return []
    world = int(groups["size"].max() or 0)
    members = (groups.filter(pl.col("size") < world).select("group", pl.col("ranks").alias("rank")).explode("rank")
               .join(topo.frame().select("rank", pl.col("host").cast(pl.String)), on="rank"))
    shared = members.filter(pl.col("host").is_in(named))["group"].unique()
    return sorted(named | set(members.filter(pl.col("group").is_in(shared.implode()))["host"].to_list()))


def hosts_of_stragglers(per_rank: pl.DataFrame, per_host: pl.DataFrame, topo: Topology) -> pl.DataFrame:
    """A host all of whose ranks (two or more) are stragglers is a straggler host: when hosts are smaller than
    tensor-parallel groups, a slow host's ranks are each late beside on-time peers."""
    flagged = per_rank.filter(pl.col("straggler")).select("rank", pl.lit(True).alias("_flagged"))
    slow = (topo.frame().join(flagged, on="rank", how="left")
            .group_by("host").agg(pl.len().alias("_n"), pl.col("_flagged").fill_null(False).all().alias("_all"))
            .filter((pl.col("_n") > 1) & pl.col("_all")))
    slow_names = slow["host"].cast(pl.String).implode()
    return per_host.with_columns(pl.col("straggler") | pl.col("host").cast(pl.String).is_in(slow_names))
