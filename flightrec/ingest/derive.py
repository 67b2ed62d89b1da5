"""Columns derived from the raw ones, vectorized over a chunk of files: each entry's shapes summed and hashed
(to compare members without comparing lists), texts joined, the op and dtype named in our vocabulary."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flightrec.ingest.values import BOOL, I32, I32_MAX, I64, STR, canonical_dtypes, normalize_op
from flightrec.model.schema import ANY_SOURCE, P2P_OPS, STATES


def _shape_columns(sizes: pa.ChunkedArray) -> tuple[pa.DictionaryArray, pa.Array]:
    """'[[1024, 8], [8]]' per entry (as Python prints the list; null where the list or any part of it is null),
    as a dictionary, and its element count (the sum over tensors of the product of dims), from the raw nested
    lists. A chunk holds a few hundred distinct shapes in 10^5-10^6 entries: entries are told apart by a hash of
    their dims (numpy passes), and text and count are made once per distinct shape. (The tape reader tells them
    apart in one compiled pass instead: `fastpickle.to_arrow`.)"""
    outer = sizes.combine_chunks()
    tensors = pc.list_flatten(outer)
    dims = pc.list_flatten(tensors)
    tensor_len = _lengths(tensors)
    entry_len = _lengths(outer)
    bad_dim = np.asarray(dims.is_null()).astype(np.int64)
    bad_tensor = np.asarray(tensors.is_null()) | (_segment_sum(bad_dim, tensor_len) > 0)
    null = np.asarray(outer.is_null()) | (_segment_sum(bad_tensor.astype(np.int64), entry_len) > 0)
    dim_values = pc.fill_null(dims, 0).to_numpy()
    with np.errstate(over="ignore"):
        tensor_key = _mix(_segment_hash(_mix(dim_values.astype(np.uint64)), tensor_len))
        entry_key = _mix(_segment_hash(tensor_key, entry_len))
    rows = np.flatnonzero(~null)
    _, first, inverse = np.unique(entry_key[rows], return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    shapes = [outer[int(row)].as_py() for row in rows[first]]
    indices = np.zeros(len(outer), np.int32)
    indices[rows] = inverse
    # The hash only proposes: each entry is checked against its shape's first entry, dim by dim, and one that
    # differs (two shapes with one hash: a crafted file's dims) gets its shape by value.
    differs = rows[_differs(rows, rows[first][inverse], entry_len, tensor_len, dim_values)]
    if len(differs):
        code = {str(shape): i for i, shape in enumerate(shapes)}
        for row in differs.tolist():
            shape = outer[row].as_py()
            if str(shape) not in code:
                code[str(shape)] = len(shapes)
                shapes.append(shape)
            indices[row] = code[str(shape)]
    return shape_dictionary(indices, null, shapes)


def masked_array(values: np.ndarray, type_: pa.DataType, present: np.ndarray) -> pa.Array:
    """`values` as an Arrow array of `type_` (cast as `pa.array` casts, refusing what doesn't fit), null where
    not `present`. The validity bitmap is packed by numpy: Arrow turns a mask into it a value at a time (~2% of
    a worker's instructions over a batch's columns), and a column with no null needs none."""
    arr = pa.array(values, type=type_)
    if present.all():
        return arr
    validity = pa.py_buffer(np.packbits(present, bitorder="little"))
    return pa.Array.from_buffers(type_, len(arr), [validity, arr.buffers()[1]],
                                 null_count=len(present) - int(np.count_nonzero(present)))


def shape_dictionary(indices: np.ndarray, null: np.ndarray, shapes: list) -> tuple[pa.DictionaryArray, pa.Array]:
    """Shape text (a dictionary) and element count per entry: entry i has `shapes[indices[i]]` (a Python list
    of lists of ints), or none where `null[i]`."""
    at = masked_array(indices.astype(np.int32, copy=False), pa.int32(), ~null)
    text = pa.DictionaryArray.from_arrays(at, pa.array([str(shape) for shape in shapes], type=STR))
    numel = pc.take(pa.array([_numel(shape) for shape in shapes], type=I64), at)
    return text, numel


# The raw sizes fields and the element counts derived with their text (`shapes_derived`)
SIZE_FIELDS = (("input_sizes", "input_numel"), ("output_sizes", "output_numel"))


# Text fields travel as dictionaries, lists of text joined by "," (dictionaries too), and the process group's
# [name, desc] as two dictionary columns (`texts_derived`)
TEXT_FIELDS = ("profiling_name", "state", "thread_id", "thread_name")


JOINED_FIELDS = ("input_dtypes", "output_dtypes")


GROUP_FIELDS = ("process_group_name", "process_group_desc")


def shapes_derived(raw: pa.Table) -> pa.Table:
    """`raw` (per-file columns) with its sizes fields as shape text (a dictionary) and their element counts
    beside them: as the tape reader gives them (`fastpickle.to_arrow`), from shapes it never builds as nested lists. The
    unpickler's way gives nested lists, derived here; a table derived already is returned as it is."""
    for name, numel_name in SIZE_FIELDS:
        column = raw[name]
        if pa.types.is_dictionary(column.type):
            continue
        text, numel = _shape_columns(column)
        raw = raw.set_column(raw.schema.get_field_index(name), name, text).append_column(numel_name, numel)
    return raw


def texts_derived(raw: pa.Table) -> pa.Table:
    """`raw` with its text fields as dictionaries, its lists of text joined (dictionaries too) and the process
    group's name and desc apart (GROUP_FIELDS): as the tape reader gives them (`fastpickle.to_arrow`), which tells texts
    apart once per batch and so never builds a row of text. The unpickler's way gives strings and lists,
    derived here; a table derived already is returned as it is."""
    if "process_group" not in raw.column_names:
        return raw
    columns: dict[str, Any] = {}
    for name in raw.column_names:
        column = raw[name]
        if name == "process_group":
            for i, group_field in enumerate(GROUP_FIELDS):
                columns[group_field] = pc.dictionary_encode(_list_get(column, i))
            continue
        if name in JOINED_FIELDS:
            column = pc.binary_join(column, ",")
        if name in TEXT_FIELDS or name in JOINED_FIELDS:
            column = pc.dictionary_encode(column)
        columns[name] = column
    return pa.table(columns)


def raw_derived(raw: pa.Table) -> pa.Table:
    """Per-file columns in the form the tape reader gives them (`shapes_derived`, `texts_derived`)."""
    return texts_derived(shapes_derived(raw))


_PRIME = np.uint64(1099511628211)


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _differs(rows: np.ndarray, reps: np.ndarray, entry_len: np.ndarray, tensor_len: np.ndarray,
             dim_values: np.ndarray) -> np.ndarray:
    """For each entry of `rows`, whether its shape differs from that of the entry `reps` gives it (same
    tensor count, then same dims per tensor, compared position by position)."""
    bad = entry_len[rows] != entry_len[reps]
    same_count = np.flatnonzero(~bad)
    tensor_at = np.cumsum(entry_len) - entry_len
    a, b, owner = _paired(tensor_at[rows[same_count]], tensor_at[reps[same_count]], entry_len[rows[same_count]])
    owner = same_count[owner]
    unequal = tensor_len[a] != tensor_len[b]
    bad[owner[unequal]] = True
    dim_at = np.cumsum(tensor_len) - tensor_len
    keep = ~unequal
    da, db, dim_owner = _paired(dim_at[a[keep]], dim_at[b[keep]], tensor_len[a[keep]])
    bad[owner[keep][dim_owner[dim_values[da] != dim_values[db]]]] = True
    return bad


def _paired(a_start: np.ndarray, b_start: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Positions of segments laid side by side: (a_start[i] + k, b_start[i] + k, i) for k < lengths[i]."""
    owner = np.repeat(np.arange(len(lengths)), lengths)
    within = np.arange(len(owner)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return a_start[owner] + within, b_start[owner] + within, owner


def _lengths(lists: pa.Array) -> np.ndarray:
    return pc.fill_null(pc.list_value_length(lists), 0).to_numpy().astype(np.int64)


def _segment_sum(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Sum of each consecutive segment of `values` (segment i holds lengths[i] of them)."""
    out = np.zeros(len(lengths), values.dtype)
    nonempty = lengths > 0
    if nonempty.any():
        out[nonempty] = np.add.reduceat(values, (np.cumsum(lengths) - lengths)[nonempty])
    return out


def _segment_hash(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """A uint64 hash of each segment's values in order, and its length (callers silence overflow)."""
    starts = np.cumsum(lengths) - lengths
    within = np.arange(len(values)) - np.repeat(starts, lengths)
    powers = np.cumprod(np.full(int(lengths.max(initial=0)) + 1, _PRIME, dtype=np.uint64))
    terms = (values * _GOLDEN + np.uint64(1)) * powers[within]
    return _segment_sum(terms, lengths) ^ (lengths.astype(np.uint64) * _GOLDEN)


def _mix(h: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: the next level's polynomial then sees well-spread inputs."""
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


def _saturated_int32(arr: pa.ChunkedArray) -> pa.ChunkedArray:
    """Int64 -> int32, out-of-range values clamped (a timeout past 24 days reads as 24 days). Narrow columns
    that are never keys keep the entries frame small: 4 bytes a row is 120 MB at 31M entries."""
    low, high = pc.min_max(arr).values()
    if low.as_py() is None or (low.as_py() >= -I32_MAX - 1 and high.as_py() <= I32_MAX):
        return pc.cast(arr, I32)   # (every value fits, or none is there: no clamp to build)
    # (skip_nulls=False: a missing timeout stays null, not the clamp's bound)
    clamped = pc.max_element_wise(pc.min_element_wise(arr, I32_MAX, skip_nulls=False), -I32_MAX - 1,
                                  skip_nulls=False)
    return pc.cast(clamped, I32)


def _zero_to_null(arr: pa.ChunkedArray) -> pa.ChunkedArray:
    """The JSON writer puts 0 where the pickle has None. (A column without a 0, as a pickle's, is kept as is.)"""
    zero = pc.equal(arr, 0)
    if not pc.any(zero).as_py():
        return arr
    return pc.if_else(zero, pa.scalar(None, arr.type), arr)


def _coalesce(first: pa.ChunkedArray, older: pa.ChunkedArray,
              convert: Callable[[pa.ChunkedArray], pa.ChunkedArray] | None = None) -> pa.ChunkedArray:
    """`first`, its nulls filled from an older recorder's field (`convert`ed): computed only where both hold
    something to fill, else `first` as it is (a pass and an array less per column)."""
    if first.null_count == 0 or older.null_count == len(older):
        return first
    return pc.coalesce(first, convert(older) if convert else older)


def derive_entries(raw: pa.Table) -> pa.Table:
    """Raw per-file columns (a whole chunk of files at once) -> the ENTRIES columns except `group`/`peer`.

    Vectorized in Arrow (workers must not use Polars: its thread pool is not fork-safe). Python runs once per
    distinct profiling name, never per entry. Text columns stay the dictionaries they come as
    (`raw_derived`): a rule about a text (a known state, a group named) is checked once per distinct one."""
    raw = raw_derived(raw)
    names = raw["profiling_name"].combine_chunks()
    infos = [normalize_op(n) for n in names.dictionary.to_pylist()]
    peers = [i[1] if i[1] is not None and (0 <= i[1] < I32_MAX or i[1] == ANY_SOURCE) else None for i in infos]
    peer = pc.take(pa.array(peers, type=I32), names.indices) if infos else pa.nulls(len(names), I32)
    # The op as a dictionary over the distinct names' ops (a row without a name, or a name of no op known:
    # "unknown"), its codes taken per row: no text made per row and hashed again to encode it.
    ops = [i[0] or "unknown" for i in infos] + ["unknown"]
    distinct_ops = list(dict.fromkeys(ops))
    code_of_name = pa.array([distinct_ops.index(o) for o in ops], type=I32)
    codes = names.indices if names.indices.null_count == 0 else pc.fill_null(names.indices, len(infos))
    op_codes = pc.take(code_of_name, codes)
    op = pa.DictionaryArray.from_arrays(op_codes, pa.array(distinct_ops, type=STR))
    # A send or receive is point-to-point whatever the entry says: torchcomms writes is_p2p False for every
    # entry, its sends and receives included (research: torchcomms' FlightRecorder.cpp)
    by_op = pc.take(pa.array([o in P2P_OPS for o in distinct_ops], type=BOOL), op_codes)
    is_p2p = pc.or_(pc.fill_null(raw["is_p2p"], False), by_op)
    # before recorder 2.1 entries name no group, only the local pg id, which is then the pg_config key
    pg_name = raw[GROUP_FIELDS[0]].combine_chunks()
    if pg_name.null_count:
        pg_name = pc.coalesce(pg_name.cast(STR), pc.cast(raw["pg_id"], STR))
    state = raw["state"].combine_chunks()
    if not set(state.dictionary.to_pylist()) <= set(STATES):
        state = state.cast(STR)
        state = pc.if_else(pc.or_(pc.is_in(state, pa.array(list(STATES))), pc.is_null(state)), state, "unknown")
    created = _coalesce(raw["time_created_ns"], raw["time_created_us"], lambda us: pc.multiply(us, 1000))
    (in_text, in_numel), (out_text, out_numel) = ((raw[name], raw[numel]) for name, numel in SIZE_FIELDS)
    table = pa.table({
        "rank": raw["rank"],
        "pg_name": pg_name,
        "pg_desc": raw[GROUP_FIELDS[1]],
        "pg_id": raw["pg_id"],
        "record_id": raw["record_id"],
        "collective_seq_id": _coalesce(raw["collective_seq_id"], raw["seq_id"]),
        "p2p_seq_id": raw["p2p_seq_id"],
        "op_id": raw["op_id"],
        "op": op,
        "profiling_name": names,
        "is_p2p": is_p2p,
        "peer_local": peer,
        "state": state,
        "retired": raw["retired"],
        "timeout_ms": _saturated_int32(raw["timeout_ms"]),
        "time_created_ns": _zero_to_null(created),
        "time_started_ns": _zero_to_null(raw["time_discovered_started_ns"]),
        "time_completed_ns": _zero_to_null(raw["time_discovered_completed_ns"]),
        "duration_ms": pc.cast(raw["duration_ms"], pa.float32()),
        "input_sizes": in_text,
        "output_sizes": out_text,
        "input_dtypes": _canonical_dtype_column(raw["input_dtypes"]),
        "output_dtypes": _canonical_dtype_column(raw["output_dtypes"]),
        "input_numel": in_numel,
        "output_numel": out_numel,
        "thread_id": raw["thread_id"],
        "thread_name": raw["thread_name"],
        "stack_id": raw["stack_id"],
    }).combine_chunks()
    # Repeating strings travel as dictionaries: the parent then maps a few hundred distinct values per chunk
    # to Categoricals instead of hashing every row.
    for name in _CATEGORICAL:
        i = table.schema.get_field_index(name)
        if not pa.types.is_dictionary(table.schema.field(i).type):
            table = table.set_column(i, name, pc.dictionary_encode(table[name]))
    return table if table.schema == DERIVED_ENTRIES else table.cast(DERIVED_ENTRIES)


def _canonical_dtype_column(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """`canonical_dtypes` over a dictionary column's few distinct values (every C++ writer's are kept as they
    are: the common case is no change, and no copy)."""
    column = column.combine_chunks()
    if not pa.types.is_dictionary(column.type):
        return column
    values = column.dictionary.to_pylist()
    renamed = [canonical_dtypes(v) for v in values]
    if renamed == values:
        return column
    distinct = list(dict.fromkeys(renamed))   # ("float32" and "Float" are one value now)
    remap = pa.array([distinct.index(v) for v in renamed], type=column.indices.type)
    return pa.DictionaryArray.from_arrays(pc.take(remap, column.indices), pa.array(distinct, type=STR))


_CATEGORICAL = ("pg_name", "pg_desc", "op", "profiling_name", "state", "input_sizes", "output_sizes",
                "input_dtypes", "output_dtypes", "thread_id", "thread_name")


_TEXT = pa.dictionary(pa.int32(), STR)


# What `derive_entries` hands over, whatever the chunk held: the parent gathers chunks column by column
# (`one_chunk`), so every chunk's types are these.
DERIVED_ENTRIES = pa.schema([
    ("rank", I64), ("pg_name", _TEXT), ("pg_desc", _TEXT), ("pg_id", I64), ("record_id", I64),
    ("collective_seq_id", I64), ("p2p_seq_id", I64), ("op_id", I64), ("op", _TEXT), ("profiling_name", _TEXT),
    ("is_p2p", BOOL), ("peer_local", I32), ("state", _TEXT), ("retired", BOOL), ("timeout_ms", I32),
    ("time_created_ns", I64), ("time_started_ns", I64), ("time_completed_ns", I64),
    ("duration_ms", pa.float32()), ("input_sizes", _TEXT), ("output_sizes", _TEXT), ("input_dtypes", _TEXT),
    ("output_dtypes", _TEXT), ("input_numel", I64), ("output_numel", I64), ("thread_id", _TEXT),
    ("thread_name", _TEXT), ("stack_id", pa.uint64()),
])


def _list_get(lists: pa.ChunkedArray, i: int) -> pa.Array:
    """Element i of each list, null where the list is null or shorter. Taken from the items by offset: a
    choice between lists (`if_else`) copies every list, 6x slower."""
    arr = lists.combine_chunks()
    offsets = arr.offsets.to_numpy()
    there = np.diff(offsets) > i
    if arr.null_count:
        there &= ~np.asarray(arr.is_null())
    return arr.values.take(pa.array(offsets[:-1] + i, mask=~there))


def _numel(sizes: Any) -> int | None:
    if not isinstance(sizes, list):
        return None
    try:
        count = sum(math.prod(shape) for shape in sizes)
    except TypeError:
        return None
    return count if -2**63 <= count < 2**63 else None   # (a hostile file's dims: no int64 holds the count)
