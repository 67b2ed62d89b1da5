"""Stragglers and slow links, from the recorder's timestamps. Vectorized over matched collectives.

Lateness (`lateness`): for each collective every member recorded, a member's lateness is its enqueue time
minus the earliest member's, hosts' clock offsets taken out. A straggler is a rank late on most of its
collectives, by a margin far outside the spread of its peers. Without completion times (Gloo) offsets can't be
separated from lateness (so a rank is judged within its host where it can be); on one host there is nothing
to separate.

Slow collectives: a group whose collectives take much longer than the same op with the same shapes in its
peer groups (same desc) is slow; the hosts (pairs) common to every slow group and to no fast one are the
suspects, as in `localize`."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from itertools import combinations

import polars as pl

from flightrec.analysis.matching import Matching
from flightrec.analysis.timing import clock_offsets as unfelt
from flightrec.analysis.timing import waiting_not_late as echoes
from flightrec.analysis.timing.clock_offsets import Suspect
from flightrec.analysis.timing.lateness import came_last, clock_offsets, lateness, shifts
from flightrec.analysis.timing.options import TimingOptions, TimingResult
from flightrec.model import dense_index as lookup
from flightrec.model.schema import WATCHDOG_POLL_MS
from flightrec.model.topology import Topology


def stragglers(late: pl.DataFrame, host_ids: pl.DataFrame, opts: TimingOptions,
               skewed: bool = False) -> tuple[pl.DataFrame, pl.DataFrame, float]:
    """Per rank and per host lateness, with a significance threshold from everyone's spread, or the punctual
    members' when smaller. `late` (from `lateness`) names hosts by the dense index `_h` of `host_ids` (_h,
    host). `skewed`: a clock offset was removed; the estimate is only good to the watchdog's noise, so every
    rank must be late by half a poll more (a host 500 ms off, estimated 479, is not 21 ms late; estimated 522,
    its partners in collectives would be 22 ms late)."""
    threshold = _threshold(late["late_ms"], opts)
    arrivals = None
    if threshold > opts.min_late_ms:
        arrivals = came_last(late.lazy().select("_slot", "_h", "cross", "late_ms")).collect()
        # The spread decides, and the late ones' own rows widen it: in a job of a few ranks a straggler and the
        # pipeline neighbours that wait on it are a third of all rows, and none stands out. Without each
        # collective's latest arrival the spread is the punctual members' (on time, they wait together). (Of
        # two members that leaves the first's zeros: the threshold is then the minimum, and the late-fraction
        # rule keeps symmetric noise out: no straggler in 320 random healthy, offset or slow-link jobs.)
        punctual = arrivals.lazy().filter(~pl.col("last_to_arrive")).select("late_ms").collect()
        if punctual.height:
            threshold = min(threshold, _threshold(punctual["late_ms"], opts))
    # A late host is judged against the other hosts: without the last host of each collective. Of a few hosts,
    # one that holds a whole pipeline stays behind by a second or more (waits pile up across the microbatches),
    # and its other ranks, still in the punctual rows above, widen that spread past its own lateness.
    host_threshold = threshold
    if threshold > opts.min_late_ms and arrivals is not None:
        others = (arrivals.lazy().filter(pl.col("cross") & ~pl.col("last_host_to_arrive"))
                  .select("late_ms").collect())
        if others.height:
            host_threshold = min(threshold, _threshold(others["late_ms"], opts))
    margin = WATCHDOG_POLL_MS / 2 if skewed else 0.0
    bar = threshold + margin
    # (`_window` flags rank and host index sorted where they are: then per-rank and per-host groups are slices,
    # not hashed, 3x faster; the flags survive filters and selects)
    host = pl.lit(host_ids["host"]).gather(pl.col("_h")).alias("host")   # (_h is host_ids' row index)
    # (lazy, over the columns read: 2.5 ms of 9 at 850K rows)
    ranks = (
        late.lazy().select("rank", "_h", "late_ms", "cross").group_by("rank").agg(
            pl.col("_h").first(),
            pl.len().alias("n"),
            pl.col("late_ms").median().alias("median_late_ms"),
            (pl.col("late_ms") > threshold / 2).mean().alias("late_fraction"),
            pl.col("cross").any().alias("_cross"),
        )
        .with_columns(((pl.col("median_late_ms") > bar) & (pl.col("late_fraction") >= opts.min_late_fraction)
                       & (pl.col("n") >= opts.min_collectives)).alias("straggler"))
        .sort("rank")
        .collect()
    )
    per_rank = ranks.select("rank", host, pl.exclude("rank", "_h", "_cross"))
    # A whole host that is late is late against other hosts: judge it on cross-host collectives only. (Its ranks
    # in them are read from the per-rank table: a rank's host is one, and a list per host from 850K rows is 3 ms.)
    ranks_of_host = (ranks.lazy().filter(pl.col("_cross") & pl.col("_h").is_not_null())
                     .group_by("_h").agg(pl.col("rank").sort().alias("ranks")))
    per_host = (
        late.lazy().select("_h", "late_ms", "cross").filter(pl.col("cross") & pl.col("_h").is_not_null())
        .group_by("_h").agg(
            pl.len().alias("n"),
            pl.col("late_ms").median().alias("median_late_ms"),
            (pl.col("late_ms") > host_threshold / 2).mean().alias("late_fraction"),
        )
        .join(ranks_of_host, on="_h")
        .with_columns(((pl.col("median_late_ms") > host_threshold + margin)
                       & (pl.col("late_fraction") >= opts.min_late_fraction)
                       & (pl.col("n") >= opts.min_collectives) & (pl.col("ranks").list.len() > 1)).alias("straggler"),
                      pl.lit(host_threshold).alias("threshold_ms"))
        .select(host, "ranks", "median_late_ms", "straggler", "threshold_ms")
        .sort("host")
        .collect()
    )
    return per_rank, per_host, threshold


def _threshold(late_ms: pl.Series, opts: TimingOptions) -> float:
    """Lateness significant against `late_ms`' robust spread (median + `spread_factor` x MAD as a sigma), and
    at least `min_late_ms`."""
    scale = opts.spread_factor * 1.4826
    # Lateness is never negative. When more than half of it is at most v = floor / (1 + scale), so is the
    # median, and so is the spread (a deviation past v needs a value past v): median + scale x spread is then
    # at most the floor. One count, not two medians (usually the case: most members are on time).
    known = late_ms.len() - late_ms.null_count()
    v = opts.min_late_ms / (1 + scale)
    if known and v >= 0 and 2 * (late_ms > v).sum() < known and (late_ms.min() or 0.0) >= 0:
        return opts.min_late_ms
    med = late_ms.median() or 0.0
    # Usually the floor decides: the spread is below `bound` when fewer than half the deviations reach it (then
    # the middle ones don't). A count is a quarter of the cost of a second median over 850K rows.
    bound = (opts.min_late_ms - med) / scale if scale > 0 else 0.0
    deviation = (late_ms - med).abs()
    if bound > 0 and 2 * (deviation >= bound).sum() < deviation.len() - deviation.null_count():
        return opts.min_late_ms
    mad = deviation.median() or 0.0
    return max(opts.min_late_ms, med + scale * mad)


def group_speeds(units: pl.DataFrame, groups: pl.DataFrame, opts: TimingOptions,
                 block_groups: pl.Series) -> pl.DataFrame:
    """Per group and op: median time, the peers' baseline, and `slow` when `slow_factor` x longer than the same
    op and shapes in peer groups. Groups without peers are not judged. `block_groups`: the group (or its
    categorical's id) of each block of `opts.window` slots (`_window`): a collective's is its slot's block's."""
    # The collective's own time (waiting is not slowness): its shortest member's, the last to arrive, which
    # waited for no one. With NCCL timing on, `duration_ms` (GPU events around the kernel). Without, from
    # enqueue to completion on the member's own clock (no offsets to remove), as its watchdog saw it, up to a
    # poll late and pinned by the poll's phase when steps are regular: then a group must be slower than its
    # peers by a whole poll as well, or that noise reads as slow groups.
    timed = units["duration_ms"].null_count() < units.height
    own_time = (units["duration_ms"] if timed else units.select(
        ((pl.col("time_completed_ns") - pl.col("time_created_ns")) / 1e6).alias("duration_ms")).to_series())
    min_slow_ms = opts.min_slow_ms if timed else max(opts.min_slow_ms, WATCHDOG_POLL_MS)
    # Per collective (dense slot), read by position, not hashed: its op and shapes (one member's: they agree
    # where it matched) and its shortest member's time. (numpy over the columns' buffers: about half the CPU of
    # a group_by on 850K rows, which matters as this runs beside the clock offsets, `analyze_timing`.) Its group
    # is its block's: no pass over the rows.
    slot = units["_slot"]
    size = int(slot.max()) + 1 if slot.len() else 0   # (no units: no block either)
    block = pl.int_range(0, size, dtype=pl.UInt32, eager=True) // opts.window
    # (op and shapes from one member per slot: one scatter of row numbers, then two small gathers. A member
    # without shapes must not stand for members with them: where some are null, the non-null ones are scattered.)
    row = lookup.row_by_position(slot, size)
    shapes = units["input_sizes"]
    per_inst = pl.DataFrame([block_groups.to_physical().gather(block).alias("_g"),
                             units["op"].to_physical().gather(row).alias("_op"),
                             (shapes.to_physical().gather(row) if not shapes.null_count()
                              else lookup.any_by_position(shapes, slot, size)).alias("_shape"),
                             lookup.reduce_by_position(own_time, slot, size, "min").cast(pl.Float64).alias("ms")]
                            ).filter(pl.col("ms").is_not_null())
    if per_inst.height == 0:
        return pl.DataFrame(schema={"group": pl.Categorical(), "op": pl.String, "median_ms": pl.Float64,
                                    "peer_median_ms": pl.Float64, "ratio": pl.Float64, "slow": pl.Boolean})
    # (a group's name and desc are one: joined to the medians by id, not hashed with the key)
    per_group = (per_inst.group_by("_g", "_op", "_shape").agg(pl.col("ms").median().alias("median_ms"))
                 .join(groups.select(pl.col("group").to_physical().alias("_g"), "group", "pg_desc"), on="_g",
                       how="left"))
    per_group = per_group.with_columns(
        # baseline: the lower quartile of peer groups, so a slow half doesn't drag the baseline up with it
        pl.col("median_ms").quantile(0.25, "lower").over("pg_desc", "_op", "_shape").alias("peer_median_ms"),
        pl.len().over("pg_desc", "_op", "_shape").alias("_peers"))
    return (per_group.filter(pl.col("_peers") >= 2)
            .with_columns((pl.col("median_ms") / pl.col("peer_median_ms")).alias("ratio"))
            .with_columns(((pl.col("ratio") >= opts.slow_factor)
                           & (pl.col("median_ms") - pl.col("peer_median_ms") >= min_slow_ms)).alias("slow"))
            .select("group", pl.lit(pl.Series(units.schema["op"].categories)).gather(pl.col("_op")).alias("op"),
                    "median_ms", "peer_median_ms", "ratio", "slow")
            .sort("group", "op"))


def _localize(speeds: pl.DataFrame, units: pl.DataFrame, host_ids: pl.DataFrame,
              topo: Topology) -> tuple[list[str], list[list[str]]]:
    """Group testing: slow groups are positives, judged groups that are not slow are negatives."""
    if not speeds["slow"].any() or not topo.host_of:
        return [], []
    host_sets = (units.select("group", "_h").drop_nulls().unique()
                 .group_by("group").agg(pl.lit(host_ids["host"]).gather(pl.col("_h")).alias("host")))
    slow_set = set(speeds.filter(pl.col("slow"))["group"].to_list())
    judged = set(speeds["group"].to_list())
    slow_hosts = [set(h) for g, h in host_sets.iter_rows() if g in slow_set]
    fast_hosts = [set(h) for g, h in host_sets.iter_rows() if g in judged - slow_set and len(h) > 1]
    common = sorted(set.intersection(*slow_hosts)) if slow_hosts else []
    links = [[a, b] for a, b in combinations(common, 2) if not any(a in s and b in s for s in fast_hosts)]
    if len(links) == 1:
        return [], links
    singles = [h for h in common if not any(h in s for s in fast_hosts)]
    return (singles, []) if len(singles) == 1 else ([], [])


def late_joiners(late: pl.DataFrame, stuck: pl.DataFrame, opts: TimingOptions) -> pl.DataFrame:
    """Members that joined a stuck collective so late that the others' timeout fired while they waited.

    `late`: `TimingResult.lateness` (clock offsets already removed). `stuck`: (group, collective_seq_id) of
    collectives every member enqueued and none finished (they are at their group's frontier, so inside the
    timing window). A member is a late joiner when it enqueued at least `late_timeout_fraction` of the
    collective's timeout after the first member and every other member arrived within a quarter of that: one
    rank was late, the rest were on time. Holds with NCCL timing on or off and on Gloo: it reads enqueue times.
    Returns (group, collective_seq_id, rank, late_ms, next_late_ms, timeout_ms), one row per late joiner."""
    ranked = (late.join(stuck, on=["group", "collective_seq_id"], how="semi")
              .sort("late_ms", descending=True).group_by("group", "collective_seq_id", maintain_order=True)
              .agg(pl.col("rank").first(), pl.col("late_ms").first(),
                   pl.col("late_ms").get(1, null_on_oob=True).alias("next_late_ms"), pl.col("timeout_ms").max(),
                   pl.len().alias("_n")))
    return ranked.filter(
        (pl.col("_n") >= 2) & (pl.col("timeout_ms") > 0)
        & (pl.col("late_ms") >= pl.col("timeout_ms") * opts.late_timeout_fraction)
        & (pl.col("late_ms") >= opts.min_late_ms)
        & (pl.col("next_late_ms").fill_null(0.0) <= pl.col("late_ms") / 4)
    ).drop("_n")


def _window(m: Matching, groups: pl.DataFrame, hosts: pl.DataFrame,
            opts: TimingOptions) -> tuple[pl.DataFrame, pl.DataFrame, pl.Series]:
    """What timing reads, of each multi-member group's last `window` collectives below its frontier (the
    furthest any member got: from the small progress table, not from the units), in the units' (rank, record)
    order. Each row also gets the dense host index `_h`, `cross` (its group spans hosts) and `_slot`
    (a dense position per collective, below `window` x the number of groups: each collective's first arrival
    is reduced into a small table by position, no hashing). Per-group and per-rank values are read by position
    (group id, rank) from small dense tables, not joined: a join over the 1.5M units at 16K ranks costs 2.5x as
    much; tables sized to every key in the units are read without range checks (4x cheaper). Host names are
    left out (a categorical read costs as much again): returns the dense host index (_h, host) to name them,
    and the group (the id of its categorical) of each block of `window` slots: block j holds slots j x window
    to (j + 1) x window - 1."""
    units = m.units
    host_ids = hosts.select("host").unique(maintain_order=True).with_row_index("_h")
    # (the units' bounds in one pass over them)
    rank_nulls, rank_min, rank_max, group_nulls, group_max = units.select(
        pl.col("rank").null_count().alias("a"), pl.col("rank").min().alias("b"), pl.col("rank").max().alias("c"),
        pl.col("group").null_count().alias("d"), pl.col("group").to_physical().max().alias("e")).row(0)
    checked = rank_nulls == 0 and (rank_min or 0) >= 0
    by_rank = lookup.by_position(hosts.join(host_ids, on="host", maintain_order="left").select("rank", "_h"),
                                 int(max(hosts["rank"].max() or 0, rank_max or 0)) + 1)
    # Per group with two or more members, in one pass over the member table (`m.progress`, a row per member):
    # its frontier, and whether it spans hosts (its members' host indexes differ)
    gid = pl.col("group").to_physical()
    top = (m.progress.lazy().select(gid.alias("_g"), "frontier",
                                    lookup.read(by_rank, "_h", pl.col("rank")).alias("_h"))
           .group_by("_g").agg(pl.col("frontier").max().alias("_top"),
                               (pl.col("_h").max() != pl.col("_h").min()).fill_null(False).alias("cross"))
           .join(groups.lazy().filter(pl.col("size") >= 2).select(gid.alias("_g")), on="_g", how="semi")
           # each group's window is `window` slots from _base down: slot = _base - seq
           .with_row_index("_j")
           .with_columns((pl.col("_j").cast(pl.Int64) * opts.window + pl.col("_top")).alias("_base"))
           .select("_g", "_top", "cross", "_base")
           .collect())
    checked &= group_nulls == 0
    # Units are in rank order (`match.collective_units`), and so is the window: flagged, per-rank groups
    # downstream are slices. Where hosts hold runs of ranks (every rank placed, host indexes rising with rank:
    # read from the small table) the host index is sorted too.
    host_index = lookup.read(by_rank, "_h", pl.col("rank"), in_range=checked)
    if by_rank["_h"].null_count() == 0 and by_rank["_h"].is_sorted():
        host_index = host_index.set_sorted()
    by_group = lookup.by_position(top, int(max(top["_g"].max() or 0, group_max or 0)) + 1)
    top_seq = lookup.read(by_group, "_top", gid, in_range=checked)
    return (units.lazy()
            .select("group", "collective_seq_id", pl.col("rank").set_sorted(), "op", "input_sizes", "time_created_ns",
                    "time_completed_ns", "timeout_ms", "duration_ms")
            .filter(pl.col("collective_seq_id").is_between(top_seq - opts.window, top_seq, closed="right"))
            .with_columns(lookup.read(by_group, "cross", gid, in_range=checked).alias("cross"),
                          host_index.alias("_h"),
                          (lookup.read(by_group, "_base", gid, in_range=checked)
                           - pl.col("collective_seq_id")).cast(pl.UInt32).alias("_slot"))
            .collect(engine="streaming")), host_ids, top["_g"]


def analyze_timing(m: Matching, groups: pl.DataFrame, topo: Topology, opts: TimingOptions | None = None,
                   entries: pl.DataFrame | None = None) -> TimingResult:
    """Lateness, stragglers, clock offsets and slow groups from the matched collectives `m`. `entries` (the
    trace's): their sends and receives tell a late rank or host from the pipeline neighbours that wait on it;
    without them, every late one is reported."""
    opts = opts or TimingOptions()
    units, host_ids, block_groups = _window(m, groups, topo.frame(), opts)
    # While the clock offsets are estimated, a second thread works out what needs none: first the lateness as
    # enqueued (the lateness, when no host's clock is off: the usual case), then the slow groups. Polars releases
    # the GIL while it works and keeps both cores busy in only part of what follows (~1.5 of 2 at 16K ranks).
    with ThreadPoolExecutor(max_workers=1) as pool:
        as_enqueued = pool.submit(lateness, units, None)
        slow = pool.submit(_slow_groups, units, groups, host_ids, block_groups, topo, opts)
        return _analyze_window(units, host_ids, groups, topo, opts, entries, as_enqueued.result, slow.result)


def _slow_groups(units: pl.DataFrame, groups: pl.DataFrame, host_ids: pl.DataFrame, block_groups: pl.Series,
                 topo: Topology, opts: TimingOptions) -> tuple[pl.DataFrame, list[str], list[list[str]]]:
    speeds = group_speeds(units, groups, opts, block_groups)
    return speeds, *_localize(speeds, units, host_ids, topo)


def _analyze_window(units: pl.DataFrame, host_ids: pl.DataFrame, groups: pl.DataFrame, topo: Topology,
                    opts: TimingOptions, entries: pl.DataFrame | None, as_enqueued: Callable[[], pl.DataFrame],
                    slow_groups: Callable[[], tuple[pl.DataFrame, list[str], list[list[str]]]]) -> TimingResult:
    """`analyze_timing` past the window, but for two parts worked out on another thread: `as_enqueued` returns
    the lateness with no clock offset removed, `slow_groups` the slow groups, each when done."""
    by_host = clock_offsets(units, host_ids.height)
    offsets = (host_ids.with_columns(by_host.gather(host_ids["_h"]).alias("clock_offset_ms"))
               .filter(pl.col("clock_offset_ms").is_not_null()).select("host", "clock_offset_ms").sort("host"))
    shifted = shifts(by_host)
    late = lateness(units, by_host) if shifted else as_enqueued()
    per_rank, per_host, threshold = stragglers(late, host_ids, opts, skewed=shifted)
    clocks_known = offsets.height == host_ids.height
    ahead: dict[Suspect, float] = {}
    clock_evidence = "next entries"
    no_completions = units["time_completed_ns"].null_count() == units.height
    if (no_completions or host_ids.height == 0) and (per_rank["straggler"].any() or per_host["straggler"].any()):
        # Clocks that can't be aligned make a rank or host late by its clock alone. With no completion times at
        # all (Gloo, whose collectives also hold their callers until done) nobody waited on it (`unfelt`). With
        # no host known (a flat folder of dumps) offsets, estimated per host, were not removed, and its
        # completion times read as late as its enqueues (`unfelt.completed_late`).
        suspects = {**{Suspect("rank", r): [r] for r in per_rank.filter(pl.col("straggler"))["rank"].to_list()},
                    **{Suspect("host", h): list(rs) for h, rs in per_host.filter(pl.col("straggler"))
                       .select("host", "ranks").iter_rows()}}
        if no_completions:
            ahead = unfelt.unfelt(suspects, units.select("rank", "group", "collective_seq_id", "time_created_ns"),
                                  late, threshold)
        else:
            clock_evidence = "completions"
            ahead = unfelt.completed_late(suspects, units.select("group", "collective_seq_id", "rank",
                                                                  "time_created_ns", "time_completed_ns"),
                                          late, threshold)
        cleared_ranks = [s.name for s in ahead if s.kind == "rank"]
        cleared_hosts = [s.name for s in ahead if s.kind == "host"]
        per_rank = per_rank.with_columns(pl.col("straggler") & ~pl.col("rank").is_in(cleared_ranks))
        per_host = per_host.with_columns(pl.col("straggler") & ~pl.col("host").is_in(cleared_hosts))
    flagged = (per_rank.select("rank", pl.col("straggler").alias("_flagged")),
               per_host.select("host", pl.col("straggler").alias("_flagged")))
    late = late.clone()
    late.drop_in_place("_h")
    late.drop_in_place("_slot")   # (in place: `drop` goes through a lazy plan, 3 ms at 850K rows in 49 chunks)
    per_rank = echoes.drop_rank_echoes(per_rank, late, threshold, opts, clocks_known=clocks_known)
    per_rank, per_host = echoes.drop_pipeline_echoes(per_rank, per_host, entries, topo)
    # A straggling rank delays every rank that waits on it, and whole hosts of those then arrive late at
    # cross-host collectives: with a rank-level straggler, late hosts are its echo, not stragglers.
    if per_rank["straggler"].any():
        per_host = echoes.hosts_of_stragglers(per_rank, per_host.with_columns(pl.lit(False).alias("straggler")), topo)
        # (hosts are now named from their ranks' lateness: the ranks' threshold is the one they passed)
        per_host = per_host.with_columns(pl.lit(threshold).alias("threshold_ms"))
    slow_p2p = None
    if entries is not None and (per_host["straggler"].any() or per_rank["straggler"].any()):
        per_rank, per_host, slow_p2p = echoes.drop_p2p_link_echoes(per_rank, per_host, entries, groups, topo, threshold,
                                                                      opts)
    elif entries is not None and (per_rank["median_late_ms"] > threshold).any():
        # (no straggler: ranks late on most collectives may be the ends of a slow link between pipeline stages)
        slow_p2p = echoes.late_p2p_links(per_rank, entries, topo, threshold, opts)
    per_rank, per_host = (frame.join(first, on=key, how="left")
                          .with_columns((pl.col("_flagged") & ~pl.col("straggler")).fill_null(False).alias("echo"))
                          .drop("_flagged")
                          for frame, first, key in zip((per_rank, per_host), flagged, ("rank", "host")))
    per_host = per_host.join(offsets, on="host", how="left")
    # where each straggler was late: only for the few flagged ranks
    where = (late.lazy().select("rank", "group").join(per_rank.lazy().filter(pl.col("straggler")).select("rank"),
                                                       on="rank", how="semi")
             .group_by("rank").agg(pl.col("group").unique().sort().alias("groups")).collect())
    per_rank = per_rank.join(where, on="rank", how="left").with_columns(pl.col("groups").fill_null([]))
    speeds, slow_hosts, slow_links = slow_groups()
    return TimingResult(lateness=late, per_rank=per_rank, per_host=per_host, clock_offsets=offsets,
                        slow_groups=speeds.filter(pl.col("slow")).drop("slow"), slow_hosts=slow_hosts,
                        slow_links=slow_links, threshold_ms=threshold, slow_p2p_links=slow_p2p,
                        clocks_known=clocks_known, clock_ahead=ahead, clock_ahead_by=clock_evidence)
