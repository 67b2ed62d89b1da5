"""Gathering the workers' entry tables into one chunk per column (flightrec/column_builder.py)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flightrec.ingest.column_builder import OneChunkTable

TEXT = pa.dictionary(pa.int32(), pa.string())
SCHEMA = pa.schema([("n", pa.int64()), ("small", pa.int32()), ("f", pa.float32()), ("id", pa.uint64()),
                    ("flag", pa.bool_()), ("word", TEXT)])

WORDS = st.sampled_from(["send", "recv", "all_reduce", "", "ü", None])
ROW = st.tuples(*(st.one_of(st.none(), values) for values in (
    st.integers(-2**63, 2**63 - 1), st.integers(-2**31, 2**31 - 1), st.floats(width=32, allow_nan=False),
    st.integers(0, 2**64 - 1), st.booleans())), WORDS)


def _table(rows: list[tuple], null_in_dictionary: bool = False) -> pa.Table:
    columns = list(zip(*rows)) if rows else [()] * len(SCHEMA)
    arrays = [pa.array(c, type=f.type.value_type if pa.types.is_dictionary(f.type) else f.type)
              for f, c in zip(SCHEMA, columns)]
    words = arrays[-1]
    if null_in_dictionary:   # a dictionary that holds a null among its values, as a writer may make
        distinct = pa.array(sorted({w for w in words.to_pylist() if w is not None}) + [None], pa.string())
        index = {w: i for i, w in enumerate(distinct.to_pylist())}
        arrays[-1] = pa.DictionaryArray.from_arrays(pa.array([index[w] for w in words.to_pylist()], pa.int32()),
                                                    distinct)
    else:
        arrays[-1] = words.dictionary_encode()
    return pa.table(arrays, schema=SCHEMA)


def _plain(table: pa.Table) -> list[dict]:
    return table.cast(pa.schema([(f.name, f.type.value_type if pa.types.is_dictionary(f.type) else f.type)
                                 for f in table.schema])).to_pylist()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(ROW, max_size=40), st.booleans(), st.integers(1, 60)), max_size=6),
       st.integers(1, 64))
def test_gathered_tables_read_as_their_concatenation(parts, capacity):
    """Any tables of the schema, nulls anywhere (in values or in a dictionary), each with its own dictionary,
    gathered from the smallest start (a page a column; tables of up to 2,400 rows, so columns grow with rows
    in them) read as the tables one after another, in one chunk per column."""
    gathered = OneChunkTable(SCHEMA, capacity_rows=capacity)
    tables = [_table(rows * repeat, null_in_dictionary) for rows, null_in_dictionary, repeat in parts]
    for table in tables:
        gathered.add(table)
    out = gathered.finish()
    out.validate(full=True)
    word = out.column("word").chunk(0)   # every index is in range, even under a null (readers may not check)
    assert word.type.index_type == pa.uint16()   # (two bytes a row while the dictionary is small)
    raw = np.frombuffer(word.indices.buffers()[1], np.uint16, count=len(word)) if len(word) else np.zeros(0)
    assert ((raw >= 0) & (raw < max(1, len(word.dictionary)))).all()
    assert out.schema.names == SCHEMA.names and all(c.num_chunks == 1 for c in out.columns)
    assert _plain(out) == [row for t in tables for row in _plain(t)]
    words = out.column("word").chunk(0).dictionary.to_pylist()
    assert len(words) == len(set(words)) and None not in words   # one entry per text, for the whole job


def test_a_table_is_copied_in_and_can_go(tmp_path):
    """add() copies: the table (here memory-mapped from a file that is then removed) is not needed after."""
    table = _table([(1, 2, 0.5, 3, True, "x"), (None, None, None, None, None, None)])
    path = tmp_path / "chunk.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, SCHEMA) as writer:
        writer.write_table(table)
    gathered = OneChunkTable(SCHEMA)
    with pa.memory_map(str(path), "r") as source:
        gathered.add(pa.ipc.open_file(source).read_all())
    path.unlink()
    assert _plain(gathered.finish()) == _plain(table)


def test_a_table_of_other_columns_is_refused():
    gathered = OneChunkTable(SCHEMA)
    with pytest.raises(ValueError, match="schema"):
        gathered.add(pa.table({"n": pa.array([1], pa.int64())}))
    with pytest.raises(ValueError, match="int32 indices"):
        OneChunkTable(pa.schema([("w", pa.dictionary(pa.int8(), pa.string()))]))


def test_codes_widen_to_four_bytes_past_65536_texts():
    """A text column whose dictionary outgrows two-byte codes mid-way keeps every row: the codes so far are
    copied into four-byte ones."""
    many = [f"shape-{i}" for i in range(70_000)]
    first = [(i, None, None, None, None, "send") for i in range(5)]
    second = [(i, None, None, None, None, w) for i, w in enumerate(many)]
    gathered = OneChunkTable(SCHEMA, capacity_rows=8)
    tables = [_table(first), _table(second), _table(first)]
    for table in tables:
        gathered.add(table)
    out = gathered.finish()
    assert out.column("word").type.index_type == pa.int32()
    assert _plain(out) == [row for t in tables for row in _plain(t)]


def test_columns_grow_by_copying_where_maps_cannot_be_resized(monkeypatch):
    """Where the system has no mremap (macOS: Python's resize raises SystemError), a column grows into a new
    map with the old one copied in, and reads the same."""
    from flightrec.ingest import column_builder

    def no_mremap(old, size):
        return column_builder._copied(old, size)

    monkeypatch.setattr(column_builder, "_grown", no_mremap)
    rows = [(i, i, float(i), i, i % 2 == 0, ["send", "recv", None][i % 3]) for i in range(5000)]
    gathered = OneChunkTable(SCHEMA, capacity_rows=1)
    tables = [_table(rows[:700]), _table(rows[700:3000]), _table(rows[3000:])]   # (grown with rows in: 8 KB+)
    for table in tables:
        gathered.add(table)
    assert _plain(gathered.finish()) == [row for t in tables for row in _plain(t)]
