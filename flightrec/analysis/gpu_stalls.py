"""Ranks whose GPU stopped: their peers finished collectives with them that their own recorder never saw finish.

A collective completes on a member only once every member's GPU has run its part. So where a member's
recorder (NCCL's, which marks completion from CUDA events polled by its watchdog) shows collective #s of a
group completed, every other member's GPU took part in #s. A member that enqueued #s and still reads it
unfinished, while its peers finished it, has a GPU (or driver) that stopped answering: its watchdog can no
longer see its events complete. This holds with NCCL timing on or off (completion is tracked either way), in
full dumps and in dumps of unfinished entries only (the counters in `pg_status` say it), and does not appear
for a rank whose process merely stopped (a held GIL, a hang in host code: its watchdog still sees its work
finish). Checked on NVIDIA's real GPU-error dumps (fixtures/nvrx/gpu_error_*), where the ranks it names are
exactly the injected ones and no GIL-held rank is named.

Groups with sends or receives are left out: their counters mix point-to-point sequence numbers in.
"""

from __future__ import annotations

import polars as pl

GPU_STALLS = pl.Schema({
    "rank": pl.Int64,
    "group": pl.Categorical(),
    "first_unacked": pl.Int64,   # the first collective of the group its peers finished and it never saw finish
    "last_unacked": pl.Int64,
    "unacked": pl.Int64,         # how many
})


def gpu_stalls(progress: pl.DataFrame, p2p_groups: pl.DataFrame) -> pl.DataFrame:
    """(GPU_STALLS) one row per (rank, group) where the rank enqueued collectives its peers completed, and never
    saw them complete. `progress`: matching's (PROGRESS); `p2p_groups` (group): groups with sends or receives."""
    known = (progress.lazy()
             .filter(pl.col("has_dump") & pl.col("tracks_completion") & pl.col("last_completed").is_not_null()
                     & pl.col("last_enqueued").is_not_null())
             .join(p2p_groups.lazy().select(pl.col("group").cast(progress.schema["group"])), on="group", how="anti"))
    peers_done = pl.col("last_completed").max().over("group")
    upto = pl.min_horizontal("last_enqueued", peers_done)
    return (known.with_columns(upto.alias("_upto"))
            .filter(pl.col("_upto") > pl.col("last_completed"))
            .select("rank", "group", (pl.col("last_completed") + 1).alias("first_unacked"),
                    pl.col("_upto").alias("last_unacked"),
                    (pl.col("_upto") - pl.col("last_completed")).alias("unacked"))
            .sort("rank", "group").collect().cast(GPU_STALLS))
