"""Turn one dump (plain Python data) into Arrow columns, right away, so the Python objects can be dropped.

This runs in worker processes, once per file. It renames the keys of every recorder version to one set of
columns (`values` reads each value, `derive` adds the columns computed from them). A field of the wrong type
becomes null and is noted in the dump's `problems`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from flightrec.ingest.derive import raw_derived
from flightrec.ingest.values import (
    BOOL,
    F64,
    I64,
    SIZES,
    STR,
    STRS,
    as_bool,
    as_float,
    as_int,
    as_sizes,
    as_str,
    as_str_list,
    normalize_op,
    rank_list_key,
    stack_hash,
    text_as_characters,
)
from flightrec.model.schema import KNOWN_DUMP_VERSIONS, TRUNCATED


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


# Every entry key we read, across recorder versions, with its Arrow type. Missing keys come out null.
RAW_FIELDS = {
    "record_id": (I64, "int"), "pg_id": (I64, "int"), "process_group": (STRS, "strs"),
    "collective_seq_id": (I64, "int"), "seq_id": (I64, "int"), "p2p_seq_id": (I64, "int"),
    "op_id": (I64, "int"), "profiling_name": (STR, "str"), "time_created_ns": (I64, "int"),
    "time_created_us": (I64, "int"), "input_sizes": (SIZES, "sizes"), "input_dtypes": (STRS, "strs"),
    "output_sizes": (SIZES, "sizes"), "output_dtypes": (STRS, "strs"), "state": (STR, "str"),
    "time_discovered_started_ns": (I64, "int"), "time_discovered_completed_ns": (I64, "int"),
    "retired": (BOOL, "bool"), "timeout_ms": (I64, "int"), "is_p2p": (BOOL, "bool"),
    "duration_ms": (F64, "float"), "thread_id": (STR, "str"), "thread_name": (STR, "str"),
}


RAW_STRUCT = pa.struct([(name, typ) for name, (typ, _) in RAW_FIELDS.items()])


def _raw_table(entries: list[dict], problems: list[str]) -> pa.Table:
    """Entries -> one Arrow column per raw key. Arrow walks the dicts in C (one pass, ~4 us an entry); only
    when some value has the wrong type does it go key by key with coercion, noting what was nulled."""
    try:
        table = pa.Table.from_struct_array(pa.array(entries, type=RAW_STRUCT))
        if not text_as_characters(table):
            return table
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        pass
    coerce = {"int": as_int, "float": as_float, "bool": as_bool, "str": as_str, "strs": as_str_list,
              "sizes": as_sizes}
    columns = {}
    for name, (typ, kind) in RAW_FIELDS.items():
        values = [e.get(name) for e in entries]
        if kind == "strs" and any(isinstance(v, str) for v in values):
            values = [as_str_list(v) for v in values]   # (not as characters: `text_as_characters`)
        columns[name] = _column(name, values, typ, coerce[kind], problems)
    return pa.table(columns)


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
            sid = stack_hash(frames)
            by_identity[key] = sid
            if sid not in stacks:
                stacks[sid] = [
                    {"name": as_str(f.get("name")), "filename": as_str(f.get("filename")),
                     "line": as_int(f.get("line"))}
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
    version = as_str(dump.get("version"))
    # (a cut JSON dump lost its version with the keys after its entries: PyTorch writes them alphabetically)
    problems[:0] = [] if version is None and dump.get("_truncated") else version_problems(version)
    entries_table = entries_table.append_column("rank", pa.array([rank] * entries_table.num_rows, type=I64))
    entries_table = entries_table.append_column("stack_id", stack_ids)
    names = entries_table["profiling_name"].unique().to_pylist() if entries_table.num_rows else []
    meta = file_meta(rank, version, {normalize_op(n)[2] for n in names},
                     as_str(dump.get("comm_lib_version", dump.get("nccl_version"))), entries_table.num_rows, problems)
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
PG_CONFIG_ROWS = pa.schema([("rank", I64), ("pg_name", STR), ("pg_desc", STR), ("ranks_key", pa.uint64())])


PG_STATUS_ROWS = pa.schema([("rank", I64), ("pg_id", I64), ("last_enqueued", I64), ("last_started", I64),
                            ("last_completed", I64)])


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
        name = as_str(cfg.get("name")) or as_str(key)
        ranks = cfg.get("ranks")
        ranks_text = (ranks if isinstance(ranks, str)
                      else repr(list(ranks)) if isinstance(ranks, (list, tuple)) else None)
        if not name and (not ranks_text or ranks_text.strip() in ("[]", "")):
            continue  # Gloo writes {'': {'name': '', 'desc': '', 'ranks': '[]'}}: no information
        # The world group's list is the same ~7 bytes x world size on every rank (1 MB at 131K ranks): keep
        # one copy per distinct list, keyed by a content hash that agrees across processes.
        key = None
        if ranks_text is not None:
            key = rank_list_key(ranks_text)
            rank_lists[key] = ranks_text
        rows.append((rank, name, as_str(cfg.get("desc")), key))
    return rows


def _pg_status_rows(pg_status: Any, rank: int, problems: list[str]) -> list[tuple]:
    if pg_status is None:
        return []
    if not isinstance(pg_status, dict):
        problems.append(f"'pg_status' is a {type(pg_status).__name__}, not a dict (ignored)")
        return []
    rows = []
    for key, st in pg_status.items():
        pg_id = as_int(key)
        if pg_id is None or not isinstance(st, dict):
            problems.append(f"pg_status[{key!r}] is not readable (ignored)")
            continue
        rows.append((
            rank, pg_id,
            as_int(st.get("last_enqueued_collective")),
            as_int(st.get("last_started_collective")),
            as_int(st.get("last_completed_collective")),
        ))
    return rows
