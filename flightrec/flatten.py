"""Turn one dump (plain Python data) into Arrow columns, right away, so the Python objects can be dropped.

This runs in worker processes, once per file. It interprets nothing beyond naming: it renames the keys of
every recorder version to one set of columns, normalizes the op name and reads the peer out of
`profiling_name`. A field of the wrong type becomes null and is noted in the dump's `problems`.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any, Callable

import pyarrow as pa

from .schema import KNOWN_DUMP_VERSIONS

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
    # spellings read from the 2.x writers (see docs/format.md)
    "_all_gather_base": "all_gather", "all_gather_single": "all_gather", "all_gather_v": "all_gather",
    "reduce_scatter_single": "reduce_scatter", "reduce_scatter_v": "reduce_scatter",
    "all_to_all_v_single": "all_to_all", "all_reduce_barrier": "barrier", "_broadcast_oop": "broadcast",
    "_reduce_oop": "reduce", "all_reduce_sparse": "all_reduce", "sparse_all_reduce": "all_reduce",
    "recvanysource": "recv",
}
_P2P_PEER = re.compile(r"(\d+)\s*(->|<-)\s*(\d+)")


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


def _shape_text(sizes: Any) -> str | None:
    if sizes is None:
        return None
    return repr(sizes) if isinstance(sizes, list) else None


def _numel(sizes: Any) -> int | None:
    if not isinstance(sizes, list):
        return None
    try:
        return sum(math.prod(shape) for shape in sizes)
    except TypeError:
        return None


def _dtypes_text(dtypes: Any) -> str | None:
    if isinstance(dtypes, list):
        return ",".join(str(d) for d in dtypes)
    return None


def _stack_hash(frames: list) -> int:
    text = repr([(f.get("name"), f.get("filename"), f.get("line")) if isinstance(f, dict) else f for f in frames])
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def _stacks(frames_per_entry: list, problems: list[str]) -> tuple[list, dict[int, list]]:
    """Stack id per entry, and the distinct stacks. The writer shares frame objects between entries, so
    object identity finds repeats cheaply; the content hash makes ids agree across files."""
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
                    {"name": _as_str(f.get("name")), "filename": _as_str(f.get("filename")), "line": _as_int(f.get("line"))}
                    for f in frames if isinstance(f, dict)
                ]
        ids.append(sid)
    return ids, stacks


def _created_ns(entries: list[dict]) -> list:
    """torch 2.2 wrote microseconds under `time_created_us`."""
    out = []
    for e in entries:
        v = e.get("time_created_ns")
        if v is None and "time_created_us" in e:
            us = _as_int(e["time_created_us"])
            v = us * 1000 if us is not None else None
        out.append(v)
    return out


def flatten_dump(dump: dict, rank: int) -> dict[str, Any]:
    """Columns for one rank's dump: {'meta', 'entries', 'pg_config', 'pg_status', 'stacks'}."""
    problems: list[str] = []
    version = _as_str(dump.get("version"))
    if version is None:
        problems.append("no 'version' field")
    elif version not in KNOWN_DUMP_VERSIONS:
        problems.append(f"recorder version {version} is newer than this flightrec knows; loaded the known fields")

    raw_entries = dump.get("entries", [])
    if raw_entries is None:
        raw_entries = []
    if not isinstance(raw_entries, list):
        problems.append(f"'entries' is a {type(raw_entries).__name__}, not a list (ignored)")
        raw_entries = []
    entries = [e for e in raw_entries if isinstance(e, dict)]
    if len(entries) != len(raw_entries):
        problems.append(f"{len(raw_entries) - len(entries)} entries are not dicts (ignored)")

    def get(key: str, *older: str) -> list:
        if older:
            return [e.get(key, next((e[o] for o in older if o in e), None)) for e in entries]
        return [e.get(key) for e in entries]

    names = get("profiling_name")
    parsed = [normalize_op(n) for n in names]
    pgs = get("process_group")
    pg_ids = get("pg_id")
    # Before recorder 2.1 entries name no group, only the local pg id, which is also the pg_config key then.
    pg_name = [_as_str(p[0]) if isinstance(p, (list, tuple)) and p else (_as_str(p) if p is not None else _as_str(i))
               for p, i in zip(pgs, pg_ids)]
    pg_desc = [_as_str(p[1]) if isinstance(p, (list, tuple)) and len(p) > 1 else None for p in pgs]
    in_sizes, out_sizes = get("input_sizes"), get("output_sizes")
    stack_ids, stacks = _stacks(get("frames"), problems)
    states = [s if s in ("scheduled", "started", "completed") else ("unknown" if s is not None else None)
              for s in get("state")]

    def zero_is_null(values: list) -> list:
        return [None if v == 0 or v == "0" else v for v in values]

    i64, f64, s = pa.int64(), pa.float64(), pa.string()
    cols = {
        "rank": pa.array([rank] * len(entries), type=i64),
        "pg_name": pa.array(pg_name, type=s),
        "pg_desc": pa.array(pg_desc, type=s),
        "pg_id": _column("pg_id", pg_ids, i64, _as_int, problems),
        "record_id": _column("record_id", get("record_id"), i64, _as_int, problems),
        "collective_seq_id": _column("collective_seq_id", get("collective_seq_id", "seq_id"), i64, _as_int, problems),
        "p2p_seq_id": _column("p2p_seq_id", get("p2p_seq_id"), i64, _as_int, problems),
        "op_id": _column("op_id", get("op_id"), i64, _as_int, problems),
        "op": pa.array([p[0] for p in parsed], type=s),
        "profiling_name": pa.array([_as_str(n) for n in names], type=s),
        "is_p2p": _column("is_p2p", [v if v is not None else p[0] in ("send", "recv")
                                     for v, p in zip(get("is_p2p"), parsed)], pa.bool_(), _as_bool, problems),
        "peer_local": pa.array([p[1] for p in parsed], type=i64),
        "state": pa.array(states, type=s),
        "retired": _column("retired", get("retired"), pa.bool_(), _as_bool, problems),
        "timeout_ms": _column("timeout_ms", get("timeout_ms"), i64, _as_int, problems),
        "time_created_ns": _column("time_created_ns", zero_is_null(_created_ns(entries)), i64, _as_int, problems),
        "time_started_ns": _column(
            "time_discovered_started_ns", zero_is_null(get("time_discovered_started_ns")), i64, _as_int, problems),
        "time_completed_ns": _column(
            "time_discovered_completed_ns", zero_is_null(get("time_discovered_completed_ns")), i64, _as_int, problems),
        "duration_ms": _column("duration_ms", get("duration_ms"), f64, _as_float, problems),
        "input_sizes": pa.array([_shape_text(x) for x in in_sizes], type=s),
        "output_sizes": pa.array([_shape_text(x) for x in out_sizes], type=s),
        "input_dtypes": pa.array([_dtypes_text(x) for x in get("input_dtypes")], type=s),
        "output_dtypes": pa.array([_dtypes_text(x) for x in get("output_dtypes")], type=s),
        "input_numel": pa.array([_numel(x) for x in in_sizes], type=i64),
        "output_numel": pa.array([_numel(x) for x in out_sizes], type=i64),
        "thread_id": pa.array([_as_str(x) for x in get("thread_id")], type=s),
        "thread_name": pa.array([_as_str(x) for x in get("thread_name")], type=s),
        "stack_id": pa.array(stack_ids, type=pa.uint64()),
    }
    entries_table = pa.table(cols)

    backends = {p[2] for p in parsed if p[2]}
    meta = {
        "rank": rank,
        "version": version,
        "backend": ",".join(sorted(backends)) if backends else None,
        "comm_lib_version": _as_str(dump.get("comm_lib_version", dump.get("nccl_version"))),
        "entry_count": len(entries),
        "problems": problems,
    }
    return {
        "meta": meta,
        "entries": entries_table,
        "pg_config": _pg_config_rows(dump.get("pg_config"), rank, problems),
        "pg_status": _pg_status_rows(dump.get("pg_status"), rank, problems),
        "stacks": stacks,
    }


def _pg_config_rows(pg_config: Any, rank: int, problems: list[str]) -> list[tuple]:
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
        ranks_text = ranks if isinstance(ranks, str) else (repr(list(ranks)) if isinstance(ranks, (list, tuple)) else None)
        if not name and (not ranks_text or ranks_text.strip() in ("[]", "")):
            continue  # Gloo writes {'': {'name': '', 'desc': '', 'ranks': '[]'}}: no information
        rows.append((rank, name, _as_str(cfg.get("desc")), ranks_text))
    return rows


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
