"""The parsed files' Arrow columns as raw frames (dumps, entries, pg_status, config, stacks): renamed and
typed, nothing inferred."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

from flightrec.ingest.column_builder import raw_values
from flightrec.model.schema import (
    ENTRIES,
    PG_STATUS,
    RANK_LISTS,
    RAW_PG_CONFIG,
    STACKS,
    conform,
    empty,
)
from flightrec.model.trace import DumpFile


def _printable(text: str | None) -> str | None:
    """A file name's text as UTF-8 can hold it: bytes that aren't UTF-8 (kept by Python as lone surrogates)
    become U+FFFD. For display only; files are opened by their `Path`."""
    return None if text is None else text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def assemble_raw(files: list[DumpFile], results: list[dict]) -> dict[str, pl.DataFrame]:
    metas = [m for r in results for m in r["metas"]]
    by_rank = {f.rank: f for f in files}
    dumps = pl.DataFrame({
        "rank": [m["rank"] for m in metas],
        "host": [_printable(by_rank[m["rank"]].host) for m in metas],
        "path": [_printable(str(by_rank[m["rank"]].path)) for m in metas],
        "format": [m["format"] for m in metas],
        "version": [m["version"] for m in metas],
        "backend": [m["backend"] for m in metas],
        "comm_lib_version": [m["comm_lib_version"] for m in metas],
        "entry_count": [m["entry_count"] for m in metas],
        # (when the file was written, where it was not copied since without its times: `dump_times`)
        "mtime_ns": [by_rank[m["rank"]].mtime_ns for m in metas],
        "problems": list_column("problems", [[_printable(p) for p in m["problems"]] for m in metas],
                                 pa.large_string()),
        "loaded": [m["loaded"] for m in metas],
        "unreadable": [m.get("unreadable", False) for m in metas],
        # which reader read it ("fast", "unpickler", "json"; none where refused), and why the fast one left it
        "reader": [m.get("reader") for m in metas],
        "fast_reader_declined": [m.get("fast_reader_declined") for m in metas],
    }, schema_overrides={"reader": pl.String, "fast_reader_declined": pl.String, "problems": pl.List(pl.String), "host": pl.String, "version": pl.String,
                         "backend": pl.String, "comm_lib_version": pl.String, "format": pl.String})
    entries = _entries_frame([r["entries"] for r in results if r["entries"] is not None])
    stacks: dict[int, list] = {}
    rank_lists: dict[int, str] = {}
    for r in results:
        stacks.update(r["stacks"])
        rank_lists.update(r["rank_lists"])
    return {
        "dumps": dumps,
        "entries": entries,
        "pg_config": _frame_from_tables([r["pg_config"] for r in results], RAW_PG_CONFIG),
        "rank_lists": pl.DataFrame({"ranks_key": list(rank_lists), "ranks_text": list(rank_lists.values())},
                                   schema=RANK_LISTS),
        "pg_status": _frame_from_tables([r["pg_status"] for r in results], PG_STATUS),
        "stacks": pl.DataFrame({"stack_id": list(stacks), "frames": list(stacks.values())},
                               schema=STACKS),
    }


def _frame_from_tables(tables: list[pa.Table], schema: pl.Schema) -> pl.DataFrame:
    """The workers' row tables (`flatten.rows_table`) as one frame of `schema`."""
    if not tables:
        return empty(schema)
    return conform(pl.from_arrow(pa.concat_tables(tables)), schema)


def list_column(name: str, lists: list[list | None], values_type: pa.DataType) -> pl.Series:
    """A list column from Python lists (null where a list is None), built as Arrow offsets and values: Polars
    builds a Series per inner list (50 ms for 8,192 ranks' lists of problems, nearly all empty; 30-40 ms for the
    3,105 groups' rank lists of 8,192 ranks)."""
    offsets = [0]
    for inner in lists:
        offsets.append(offsets[-1] + (len(inner) if inner is not None else 0))
    values = pa.array([v for inner in lists if inner is not None for v in inner], type=values_type)
    mask = pa.array([inner is None for inner in lists], type=pa.bool_())
    return pl.Series(name, pa.LargeListArray.from_arrays(pa.array(offsets, type=pa.int64()), values, mask=mask))


def _entries_frame(parts: list) -> pl.DataFrame:
    """Concatenate the workers' columns (tables, or spool files to memory-map) into the ENTRIES frame."""
    tables = [pa.ipc.open_file(pa.memory_map(p, "r")).read_all() if isinstance(p, str) else p for p in parts]
    if not tables:
        return empty(ENTRIES)
    table = pa.concat_tables(tables, promote_options="permissive")
    enums = {name: _as_enum(table.column(name), dtype) for name, dtype in ENTRIES.items()
             if isinstance(dtype, pl.Enum) and name in table.column_names}
    enums = {name: series for name, series in enums.items() if series is not None}
    frame = pl.from_arrow(table.drop_columns(list(enums)), rechunk=False)
    return conform(frame.with_columns(**enums) if enums else frame, ENTRIES)


_ENUM_CODES = {pl.UInt8: np.uint8, pl.UInt16: np.uint16, pl.UInt32: np.uint32}   # (an enum's physical type)


def _as_enum(column: pa.ChunkedArray, dtype: pl.Enum) -> pl.Series | None:
    """A dictionary column of `dtype`'s categories as that enum, each chunk's codes mapped to the enum's in one
    numpy gather. Read as a categorical and cast, it went through the texts: 13-15 ms a column of 1.6M rows
    (8,192 x 200), ~5% of the analysis after the pool. None where the column is no dictionary or holds a text
    outside `dtype`: the cast then reads it (and says which values are not categories)."""
    if not pa.types.is_dictionary(column.type):
        return None
    numpy_type = _ENUM_CODES.get(pl.Series([], dtype=dtype).to_physical().dtype)
    if numpy_type is None:   # (an enum kept in another physical type by some Polars: the cast's way)
        return None
    position = {category: i for i, category in enumerate(dtype.categories)}
    pieces = []
    for chunk in column.chunks:
        table = np.array([position.get(word, -1) for word in chunk.dictionary.to_pylist()], np.int64)
        if (table < 0).any():
            return None
        indices = chunk.indices
        if len(table) and indices.null_count < len(indices):
            # (under a null row the index is whatever the buffer holds: clipped into range, masked below)
            codes = np.take(table.astype(numpy_type), raw_values(indices), mode="clip")
        else:   # (every row null)
            codes = np.zeros(len(chunk), numpy_type)
        mask = np.asarray(indices.is_null()) if indices.null_count else None
        pieces.append(pl.from_arrow(pa.array(codes, mask=mask)).cat.to(dtype))
    if not pieces:
        return pl.Series([], dtype=dtype)
    return pieces[0] if len(pieces) == 1 else pl.concat(pieces, rechunk=False)
