"""When each dump was written, and how long the collectives still in flight had waited then: a hang, or a
snapshot of a running job.

Dumps are written on a timeout (the watchdog's, once a collective waited its `timeout_ms`), or on demand from a
running job (the debug pipe, the HTTP endpoint, periodic dumps). Both show collectives in flight on every
member; only how long they had waited tells them apart. Each dump's moment is bounded, on its rank's own clock:

- from below by the newest stamp it holds (it was written after); with NCCL timing on, an op in flight is
  marked `started` when the dump itself finds it started, so that stamp is the moment of the dump;
- from above by the file's modification time (a file is written at the dump or copied later, never before;
  one older than its own newest stamp was touched or its clock is off, and is not read).

A collective whose wait, from below, reached its timeout is proof of a hang; so is the watchdog's own signature:
files written just as the op in flight longest reached its timeout (its wait, from above, within 30 s past it;
a copy made later lands there only by chance). Ops whose waits, from above, were all under their timeouts are proof
of a running job (a dump read where it was written). Anything else the dumps can't tell; the user can
(`trigger`).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

TRIGGERS = ("auto", "timeout", "on-demand")
# Clocks of the host that wrote a file and of its file system may disagree by this much
CLOCK_SLACK_NS = 10**9
# The watchdog writes its dumps within this long of the first op's timeout (its poll, the dump itself, the other
# ranks told to dump through the store)
WATCHDOG_WRITES_WITHIN_MS = 30_000

DUMP_MOMENTS = pl.Schema({
    "rank": pl.Int64,
    "after_ns": pl.Int64,     # the dump was written at or after this (its newest stamp, or its started-at-dump one)
    "before_ns": pl.Int64,    # and at or before this (its file's modification time), where that can be read
    "at_dump": pl.Boolean,    # `after_ns` is the moment of the dump itself (a stamp the dump made)
})


def dump_moments(dumps: pl.DataFrame, entries: pl.DataFrame) -> pl.DataFrame:
    """(DUMP_MOMENTS) for every loaded dump that holds a stamp."""
    stamps = (entries.lazy()
              .group_by("rank")
              .agg(pl.max_horizontal(pl.col("time_created_ns").max(), pl.col("time_started_ns").max(),
                                     pl.col("time_completed_ns").max()).alias("after_ns"),
                   # (an op still in flight that the dump found started: stamped at the dump)
                   pl.col("time_started_ns").filter(pl.col("state") == "started").max().alias("_at"))
              .collect())
    mtime = dumps.select("rank", (pl.col("mtime_ns") if "mtime_ns" in dumps.columns
                                  else pl.lit(None, pl.Int64)).alias("_mtime"))
    return (stamps.join(mtime, on="rank", how="left")
            .filter(pl.col("after_ns").is_not_null())
            .select("rank", "after_ns",
                    pl.when(pl.col("_mtime") >= pl.col("after_ns") - CLOCK_SLACK_NS).then("_mtime").alias("before_ns"),
                    (pl.col("_at").is_not_null() & (pl.col("_at") >= pl.col("after_ns"))).alias("at_dump"))
            .cast(DUMP_MOMENTS).sort("rank"))


@dataclass(frozen=True)
class Waited:
    """How long the ops in flight had waited when the dumps were written.

    Attributes:
        reading: "hung" (some op had waited its timeout, or the user says the dumps were written on a timeout),
            "running" (every op in flight had waited less than its timeout, or the user says the dumps were taken
            on demand), "unknown" (the dumps can't say), or "idle" (nothing was in flight).
        longest_ms: the longest wait seen, at least (from each dump's newest stamp); None with nothing in flight.
        timeout_ms: that op's timeout.
        trigger: what the user said ("auto": nothing).
    """

    reading: str
    longest_ms: float | None
    timeout_ms: int | None
    trigger: str

    def describe(self) -> str:
        """How long the newest collectives had waited, as a person reads it ('for at least 12 ms of its 10 min
        timeout')."""
        if self.longest_ms is None:
            return "nothing was in flight"
        timeout = f" of its {_duration(self.timeout_ms)} timeout" if self.timeout_ms else ""
        return f"in flight for at least {_duration(self.longest_ms)}{timeout}"


def _duration(ms: float | None) -> str:
    if ms is None:
        return "?"
    if ms < 1000:
        return f"{ms:,.0f} ms"
    if ms < 120_000:
        return f"{ms / 1e3:,.1f} s"
    return f"{ms / 60e3:,.0f} min"


def waited(pending: pl.DataFrame, moments: pl.DataFrame, trigger: str = "auto") -> Waited:
    """How long the ops in flight had waited. `pending`: (rank, time_created_ns, timeout_ms) of every unfinished
    op; `moments`: `dump_moments`; `trigger`: what the user says wrote the dumps (TRIGGERS)."""
    if trigger not in TRIGGERS:
        raise ValueError(f"trigger must be one of {', '.join(TRIGGERS)}, not {trigger!r}")
    ages = (pending.lazy().join(moments.lazy(), on="rank", how="left")
            .select(((pl.col("after_ns") - pl.col("time_created_ns")) / 1e6).alias("_least"),
                    ((pl.col("before_ns") - pl.col("time_created_ns")) / 1e6).alias("_most"),
                    pl.col("at_dump"), pl.col("timeout_ms").cast(pl.Int64))
            .collect())
    if ages.height == 0:
        reading = {"timeout": "hung", "on-demand": "running"}.get(trigger, "idle")
        return Waited(reading, None, None, trigger)
    known = ages.filter(pl.col("_least").is_not_null())
    longest = known.sort("_least", descending=True).row(0, named=True) if known.height else None
    # (the watchdog's signature: the op in flight longest had waited, by the files' times, just its timeout)
    oldest = ages.filter(pl.col("_most").is_not_null()).sort("_most", descending=True).head(1)
    signed = oldest.filter((pl.col("_most") >= pl.col("timeout_ms") - CLOCK_SLACK_NS / 1e6)
                           & (pl.col("_most") <= pl.col("timeout_ms") + WATCHDOG_WRITES_WITHIN_MS)).height > 0
    timed_out = known.filter(pl.col("_least") >= pl.col("timeout_ms")).height > 0 or signed
    # (under its timeout for sure: by the file's time, or by a stamp the dump itself made)
    under = (pl.col("_most") < pl.col("timeout_ms")) | (pl.col("at_dump") & (pl.col("_least") < pl.col("timeout_ms")))
    all_under = bool(ages.select(under.fill_null(False).all()).item())
    if trigger == "timeout" or (trigger == "auto" and timed_out):
        reading = "hung"
    elif trigger == "on-demand" or all_under:
        reading = "running"
    else:
        reading = "unknown"
    return Waited(reading, None if longest is None else float(longest["_least"]),
                  None if longest is None else longest["timeout_ms"], trigger)
