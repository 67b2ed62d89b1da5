"""What an op's own shapes must satisfy, and what must be equal across a collective's members: Polars
expressions over matched units, shared by matching (`match`) and the first divergence (`divergences`)."""

from __future__ import annotations

import polars as pl


def size_rule_ok() -> pl.Expr:
    """Per unit: the op's own shape rule (all_gather output = input x group size, reduce_scatter the reverse)."""
    op = pl.col("op")
    return (
        pl.when(op.is_in(["all_gather", "all_gather_coalesced"]))
        .then(pl.col("output_numel") == pl.col("input_numel") * pl.col("size"))
        .when(op.is_in(["reduce_scatter", "reduce_scatter_coalesced"]))
        .then(pl.col("input_numel") == pl.col("output_numel") * pl.col("size"))
        .otherwise(True)
        .fill_null(True)
    )


# Ops whose per-member shapes legitimately differ: all_to_all splits may be uneven (checked by totals), and
# gather/scatter shapes depend on whether the member is the root.
_UNEQUAL_SHAPES = ["all_to_all", "gather", "scatter"]


def known_op() -> pl.Expr:
    """The unit's op, null where its profiling name was missing or not one the recorder writes ("unknown"):
    compared across members, unknown is no disagreement."""
    return pl.when(pl.col("op") != "unknown").then(pl.col("op"))


def shape_key(as_text: bool = False) -> pl.Expr:
    """What must be equal across members: outputs for reduce_scatter, inputs for the rest, nothing for ops
    whose members' shapes may differ. Shapes are categoricals over one set of categories (equal text, equal
    id), so matching compares ids and spares turning millions of rows back into strings; the top id stands for
    "nothing to compare". `as_text` for the few divergent collectives a report shows."""
    def shape(column: str) -> pl.Expr:
        return pl.col(column).cast(pl.String) if as_text else pl.col(column).to_physical()

    return (
        # (an op not known: which of its shapes to compare isn't either)
        pl.when(pl.col("op") == "unknown").then(pl.lit(None, pl.String if as_text else pl.UInt32))
        .when(pl.col("op").is_in(_UNEQUAL_SHAPES)).then(pl.lit("") if as_text else pl.lit(2**32 - 1, pl.UInt32))
        .when(pl.col("op").is_in(["reduce_scatter", "reduce_scatter_coalesced"])).then(shape("output_sizes"))
        .otherwise(shape("input_sizes"))
    )


def all_to_all_totals_ok() -> pl.Expr:
    """Per collective (in a group_by): what all members send adds up to what they all receive. MoE jobs run
    all_to_all with uneven splits, so only the totals over the whole group must agree, and only where every
    member recorded it: a member missing (no dump, an only-active dump that left out its finished entry, or one
    that never joined) leaves the sums unequal with nothing wrong (NVIDIA's real MoE dumps, fixtures/nvrx)."""
    return (
        (pl.col("op").first() != "all_to_all")
        | (pl.len() < pl.col("size").first())
        | (pl.col("input_numel").sum() == pl.col("output_numel").sum())
        | pl.col("input_numel").is_null().any() | pl.col("output_numel").is_null().any()
    )
