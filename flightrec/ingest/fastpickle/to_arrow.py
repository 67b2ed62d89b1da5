"""A batch of pickled dumps, read by the walker, as the columns `normalize.flatten_dump` gives: one tape for
the batch, array passes over it, a file at a time where the batch holds a layout those passes don't take,
and the unpickler's way (with the reason noted) for a file the walker or these passes decline."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from flightrec.ingest.fastpickle import tape, walker
from flightrec.ingest.fastpickle.entry_columns import columns_of_entries
from flightrec.ingest.fastpickle.graph import DECLINED, SEQUENCES, Graph, Unsupported, fields, kinds
from flightrec.ingest.fastpickle.kinds import BOOL, DICT, FLOAT, INT, LIST, NONE, STR
from flightrec.ingest.normalize import assemble, file_meta, merge_parts, version_problems
from flightrec.ingest.values import as_int, normalize_op, rank_list_key


def flatten_pickle(data: bytes, rank: int) -> dict[str, Any] | None:
    """`flatten_dump`'s result for a pickled dump, or None when the tape reader doesn't take it."""
    part, _ = flatten_pickles([data], [rank])
    return part


def flatten_pickles(datas: list[bytes], ranks: list[int]) -> tuple[dict[str, Any] | None, list[int]]:
    """Many files at once: one part (`flatten.merge_parts`) for the files the tape reader takes, and their
    indexes; what `flatten_dump` gives for each of them, merged. One tape for all (`walker.read_many`), and the
    whole batch's columns, metadata, groups and statuses made by array passes: per file, that work cost more
    than unpickling a 200-entry dump. A batch holding something those passes don't take (an older recorder's
    pg_config, a value of another type) is read a file at a time (`_one_file`)."""
    return flatten_laid_out(b"".join(datas), np.array([len(d) for d in datas], dtype=np.int64), ranks)


def flatten_laid_out(data: bytes | bytearray, sizes: np.ndarray, ranks: list[int],
                     declined: dict[int, str] | None = None) -> tuple[dict[str, Any] | None, list[int]]:
    """`flatten_pickles` of files laid end to end from the start of `data` (`walker.read_laid_out`). `declined`,
    where given, gets why each file not read was left (index -> reason, in words for the dumps' table)."""
    declined = {} if declined is None else declined
    joined, roots = walker.read_laid_out(data, sizes)
    taken = [i for i, root in enumerate(roots) if root >= 0]
    declined.update((i, NOT_PLAIN_DATA) for i, root in enumerate(roots) if root < 0)
    if joined is None or not taken:
        return None, []
    g = Graph(joined)
    try:
        return _batch(joined, g, roots[taken], [ranks[i] for i in taken]), taken
    except DECLINED:
        pass
    parts, read = [], []
    for i in taken:
        try:
            parts.append(_one_file(joined, g, int(roots[i]), ranks[i]))
            read.append(i)
        except DECLINED as exc:
            declined[i] = _why_declined(exc)
    return (merge_parts(parts), read) if parts else (None, [])


# Why the fast reader left a file to the unpickler, in the dumps' table (`fast_reader_declined`)
NOT_PLAIN_DATA = ("not a plain-data pickle the fast reader walks (other opcodes, cut short, an int over 64 bits, "
                  "or more than 2 GiB)")


def _why_declined(exc: Exception) -> str:
    if isinstance(exc, UnicodeError):
        return "text that is not UTF-8"
    if isinstance(exc, RecursionError):
        return "values nested too deeply"
    return "laid out unlike the recorder's dumps (a value of another type, a key twice, a cut file)"


_TOP_KEYS = ("entries", "pg_config", "pg_status", "version", "comm_lib_version", "nccl_version", "_truncated")


_STATUS_KEYS = ("last_enqueued_collective", "last_started_collective", "last_completed_collective")


def _batch(t: tape.Tape, g: Graph, roots: np.ndarray, ranks: list[int]) -> dict[str, Any]:
    """The part of dumps `roots` (one per file), or Unsupported when one of them is not as the recorder
    writes it (dicts with text keys, values of the usual types): then `_one_file` reads them as Python values."""
    if (t.kind[roots] != DICT).any():
        raise Unsupported
    top = fields(t, g, roots, _TOP_KEYS)
    cut = top["_truncated"]
    kind, value = t.kind[np.maximum(cut, 0)], t.value[np.maximum(cut, 0)]
    if not ((cut < 0) | (kind == NONE) | (((kind == BOOL) | (kind == INT)) & (value == 0))).all():
        raise Unsupported   # a cut file (or a flag of another type): flatten_dump notes it
    lists = top["entries"]
    if (lists < 0).any() or (t.kind[lists] != LIST).any():
        raise Unsupported
    offsets, entry_ids = g.children_of(lists)
    counts = np.diff(offsets)
    table, stack_ids, stacks = columns_of_entries(t, g, entry_ids)
    table = table.append_column("rank", pa.array(np.repeat(np.asarray(ranks, np.int64), counts), type=pa.int64()))
    table = table.append_column("stack_id", stack_ids)

    versions = _optional_texts(t, top["version"])
    comm = np.where(top["comm_lib_version"] >= 0, top["comm_lib_version"], top["nccl_version"])
    backends = _backends_per_file(table["profiling_name"], counts)
    metas = []
    for rank, version, comm_lib, backend, n in zip(ranks, versions, _optional_texts(t, comm), backends, counts):
        metas.append(file_meta(rank, version, backend, comm_lib, int(n), version_problems(version)))
    pg_config, rank_lists = _pg_config(t, g, top["pg_config"], ranks)
    return {"metas": metas, "entries": table if table.num_rows else None, "pg_config": pg_config,
            "rank_lists": rank_lists,
            "pg_status": _pg_status(t, g, top["pg_status"], ranks), "stacks": stacks}


def _backends_per_file(names: pa.ChunkedArray, counts: np.ndarray) -> list[set]:
    """Each file's backends (the profiling names' prefixes), from a (file, name) table of the batch's few
    distinct names (`_text_column` made the column a dictionary already)."""
    codes = names.combine_chunks()
    if not pa.types.is_dictionary(codes.type):
        codes = codes.dictionary_encode()
    backend = [normalize_op(n)[2] for n in codes.dictionary.to_pylist()]
    out: list[set] = [set() for _ in counts]
    if not backend:
        return out
    index = codes.indices.to_numpy(zero_copy_only=False)
    present = np.asarray(codes.is_valid(), bool)
    seen = np.zeros((len(counts), len(backend)), bool)
    seen[np.repeat(np.arange(len(counts)), counts)[present], index[present]] = True
    for f, code in zip(*np.nonzero(seen)):
        out[f].add(backend[code])
    return out


_MIX = np.int64(-7046029254386353131)   # (0x9E3779B97F4A7C15: odd, so i -> i * _MIX is one-to-one)


def _items(t: tape.Tape, g: Graph, dicts: np.ndarray, owners: list[int]) -> tuple[list[int], np.ndarray, np.ndarray]:
    """The items of dict objects `dicts` (absent or None ones have none): each item's owner (from `owners`),
    key object and value object. A key repeated within a dict is Unsupported (Python keeps the last)."""
    present = dicts >= 0
    present[present] = t.kind[dicts[present]] != NONE
    if (t.kind[dicts[present]] != DICT).any():
        raise Unsupported
    parents = dicts[present]
    offsets, values = g.children_of(parents)
    _, keys = g.keys_of(parents)
    sizes = np.diff(offsets)
    owner = np.repeat(np.asarray(owners, np.int64)[present], sizes)
    # (a dict's keys told apart by content hash mixed with the dict's index, in one 1-D sort: a collision, or
    # a mix of two dicts' keys that meet, only sends the batch the slower way)
    in_dict = t.value[keys] ^ (np.repeat(np.arange(len(parents), dtype=np.int64), sizes) * _MIX)
    if len(keys) and len(np.unique(in_dict)) != len(keys):
        raise Unsupported
    return owner.tolist(), keys, values


def _pg_config(t: tape.Tape, g: Graph, configs: np.ndarray, ranks: list[int]) -> tuple[list[tuple], dict]:
    """`flatten._pg_config_rows` for every file: {group name: {'name', 'desc', 'ranks': text}} only (the 1.4
    recorder's lists and ranks given as lists are `_one_file`'s)."""
    owner, keys, values = _items(t, g, configs, ranks)
    if not len(values):
        return [], {}
    if (t.kind[values] != DICT).any():
        raise Unsupported
    field = fields(t, g, values, ("name", "desc", "ranks"))
    # (each rank list's key made once per distinct text: every file holds the world group's)
    texts, which = _distinct_values(t, field["ranks"])
    list_keys = [rank_list_key(text) for text in texts] + [None]
    rows, rank_lists = [], {}
    for rank, key, name, desc, k in zip(owner, _optional_texts(t, keys, required=True),
                                        *(_optional_texts(t, field[f]) for f in ("name", "desc")), which.tolist()):
        name = name or key
        if not name and (k < 0 or texts[k].strip() in ("[]", "")):
            continue   # (as flatten._pg_config_rows: Gloo's config of no group)
        if k >= 0:
            rank_lists[list_keys[k]] = texts[k]
        rows.append((rank, name, desc, list_keys[k]))
    return rows, rank_lists


def _pg_status(t: tape.Tape, g: Graph, statuses: np.ndarray, ranks: list[int]) -> list[tuple]:
    """`flatten._pg_status_rows` for every file: {pg id (text or int): {the three counters: ints}} only."""
    owner, keys, values = _items(t, g, statuses, ranks)
    if not len(values):
        return []
    if (t.kind[values] != DICT).any():
        raise Unsupported
    distinct, which = _distinct_values(t, keys, required=True, ints=True)   # (keys: text or int)
    distinct_ids = [as_int(k) for k in distinct]
    if None in distinct_ids:
        raise Unsupported
    pg_ids = [distinct_ids[k] for k in which.tolist()]
    field = fields(t, g, values, _STATUS_KEYS)
    counters = [_optional_ints(t, field[name]) for name in _STATUS_KEYS]
    return list(zip(owner, pg_ids, *counters))


def _distinct_values(t: tape.Tape, ids: np.ndarray, required: bool = False,
                     ints: bool = False) -> tuple[list, np.ndarray]:
    """The distinct texts among `ids` (with `ints`, int values too, after them) and each one's index among
    them, -1 where absent or None. Another kind (or an absent one when `required`) is Unsupported: flatten
    would coerce it with str()."""
    present, kind = kinds(t, ids, (STR, INT) if ints else (STR,))
    if required and not present.all():
        raise Unsupported
    index = np.full(len(ids), -1, np.int64)
    distinct: list = []
    is_text = kind == STR
    if is_text.any():
        distinct, index[is_text] = t.texts(ids[is_text])
    is_int = kind == INT
    if is_int.any():
        numbers, codes = np.unique(t.value[ids[is_int]], return_inverse=True)
        index[is_int] = codes.reshape(-1) + len(distinct)
        distinct = [*distinct, *numbers.tolist()]
    return distinct, index


def _optional_texts(t: tape.Tape, ids: np.ndarray, required: bool = False, ints: bool = False) -> list:
    """The text of each of `ids` (None where absent or None); with `ints`, an int object is its value.
    Another kind (or an absent one when `required`) is Unsupported: flatten would coerce it with str()."""
    distinct, index = _distinct_values(t, ids, required, ints)
    distinct = [*distinct, None]   # (index -1: None)
    return [distinct[i] for i in index.tolist()]


def _optional_ints(t: tape.Tape, ids: np.ndarray) -> list:
    present, _ = kinds(t, ids, (INT,))
    values = t.value[np.maximum(ids, 0)]
    return [int(v) if p else None for v, p in zip(values.tolist(), present.tolist())]


def _one_file(t: tape.Tape, g: Graph, root: int, rank: int) -> dict[str, Any]:
    """One file's part by way of its top-level values as Python objects (`flatten.assemble`): the dumps
    `_batch` doesn't take, such as the 1.4 recorder's pg_config."""
    dump, entries = _top(t, g, root)
    table, stack_ids, stacks = columns_of_entries(t, g, entries)
    return assemble(dump, rank, table, stack_ids, stacks, [])


def _top(t: tape.Tape, g: Graph, root: int) -> tuple[dict, np.ndarray]:
    """A dump's keys other than its entries, as Python values, and its entry objects."""
    if t.kind[root] != DICT:
        raise Unsupported
    top = {}
    for e in g.edges(root):
        k = int(t.key[e])
        if t.kind[k] != STR:
            raise Unsupported
        top[t.text(k)] = int(t.child[e])
    entries_id = top.get("entries")
    if entries_id is None or t.kind[entries_id] != LIST:
        raise Unsupported
    dump = {k: _materialize(t, g, v) for k, v in top.items() if k != "entries"}
    if dump.get("_truncated"):
        raise Unsupported
    return dump, g.children(entries_id)


def _materialize(t: tape.Tape, g: Graph, obj: int) -> Any:
    """The Python value of a (small) object: the dump's keys other than its entries. A list of ints (a
    world group's ranks, 16K of them) is made in one numpy call."""
    k = t.kind[obj]
    if k == NONE:
        return None
    if k == INT:
        return int(t.value[obj])
    if k == BOOL:
        return bool(t.value[obj])
    if k == FLOAT:
        return float(t.value[obj:obj + 1].view(np.float64)[0])
    if k == STR:
        return t.text(obj)
    if k in SEQUENCES:
        children = g.children(obj)
        if len(children) and (t.kind[children] == INT).all():
            items = t.value[children].tolist()
        else:
            items = [_materialize(t, g, int(c)) for c in children]
        return items if k == LIST else tuple(items)
    try:
        return {_materialize(t, g, int(t.key[e])): _materialize(t, g, int(t.child[e])) for e in g.edges(obj)}
    except TypeError:   # a key Python can't hash (a list, a dict): pickle.load refuses the file, and so does this
        raise Unsupported from None
