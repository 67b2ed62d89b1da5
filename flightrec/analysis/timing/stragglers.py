"""Stragglers and slow links, from the recorder's timestamps. Vectorized over matched collectives.

Lateness: for each collective every member recorded, a member's lateness is its enqueue time minus the
earliest member's. Hosts' clocks disagree, so first each host's clock offset is estimated from completion
times (a collective ends at the same instant on every member: the spread of its discovered completion times
is clock offset plus polling jitter) and removed. A straggler is a rank late on most of its collectives, by
a margin far outside the spread of its peers. Without completion times (Gloo) offsets can't be separated from
lateness (so a rank is judged within its host where it can be); on one host there is nothing to separate.

Slow collectives: a group whose collectives take much longer than the same op with the same shapes in its
peer groups (same desc) is slow; the hosts (pairs) common to every slow group and to no fast one are the
suspects, as in `locate`.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import combinations
from typing import Callable

import polars as pl

from flightrec.analysis.matching import Matching
from flightrec.analysis.timing import clock_offsets as unfelt
from flightrec.analysis.timing import waiting_not_late as echoes
from flightrec.analysis.timing.clock_offsets import Suspect
from flightrec.model import dense_index as lookup
from flightrec.model.schema import P2P_OPS, WATCHDOG_POLL_MS
from flightrec.model.topology import NO_HOSTS_HINT, Topology


@dataclass(frozen=True, kw_only=True)
class TimingOptions:
    """Thresholds. A straggler must be late by at least `min_late_ms` and by `spread_factor` times the robust
    spread of everyone's lateness (or of the punctual members', when smaller), on at least `min_late_fraction`
    of its collectives (`min_collectives`+)."""

    min_late_ms: float = 20.0
    spread_factor: float = 5.0
    min_late_fraction: float = 0.6
    min_collectives: int = 5
    slow_factor: float = 2.0
    min_slow_ms: float = 5.0
    window: int = 32   # judge each group on its last `window` collectives: the state of the job now
    # a member that joins a stuck collective this fraction of its timeout after the others caused the timeout
    late_timeout_fraction: float = 0.9


@dataclass(frozen=True)
class TimingResult:
    """Frames behind the timing findings (see `per_rank`, `per_host`, `lateness`)."""

    lateness: pl.DataFrame          # (group, collective_seq_id, rank, cross, timeout_ms, late_ms): one row per
                                    # member per collective of the window (hosts: join per_rank)
    per_rank: pl.DataFrame          # rank, host, n, median_late_ms, late_fraction, straggler, tied_with, echo, groups
    per_host: pl.DataFrame          # host, ranks, median_late_ms, straggler, threshold_ms, tied_with, echo,
                                    # clock_offset_ms
    # tied_with: pipeline neighbours named as stragglers too, as late as this one: one of them is the cause
    # echo: late enough to be named, but not, as it only waits on one that is (or on a slow link)
    clock_offsets: pl.DataFrame     # host, clock_offset_ms (removed before computing lateness)
    slow_groups: pl.DataFrame       # group, op, median_ms, peer_median_ms, ratio
    slow_hosts: list[str]
    slow_links: list[list[str]]
    threshold_ms: float
    # host pairs whose sends and receives are slow at both ends (checked when hosts are late, or ranks: then
    # only pairs with a late rank at both ends): a, b, a_ms, b_ms, baseline_ms
    slow_p2p_links: pl.DataFrame | None = None
    # every host's clock offset was estimated (completion times): else a rank is judged within its host
    clocks_known: bool = True
    # without them, ranks and hosts late on most collectives whose peers never waited for them
    # (`unfelt.Suspect("rank", 5)` or ("host", "node3") -> median ms late): their clock runs ahead; not stragglers
    clock_ahead: dict[Suspect, float] = field(default_factory=dict)
    # what tells them: "next entries" (peers went on at once: `unfelt.unfelt`, no completion times) or
    # "completions" (they complete as late: `unfelt.completed_late`, no host placement)
    clock_ahead_by: str = "next entries"


_P2P_OPS = [*P2P_OPS, "coalesced"]   # (coalesced: the entry that closes a batch_isend_irecv)


def clock_offsets(units: pl.DataFrame, n_hosts: int, tolerance_ms: float = 1.0, max_rounds: int = 40,
                  significance: float = 3.0) -> pl.Series:
    """Per host (by the window's dense host index `_h`), how far its clock is ahead, from completion times (a
    collective ends at one instant on every member). Solved by rounds of: offset += the host's typical
    deviation (below) from the collective's corrected median, until no host moves by `tolerance_ms`. In a
    collective of two hosts the median is their midpoint: a host that meets several others in pairs moves part
    of the way each round, and a fixed two rounds left 312 ms of a 5 s offset, enough to name the host a
    straggler. Where collectives span many hosts the median ignores the odd one out and one or two rounds do.
    Only differences between hosts matter: centred on zero. Null for hosts without a completed cross-host
    collective. `units` are the windowed units of `analyze_timing`.

    The recorder's completion times are the NCCL watchdog's: it polls every 100 ms, so each is up to 100 ms
    late, by an amount that depends on the rank's polling phase. With a few dozen of them a host's estimate is
    off by several ms, and taking their median instead of their mean by up to 50: as much as the lateness that
    makes a straggler. An offset within `significance` standard errors of zero, or under half a poll, is not
    told from that noise and is 0: a synchronised clock is the likelier answer (NTP keeps them within a few
    ms). In practice the half poll decides: the standard error is larger only for a host with three or fewer
    collectives. A clock up to ~50-60 ms off (or estimated under 50) is then kept, and can read as a late
    host."""
    # (not sends and receives, batched or not: a send can complete before its receive, every time, and the
    # rounds would turn that into offsets growing along the pipeline)
    done = (units.lazy().filter(pl.col("cross") & pl.col("time_completed_ns").is_not_null() & pl.col("_h").is_not_null()
                                & ~pl.col("op").is_in(_P2P_OPS))
            .select("_slot", "_h", (pl.col("time_completed_ns") / 1e6).alias("_ms")).collect(engine="streaming"))
    offsets = pl.Series("clock_offset_ms", [0.0] * n_hosts, dtype=pl.Float64)
    if done.height == 0:
        return offsets.clear(n_hosts)
    for i in range(max(1, max_rounds)):
        # offsets are read per row by position (the dense host index), not joined: the window is long
        ms = pl.col("_ms") if i == 0 else pl.col("_ms") - pl.lit(offsets).gather(pl.col("_h"))
        # Far off, the median step. Within a polling period, the mean of the deviations near the median: two
        # ranks' watchdog lags differ by a fixed phase d or by d - 100 ms, whichever side of a poll the
        # collective ends, so the median is off by up to 50 ms while the mean is not; further out is not lag.
        # (Computed as flat columns, then simple per-host aggregations: a filter inside the aggregation runs
        # host by host, 2.5x slower.)
        dev = (done.lazy().with_columns(ms.alias("_c"))
               .with_columns((pl.col("_c") - pl.col("_c").median().over("_slot")).alias("_d"))
               .with_columns(pl.col("_d").median().over("_h").alias("_median"))
               .with_columns(pl.when((pl.col("_d") - pl.col("_median")).abs() <= WATCHDOG_POLL_MS)
                             .then(pl.col("_d")).alias("_near"))
               .collect())
        step = (dev.lazy().group_by("_h").agg(pl.col("_median").first(), pl.col("_near").mean())
                .select("_h", pl.when(pl.col("_median").abs() > WATCHDOG_POLL_MS).then(pl.col("_median"))
                        .otherwise(pl.col("_near").fill_null(pl.col("_median"))).alias("_step")).collect())
        offsets = offsets.scatter(step["_h"], offsets.gather(step["_h"]) + step["_step"])
        # (No early stop on a small first round: where a host holds most of its groups' ranks, the medians
        # follow it and the first round barely moves anything, yet the rounds add up to hundreds of ms.)
        if (step["_step"].abs().max() or 0.0) < tolerance_ms:
            break
    # The estimate's standard error: at least the lag's own (uniform over a poll: 100 / sqrt(12) ms) over the
    # host's collectives, for a handful of deviations can agree by chance, its ranks' phases being fixed.
    error = dev.lazy().group_by("_h").agg(pl.max_horizontal(
        pl.col("_near").std().fill_null(0.0) / pl.col("_near").count().sqrt(),
        WATCHDOG_POLL_MS / 12 ** 0.5 / pl.col("_slot").n_unique().sqrt()).alias("_se")).collect()
    # (a host's own offset, not a midpoint: between two hosts the whole difference is the one to test)
    centre = offsets.gather(error["_h"]).quantile(0.5, "lower") or 0.0
    centred = offsets.gather(error["_h"]) - centre
    # (and at least half a poll: with steps of a regular length the lags repeat step after step, so the
    # deviations are fewer independent draws than they look, and a pair of hosts' phases bias them by up to 50)
    significant = (centred.abs() > significance * error["_se"]) & (centred.abs() > WATCHDOG_POLL_MS / 2)
    return (pl.Series("clock_offset_ms", [None] * n_hosts, dtype=pl.Float64)
            .scatter(error["_h"], centred.zip_with(significant, pl.Series([0.0] * len(centred)))))


def lateness(units: pl.DataFrame, offsets: pl.Series | None) -> pl.DataFrame:
    """Each member's lateness (ms) against the first member of the collective, clock offsets (per dense host
    index, from `clock_offsets`; None: none) removed. Hosts by their dense index `_h` and collectives by their
    dense `_slot`, as in `units` (`came_last` reads who came last from them)."""
    # (with no offset, the usual case, the enqueue times are read as they are: no new column)
    t = (units["time_created_ns"] if not shifts(offsets) else units.select(
        (pl.col("time_created_ns") - (pl.lit(offsets.fill_null(0.0)).gather(pl.col("_h")).fill_null(0.0) * 1e6)
         .cast(pl.Int64)).alias("time_created_ns")).to_series())
    # per collective (dense slot) the first arrival, in a small table
    # (`reduce_by_position` aligns the columns' chunks itself: one reduction left, nothing to align once for it)
    first = lookup.reduce_by_position(t, units["_slot"], int(units["_slot"].max() or 0) + 1, "min")
    # (the filter copies every column it keeps: only when some enqueue time is unknown, which is rare)
    known = units.lazy().with_columns(t.alias("_t"))
    return ((known.filter(pl.col("_t").is_not_null()) if t.null_count() else known)
            .select("group", "collective_seq_id", "rank", "_h", "cross", "timeout_ms", "_slot",
                    ((pl.col("_t") - pl.lit(first).gather(pl.col("_slot"))) / 1e6).alias("late_ms"))
            .collect(engine="streaming"))


def shifts(offsets: pl.Series | None) -> bool:
    """Some host's clock offset is not zero (so `lateness` removes them)."""
    return offsets is not None and bool(offsets.fill_null(0.0).abs().max() or 0.0)


def came_last(late: pl.LazyFrame) -> pl.LazyFrame:
    """`late` (from `lateness`) with `last_to_arrive`: the member came after every other member of its
    collective (the rest were not all at once), and `last_host_to_arrive`: it is on the host of such a member
    (the collective spans hosts). Only where the straggler threshold needs them: hashing by collective costs
    more than the lateness itself."""
    latest = pl.col("late_ms").max().over("_slot")
    is_last = (pl.col("late_ms") == latest) & (latest > 0)
    # (members of one host share it; of two hosts' members last at the same nanosecond, the higher index)
    last_host = pl.when(is_last & pl.col("cross")).then(pl.col("_h").cast(pl.Int64) + 1).max().over("_slot")
    mine = pl.col("_h").cast(pl.Int64) + 1
    return late.with_columns(is_last.alias("last_to_arrive"),
                             (last_host == mine).fill_null(False).alias("last_host_to_arrive"))


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


def findings(result: TimingResult, groups: pl.DataFrame, topo: Topology) -> list:
    """Straggler and slow-link findings (role warning)."""
    from flightrec.ingest.load import format_ranks
    from flightrec.report.model import Finding

    out = []
    host_stragglers = result.per_host.filter(pl.col("straggler"))
    covered: set[int] = set()
    for host, ranks, med, bar, tied, offset in host_stragglers.select(
            "host", "ranks", "median_late_ms", "threshold_ms", "tied_with", "clock_offset_ms").iter_rows():
        covered |= set(ranks)
        out.append(Finding(
            kind="straggler", role="warning", ranks=list(ranks), hosts=[host],
            message=(f"host {host} is a straggler: its {len(ranks)} ranks ({format_ranks(ranks)}) enqueue their "
                     f"collectives {med:,.0f} ms after their peers (median){_clock_text(offset)}{_tie_text(tied)}"),
            evidence={"median_late_ms": round(med, 3), "threshold_ms": round(bar, 3),
                      "clock_offset_ms": None if offset is None else round(offset, 3),
                      **({"tied_with": tied} if tied else {})},
        ))
    flagged = result.per_rank.filter(pl.col("straggler") & ~pl.col("rank").is_in(list(covered)))
    # (the rule only matters, and is only said, where there are hosts to tell apart)
    clocks_unknown = not result.clocks_known and result.per_host.height > 1
    # (only where a rank is flagged: the medians by kind of group read the whole lateness, ~25 ms at 16K ranks)
    by_kind = _lateness_by_group_kind(result.lateness, flagged["rank"], groups) if flagged.height else {}
    desc = dict(groups.select("group", pl.col("pg_desc").fill_null("")).iter_rows()) if flagged.height else {}
    for row in flagged.iter_rows(named=True):
        descs = sorted({desc.get(g, "") for g in row["groups"]} - {""})
        where = f" in {', '.join(descs)} groups" if descs else ""
        host = f" (host {row['host']})" if row["host"] else ""
        kinds = by_kind.get(row["rank"], {})
        # (waits add up along a step: a rank 150 ms late on each op is 450 ms late in a group it reaches after
        # three of them; its least late kind of group is its own delay)
        split = (f"; by group: {', '.join(f'{k} {v:,.0f}' for k, v in sorted(kinds.items(), key=lambda kv: kv[1]))} ms"
                 if len(kinds) > 1 else "")
        if split and clocks_unknown:
            split += "; judged within its host: no completion times to align the hosts' clocks"
        out.append(Finding(
            kind="straggler", role="warning", ranks=[row["rank"]], hosts=[row["host"]] if row["host"] else [],
            message=(f"rank {row['rank']}{host} is a straggler: it enqueues its collectives "
                     f"{row['median_late_ms']:,.0f} ms after the first of its peers (median{split}), late on "
                     f"{row['late_fraction']:.0%} of {row['n']} collectives{where}{_tie_text(row['tied_with'])}"),
            evidence={"median_late_ms": round(row["median_late_ms"], 3),
                      "late_fraction": round(row["late_fraction"], 3),
                      "collectives": row["n"], "threshold_ms": round(result.threshold_ms, 3),
                      **({"median_late_ms_by_group": {k: round(v, 3) for k, v in sorted(kinds.items())}}
                         if len(kinds) > 1 else {}),
                      **({"tied_with": row["tied_with"]} if row["tied_with"] else {})},
        ))
    if result.clock_ahead_by == "completions" and result.clock_ahead:
        out.append(_clock_from_completions(result))
    for label, ms in sorted(result.clock_ahead.items() if result.clock_ahead_by == "next entries" else []):
        what, name = label
        ranks = [name] if what == "rank" else sorted(result.per_host.filter(pl.col("host") == name)["ranks"][0])
        out.append(Finding(
            kind="clock_offset", role="warning", ranks=ranks, hosts=[] if what == "rank" else [name],
            message=(f"{label} reads {ms:,.0f} ms late on its collectives (median), yet none of its peers waits for it "
                     "(their next entry comes as soon as ever): not a straggler, the clocks disagree (its host's runs "
                     "ahead, or its peers' run behind). These dumps have no completion times to align clocks by"),
            evidence={"median_late_ms": round(ms, 3), "threshold_ms": round(result.threshold_ms, 3)},
        ))
    if result.slow_groups.height:
        slow = result.slow_groups
        what = (f"collectives in {slow['group'].n_unique()} group(s) take {slow['ratio'].median():.1f}x longer "
                f"than the same ops in their peer groups (median {slow['median_ms'].median():,.1f} ms vs "
                f"{slow['peer_median_ms'].median():,.1f} ms)")
        if result.slow_links:
            a, b = result.slow_links[0]
            message = f"slow link {a} <-> {b}: {what}; every slow group spans both hosts, no fast one does"
        elif result.slow_hosts:
            message = f"slow host {result.slow_hosts[0]}: {what}; it is in every slow group and in no fast one"
        else:
            message = f"{what}; not narrowed to one host or link"
        out.append(Finding(
            kind="slow_link", role="warning", hosts=result.slow_hosts, links=result.slow_links, message=message,
            evidence={"slow_groups": slow["group"].to_list()[:50], "ratio": round(slow["ratio"].median(), 2)},
        ))
    if result.slow_p2p_links is not None and result.slow_p2p_links.height:
        out += _p2p_findings(result)
    return out


def _clock_from_completions(result: TimingResult):
    """One `clock_offset` warning for every rank `unfelt.completed_late` cleared (no host placement: one host's
    clock off makes each of its ranks, or each of everyone else's, read late alike)."""
    from flightrec.ingest.load import format_ranks
    from flightrec.report.model import Finding

    by_rank = {suspect.name: ms for suspect, ms in result.clock_ahead.items()}
    ranks = sorted(by_rank)
    ms = sorted(by_rank.values())[(len(by_rank) - 1) // 2]
    one = len(ranks) == 1
    who, reads, its, verdict, runs = (("rank", "reads", "its", "not a straggler", "its runs") if one else
                                      ("ranks", "read", "their", "not stragglers", "theirs run"))
    return Finding(
        kind="clock_offset", role="warning", ranks=ranks,
        message=(f"{who} {format_ranks(ranks)} {reads} {ms:,.0f} ms late on {its} collectives (median), and {its} "
                 f"completions read as late, though a collective ends at one instant on every member: {verdict}, the "
                 f"clocks disagree ({runs} ahead, or the first members' run behind). With no host placement known, "
                 "no clock offset was estimated to remove"),
        evidence={"median_late_ms": round(ms, 3), "threshold_ms": round(result.threshold_ms, 3),
                  **({"median_late_ms_by_rank": {r: round(v, 3) for r, v in sorted(by_rank.items())}}
                     if not one else {})},
    )


def _lateness_by_group_kind(lateness: pl.DataFrame, ranks: pl.Series, groups: pl.DataFrame) -> dict[int, dict]:
    """For the few `ranks`: their median lateness (ms) per kind of group (pg_desc), {rank: {desc: ms}}."""
    per = (lateness.join(pl.DataFrame({"rank": ranks}), on="rank", how="semi")
           .join(groups.select("group", pl.col("pg_desc").cast(pl.String)), on="group", how="left")
           .filter(pl.col("pg_desc").is_not_null() & (pl.col("pg_desc") != ""))
           .group_by("rank", "pg_desc").agg(pl.col("late_ms").median()))
    out: dict[int, dict] = {}
    for rank, kind, ms in per.iter_rows():
        out.setdefault(rank, {})[kind] = ms
    return out


def _p2p_findings(result: TimingResult) -> list:
    """A host at the end of two or more slow pairs is the slow one (its NIC, its GPU): one finding for it. The
    other pairs are links. Hosts and links the collective groups already named are not repeated."""
    from flightrec.report.model import Finding

    pairs = result.slow_p2p_links
    ends = pl.concat([pairs.select(pl.col("a").alias("host"), pl.col("b").alias("other"), pl.col("a_ms").alias("ms")),
                      pairs.select(pl.col("b").alias("host"), pl.col("a").alias("other"), pl.col("b_ms").alias("ms"))])
    per_host = (ends.group_by("host").agg(pl.col("other").sort(), pl.col("ms").median())
                .filter(pl.col("other").list.len() > 1))
    slow_hosts = set(per_host["host"].to_list())
    known_hosts = set(result.slow_hosts)
    known_links = {tuple(sorted(link)) for link in result.slow_links}
    base = pairs["baseline_ms"][0]
    out = []
    for host, others, ms in per_host.sort("host").iter_rows():
        if host not in known_hosts:
            out.append(Finding(
                kind="slow_link", role="warning", hosts=[host], links=[],
                message=(f"slow host {host}: its sends and receives with {', '.join(others)} are slow at both ends "
                         f"({ms:,.0f} ms median at its end, {base:,.1f} ms between other hosts); the ranks waiting on "
                         "it are late, not slow"),
                evidence={"slow_with": others, "median_ms": round(ms, 3), "baseline_ms": round(base, 3)},
            ))
    for a, b, a_ms, b_ms, base in pairs.iter_rows():
        if {a, b} & (slow_hosts | known_hosts) or (a, b) in known_links:
            continue   # (a slow host is slow with every peer: its pairs are not links)
        out.append(Finding(
            kind="slow_link", role="warning", hosts=[], links=[[a, b]],
            message=(f"slow link {a} <-> {b}: sends and receives between them take {a_ms:,.0f} / {b_ms:,.0f} ms "
                     f"(median, at each end) against {base:,.1f} ms between other hosts; the ranks waiting on it "
                     "are late, not slow"),
            evidence={"median_ms": [round(a_ms, 3), round(b_ms, 3)], "baseline_ms": round(base, 3)},
        ))
    return out


def _clock_text(offset: float | None) -> str:
    """What is known of the host's clock: a late host and a host whose clock runs ahead look alike."""
    if offset is None:
        return ("; its clock offset can't be told apart (no completion times in these dumps, as with Gloo or no "
                "cross-host collective): a clock running ahead reads the same")
    if offset == 0:
        return (f"; its clock agrees with the other hosts' within the watchdog's {WATCHDOG_POLL_MS:.0f} ms polling "
                "noise (a clock off by less than about half of that can still read as late)")
    return f", after removing its clock offset of {offset:+,.0f} ms"


def _tie_text(tied: list) -> str:
    if not tied:
        return ""
    return (f"; as late as its pipeline neighbour{'s' if len(tied) > 1 else ''} {', '.join(map(str, tied))} "
            "(named too): the data can't tell which one the others wait on")


def lateness_dict(result: TimingResult, top: int = 20, late_joins: list | None = None) -> dict:
    """What `lateness_table` shows, as data (`flightrec timing --format json`)."""
    return {
        "threshold_ms": result.threshold_ms,
        "joined_past_timeout": [
            {"rank": r, "group": f.process_group.name if f.process_group else None,
             "pg_desc": f.process_group.desc if f.process_group else None, "seq": f.collective_seq_id,
             "late_ms": f.evidence.get("late_ms"), "timeout_ms": f.evidence.get("timeout_ms")}
            for f in late_joins or [] for r in f.ranks],
        "ranks": result.per_rank.sort("median_late_ms", descending=True).head(top)
        .select("rank", "host", "n", "median_late_ms", "late_fraction", "straggler",
                pl.col("echo").alias("only_waits")),
        "hosts": result.per_host.sort("median_late_ms", descending=True).head(top)
        .select("host", "ranks", "median_late_ms", "threshold_ms", "clock_offset_ms", "straggler",
                pl.col("echo").alias("only_waits")),
        "clock_ahead_ms": [{"what": s.kind, "name": s.name, "median_late_ms": ms}
                           for s, ms in sorted(result.clock_ahead.items())],
        "slow_groups": result.slow_groups,
        "slow_p2p_links": result.slow_p2p_links if result.slow_p2p_links is not None else [],
    }


def lateness_table(result: TimingResult, top: int = 20, late_joins: list | None = None) -> str:
    """Text for `flightrec timing`: the latest ranks, the hosts, clock offsets, slow groups and host pairs; and
    `late_joins` (the root-cause findings of members that joined a collective past its timeout) first."""
    from flightrec.report.tables import text_table

    parts = [f"Lateness threshold: {result.threshold_ms:,.1f} ms (median + 5 x spread of all ranks' lateness, or of "
             "the punctual ones' when smaller; at least the minimum; hosts: see their own, against the other hosts)",
             ""]
    if late_joins:
        # (late once, past the timeout: why the job stopped, where the medians below can look on time)
        rows = [{"rank": r, "group": f.process_group.label() if f.process_group else "", "seq": f.collective_seq_id,
                 "late_ms": f.evidence.get("late_ms"), "timeout_ms": f.evidence.get("timeout_ms")}
                for f in late_joins for r in f.ranks]
        parts += ["Joined a collective past its timeout (the others timed out waiting; `analyze` names it):",
                  text_table(pl.DataFrame(rows)), ""]
    parts.append("Ranks, latest first:")
    ranks = (result.per_rank.sort("median_late_ms", descending=True).head(top)
             .select("rank", "host", "n", pl.col("median_late_ms").round(2), pl.col("late_fraction").round(2),
                     "straggler", pl.col("echo").alias("only_waits")))
    parts.append(text_table(ranks))
    if result.per_host.height:
        hosts = (result.per_host.sort("median_late_ms", descending=True).head(top)
                 .select("host", pl.col("ranks").list.len().alias("n_ranks"), pl.col("median_late_ms").round(2),
                         pl.col("threshold_ms").round(2), pl.col("clock_offset_ms").round(2), "straggler",
                         pl.col("echo").alias("only_waits")))
        parts += ["", "Hosts:", text_table(hosts)]
    elif result.per_rank["host"].null_count() == result.per_rank.height and result.per_rank.height > 1:
        parts += ["", f"Hosts: {NO_HOSTS_HINT}"]
    if result.per_rank["echo"].any() or result.per_host["echo"].any():
        parts += ["", "only_waits: late enough to be named, but it only waits on a straggler (a pipeline neighbour, "
                  "the straggler's peers, a slow link): not named"]
    if result.clock_ahead:
        parts += ["", "Late by their clock only (nobody waited on them; no completion times to align clocks): "
                  + ", ".join(f"{label} ({ms:,.0f} ms)" for label, ms in sorted(result.clock_ahead.items()))]
    if result.slow_groups.height:
        parts += ["", "Slow groups:", text_table(result.slow_groups.with_columns(pl.col(pl.Float64).round(2)))]
    if result.slow_p2p_links is not None and result.slow_p2p_links.height:
        parts += ["", "Host pairs whose sends and receives are slow at both ends (ms, median at each end):",
                  text_table(result.slow_p2p_links.with_columns(pl.col(pl.Float64).round(2)))]
    return "\n".join(parts)
