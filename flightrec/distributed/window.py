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

from flightrec.errors import FlightrecError

# Fewer than this can leave a rank no finished entry at all, which reads as a dump written with only its
# unfinished ones (TORCH_INCLUDE_ONLY_ACTIVE); every real case checked reads the same from 10 (docs/scale.md).
MIN_KEEP = 10


@dataclass(frozen=True)
class Window:
    """A shard's tables cut to each rank's newest entries, how much was left out, and how many ranks' dumps
    were kept whole (`kept_whole`)."""

    tables: dict[str, pl.DataFrame]
    entries_read: int
    entries_left_out: int
    ranks_kept_whole: int


def kept_whole() -> pl.Expr:
    """Over one rank's entries: a dump that is not a plain ring buffer of finished history is kept whole. One
    that skips record ids or holds no completed entry is one written with only its unfinished entries
    (TORCH_INCLUDE_ONLY_ACTIVE: in NVIDIA's real dumps some ranks' unfinished entries happen to run without a
    gap), or Gloo's, which never marks one completed: what it holds is what was in flight, the evidence of a
    hang (small in the first case; Gloo's are as long as their buffers, and the report counts them)."""
    ids = pl.col("record_id")
    return (ids.max() - ids.min() + 1 > ids.count()) | ~(pl.col("state") == "completed").any()


def newest_entries(raw: dict[str, pl.DataFrame], keep: int) -> Window:
    """`raw` (a shard's or a load's tables) with each rank's newest `keep` entries, by record id (the recorder's
    own order), or all of them where its dump is no plain ring buffer of finished history (`kept_whole`); their
    stacks, and every other table whole (pg_config, pg_status and the rank lists are per rank and small). A
    dump's `entry_count` becomes what is kept of it, as a recorder of that size would have written."""
    if keep < MIN_KEEP:
        raise FlightrecError(f"keep must be at least {MIN_KEEP} entries, not {keep}")
    entries = raw["entries"]
    # (an entry with no record id can't be placed: kept, as in flight)
    newest = (pl.col("record_id").rank("ordinal", descending=True).over("rank") <= keep).fill_null(True)
    whole = entries.group_by("rank").agg(kept_whole().first().alias("_whole"), pl.len().alias("_n")).filter("_whole")
    kept = entries.filter(newest | pl.col("rank").is_in(whole["rank"].implode()))
    stacks = raw["stacks"].join(kept.select("stack_id").drop_nulls().unique(), on="stack_id", how="semi")
    counts = kept.group_by("rank").agg(pl.len().cast(pl.Int64).alias("_kept"))
    dumps = (raw["dumps"].join(counts, on="rank", how="left")
             .with_columns(pl.min_horizontal("entry_count", pl.col("_kept").fill_null(0)).alias("entry_count"))
             .drop("_kept"))
    return Window(tables={**raw, "entries": kept, "stacks": stacks, "dumps": dumps},
                  entries_read=entries.height, entries_left_out=entries.height - kept.height,
                  ranks_kept_whole=whole.filter(pl.col("_n") > keep).height)
