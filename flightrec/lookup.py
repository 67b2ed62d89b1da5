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


def read(laid_out: pl.DataFrame, column: str, key: pl.Expr, *, in_range: bool = False) -> pl.Expr:
    """Each row's `column` from a `by_position` table at position `key`; null for a null key, a negative
    one (gather would count it from the end) or one past the table. `in_range`: the caller sized the table
    from the data, so every key is null or a position in it; the checks are skipped (they cost 4x the read)."""
    values = laid_out.get_column(column)
    if in_range:
        return pl.lit(values).gather(key)
    return pl.lit(values).gather(pl.when((key >= 0) & (key < len(values))).then(key))


def covers(keys: pl.Series, size: int) -> bool:
    """Every non-null value of `keys` is a position in a table of `size` rows (then `read(in_range=True)`)."""
    return keys.null_count() == len(keys) or (keys.min() >= 0 and keys.max() < size)
