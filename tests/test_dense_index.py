"""Reading small tables by position: same values as a join, nulls where a join would find nothing."""

import polars as pl

from flightrec import load
from flightrec.ingest.assemble import _peer_of
from flightrec.model import dense_index
from flightrec.testing import synth


def test_read_by_position_is_a_left_join():
    table = pl.DataFrame({"rank": [0, 2, 5], "host": ["a", "b", "c"]})
    rows = pl.DataFrame({"rank": [5, 0, None, -1, 2, 1, 9, 0]})
    laid_out = dense_index.by_position(table, 6)
    got = rows.with_columns(dense_index.read(laid_out, "host", pl.col("rank")))
    want = rows.join(table, on="rank", how="left", maintain_order="left")
    assert got.equals(want)
    assert got["host"].to_list() == ["c", "a", None, None, "b", None, None, "a"]


def test_a_table_already_laid_out_is_taken_as_it_is_and_one_that_only_looks_so_is_not():
    # (a key per row from 0 in order is the layout itself; same first and last keys with a repeat in between,
    # or out of order, or short of the size, or a null key, go through the join)
    for keys, size in (([0, 1, 2, 3], 4), ([0, 1, 1, 3], 4), ([0, 2, 1, 3], 4), ([0, 1, 2], 4), ([1, 2, 3], 3),
                       ([0, None, 2], 3), ([0, 1, None], 3)):
        table = pl.DataFrame({"k": keys, "v": [10 * (k or 0) + i for i, k in enumerate(keys)]})
        want = (pl.DataFrame({"k": list(range(size))}).join(table, on="k", how="left", maintain_order="left")
                .drop("k"))
        assert dense_index.by_position(table, size).equals(want), keys


def test_read_from_an_empty_table_gives_nulls():
    laid_out = dense_index.by_position(pl.DataFrame(schema={"g": pl.UInt32, "n": pl.Int64}), 1)
    got = pl.DataFrame({"g": [0, 3]}).select(dense_index.read(laid_out, "n", pl.col("g")))
    assert got["n"].to_list() == [None, None]


def test_in_range_reads_skip_the_checks_and_covers_says_when_that_is_safe():
    laid_out = dense_index.by_position(pl.DataFrame({"k": [0, 1, 2], "v": [10, 11, 12]}), 3)
    keys = pl.Series("k", [2, None, 0])
    assert dense_index.covers(keys, 3) and not dense_index.covers(pl.Series([3]), 3) and not dense_index.covers(pl.Series([-1]), 3)
    assert dense_index.covers(pl.Series([None], dtype=pl.Int64), 3)
    got = keys.to_frame().select(dense_index.read(laid_out, "v", pl.col("k"), in_range=True))
    assert got["v"].to_list() == [12, None, 10]


def test_reduce_by_position_is_a_group_by_min_or_max_laid_out_with_nulls_where_no_row():
    # chunked differently from the key (as a computed column is from the window), nulls skipped
    values = pl.concat([pl.Series("t", [5, None, 7]), pl.Series("t", [2, 9])], rechunk=False)
    keys = pl.Series("k", [0, 1, 3, 3, 0], dtype=pl.UInt32)
    frame = pl.DataFrame([values, keys])
    for how in ("min", "max"):
        got = dense_index.reduce_by_position(values, keys, 5, how)
        want = (pl.DataFrame({"k": pl.arange(0, 5, dtype=pl.UInt32, eager=True)})
                .join(frame.group_by("k").agg(getattr(pl.col("t"), how)()), on="k", how="left", maintain_order="left"))
        assert got.to_list() == want["t"].to_list(), how
    floats = dense_index.reduce_by_position(pl.Series("ms", [1.5, 0.5, None], dtype=pl.Float32), keys.head(3), 4, "min")
    assert floats.dtype == pl.Float32 and floats.to_list() == [1.5, 0.5, None, None]


def test_any_by_position_gives_one_row_s_code_per_position_and_null_where_none():
    # chunked as the window comes (several chunks, keys spread over them), with a null value: it is skipped,
    # and a position whose only row is null stays null
    ops = pl.Enum(["all_reduce", "send", "recv"])
    values = pl.concat([pl.Series("op", ["send", None, "recv"], dtype=ops),
                        pl.Series("op", ["send", "all_reduce"], dtype=ops)], rechunk=False)
    keys = pl.concat([pl.Series("k", [3, 1, 0], dtype=pl.UInt32), pl.Series("k", [3, 4], dtype=pl.UInt32)],
                     rechunk=False)
    got = dense_index.any_by_position(values, keys, 6)
    assert got.dtype == pl.UInt8 and got.to_list() == [2, None, None, 1, 0, None]
    names = pl.Series(ops.categories)
    assert [None if c is None else names[c] for c in got.to_list()] == ["recv", None, None, "send", "all_reduce", None]
    groups = pl.Series("group", ["tp0", "dp1", "tp0"], dtype=pl.Categorical())
    codes = dense_index.any_by_position(groups, pl.Series([1, 0, 1], dtype=pl.UInt32), 2)
    assert codes.to_list() == groups.to_physical().gather([1, 0]).to_list()


def test_row_by_position_gives_the_last_row_of_each_position_across_chunks():
    keys = pl.concat([pl.Series("k", [3, 1, 0], dtype=pl.UInt32), pl.Series("k", [3, 4], dtype=pl.UInt32)],
                     rechunk=False)
    rows = dense_index.row_by_position(keys, 6)
    assert rows.to_list() == [2, 1, None, 3, 4, None]
    values = pl.Series(["a", "b", "c", "d", "e"])
    assert values.gather(rows).to_list() == ["c", "b", None, "d", "e", None]
    assert dense_index.row_by_position(keys.clear(), 0).len() == 0


def test_a_negative_peer_local_has_no_peer(make_job):
    """A peer's local rank outside its group (negative, or past its size) names no peer, never another
    group's member."""
    out, _ = make_job(synth.Job(tp=2, pp=2, dp=2, steps=1))
    trace = load(out)
    g = trace.members["group"][0]
    rows = pl.DataFrame({"group": [g, g, g, g], "peer_local": [0, -1, 99, None]},
                        schema={"group": trace.members.schema["group"], "peer_local": pl.Int64})
    got = rows.select(_peer_of(trace.members, trace.groups))["peer"].to_list()
    first = trace.members.filter(pl.col("group") == g).sort("local_rank")["rank"][0]
    assert got == [first, None, None, None]
