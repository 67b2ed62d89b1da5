"""Turn one dump (plain Python data) into Arrow columns, right away, so the Python objects can be dropped.

This runs in worker processes, once per file. It interprets nothing beyond naming: it renames the keys of
every recorder version to one set of columns, normalizes the op name and reads the peer out of
`profiling_name`. A field of the wrong type becomes null and is noted in the dump's `problems`.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flightrec.model.schema import ANY_SOURCE, KNOWN_DUMP_VERSIONS, P2P_OPS, STATES, TRUNCATED

# Raw op names the writers emit (NCCL, Gloo, and older spellings) -> our vocabulary (schema.OPS).
_OP_ALIASES = {
    "all_reduce": "all_reduce", "allreduce": "all_reduce",
    "allreduce_coalesced": "all_reduce_coalesced", "all_reduce_coalesced": "all_reduce_coalesced",
    "all_gather": "all_gather", "allgather": "all_gather", "_allgather_base": "all_gather",
    "all_gather_into_tensor": "all_gather", "all_gather_base": "all_gather", "allgather_base": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather_coalesced", "allgather_coalesced": "all_gather_coalesced",
    "allgather_into_tensor_coalesced": "all_gather_coalesced",
    "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_coalesced",
    "reduce_scatter_coalesced": "reduce_scatter_coalesced",
    "all_to_all": "all_to_all", "alltoall": "all_to_all", "alltoall_base": "all_to_all",
    "all_to_all_single": "all_to_all",
    "broadcast": "broadcast", "reduce": "reduce", "gather": "gather", "scatter": "scatter",
    "barrier": "barrier", "send": "send", "recv": "recv", "coalesced": "coalesced",
    # spellings read from the 2.x writers
    "_all_gather_base": "all_gather", "all_gather_single": "all_gather",
    "reduce_scatter_single": "reduce_scatter",
    "all_to_all_v_single": "all_to_all", "all_reduce_barrier": "barrier", "_broadcast_oop": "broadcast",
    "_reduce_oop": "reduce", "all_reduce_sparse": "all_reduce", "sparse_all_reduce": "all_reduce",
    "recvanysource": "recv",
    # the c10d hook and torchcomms writers' names (research: PyTorch's hooks/FlightRecorderHook.cpp, torchcomms'
    # TorchCommHooks.hpp): the "_v" forms are uneven, their members' shapes differ by design
    "all_gather_v": "all_gather_v", "reduce_scatter_v": "reduce_scatter_v", "gather_single": "gather",
    "batch_op_issue": "p2p_batch", "split": "split", "new_window": "new_window",
}
# torch's dtype names -> the c10 ScalarType names the C++ writers record (`c10::toString`): PyTorch's analyzer
# tests write "float32", the profiler's CUPTI writer "torch.float32"; every C++ writer writes "Float".
_DTYPE_NAMES = {
    "float32": "Float", "float": "Float", "float64": "Double", "double": "Double", "float16": "Half",
    "half": "Half", "bfloat16": "BFloat16", "int8": "Char", "uint8": "Byte", "int16": "Short", "short": "Short",
    "int32": "Int", "int": "Int", "int64": "Long", "long": "Long", "bool": "Bool", "complex64": "ComplexFloat",
    "complex128": "ComplexDouble", "complex32": "ComplexHalf", "float8_e4m3fn": "Float8_e4m3fn",
    "float8_e5m2": "Float8_e5m2", "float8_e4m3fnuz": "Float8_e4m3fnuz", "float8_e5m2fnuz": "Float8_e5m2fnuz",
    "uint16": "UInt16", "uint32": "UInt32", "uint64": "UInt64",
}


def canonical_dtypes(joined: str | None) -> str | None:
    """'float32,torch.bfloat16' -> 'Float,BFloat16': a dtypes list (joined by ",") in the C++ writers' names."""
    if not joined:
        return joined
    return ",".join(_DTYPE_NAMES.get(d.strip().removeprefix("torch."), d) for d in joined.split(","))


_P2P_PEER = re.compile(r"(\d+)\s*(->|<-)\s*(\d+)")
_ANY_SOURCE = re.compile(r"\d+\s*<-\s*\?")


def normalize_op(profiling_name: str | None) -> tuple[str, int | None, str | None]:
    """'nccl:send 0->3' -> ('send', 3, 'nccl'): op, group-local peer, backend prefix."""
    if not isinstance(profiling_name, str) or not profiling_name:
        return "unknown", None, None
    backend, sep, rest = profiling_name.partition(":")
    if not sep:
        backend, rest = None, profiling_name
    word = rest.strip().split(" ", 1)[0].lower()
    op = _OP_ALIASES.get(word, "unknown")
    peer = None
    if op in ("send", "recv"):
        m = _P2P_PEER.search(rest)
        if m:
            peer = int(m.group(3))
        elif op == "recv" and _ANY_SOURCE.search(rest):
            peer = ANY_SOURCE
    return op, peer, backend


def _as_int(v: Any) -> int | None:
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, float) and math.isfinite(v):
        return int(v)
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            return None
    return None


def _as_float(v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def _as_bool(v: Any) -> bool | None:
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return bool(v)
    if isinstance(v, str) and v.lower() in ("true", "false", "1", "0"):
        return v.lower() in ("true", "1")
    return None


def _as_str(v: Any) -> str | None:
    if v is None:
        return None
    return v if isinstance(v, str) else str(v)


def _column(name: str, values: list, typ: pa.DataType, coerce: Callable[[Any], Any], problems: list[str]) -> pa.Array:
    """Fast path: Arrow converts the list in C. Slow path only when some value has the wrong type."""
    try:
        return pa.array(values, type=typ)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        fixed = [coerce(v) for v in values]
        bad = sum(1 for v, f in zip(values, fixed) if v is not None and f is None)
        if bad:
            problems.append(f"{bad} entries have a non-{typ} '{name}' (read as null)")
        try:
            return pa.array(fixed, type=typ)
        except OverflowError:
            problems.append(f"'{name}' holds values out of range (read as null)")
            return pa.array([f if f is None or abs(f) < 2**63 else None for f in fixed], type=typ)


_STATES = list(STATES)
_I64, _I32, _F64, _STR, _BOOL = pa.int64(), pa.int32(), pa.float64(), pa.string(), pa.bool_()
_I32_MAX = 2**31 - 1
_SIZES, _STRS = pa.list_(pa.list_(_I64)), pa.list_(_STR)

# Every entry key we read, across recorder versions, with its Arrow type. Missing keys come out null.
RAW_FIELDS = {
    "record_id": (_I64, "int"), "pg_id": (_I64, "int"), "process_group": (_STRS, "strs"),
    "collective_seq_id": (_I64, "int"), "seq_id": (_I64, "int"), "p2p_seq_id": (_I64, "int"),
    "op_id": (_I64, "int"), "profiling_name": (_STR, "str"), "time_created_ns": (_I64, "int"),
    "time_created_us": (_I64, "int"), "input_sizes": (_SIZES, "sizes"), "input_dtypes": (_STRS, "strs"),
    "output_sizes": (_SIZES, "sizes"), "output_dtypes": (_STRS, "strs"), "state": (_STR, "str"),
    "time_discovered_started_ns": (_I64, "int"), "time_discovered_completed_ns": (_I64, "int"),
    "retired": (_BOOL, "bool"), "timeout_ms": (_I64, "int"), "is_p2p": (_BOOL, "bool"),
    "duration_ms": (_F64, "float"), "thread_id": (_STR, "str"), "thread_name": (_STR, "str"),
}
RAW_STRUCT = pa.struct([(name, typ) for name, (typ, _) in RAW_FIELDS.items()])


def _raw_table(entries: list[dict], problems: list[str]) -> pa.Table:
    """Entries -> one Arrow column per raw key. Arrow walks the dicts in C (one pass, ~4 us an entry); only
    when some value has the wrong type does it go key by key with coercion, noting what was nulled."""
    try:
        table = pa.Table.from_struct_array(pa.array(entries, type=RAW_STRUCT))
        if not _text_as_characters(table):
            return table
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        pass
    coerce = {"int": _as_int, "float": _as_float, "bool": _as_bool, "str": _as_str, "strs": _as_str_list,
              "sizes": _as_sizes}
    columns = {}
    for name, (typ, kind) in RAW_FIELDS.items():
        values = [e.get(name) for e in entries]
        if kind == "strs" and any(isinstance(v, str) for v in values):
            values = [_as_str_list(v) for v in values]   # (not as characters: `_text_as_characters`)
        columns[name] = _column(name, values, typ, coerce[kind], problems)
    return pa.table(columns)


def _shape_columns(sizes: pa.ChunkedArray) -> tuple[pa.DictionaryArray, pa.Array]:
    """'[[1024, 8], [8]]' per entry (as Python prints the list; null where the list or any part of it is null),
    as a dictionary, and its element count (the sum over tensors of the product of dims), from the raw nested
    lists. A chunk holds a few hundred distinct shapes in 10^5-10^6 entries: entries are told apart by a hash of
    their dims (numpy passes), and text and count are made once per distinct shape. (The tape reader tells them
    apart in one compiled pass instead: `fastflat`.)"""
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
    text = pa.DictionaryArray.from_arrays(at, pa.array([str(shape) for shape in shapes], type=_STR))
    numel = pc.take(pa.array([_numel(shape) for shape in shapes], type=_I64), at)
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
    beside them: as the tape reader gives them (`fastflat`), from shapes it never builds as nested lists. The
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
    group's name and desc apart (GROUP_FIELDS): as the tape reader gives them (`fastflat`), which tells texts
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
    if low.as_py() is None or (low.as_py() >= -_I32_MAX - 1 and high.as_py() <= _I32_MAX):
        return pc.cast(arr, _I32)   # (every value fits, or none is there: no clamp to build)
    # (skip_nulls=False: a missing timeout stays null, not the clamp's bound)
    clamped = pc.max_element_wise(pc.min_element_wise(arr, _I32_MAX, skip_nulls=False), -_I32_MAX - 1,
                                  skip_nulls=False)
    return pc.cast(clamped, _I32)


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
    peers = [i[1] if i[1] is not None and (0 <= i[1] < _I32_MAX or i[1] == ANY_SOURCE) else None for i in infos]
    peer = pc.take(pa.array(peers, type=_I32), names.indices) if infos else pa.nulls(len(names), _I32)
    # The op as a dictionary over the distinct names' ops (a row without a name, or a name of no op known:
    # "unknown"), its codes taken per row: no text made per row and hashed again to encode it.
    ops = [i[0] or "unknown" for i in infos] + ["unknown"]
    distinct_ops = list(dict.fromkeys(ops))
    code_of_name = pa.array([distinct_ops.index(o) for o in ops], type=_I32)
    codes = names.indices if names.indices.null_count == 0 else pc.fill_null(names.indices, len(infos))
    op_codes = pc.take(code_of_name, codes)
    op = pa.DictionaryArray.from_arrays(op_codes, pa.array(distinct_ops, type=_STR))
    # A send or receive is point-to-point whatever the entry says: torchcomms writes is_p2p False for every
    # entry, its sends and receives included (research: torchcomms' FlightRecorder.cpp)
    by_op = pc.take(pa.array([o in P2P_OPS for o in distinct_ops], type=_BOOL), op_codes)
    is_p2p = pc.or_(pc.fill_null(raw["is_p2p"], False), by_op)
    # before recorder 2.1 entries name no group, only the local pg id, which is then the pg_config key
    pg_name = raw[GROUP_FIELDS[0]].combine_chunks()
    if pg_name.null_count:
        pg_name = pc.coalesce(pg_name.cast(_STR), pc.cast(raw["pg_id"], _STR))
    state = raw["state"].combine_chunks()
    if not set(state.dictionary.to_pylist()) <= set(_STATES):
        state = state.cast(_STR)
        state = pc.if_else(pc.or_(pc.is_in(state, pa.array(_STATES)), pc.is_null(state)), state, "unknown")
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
    return pa.DictionaryArray.from_arrays(pc.take(remap, column.indices), pa.array(distinct, type=_STR))


_CATEGORICAL = ("pg_name", "pg_desc", "op", "profiling_name", "state", "input_sizes", "output_sizes",
                "input_dtypes", "output_dtypes", "thread_id", "thread_name")
_TEXT = pa.dictionary(pa.int32(), _STR)

# What `derive_entries` hands over, whatever the chunk held: the parent gathers chunks column by column
# (`one_chunk`), so every chunk's types are these.
DERIVED_ENTRIES = pa.schema([
    ("rank", _I64), ("pg_name", _TEXT), ("pg_desc", _TEXT), ("pg_id", _I64), ("record_id", _I64),
    ("collective_seq_id", _I64), ("p2p_seq_id", _I64), ("op_id", _I64), ("op", _TEXT), ("profiling_name", _TEXT),
    ("is_p2p", _BOOL), ("peer_local", _I32), ("state", _TEXT), ("retired", _BOOL), ("timeout_ms", _I32),
    ("time_created_ns", _I64), ("time_started_ns", _I64), ("time_completed_ns", _I64),
    ("duration_ms", pa.float32()), ("input_sizes", _TEXT), ("output_sizes", _TEXT), ("input_dtypes", _TEXT),
    ("output_dtypes", _TEXT), ("input_numel", _I64), ("output_numel", _I64), ("thread_id", _TEXT),
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


def _as_str_list(v: Any) -> list[str] | None:
    if isinstance(v, (list, tuple)):
        return [x if isinstance(x, str) else str(x) for x in v]
    if isinstance(v, str):
        # one dtype written as a bare string (PyTorch's analyzer tests: "float32"; "" for none), not a list
        return [v] if v else []
    return None


def _text_as_characters(table: pa.Table) -> bool:
    """Arrow reads a bare string where a list of strings is expected as the list of its characters ("float32"
    -> f,l,o,a,t,3,2). The recorder writes one dtype per tensor, so a dtypes list longer or shorter than its
    sizes list is such a string (or a file that needs the careful, value-by-value way anyway)."""
    for dtypes, sizes in (("input_dtypes", "input_sizes"), ("output_dtypes", "output_sizes")):
        both = pc.and_(pc.is_valid(table[dtypes]), pc.is_valid(table[sizes]))
        differ = pc.not_equal(pc.list_value_length(table[dtypes]), pc.list_value_length(table[sizes]))
        if pc.any(pc.and_(both, differ)).as_py():
            return True
    return False


def _as_sizes(v: Any) -> list[list[int]] | None:
    if not isinstance(v, (list, tuple)):
        return None
    try:
        out = [[int(d) for d in shape] for shape in v]
    except (TypeError, ValueError):
        return None
    return out if all(abs(d) < 2**63 for shape in out for d in shape) else None


def _numel(sizes: Any) -> int | None:
    if not isinstance(sizes, list):
        return None
    try:
        count = sum(math.prod(shape) for shape in sizes)
    except TypeError:
        return None
    return count if -2**63 <= count < 2**63 else None   # (a hostile file's dims: no int64 holds the count)


def _stack_hash(frames: list) -> int:
    text = repr([(f.get("name"), f.get("filename"), f.get("line")) if isinstance(f, dict) else f for f in frames])
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def _stacks(frames_per_entry: list, problems: list[str]) -> tuple[list, dict[int, list]]:
    """Stack id per entry, and the distinct stacks. The writer shares frame dicts between entries (each entry
    has its own list of them, fixtures/writer_sharing), so the frames' identities find repeats cheaply (all
    stay alive meanwhile); the content hash makes ids agree across files."""
    by_identity: dict[tuple, int] = {}
    stacks: dict[int, list] = {}
    ids: list[int | None] = []
    for frames in frames_per_entry:
        if not frames or not isinstance(frames, list):
            ids.append(None)
            continue
        key = tuple(map(id, frames))
        sid = by_identity.get(key)
        if sid is None:
            sid = _stack_hash(frames)
            by_identity[key] = sid
            if sid not in stacks:
                stacks[sid] = [
                    {"name": _as_str(f.get("name")), "filename": _as_str(f.get("filename")),
                     "line": _as_int(f.get("line"))}
                    for f in frames if isinstance(f, dict)
                ]
        ids.append(sid)
    return ids, stacks


def flatten_dump(dump: dict, rank: int) -> dict[str, Any]:
    """Columns for one rank's dump, as a part (`merge_parts`) of one file: {'metas': [meta], 'entries',
    'pg_config', 'rank_lists', 'pg_status', 'stacks'}."""
    problems: list[str] = []
    if dump.get("_truncated"):
        problems.append(f"{TRUNCATED}: kept the {len(dump.get('entries') or [])} entries written before the cut")
    raw_entries = dump.get("entries", [])
    if raw_entries is None:
        raw_entries = []
    if not isinstance(raw_entries, list):
        problems.append(f"'entries' is a {type(raw_entries).__name__}, not a list (ignored)")
        raw_entries = []
    entries = [e for e in raw_entries if isinstance(e, dict)]
    if len(entries) != len(raw_entries):
        problems.append(f"{len(raw_entries) - len(entries)} entries are not dicts (ignored)")

    entries_table = _raw_table(entries, problems)
    stack_ids, stacks = _stacks([e.get("frames") for e in entries], problems)
    return assemble(dump, rank, entries_table, pa.array(stack_ids, type=pa.uint64()), stacks, problems)


def assemble(dump: dict, rank: int, entries_table: pa.Table, stack_ids: pa.Array, stacks: dict[int, list],
             problems: list[str]) -> dict[str, Any]:
    """`flatten_dump`'s result from the raw entry columns (RAW_FIELDS), their stack ids and the distinct
    stacks, and the dump's other keys (`dump['entries']` is not read): shared with the tape reader."""
    rank_lists: dict[int, str] = {}
    version = _as_str(dump.get("version"))
    # (a cut JSON dump lost its version with the keys after its entries: PyTorch writes them alphabetically)
    problems[:0] = [] if version is None and dump.get("_truncated") else version_problems(version)
    entries_table = entries_table.append_column("rank", pa.array([rank] * entries_table.num_rows, type=_I64))
    entries_table = entries_table.append_column("stack_id", stack_ids)
    names = entries_table["profiling_name"].unique().to_pylist() if entries_table.num_rows else []
    meta = file_meta(rank, version, {normalize_op(n)[2] for n in names},
                     _as_str(dump.get("comm_lib_version", dump.get("nccl_version"))), entries_table.num_rows, problems)
    return {
        "metas": [meta],
        "entries": entries_table,
        "pg_config": _pg_config_rows(dump.get("pg_config"), rank, problems, rank_lists),
        "rank_lists": rank_lists,
        "pg_status": _pg_status_rows(dump.get("pg_status"), rank, problems),
        "stacks": stacks,
    }


def version_problems(version: str | None) -> list[str]:
    if version is None:
        return ["no 'version' field"]
    if version not in KNOWN_DUMP_VERSIONS:
        return [f"recorder version {version} is newer than this flightrec knows; loaded the known fields"]
    return []


def file_meta(rank: int, version: str | None, backends: set, comm_lib_version: str | None, entry_count: int,
              problems: list[str]) -> dict[str, Any]:
    """A file's row of the dumps table (`format` and `loaded` are the reader's to add)."""
    backends = backends - {None}
    return {"rank": rank, "version": version, "backend": ",".join(sorted(backends)) if backends else None,
            "comm_lib_version": comm_lib_version, "entry_count": entry_count, "problems": problems}


# The group and status rows of a part as Arrow tables (`rows_table`): the Arrow twins of schema.RAW_PG_CONFIG and
# schema.PG_STATUS (a test keeps them so). A chunk's rows travel to the parent as columns: as tuples, unpickling
# them and building the frames a value at a time took the parent ~0.1 s at 8,192 ranks, while the workers waited.
PG_CONFIG_ROWS = pa.schema([("rank", _I64), ("pg_name", _STR), ("pg_desc", _STR), ("ranks_key", pa.uint64())])
PG_STATUS_ROWS = pa.schema([("rank", _I64), ("pg_id", _I64), ("last_enqueued", _I64), ("last_started", _I64),
                            ("last_completed", _I64)])


def rows_table(rows: list[tuple], schema: pa.Schema) -> pa.Table:
    """Row tuples (a part's 'pg_config' or 'pg_status') -> a table of `schema`, a column at a time."""
    columns = list(zip(*rows)) if rows else [()] * len(schema)
    return pa.table([pa.array(column, type=field.type) for field, column in zip(schema, columns)], schema=schema)


def merge_parts(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Parts (a file's, or a batch of files' from the tape reader) -> one, the entry tables concatenated
    (None when no file has entries)."""
    out: dict[str, Any] = {"metas": [], "entries": None, "pg_config": [], "rank_lists": {}, "pg_status": [],
                           "stacks": {}}
    tables = []
    for part in parts:
        out["metas"].extend(part["metas"])
        if part["entries"] is not None and part["entries"].num_rows:
            tables.append(part["entries"])
        out["pg_config"].extend(part["pg_config"])
        out["rank_lists"].update(part["rank_lists"])
        out["pg_status"].extend(part["pg_status"])
        out["stacks"].update(part["stacks"])
    if tables:
        if len({"process_group" in t.column_names for t in tables}) > 1:
            tables = [raw_derived(t) for t in tables]   # (the tape reader's parts beside the unpickler's)
        out["entries"] = pa.concat_tables(tables, promote_options="permissive")
    return out


def _pg_config_rows(pg_config: Any, rank: int, problems: list[str], rank_lists: dict[int, str]) -> list[tuple]:
    if pg_config is None:
        return []
    if not isinstance(pg_config, dict):
        problems.append(f"'pg_config' is a {type(pg_config).__name__}, not a dict (ignored)")
        return []
    rows = []
    for key, cfg in pg_config.items():
        if isinstance(cfg, list):  # recorder 1.4: {pg_id: [ranks]}
            cfg = {"name": str(key), "ranks": cfg}
        if not isinstance(cfg, dict):
            problems.append(f"pg_config[{key!r}] is not a dict (ignored)")
            continue
        name = _as_str(cfg.get("name")) or _as_str(key)
        ranks = cfg.get("ranks")
        ranks_text = (ranks if isinstance(ranks, str)
                      else repr(list(ranks)) if isinstance(ranks, (list, tuple)) else None)
        if not name and (not ranks_text or ranks_text.strip() in ("[]", "")):
            continue  # Gloo writes {'': {'name': '', 'desc': '', 'ranks': '[]'}}: no information
        # The world group's list is the same ~7 bytes x world size on every rank (1 MB at 131K ranks): keep
        # one copy per distinct list, keyed by a content hash that agrees across processes.
        key = None
        if ranks_text is not None:
            key = _rank_list_key(ranks_text)
            rank_lists[key] = ranks_text
        rows.append((rank, name, _as_str(cfg.get("desc")), key))
    return rows


@functools.lru_cache(maxsize=64)
def _rank_list_key(ranks_text: str) -> int:
    """The content hash of a rank list. Every file of a chunk carries the world group's (~110 KB at 16K
    ranks): hashed once, then found by the string's own (cached) hash."""
    return int.from_bytes(hashlib.blake2b(ranks_text.encode(), digest_size=8).digest(), "little")


def _pg_status_rows(pg_status: Any, rank: int, problems: list[str]) -> list[tuple]:
    if pg_status is None:
        return []
    if not isinstance(pg_status, dict):
        problems.append(f"'pg_status' is a {type(pg_status).__name__}, not a dict (ignored)")
        return []
    rows = []
    for key, st in pg_status.items():
        pg_id = _as_int(key)
        if pg_id is None or not isinstance(st, dict):
            problems.append(f"pg_status[{key!r}] is not readable (ignored)")
            continue
        rows.append((
            rank, pg_id,
            _as_int(st.get("last_enqueued_collective")),
            _as_int(st.get("last_started_collective")),
            _as_int(st.get("last_completed_collective")),
        ))
    return rows
