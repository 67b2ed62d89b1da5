"""Turn one dump (plain Python data) into Arrow columns, right away, so the Python objects can be dropped.

This runs in worker processes, once per file. It interprets nothing beyond naming: it renames the keys of
every recorder version to one set of columns, normalizes the op name and reads the peer out of
`profiling_name`. A field of the wrong type becomes null and is noted in the dump's `problems`.
"""

from __future__ import annotations

import hashlib
import math
import re
from operator import itemgetter
from typing import Any, Callable

import polars as pl
import pyarrow as pa

from .schema import ENTRIES, KNOWN_DUMP_VERSIONS, STATES, conform

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


def _as_str_list(v: Any) -> list[str] | None:
    if isinstance(v, (list, tuple)):
        return [x if isinstance(x, str) else str(x) for x in v]
    return None


def _as_sizes(v: Any) -> list[list[int]] | None:
    if not isinstance(v, (list, tuple)):
        return None
    try:
        out = [[int(d) for d in shape] for shape in v]
    except (TypeError, ValueError):
        return None
    return out if all(abs(d) < 2**63 for shape in out for d in shape) else None


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


def _stack_hash(frames: list) -> int:
    text = repr([(f.get("name"), f.get("filename"), f.get("line")) if isinstance(f, dict) else f for f in frames])
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


_OPTIONAL_KEYS = frozenset({"duration_ms", "frames"})  # absent from an entry when unknown / not captured


def _transpose(entries: list[dict]) -> dict[str, list]:
    """Entries (dicts) -> columns: one C-level itemgetter call an entry for the keys every entry has; keys
    only some entries carry (duration_ms, frames, or anything unusual) go key by key."""
    if not entries:
        return {}
    first, last = entries[0], entries[-1]
    keys = sorted((first.keys() & last.keys()) - _OPTIONAL_KEYS)
    rare = (first.keys() | last.keys() | _OPTIONAL_KEYS) - set(keys)
    columns: dict[str, list] = {}
    try:
        if len(keys) > 1:
            columns.update(zip(keys, map(list, zip(*map(itemgetter(*keys), entries)))))
        elif keys:
            columns[keys[0]] = [e[keys[0]] for e in entries]
    except KeyError:  # some entry lacks a key the first and last have: take every key the slow way
        rare |= set(keys)
        columns.clear()
    for key in rare:
        values = [e.get(key) for e in entries]
        if any(v is not None for v in values):
            columns[key] = values
    return columns


def _stacks(frames_per_entry: list, problems: list[str]) -> tuple[list, dict[int, list]]:
    """Stack id per entry, and the distinct stacks. The writer shares frame objects between entries, so
    object identity finds repeats cheaply; the content hash makes ids agree across files."""
    by_identity: dict[tuple, int] = {}
    by_list: dict[int, int] = {}  # the writer often shares the whole list too (all ids stay alive meanwhile)
    stacks: dict[int, list] = {}
    ids: list[int | None] = []
    for frames in frames_per_entry:
        if not frames or not isinstance(frames, list):
            ids.append(None)
            continue
        sid = by_list.get(id(frames))
        if sid is not None:
            ids.append(sid)
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
        by_list[id(frames)] = sid
        ids.append(sid)
    return ids, stacks


def flatten_dump(dump: dict, rank: int) -> dict[str, Any]:
    """Columns for one rank's dump: {'meta', 'entries', 'pg_config', 'pg_status', 'stacks'}."""
    problems: list[str] = []
    rank_lists: dict[int, str] = {}
    version = _as_str(dump.get("version"))
    if version is None:
        problems.append("no 'version' field")
    elif version not in KNOWN_DUMP_VERSIONS:
        problems.append(f"recorder version {version} is newer than this flightrec knows; loaded the known fields")

    if dump.get("_truncated"):
        problems.append(f"truncated file: kept the {len(dump.get('entries') or [])} entries written before the cut")
    raw_entries = dump.get("entries", [])
    if raw_entries is None:
        raw_entries = []
    if not isinstance(raw_entries, list):
        problems.append(f"'entries' is a {type(raw_entries).__name__}, not a list (ignored)")
        raw_entries = []
    entries = [e for e in raw_entries if isinstance(e, dict)]
    if len(entries) != len(raw_entries):
        problems.append(f"{len(raw_entries) - len(entries)} entries are not dicts (ignored)")

    columns = _transpose(entries)

    def get(key: str, *older: str) -> list:
        if key not in columns:
            for o in older:
                if o in columns:
                    return columns[o]
        return columns.get(key) or [None] * len(entries)

    stack_ids, stacks = _stacks(get("frames"), problems)
    created = get("time_created_ns")
    if entries and "time_created_ns" not in entries[0] and "time_created_us" in entries[0]:
        created = [None if v is None else _as_int(v) * 1000 if _as_int(v) is not None else None
                   for v in get("time_created_us")]  # torch 2.2 wrote microseconds

    i64, f64, s, b = pa.int64(), pa.float64(), pa.string(), pa.bool_()
    sizes, dtypes = pa.list_(pa.list_(i64)), pa.list_(s)
    cols = {
        "rank": pa.array([rank] * len(entries), type=i64),
        "process_group": _column("process_group", get("process_group"), dtypes, _as_str_list, problems),
        "pg_id": _column("pg_id", get("pg_id"), i64, _as_int, problems),
        "record_id": _column("record_id", get("record_id"), i64, _as_int, problems),
        "collective_seq_id": _column("collective_seq_id", get("collective_seq_id", "seq_id"), i64, _as_int, problems),
        "p2p_seq_id": _column("p2p_seq_id", get("p2p_seq_id"), i64, _as_int, problems),
        "op_id": _column("op_id", get("op_id"), i64, _as_int, problems),
        "profiling_name": _column("profiling_name", get("profiling_name"), s, _as_str, problems),
        "is_p2p": _column("is_p2p", get("is_p2p"), b, _as_bool, problems),
        "state": _column("state", get("state"), s, _as_str, problems),
        "retired": _column("retired", get("retired"), b, _as_bool, problems),
        "timeout_ms": _column("timeout_ms", get("timeout_ms"), i64, _as_int, problems),
        "time_created_ns": _column("time_created_ns", created, i64, _as_int, problems),
        "time_started_ns": _column("time_discovered_started_ns", get("time_discovered_started_ns"), i64, _as_int,
                                   problems),
        "time_completed_ns": _column("time_discovered_completed_ns", get("time_discovered_completed_ns"), i64,
                                     _as_int, problems),
        "duration_ms": _column("duration_ms", get("duration_ms"), f64, _as_float, problems),
        "input_sizes": _column("input_sizes", get("input_sizes"), sizes, _as_sizes, problems),
        "output_sizes": _column("output_sizes", get("output_sizes"), sizes, _as_sizes, problems),
        "input_dtypes": _column("input_dtypes", get("input_dtypes"), dtypes, _as_str_list, problems),
        "output_dtypes": _column("output_dtypes", get("output_dtypes"), dtypes, _as_str_list, problems),
        "thread_id": _column("thread_id", get("thread_id"), s, _as_str, problems),
        "thread_name": _column("thread_name", get("thread_name"), s, _as_str, problems),
        "stack_id": pa.array(stack_ids, type=pa.uint64()),
    }
    entries_table = pa.table(cols)

    backends = {normalize_op(n)[2] for n in set(cols["profiling_name"].to_pylist())} - {None}
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
        "pg_config": _pg_config_rows(dump.get("pg_config"), rank, problems, rank_lists),
        "rank_lists": rank_lists,
        "pg_status": _pg_status_rows(dump.get("pg_status"), rank, problems),
        "stacks": stacks,
    }


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
        ranks_text = ranks if isinstance(ranks, str) else (repr(list(ranks)) if isinstance(ranks, (list, tuple)) else None)
        if not name and (not ranks_text or ranks_text.strip() in ("[]", "")):
            continue  # Gloo writes {'': {'name': '', 'desc': '', 'ranks': '[]'}}: no information
        # The world group's list is the same ~7 bytes x world size on every rank (1 MB at 131K ranks): keep
        # one copy per distinct list, keyed by a content hash that agrees across processes.
        key = None
        if ranks_text is not None:
            key = int.from_bytes(hashlib.blake2b(ranks_text.encode(), digest_size=8).digest(), "little")
            rank_lists[key] = ranks_text
        rows.append((rank, name, _as_str(cfg.get("desc")), key))
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


def _distinct_map(df: pl.DataFrame, column: str, fn: Callable[[Any], dict]) -> pl.DataFrame:
    """Apply a Python function once per distinct value of a column (shapes, names repeat a lot)."""
    key = f"_{column}_key"
    keyed = df.with_columns(pl.col(column).hash().alias(key))
    distinct = keyed.group_by(key).agg(pl.col(column).first())
    values = [fn(v) for v in distinct[column].to_list()]
    mapped = pl.DataFrame(values) if values else pl.DataFrame()
    mapped = pl.concat([distinct.select(key), mapped], how="horizontal") if values else distinct.select(key)
    return keyed.join(mapped, on=key, how="left").drop(key)


def normalize_entries(tables: list[pa.Table]) -> pl.DataFrame:
    """Raw per-file columns -> the ENTRIES schema (without `group` and `peer`, which need every rank).

    Vectorized over a whole chunk of files: per-value Python runs once per distinct profiling name or shape.
    """
    if not tables:
        return pl.DataFrame(schema=ENTRIES)
    df = pl.from_arrow(pa.concat_tables(tables, promote_options="permissive"))

    def op_fields(name: Any) -> dict:
        op, peer, _backend = normalize_op(name)
        return {"op": op, "peer_local": peer}

    def shape_fields(prefix: str) -> Callable[[Any], dict]:
        def fields(sizes: Any) -> dict:
            return {f"{prefix}_sizes_text": _shape_text(sizes), f"{prefix}_numel": _numel(sizes)}
        return fields

    df = _distinct_map(df, "profiling_name", op_fields)
    df = _distinct_map(df, "input_sizes", shape_fields("input"))
    df = _distinct_map(df, "output_sizes", shape_fields("output"))
    zero_is_null = {c: pl.when(pl.col(c) == 0).then(None).otherwise(pl.col(c)).alias(c)
                    for c in ("time_created_ns", "time_started_ns", "time_completed_ns")}
    df = df.with_columns(
        # Before recorder 2.1 entries name no group, only the local pg id, which is then the pg_config key.
        pl.coalesce(pl.col("process_group").list.get(0, null_on_oob=True), pl.col("pg_id").cast(pl.String))
        .alias("pg_name"),
        pl.col("process_group").list.get(1, null_on_oob=True).alias("pg_desc"),
        pl.when(pl.col("state").is_in(list(STATES)) | pl.col("state").is_null()).then(pl.col("state"))
        .otherwise(pl.lit("unknown")).alias("state"),
        pl.coalesce("is_p2p", pl.col("op").is_in(["send", "recv"])).alias("is_p2p"),
        pl.col("input_dtypes").list.join(",").alias("input_dtypes"),
        pl.col("output_dtypes").list.join(",").alias("output_dtypes"),
        pl.col("input_sizes_text").alias("input_sizes"),
        pl.col("output_sizes_text").alias("output_sizes"),
        *zero_is_null.values(),
    )
    return conform(df, ENTRIES)
