"""Per-row values from small tables, read by position instead of joined.

Joining a table of a few thousand rows onto millions hashes every one of them; when the key is a small
non-negative integer (a rank, a categorical's id) the table can be laid out by key once and each row read
with `gather`: 2-3x faster than the join at 16K ranks, and the rows keep their order."""

from __future__ import annotations

import polars as pl


def by_position(table: pl.DataFrame, size: int) -> pl.DataFrame:
    """`table` (first column: a non-negative integer key, then values) laid out over positions 0..size-1,
    nulls where a key is absent."""
    key = table.columns[0]
    return (pl.DataFrame({key: pl.arange(0, size, dtype=table.schema[key], eager=True)})
            .join(table, on=key, how="left", maintain_order="left").drop(key))


def read(laid_out: pl.DataFrame, column: str, key: pl.Expr) -> pl.Expr:
    """Each row's `column` from a `by_position` table at position `key`; null for a null key, a negative
    one (gather would count it from the end) or one past the table."""
    values = laid_out.get_column(column)
    return pl.lit(values).gather(pl.when((key >= 0) & (key < len(values))).then(key))
