"""Lateness that is a clock's, not a straggler's, where clocks can't be aligned (no completion times, or no hosts).

Without completion times (Gloo) the hosts' clocks can't be aligned, so a host whose clock runs ahead reads as
late on every collective it shares with other hosts, exactly as a straggling host does. What tells them apart
is on each rank's own clock: a collective can't finish before its last member arrives, and a blocking
collective (Gloo's are) holds its callers until it does. A member that came L ms before the last one can't
enqueue its next entry less than L ms later; when the last one only looks late, by its clock, the others go
on to their next entry as soon as ever. Each flagged rank or host is checked on the collectives it was late
in: the other members' gap to their next entry (on their own clock) against how late it was. Where the gaps
are long anyway (compute between collectives, sends and receives Gloo doesn't record), the check clears
nothing: the flag stays.

With completion times but no host placement (a flat folder of dumps), offsets can't be estimated per host
either, and a rank whose host clock runs ahead reads as late the same way. There the completion times tell:
a collective ends at one instant on every member, so a rank whose completions read as late as its enqueues,
on the collectives it was late in, is late by its clock only (`completed_late`).
"""

from __future__ import annotations

from typing import NamedTuple

import polars as pl

from flightrec.model.schema import WATCHDOG_POLL_MS


class Suspect(NamedTuple):
    """A rank or a host flagged late: `Suspect("rank", 5)`, `Suspect("host", "node3")`; reads "rank 5"."""

    kind: str       # "rank" or "host"
    name: int | str

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"


# peers "felt" the lateness when their gap to their next entry is at least this fraction of it
FELT_FRACTION = 0.5


def unfelt(flagged: dict[Suspect, list[int]], units: pl.DataFrame, late: pl.DataFrame,
           threshold: float) -> dict[Suspect, float]:
    """Of the `flagged` ranks or hosts (suspect -> its ranks), those whose peers did not wait for them: suspect
    -> the median lateness (ms) nobody felt. `units`: the timing window (rank, group, collective_seq_id,
    time_created_ns); `late`: lateness per member (group, collective_seq_id, rank, late_ms). A suspect with no
    collective to judge it on (no peer with a next entry) is not returned."""
    if not flagged:
        return {}
    key = ["group", "collective_seq_id"]
    # each member's gap to its own next entry in the window, on its own clock (entries are per rank in time order)
    gaps = (units.lazy().select("rank", *key, "time_created_ns").sort("rank", "time_created_ns")
            .with_columns(((pl.col("time_created_ns").shift(-1).over("rank") - pl.col("time_created_ns")) / 1e6)
                          .alias("_gap"))
            .join(late.lazy().select(*key, "rank", "late_ms"), on=[*key, "rank"])
            .collect())
    # (every suspect at once: a suspect -> rank table joined, not a filter of the window per suspect)
    suspects, labels = _labels(flagged)
    # the collectives each was late in, by how much (the least late of its ranks)
    mine = (gaps.join(labels, on="rank").filter(pl.col("late_ms") >= threshold)
            .group_by("_label", *key).agg(pl.col("late_ms").min().alias("_late")))
    # a member that came L ms before the last one can't leave, and enqueue its next entry, before L ms
    waited = (gaps.filter(pl.col("_gap").is_not_null()).join(mine, on=key)
              .join(labels, on=["_label", "rank"], how="anti")
              .group_by("_label", *key).agg((pl.col("_gap").median() >= FELT_FRACTION * pl.col("_late").first())
                                            .alias("_felt"))
              .group_by("_label").agg(pl.col("_felt").mean()))
    unfelt_labels = waited.filter(pl.col("_felt") < 0.5)["_label"].to_list()
    lateness = dict(mine.group_by("_label").agg(pl.col("_late").median()).iter_rows())
    return {suspects[label]: float(lateness[label]) for label in sorted(unfelt_labels)}


def completed_late(flagged: dict[Suspect, list[int]], units: pl.DataFrame, late: pl.DataFrame,
                   threshold: float) -> dict[Suspect, float]:
    """Of the `flagged` ranks (suspect -> its ranks), those whose completion times run as late as their enqueue
    times: suspect -> the median lateness (ms), which is their clock's. `units`: the timing window (group,
    collective_seq_id, rank, time_created_ns, time_completed_ns); `late`: lateness per member (group,
    collective_seq_id, rank, late_ms). On each collective the rank was late in, its completion is read against
    that of the member it is late against (the first to enqueue). The watchdog stamps completions up to a poll
    late, so where the two clocks differ (its own ahead, or the first member's behind) it reads at least a poll
    ahead, and no more than a poll short of the lateness. A real straggler's completion is its peers' (within a
    poll)."""
    if not flagged:
        return {}
    key = ["group", "collective_seq_id"]
    suspects, labels = _labels(flagged)
    done = (units.lazy().select(*key, "rank", "time_created_ns", "time_completed_ns")
            .filter(pl.col("time_completed_ns").is_not_null()))
    mine = (late.lazy().select(*key, "rank", "late_ms").join(labels.lazy(), on="rank")
            .filter(pl.col("late_ms") >= threshold)
            .join(done, on=[*key, "rank"]))
    others = (done.join(mine.select(*key, "_label").unique(), on=key)
              .join(labels.lazy(), on=["_label", "rank"], how="anti")
              # (the completion of the member it is late against: the first to enqueue, on its own clock)
              .group_by("_label", *key).agg(pl.col("time_completed_ns").sort_by("time_created_ns").first()
                                            .alias("_others")))
    ahead = (mine.join(others, on=["_label", *key])
             .with_columns(((pl.col("time_completed_ns") - pl.col("_others")) / 1e6).alias("_ahead"))
             .group_by("_label").agg(
                 ((pl.col("_ahead") > WATCHDOG_POLL_MS) & (pl.col("_ahead") >= pl.col("late_ms") - WATCHDOG_POLL_MS))
                 .mean().alias("_clock"),
                 pl.col("late_ms").median().alias("_late"))
             .filter(pl.col("_clock") >= 0.5).sort("_label").collect())
    return {suspects[label]: float(ms) for label, _, ms in ahead.iter_rows()}


def _labels(flagged: dict[Suspect, list[int]]) -> tuple[list[Suspect], pl.DataFrame]:
    """The suspects in order, and (_label, rank): each suspect's ranks under its position in that order."""
    suspects = list(flagged)
    return suspects, pl.DataFrame([(i, r) for i, s in enumerate(suspects) for r in flagged[s]],
                                  schema={"_label": pl.Int64, "rank": pl.Int64}, orient="row")
