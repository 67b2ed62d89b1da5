"""What the recorder's own fields say about an entry or a rank, in every setting: a send/recv batch's closing
entry, a writer that kept only unfinished entries, a rank whose recorder reports completion, a dump cut short."""

from __future__ import annotations

import polars as pl

from flightrec.model import dense_index as lookup
from flightrec.model.schema import (
    TRUNCATED,
    reports_completion,
)


def is_p2p_closer() -> pl.Expr:
    """The `coalesced` entry that closes a batch_isend_irecv: it follows the batch's sends/recvs on the same
    rank and group with the same p2p_seq_id (the writer records it with is_p2p False)."""
    prev = lambda c: pl.col(c).shift(1)  # noqa: E731  (entries are sorted by rank, record_id)
    return (
        (pl.col("op") == "coalesced")
        & (prev("rank") == pl.col("rank"))
        & (prev("group") == pl.col("group"))
        & prev("is_p2p").fill_null(False)
        & (prev("p2p_seq_id") == pl.col("p2p_seq_id"))
    )


def written_only_active(dumps: pl.DataFrame) -> bool:
    """The job's writer kept only unfinished entries (`TORCH_INCLUDE_ONLY_ACTIVE`: load's `only_active`)."""
    return "only_active" in dumps.columns and bool(dumps["only_active"].fill_null(False).any())


def tracks_completion(tracks: pl.DataFrame, entries: pl.DataFrame) -> pl.Expr:
    """Each entry's `tracks_completion` (from `completion_by_rank`), read by rank from a table laid out over
    every rank in `entries`: no join. Built once per matching, used by units and p2p pairing."""
    size = int(max(tracks["rank"].max() or 0, entries["rank"].max() or 0)) + 1
    laid_out = lookup.by_position(tracks, size)
    return lookup.read(laid_out, "tracks_completion", pl.col("rank"), in_range=lookup.covers(entries["rank"], size))


def completion_by_rank(entries: pl.DataFrame, dumps: pl.DataFrame) -> pl.DataFrame:
    """(rank, tracks_completion): the rank's recorder reports completion. Read from the backend, so a rank
    whose first op is the one that hung still counts; and from the states, for dumps of unknown backend."""
    # entries are in rank order (as `load` leaves them): flagged sorted, the groups are slices, not hashed (10x
    # faster at 31M entries; flagging the whole frame instead slows the runs in `collective_units` 4x)
    seen = (entries.lazy().select(pl.col("rank").set_sorted(), "state").group_by("rank")
            .agg(pl.col("state").is_in(["started", "completed"]).any().alias("_seen")).collect())
    backend = dumps.select("rank", pl.when(pl.col("backend").is_not_null())
                           .then(reports_completion(pl.col("backend"))).alias("_backend"))
    # A dump with no entry names no backend: its rank's is the job's, where every dump that names one agrees
    # (its pg_status counters then mean what theirs do: a dump cut before its entries, or one with nothing left)
    named = backend["_backend"].drop_nulls()
    job_wide = named.len() > 0 and bool(named.all())
    return (backend.join(seen, on="rank", how="full", coalesce=True)
            .select("rank", (pl.col("_backend").fill_null(job_wide) | pl.col("_seen").fill_null(False))
                    .alias("tracks_completion")))


def cut_short(dumps: pl.DataFrame) -> pl.Series:
    """The ranks whose dump file was cut short (the reader kept the entries written before the cut)."""
    return dumps.filter(pl.col("problems").list.eval(pl.element().str.starts_with(TRUNCATED)).list.any())["rank"]


def last_group_per_rank(entries: pl.DataFrame) -> pl.DataFrame:
    """(rank, _last_group): the group of each rank's latest entry. Entries are in (rank, record) order, as `load`
    leaves them: the rank column flagged sorted, each rank is a slice and its last row the latest (no sort of
    31M rows)."""
    return (entries.lazy().select(pl.col("rank").set_sorted(), "group").group_by("rank")
            .agg(pl.col("group").last().alias("_last_group")).collect())
