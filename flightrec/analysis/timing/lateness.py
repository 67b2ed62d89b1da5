"""How late each member joined each collective, on one clock: every host's clock offset, estimated from
completion times (a collective ends at the same instant on every member: the spread of its discovered
completion times is clock offset plus polling jitter), taken out of the enqueue times."""

from __future__ import annotations

import polars as pl

from flightrec.model import dense_index as lookup
from flightrec.model.schema import P2P_OPS, WATCHDOG_POLL_MS

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
