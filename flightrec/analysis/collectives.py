"""Collectives matched across the members of each group: one unit per (group, seq, rank), then each collective
classified (complete, in flight, members missing, or members that disagree on the op, dtype or shape)."""

from __future__ import annotations

import polars as pl

from flightrec.analysis.entry_facts import is_p2p_closer
from flightrec.analysis.shape_rules import all_to_all_totals_ok, dtype_keys, known_op, shape_keys, size_rule_ok
from flightrec.model import dense_index as lookup
from flightrec.model.schema import (
    COLLECTIVES,
    Op,
    conform,
)

_UNIT_KEY = ["group", "collective_seq_id", "rank"]


# Each unit column read from one entry (a unit of its own) ...
_ONE_ENTRY = [
    pl.lit(1, pl.UInt32).alias("n_entries"),
    pl.col("op"), pl.col("input_sizes"), pl.col("output_sizes"), pl.col("input_dtypes"), pl.col("output_dtypes"),
    pl.col("input_numel"), pl.col("output_numel"),   # (null: unknown, which no size rule fails)
    pl.col("state"), pl.col("retired").fill_null(True), pl.col("record_id"), pl.col("stack_id"),
    pl.col("time_created_ns"), pl.col("time_completed_ns"), pl.col("tracks_completion"), pl.col("pg_id"),
    pl.col("timeout_ms"), pl.col("duration_ms"),
]


# ... and over a run of such rows. A coalesced batch of collectives shares one seq: its last entry (the closer)
# carries the state; its members' shapes are summed so the batch is compared as one unit.
_RUN_AGGS = [
    pl.col("n_entries").sum(),
    # (the slow path's uneven all_gather / reduce_scatter: one _broadcast_oop / _reduce_oop per member, closed by
    # ALLGATHER_coalesced / REDUCE_SCATTER_coalesced: the uneven form, whose members' inputs (outputs) differ)
    pl.when((pl.len() > 1) & (pl.col("op").last() == "all_gather_coalesced")).then(pl.lit("all_gather_v", Op))
    .when((pl.len() > 1) & (pl.col("op").last() == "reduce_scatter_coalesced")).then(pl.lit("reduce_scatter_v", Op))
    .otherwise(pl.col("op").filter(pl.col("op") != "coalesced").first().fill_null(pl.col("op").first()))
    .alias("op"),
    pl.col("input_sizes").first(), pl.col("output_sizes").first(),
    pl.col("input_dtypes").first(), pl.col("output_dtypes").first(),
    # (a batch's closer records no shapes: summed over the members that did, unknown only if none did)
    *[pl.when(pl.col(c).is_not_null().any()).then(pl.col(c).sum()).alias(c) for c in ("input_numel", "output_numel")],
    pl.col("state").last(), pl.col("retired").all(), pl.col("record_id").min(), pl.col("stack_id").first(),
    pl.col("time_created_ns").min(), pl.col("time_completed_ns").max(),
    pl.col("tracks_completion").first(), pl.col("pg_id").first(), pl.col("timeout_ms").max(),
    pl.col("duration_ms").max(),
]


def _keys_unique_per_rank(units: pl.DataFrame) -> bool:
    """No (group, seq) twice on one rank. Units are in rank order: per-rank slices, each a small exact set
    (8x faster than hashing every key at 14.6M units)."""
    key = pl.col("group").to_physical().cast(pl.UInt64) * (1 << 32) + pl.col("collective_seq_id").cast(pl.UInt64)
    distinct = (units.lazy().select(pl.col("rank").set_sorted(), key.alias("_k")).group_by("rank")
                .agg(pl.col("_k").n_unique()).select(pl.col("_k").sum()).collect().item())
    return (distinct or 0) == units.height


def collective_units(entries: pl.DataFrame, groups: pl.DataFrame, completion: pl.Expr) -> pl.DataFrame:
    """One row per (group, seq, rank) for collectives, in (rank, record) order; p2p and batch closers are left
    out. `entries` must be in (rank, record) order, as `load` leaves them."""
    # Lazy, so only the columns used below are materialized from the (widest, longest) entries frame.
    marked = entries.lazy().with_columns((pl.col("is_p2p") | is_p2p_closer()).alias("_p2p"),
                                         completion.alias("tracks_completion"))
    # (a negative seq id, from a damaged or hand-edited dump, is no place in the sequence: unknown, as null)
    coll = marked.filter(~pl.col("_p2p") & pl.col("group").is_not_null() & (pl.col("collective_seq_id") >= 0))
    # Entries are in (rank, record) order, and one thread records a unit's entries back to back: each run of
    # equal keys is a unit. Each entry is first read as a unit of its own (`_ONE_ENTRY`); when every run is one
    # entry (no coalesced batches: the usual NCCL job) those rows are the units, else runs are aggregated over
    # contiguous slices (`_RUN_AGGS`), not by hashing every row. If a unit's entries were interleaved with
    # another's, its key shows up in two runs: then group by key.
    rows = coll.select(*_UNIT_KEY, *_ONE_ENTRY, pl.struct(_UNIT_KEY).rle_id().alias("_run")).collect()
    if rows.height == 0 or rows["_run"][-1] + 1 == rows.height:
        units = rows.drop("_run")
    else:
        units = (rows.lazy().with_columns(pl.col("_run").set_sorted())
                 .group_by("_run", maintain_order=True).agg(*[pl.col(c).first() for c in _UNIT_KEY], *_RUN_AGGS)
                 .drop("_run").collect())
    del rows
    if not _keys_unique_per_rank(units):
        units = (coll.select(*_UNIT_KEY, *_ONE_ENTRY).group_by(_UNIT_KEY).agg(*_RUN_AGGS)
                 .sort("rank", "record_id").collect())
    multi = units.filter(pl.col("n_entries") > 1)
    if multi.height:
        # Signatures of multi-entry units: every member's shape, in record order, so batches compare whole.
        sig = (
            coll.join(multi.lazy().select("group", "collective_seq_id", "rank"),
                      on=["group", "collective_seq_id", "rank"])
            # (the closer records no tensor: the members' shapes make the signature)
            .filter((pl.col("input_sizes") != "[]") | (pl.col("output_sizes") != "[]"))
            .sort("record_id")
            .group_by("group", "collective_seq_id", "rank")
            .agg(
                pl.col("input_sizes").cast(pl.String).str.join(";").alias("_in"),
                pl.col("output_sizes").cast(pl.String).str.join(";").alias("_out"),
                pl.col("input_dtypes").cast(pl.String).str.join(";").alias("_dt"),
                pl.col("output_dtypes").cast(pl.String).str.join(";").alias("_odt"),
            )
        ).collect()
        units = units.join(sig, on=["group", "collective_seq_id", "rank"], how="left",
                           maintain_order="left").with_columns(
            pl.coalesce(pl.col("_in").cast(pl.Categorical), "input_sizes").alias("input_sizes"),
            pl.coalesce(pl.col("_out").cast(pl.Categorical), "output_sizes").alias("output_sizes"),
            pl.coalesce(pl.col("_dt").cast(pl.Categorical), "input_dtypes").alias("input_dtypes"),
            pl.coalesce(pl.col("_odt").cast(pl.Categorical), "output_dtypes").alias("output_dtypes"),
        ).drop("_in", "_out", "_dt", "_odt")
    sizes = groups.select(pl.col("group").to_physical().alias("_g"), "size")
    by_group = lookup.by_position(sizes, int(sizes["_g"].max() or 0) + 1)
    return units.with_columns(lookup.read(by_group, "size", pl.col("group").to_physical()))


def _all_equal(expr: pl.Expr) -> pl.Expr:
    """In a group_by: every member that recorded a value has the same one. A null is unknown (a field the
    dump lacks, or of a type it can't hold), never a disagreement: a rank whose recorder left out the dtypes
    did not run another dtype. On the physical ids of enums and categoricals, min == max is a pass over the
    slice where n_unique would hash it."""
    ids = expr.to_physical()
    return (ids.min() == ids.max()).fill_null(True)


def classify(units: pl.DataFrame, prog: pl.DataFrame) -> pl.DataFrame:
    """One row per (group, seq) inside the window all members cover, with a status."""
    window = prog.group_by("group").agg(
        pl.col("first_seq").max().alias("_lo"),
        pl.col("last_enqueued").is_not_null().sum().alias("n_known"),
    )
    # Lazy: only the columns read below, joined, filtered and aggregated in one plan. Eager, each step copied
    # the 14.6M units at 16K x 2,000 (10 s, +3.5 GiB; lazy: 2.3 s, +0.7 GiB).
    # (the window's bounds read per unit by group id, not joined)
    window = window.select(pl.col("group").to_physical().alias("_g"), "_lo", "n_known")
    by_group = lookup.by_position(window, int(window["_g"].max() or 0) + 1)
    gid = pl.col("group").to_physical()
    inst = (
        units.lazy()
        .filter(pl.col("collective_seq_id") >= lookup.read(by_group, "_lo", gid))
        .with_columns(*(key.alias(name) for key, name in zip((*shape_keys(), *dtype_keys()),
                                                              ("_in", "_out", "_in_dt", "_out_dt"))),
                      size_rule_ok().alias("_self_ok"),
                      lookup.read(by_group, "n_known", gid).alias("n_known"))
        .group_by("group", "collective_seq_id")
        .agg(
            pl.col("op").first(),   # the most common op where members disagree: below, for those few
            pl.col("size").first(),
            pl.len().alias("n_present"),
            pl.col("n_known").first(),
            (pl.col("state") == "completed").sum().alias("n_completed"),
            pl.col("tracks_completion").sum().alias("n_tracking"),
            # a recorder without completion states (Gloo) still leaves unfinished work un-retired
            (~pl.col("tracks_completion") & ~pl.col("retired").fill_null(True)).sum().alias("n_unretired"),
            _all_equal(known_op()).alias("type_ok"),
            (_all_equal(pl.col("_in_dt")) & _all_equal(pl.col("_out_dt"))).alias("dtype_ok"),
            # (the op's own rule is broken when some members keep it and some don't: where none does, the
            # group's size we hold is what's wrong, e.g. a world size given or inferred too large)
            (_all_equal(pl.col("_in")) & _all_equal(pl.col("_out"))
             & (pl.col("_self_ok").all() | ~pl.col("_self_ok").any())
             & all_to_all_totals_ok()).alias("size_ok"),
        )
        .collect()
    )
    if not inst["type_ok"].all():
        modes = (units.join(inst.filter(~pl.col("type_ok")).select("group", "collective_seq_id"),
                            on=["group", "collective_seq_id"])
                 .group_by("group", "collective_seq_id")
                 .agg(known_op().drop_nulls().mode().sort().first().alias("_mode")))
        inst = inst.join(modes, on=["group", "collective_seq_id"], how="left").with_columns(
            pl.coalesce("_mode", "op").alias("op")).drop("_mode")
    everyone_in = pl.col("n_present") >= pl.col("n_known")
    tracked = pl.col("n_tracking") == pl.col("n_present")
    inst = inst.with_columns(
        pl.when(~pl.col("type_ok")).then(pl.lit("type_mismatch"))
        .when(~pl.col("dtype_ok")).then(pl.lit("dtype_mismatch"))
        .when(~pl.col("size_ok")).then(pl.lit("size_mismatch"))
        .when(~everyone_in).then(pl.lit("not_joined"))
        .when(tracked & (pl.col("n_completed") > 0) & (pl.col("n_completed") < pl.col("n_present")))
        .then(pl.lit("state_mismatch"))
        .when(tracked & (pl.col("n_completed") == 0)).then(pl.lit("in_flight"))
        .when(pl.col("n_known") < pl.col("size")).then(pl.lit("missing_dumps"))
        # Gloo: retired work may have failed, so only members still in it count, and one is enough
        .when(~tracked & (pl.col("n_unretired") > 0)).then(pl.lit("in_flight"))
        .otherwise(pl.lit("matched"))
        .alias("status")
    )
    return conform(inst, COLLECTIVES).sort("group", "collective_seq_id")
