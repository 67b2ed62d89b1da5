"""Reading small tables by position: same values as a join, nulls where a join would find nothing."""

import polars as pl

from flightrec import lookup


def test_read_by_position_is_a_left_join():
    table = pl.DataFrame({"rank": [0, 2, 5], "host": ["a", "b", "c"]})
    rows = pl.DataFrame({"rank": [5, 0, None, -1, 2, 1, 9, 0]})
    laid_out = lookup.by_position(table, 6)
    got = rows.with_columns(lookup.read(laid_out, "host", pl.col("rank")))
    want = rows.join(table, on="rank", how="left", maintain_order="left")
    assert got.equals(want)
    assert got["host"].to_list() == ["c", "a", None, None, "b", None, None, "a"]


def test_read_from_an_empty_table_gives_nulls():
    laid_out = lookup.by_position(pl.DataFrame(schema={"g": pl.UInt32, "n": pl.Int64}), 1)
    got = pl.DataFrame({"g": [0, 3]}).select(lookup.read(laid_out, "n", pl.col("g")))
    assert got["n"].to_list() == [None, None]
