"""Where each rank's GPU stands: its oldest unfinished op, and the ops its peers began that it never did.

The CPU runs ahead of the GPU, enqueuing (recording, `scheduled`) its next ops until Python needs a result; a
rank's later unfinished ops are its run-ahead, not ops its GPU is in. Its oldest unfinished op is where its
GPU is (unless later ones began: `started`, NCCL timing on). Checked on jobs from a model of CPU run-ahead and
NCCL streams (`flightrec.testing.runahead`), and on NVIDIA's real dumps (where it keeps run-ahead out of the
hang below the collectives): a hypothesis on real timing-on dumps, which we have none of (`docs/findings.md`).
"""

from __future__ import annotations

import polars as pl

from flightrec.analysis.matching import Matching


def unit_pending() -> pl.Expr:
    """A rank's part in a collective is unfinished: not completed where its recorder reports completion (NCCL),
    still in the work queue (not retired) where it doesn't (Gloo)."""
    return pl.when(pl.col("tracks_completion")).then(pl.col("state") != "completed").otherwise(~pl.col("retired"))


def oldest_pending(m: Matching) -> pl.DataFrame:
    """(rank, _oldest): the record id of each rank's oldest unfinished op, collective or send/recv: where its GPU
    stands. The CPU runs ahead of the GPU, enqueuing (recording, `scheduled`) its next ops until Python needs a
    result, so a rank's later unfinished ops are its run-ahead, not ops its GPU is in (unless they began:
    `started`, NCCL timing on)."""
    units = m.units.lazy().filter(unit_pending()).select("rank", "record_id")
    ends = [m.p2p.lazy().filter(pl.col(f"{end}_pending") & pl.col(f"{end}_record").is_not_null())
            .select(pl.col(f"{end}_rank").alias("rank"), pl.col(f"{end}_record").alias("record_id"))
            for end in ("send", "recv")]
    return (pl.concat([units, *ends]).group_by("rank").agg(pl.col("record_id").min().alias("_oldest")).collect())



NEVER_BEGAN = pl.Schema({
    "rank": pl.Int64,
    "group": pl.Categorical(),
    "collective_seq_id": pl.Int64,
    "began": pl.Int64,           # how many of its peers began it
})


def never_began(m: Matching) -> pl.DataFrame:
    """(NEVER_BEGAN) ranks whose oldest unfinished op is a collective some peer began (`started`, NCCL timing on)
    and they never did: nothing older held their GPU, yet it never launched it. Their GPU stopped, or is stuck
    in a kernel of its own. (In a hang only: in a running job's snapshot a GPU a moment behind reads the same.)"""
    oldest = oldest_pending(m)
    units = m.units.lazy().select("group", "collective_seq_id", "rank", "record_id", "state")
    began = (units.group_by("group", "collective_seq_id")
             .agg((pl.col("state") == "started").sum().alias("began")).filter(pl.col("began") > 0))
    return (units.join(oldest.lazy(), on="rank")
            .filter((pl.col("record_id") == pl.col("_oldest")) & (pl.col("state") == "scheduled"))
            .join(began, on=["group", "collective_seq_id"])
            .select("rank", "group", "collective_seq_id", "began")
            .sort("rank").collect().cast(NEVER_BEGAN))
