"""What an op's own shapes must satisfy, and what must be equal across a collective's members: Polars
expressions over matched units, shared by matching (`match`) and the first divergence (`divergences`).

Each side of a collective (its inputs, its outputs) is compared across members where the op requires it, and
only among the members that recorded that side: a gather's or scatter's non-root members record no tensor
there (Gloo: `[]`; NCCL: an undefined tensor, dtype `Undefined`), a coalesced batch's closer records none.
"""

from __future__ import annotations

import polars as pl

# Ops whose members' inputs (outputs) legitimately differ, so that side is not compared: uneven splits
# (all_to_all: checked by totals; the hook and torchcomms writers' all_gather_v and reduce_scatter_v), and the
# root's side of gather and scatter (NCCL records scatter's tensors swapped: the root's list is its output).
_INPUTS_DIFFER = ("all_to_all", "all_gather_v")
_OUTPUTS_DIFFER = ("all_to_all", "reduce_scatter_v", "gather", "scatter")
# (dtypes agree on every side but the root's: an all_to_all's splits are uneven, its dtype is one)
_OUTPUT_DTYPES_DIFFER = ("gather", "scatter")


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


def known_op() -> pl.Expr:
    """The unit's op, null where its profiling name was missing or not one the recorder writes ("unknown"):
    compared across members, unknown is no disagreement."""
    return pl.when(pl.col("op") != "unknown").then(pl.col("op"))


def side_recorded(side: str) -> pl.Expr:
    """The unit recorded tensors on this side ("input" or "output"): not none (`[]`), not an undefined tensor
    (a non-root's gather output, NCCL)."""
    return ((pl.col(f"{side}_sizes") != "[]") & ~pl.col(f"{side}_dtypes").is_in(["", "Undefined"])).fill_null(True)


def _side(value: str, compared: pl.Expr, as_text: bool) -> pl.Expr:
    """`value`'s column where this side is compared and recorded, else null (nothing to compare). Categoricals
    share one set of categories (equal text, equal id), so matching compares ids; `as_text` for the few
    divergent collectives a report shows."""
    side = value.split("_")[0]
    read = pl.col(value).cast(pl.String) if as_text else pl.col(value).to_physical()
    return pl.when(compared & (pl.col("op") != "unknown") & side_recorded(side)).then(read)


def shape_keys(as_text: bool = False) -> tuple[pl.Expr, pl.Expr]:
    """(inputs, outputs): what must be equal across members, per side; null where the side isn't compared."""
    op = pl.col("op")
    return (_side("input_sizes", ~op.is_in(_INPUTS_DIFFER), as_text),
            _side("output_sizes", ~op.is_in(_OUTPUTS_DIFFER), as_text))


def dtype_keys(as_text: bool = False) -> tuple[pl.Expr, pl.Expr]:
    """(inputs, outputs) dtypes that must be equal across members; null where the side isn't compared."""
    op = pl.col("op")
    return (_side("input_dtypes", pl.lit(True), as_text),
            _side("output_dtypes", ~op.is_in(_OUTPUT_DTYPES_DIFFER), as_text))


def _as_one_text(keys: tuple[pl.Expr, pl.Expr]) -> pl.Expr:
    """One text for a report from a (inputs, outputs) pair: the inputs, and '-> outputs' where the outputs are
    compared and differ from them ('[[4096]] -> [[8192]]'; 'Float -> BFloat16')."""
    inputs, outputs = keys
    return (pl.when(inputs.is_null()).then(outputs)
            .when(outputs.is_not_null() & (outputs != inputs)).then(pl.format("{} -> {}", inputs, outputs))
            .otherwise(inputs))


def shape_text() -> pl.Expr:
    """A unit's compared shapes as one text, for the report."""
    return _as_one_text(shape_keys(as_text=True))


def dtype_text() -> pl.Expr:
    """A unit's compared dtypes as one text, for the report."""
    return _as_one_text(dtype_keys(as_text=True))


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
