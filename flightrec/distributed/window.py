"""Each rank's newest entries: what a worker hands the driver instead of a shard's whole history.

A flight recorder is a ring buffer: a dump already holds only a rank's newest entries, and the engine reads a
dump whose buffer rolled its oldest out (`wrapped`) by sequence ids and `pg_status`, whatever the buffer's size.
Keeping each rank's newest `keep` entries is therefore the same input as a job whose recorder kept `keep`: no new
rule, no second engine. The driver's memory then grows with ranks x `keep`, not with the buffer the job ran with
(2,000 entries by default: 262M at 131,072 ranks), and the hang, which lies at every group's frontier, is in it.
What it loses is old history: timing (stragglers, slow links) and who traded with whom are read over the newest
`keep` entries only, which the report says (`dumps.window`).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from flightrec.errors import require_count


@dataclass(frozen=True)
class Window:
    """A shard's tables cut to each rank's newest entries, and how much was left out."""

    tables: dict[str, pl.DataFrame]
    entries_read: int
    entries_left_out: int


def kept_whole() -> pl.Expr:
    """Per rank: a dump that is not a plain ring buffer of finished history is kept whole. One that skips record
    ids or holds no completed entry is one written with only its unfinished entries (TORCH_INCLUDE_ONLY_ACTIVE:
    in NVIDIA's real dumps some ranks' unfinished entries happen to run without a gap), or Gloo's, which never
    marks one completed: what it holds is what was in flight, the evidence of a hang, and it is small."""
    ids = pl.col("record_id")
    return ((ids.max() - ids.min() + 1 > ids.count()) | ~(pl.col("state") == "completed").any()).over("rank")


def newest_entries(raw: dict[str, pl.DataFrame], keep: int) -> Window:
    """`raw` (a shard's or a load's tables) with each rank's newest `keep` entries, by record id (the recorder's
    own order), or all of them where its dump is no plain ring buffer of finished history (`kept_whole`); their stacks, and every other
    table whole (pg_config, pg_status and the rank lists are per rank and small). A dump's `entry_count` becomes
    what is kept of it, as a recorder of that size would have written."""
    require_count("keep", keep)
    entries = raw["entries"]
    newest = pl.col("record_id").rank("ordinal", descending=True).over("rank") <= keep
    kept = entries.filter(newest | kept_whole())
    stacks = raw["stacks"].join(kept.select("stack_id").drop_nulls().unique(), on="stack_id", how="semi")
    counts = kept.group_by("rank").agg(pl.len().cast(pl.Int64).alias("_kept"))
    dumps = (raw["dumps"].join(counts, on="rank", how="left")
             .with_columns(pl.min_horizontal("entry_count", pl.col("_kept").fill_null(0)).alias("entry_count"))
             .drop("_kept"))
    return Window(tables={**raw, "entries": kept, "stacks": stacks, "dumps": dumps},
                  entries_read=entries.height, entries_left_out=entries.height - kept.height)
