"""A batch of dumps' columns from their pickles' object table (`tape`), without Python objects per entry.

Gives exactly what `flatten.flatten_dump(unpickled dump)` gives, merged over the files (`flatten.merge_parts`),
for the dumps the recorder writes: every entry a dict, every value of its field's type (a missing key or None
is null). A file holding anything else (a value of another type, an entry that is not a dict, a dump that is
a bare list) is left out, and the caller takes the unpickler's way for it, which coerces, notes the problem
and salvages. The entry dicts' edges are pivoted into one value column per field by a compiled pass
(tape.pivot, keys matched by their bytes), and each batch's metadata, groups and statuses come from array
passes too. Text is decoded once per distinct content, stacks hashed once per distinct frame sequence.
Hashes only group: each text and each stack is checked against its group's first (bytes, frame codes), and
a collision falls back to grouping by value.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from flightrec.ingest.derive import GROUP_FIELDS, SIZE_FIELDS, masked_array, shape_dictionary
from flightrec.ingest.fastpickle import walker as tape
from flightrec.ingest.fastpickle.walker import BOOL, DICT, FLOAT, INT, LIST, NONE, STR, TUPLE
from flightrec.ingest.normalize import RAW_FIELDS, assemble, file_meta, merge_parts, version_problems
from flightrec.ingest.values import as_int, as_str, normalize_op, rank_list_key, stack_hash

_SEQUENCES = (LIST, TUPLE)


class _Unsupported(Exception):
    """The tape holds something only the unpickler's way reads as flatten_dump expects."""


# What makes a batch go a file at a time, and a file go the unpickler's way: a layout the array passes don't
# take; text that is not UTF-8, or that Arrow cannot hold (a lone surrogate; the unpickler's way reports
# both); a value too deeply nested, or cyclic, to build as a Python value.
_DECLINED = (_Unsupported, UnicodeError, RecursionError)


class _Graph:
    """Children of each container, in the order they were added (edges grouped by parent)."""

    def __init__(self, t: tape.Tape):
        self.t = t
        self.order, self.start, self.count = tape.group_by_parent(t)
        fewest = int(np.argmin(self.count)) if len(self.count) else 0   # (an object without children, if any)
        self.childless = fewest if len(self.count) and self.count[fewest] == 0 else 0

    def edges(self, obj: int) -> np.ndarray:
        return tape.edge_ids(self.order, int(self.start[obj]), int(self.count[obj]))

    def children(self, obj: int) -> np.ndarray:
        return self.t.child[self.edges(obj)]

    def children_of(self, parents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(offsets, children) of each of `parents`, concatenated (compiled: no per-parent Python)."""
        return tape.children_of(self.t, self.order, self.start, self.count, parents)

    def keys_of(self, parents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(offsets, keys) of each of the dicts `parents`, aligned with `children_of`."""
        return tape.children_of(self.t, self.order, self.start, self.count, parents, of=self.t.key)


def flatten_pickle(data: bytes, rank: int) -> dict[str, Any] | None:
    """`flatten_dump`'s result for a pickled dump, or None when the tape reader doesn't take it."""
    part, _ = flatten_pickles([data], [rank])
    return part


def flatten_pickles(datas: list[bytes], ranks: list[int]) -> tuple[dict[str, Any] | None, list[int]]:
    """Many files at once: one part (`flatten.merge_parts`) for the files the tape reader takes, and their
    indexes; what `flatten_dump` gives for each of them, merged. One tape for all (`tape.read_many`), and the
    whole batch's columns, metadata, groups and statuses made by array passes: per file, that work cost more
    than unpickling a 200-entry dump. A batch holding something those passes don't take (an older recorder's
    pg_config, a value of another type) is read a file at a time (`_one_file`)."""
    return flatten_laid_out(b"".join(datas), np.array([len(d) for d in datas], dtype=np.int64), ranks)


def flatten_laid_out(data: bytes | bytearray, sizes: np.ndarray, ranks: list[int]) -> tuple[dict[str, Any] | None,
                                                                                           list[int]]:
    """`flatten_pickles` of files laid end to end from the start of `data` (`tape.read_laid_out`)."""
    joined, roots = tape.read_laid_out(data, sizes)
    taken = [i for i, root in enumerate(roots) if root >= 0]
    if joined is None or not taken:
        return None, []
    g = _Graph(joined)
    try:
        return _batch(joined, g, roots[taken], [ranks[i] for i in taken]), taken
    except _DECLINED:
        pass
    parts, read = [], []
    for i in taken:
        try:
            parts.append(_one_file(joined, g, int(roots[i]), ranks[i]))
            read.append(i)
        except _DECLINED:
            continue
    return (merge_parts(parts), read) if parts else (None, [])


_TOP_KEYS = ("entries", "pg_config", "pg_status", "version", "comm_lib_version", "nccl_version", "_truncated")
_STATUS_KEYS = ("last_enqueued_collective", "last_started_collective", "last_completed_collective")


def _batch(t: tape.Tape, g: _Graph, roots: np.ndarray, ranks: list[int]) -> dict[str, Any]:
    """The part of dumps `roots` (one per file), or _Unsupported when one of them is not as the recorder
    writes it (dicts with text keys, values of the usual types): then `_one_file` reads them as Python values."""
    if (t.kind[roots] != DICT).any():
        raise _Unsupported
    top = _fields(t, g, roots, _TOP_KEYS)
    cut = top["_truncated"]
    kind, value = t.kind[np.maximum(cut, 0)], t.value[np.maximum(cut, 0)]
    if not ((cut < 0) | (kind == NONE) | (((kind == BOOL) | (kind == INT)) & (value == 0))).all():
        raise _Unsupported   # a cut file (or a flag of another type): flatten_dump notes it
    lists = top["entries"]
    if (lists < 0).any() or (t.kind[lists] != LIST).any():
        raise _Unsupported
    offsets, entry_ids = g.children_of(lists)
    counts = np.diff(offsets)
    table, stack_ids, stacks = _entries(t, g, entry_ids)
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


def _items(t: tape.Tape, g: _Graph, dicts: np.ndarray, owners: list[int]) -> tuple[list[int], np.ndarray, np.ndarray]:
    """The items of dict objects `dicts` (absent or None ones have none): each item's owner (from `owners`),
    key object and value object. A key repeated within a dict is _Unsupported (Python keeps the last)."""
    present = dicts >= 0
    present[present] = t.kind[dicts[present]] != NONE
    if (t.kind[dicts[present]] != DICT).any():
        raise _Unsupported
    parents = dicts[present]
    offsets, values = g.children_of(parents)
    _, keys = g.keys_of(parents)
    sizes = np.diff(offsets)
    owner = np.repeat(np.asarray(owners, np.int64)[present], sizes)
    # (a dict's keys told apart by content hash mixed with the dict's index, in one 1-D sort: a collision, or
    # a mix of two dicts' keys that meet, only sends the batch the slower way)
    in_dict = t.value[keys] ^ (np.repeat(np.arange(len(parents), dtype=np.int64), sizes) * _MIX)
    if len(keys) and len(np.unique(in_dict)) != len(keys):
        raise _Unsupported
    return owner.tolist(), keys, values


def _pg_config(t: tape.Tape, g: _Graph, configs: np.ndarray, ranks: list[int]) -> tuple[list[tuple], dict]:
    """`flatten._pg_config_rows` for every file: {group name: {'name', 'desc', 'ranks': text}} only (the 1.4
    recorder's lists and ranks given as lists are `_one_file`'s)."""
    owner, keys, values = _items(t, g, configs, ranks)
    if not len(values):
        return [], {}
    if (t.kind[values] != DICT).any():
        raise _Unsupported
    field = _fields(t, g, values, ("name", "desc", "ranks"))
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


def _pg_status(t: tape.Tape, g: _Graph, statuses: np.ndarray, ranks: list[int]) -> list[tuple]:
    """`flatten._pg_status_rows` for every file: {pg id (text or int): {the three counters: ints}} only."""
    owner, keys, values = _items(t, g, statuses, ranks)
    if not len(values):
        return []
    if (t.kind[values] != DICT).any():
        raise _Unsupported
    distinct, which = _distinct_values(t, keys, required=True, ints=True)   # (keys: text or int)
    distinct_ids = [as_int(k) for k in distinct]
    if None in distinct_ids:
        raise _Unsupported
    pg_ids = [distinct_ids[k] for k in which.tolist()]
    field = _fields(t, g, values, _STATUS_KEYS)
    counters = [_optional_ints(t, field[name]) for name in _STATUS_KEYS]
    return list(zip(owner, pg_ids, *counters))


def _distinct_values(t: tape.Tape, ids: np.ndarray, required: bool = False,
                     ints: bool = False) -> tuple[list, np.ndarray]:
    """The distinct texts among `ids` (with `ints`, int values too, after them) and each one's index among
    them, -1 where absent or None. Another kind (or an absent one when `required`) is _Unsupported: flatten
    would coerce it with str()."""
    present, kind = _kinds(t, ids, (STR, INT) if ints else (STR,))
    if required and not present.all():
        raise _Unsupported
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
    Another kind (or an absent one when `required`) is _Unsupported: flatten would coerce it with str()."""
    distinct, index = _distinct_values(t, ids, required, ints)
    distinct = [*distinct, None]   # (index -1: None)
    return [distinct[i] for i in index.tolist()]


def _optional_ints(t: tape.Tape, ids: np.ndarray) -> list:
    present, _ = _kinds(t, ids, (INT,))
    values = t.value[np.maximum(ids, 0)]
    return [int(v) if p else None for v, p in zip(values.tolist(), present.tolist())]


def _one_file(t: tape.Tape, g: _Graph, root: int, rank: int) -> dict[str, Any]:
    """One file's part by way of its top-level values as Python objects (`flatten.assemble`): the dumps
    `_batch` doesn't take, such as the 1.4 recorder's pg_config."""
    dump, entries = _top(t, g, root)
    table, stack_ids, stacks = _entries(t, g, entries)
    return assemble(dump, rank, table, stack_ids, stacks, [])


def _top(t: tape.Tape, g: _Graph, root: int) -> tuple[dict, np.ndarray]:
    """A dump's keys other than its entries, as Python values, and its entry objects."""
    if t.kind[root] != DICT:
        raise _Unsupported
    top = {}
    for e in g.edges(root):
        k = int(t.key[e])
        if t.kind[k] != STR:
            raise _Unsupported
        top[t.text(k)] = int(t.child[e])
    entries_id = top.get("entries")
    if entries_id is None or t.kind[entries_id] != LIST:
        raise _Unsupported
    dump = {k: _materialize(t, g, v) for k, v in top.items() if k != "entries"}
    if dump.get("_truncated"):
        raise _Unsupported
    return dump, g.children(entries_id)


def _materialize(t: tape.Tape, g: _Graph, obj: int) -> Any:
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
    if k in _SEQUENCES:
        children = g.children(obj)
        if len(children) and (t.kind[children] == INT).all():
            items = t.value[children].tolist()
        else:
            items = [_materialize(t, g, int(c)) for c in children]
        return items if k == LIST else tuple(items)
    try:
        return {_materialize(t, g, int(t.key[e])): _materialize(t, g, int(t.child[e])) for e in g.edges(obj)}
    except TypeError:   # a key Python can't hash (a list, a dict): pickle.load refuses the file, and so does this
        raise _Unsupported from None


def _fields(t: tape.Tape, g: _Graph, dicts: np.ndarray, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """For the dict objects `dicts`, per name in `names`: each one's value object for that key (-1 where it
    has none). Keys are matched by text (each file memoizes its own key strings), in two compiled passes over
    those dicts' items."""
    table = _field_table(t, g, dicts, names)
    return {name: table[i] for i, name in enumerate(names)}


def _field_table(t: tape.Tape, g: _Graph, dicts: np.ndarray, names: tuple[str, ...]) -> np.ndarray:
    """`_fields` as one (name, dict) array of value objects: keys matched to `names` by their bytes in the
    pass that pivots the items (`tape.pivot`)."""
    table, others, ok = tape.pivot(t, g.order, g.start, g.count, dicts, *_utf8_names(names))
    if not ok:
        raise _Unsupported
    if len(others):
        t.texts(others)   # (decoded for the check alone: a key Python can't read declines the batch)
    return table


_NAMES: dict[tuple[str, ...], tuple[np.ndarray, np.ndarray]] = {}
_BY_IDENTITY = np.zeros(0, np.int64)   # (`tape.list_codes`: items told apart by identity)


def _utf8_names(names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """`names` as `tape.pivot` takes them: their UTF-8 bytes laid flat, and where each one ends."""
    if names not in _NAMES:
        encoded = [name.encode() for name in names]
        _NAMES[names] = (np.frombuffer(b"".join(encoded), np.uint8).copy(),
                         np.cumsum([len(e) for e in encoded], dtype=np.int64))
    return _NAMES[names]


def _entries(t: tape.Tape, g: _Graph, entry_ids: np.ndarray) -> tuple[pa.Table, pa.Array, dict[int, list]]:
    if len(tape.dense_codes(entry_ids, t.code_table())[0]) != len(entry_ids) or (
            len(entry_ids) and (t.kind[entry_ids] != DICT).any()):
        raise _Unsupported
    names = (*RAW_FIELDS, "frames")
    table = _field_table(t, g, entry_ids, names)
    scalar = [i for i, name in enumerate(names[:-1]) if RAW_FIELDS[name][1] in _SCALAR_KINDS]
    columns = _scalar_columns(t, table[scalar], [names[i] for i in scalar])
    numel = dict(SIZE_FIELDS)
    for i, name in enumerate(names[:-1]):
        kind = RAW_FIELDS[name][1]
        if kind == "sizes":
            columns[name], columns[numel[name]] = _shape_columns(t, g, table[i])
        elif name == "process_group":
            columns.update(zip(GROUP_FIELDS, _group_columns(t, g, table[i])))
        elif kind == "strs":
            columns[name] = _joined_column(t, g, table[i])
        elif kind == "str":
            columns[name] = _text_column(t, table[i])
    stack_ids, stacks = _stacks(t, g, table[-1])
    order = [name for name in RAW_FIELDS if name != "process_group"] + [*numel.values(), *GROUP_FIELDS]
    return pa.table({name: columns[name] for name in order}), stack_ids, stacks


# the kinds of object each scalar field may hold (besides None), as a bitmask over tape kinds
_SCALAR_KINDS = {"int": 1 << INT, "float": (1 << FLOAT) | (1 << INT), "bool": 1 << BOOL}


def _scalar_columns(t: tape.Tape, ids: np.ndarray, names: list[str]) -> dict[str, pa.Array]:
    """The int, float and bool fields' columns from their value objects `ids` (field, entry), in one compiled
    pass (a value of another kind is _Unsupported, as in `_kinds`)."""
    allowed = np.array([_SCALAR_KINDS[RAW_FIELDS[name][1]] for name in names], dtype=np.int64)
    values, present, kinds, ok = tape.scalars(t, ids, allowed)
    if not ok:
        raise _Unsupported
    out = {}
    for i, name in enumerate(names):
        typ, kind = RAW_FIELDS[name]
        if kind == "int":
            data = values[i]
        elif kind == "bool":
            data = values[i] != 0
        else:
            data = np.where(kinds[i] == FLOAT, values[i].view(np.float64), values[i].astype(np.float64))
        out[name] = masked_array(data, typ, present[i])
    return out


def _kinds(t: tape.Tape, ids: np.ndarray, allowed: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(present: not missing and not None, kind per entry); a kind outside `allowed` is unsupported."""
    kind, ok = tape.kinds_of(t, ids, _mask((NONE, *allowed)))   # (missing or None: not present)
    if not ok:
        raise _Unsupported
    return kind != NONE, kind


def _dictionary(codes: np.ndarray, present: np.ndarray, words: list[str]) -> pa.DictionaryArray:
    """Entry i has `words[codes[i]]`, or none where not `present[i]`; each word once in the dictionary."""
    distinct = dict.fromkeys(words)
    if len(distinct) < len(words):   # (lists that join alike: ["a,b"] and ["a", "b"])
        position = {word: i for i, word in enumerate(distinct)}
        codes = np.array([position[word] for word in words], np.int32)[codes]
        words = list(distinct)
    at = masked_array(codes.astype(np.int32, copy=False), pa.int32(), present)
    return pa.DictionaryArray.from_arrays(at, pa.array(words, type=pa.string()))


def _text_column(t: tape.Tape, ids: np.ndarray) -> pa.DictionaryArray:
    """A text field (`flatten.texts_derived`): each distinct text decoded once, never a row of text made."""
    present, _ = _kinds(t, ids, (STR,))
    words, index = t.texts(ids[present]) if present.any() else ([], np.zeros(0, np.int64))
    codes = np.zeros(len(ids), np.int32)
    codes[present] = index
    return _dictionary(codes, present, words)


def _sequence(t, g, ids: np.ndarray, item_kinds: tuple[int, ...]):
    """(present, offsets, items) of the list (or tuple) objects `ids`; items of `item_kinds` only."""
    present, _ = _kinds(t, ids, _SEQUENCES)
    # (a missing or None value reads as an object without children: no items, then masked null)
    offsets, items = g.children_of(np.where(present, ids, g.childless))
    if len(items) and not tape.kinds_of(t, items, _mask(item_kinds))[1]:
        raise _Unsupported
    return present, offsets, items


def _mask(kinds: tuple[int, ...]) -> int:
    """`kinds` as a bitmask over tape kinds (`tape.kinds_of`)."""
    return sum(1 << k for k in set(kinds))


def _text_items(t, g, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray]:
    """(present, offsets, distinct texts, each item's index among them) of the lists of text `ids`."""
    present, offsets, items = _sequence(t, g, ids, (STR,))
    words, index = t.texts(items) if len(items) else ([], np.zeros(0, np.int64))
    return present, offsets, words, index


def _joined_column(t, g, ids: np.ndarray) -> pa.DictionaryArray:
    """A list-of-text field joined by "," (`flatten.texts_derived`): lists told apart by their items' texts
    in one compiled pass (`tape.shape_codes`, each list a shape of one-dim tensors), joined once each."""
    present, offsets, words, index = _text_items(t, g, ids)
    codes, reps = tape.shape_codes(offsets, np.arange(len(index) + 1), index, ~present)
    joined = [",".join(words[k] for k in index[offsets[row]:offsets[row + 1]].tolist()) for row in reps.tolist()]
    return _dictionary(codes, present, joined)


def _group_columns(t, g, ids: np.ndarray) -> list[pa.DictionaryArray]:
    """The process group's name and desc (items 0 and 1 of its [name, desc] list), none where it has fewer."""
    present, offsets, words, index = _text_items(t, g, ids)
    lengths = np.diff(offsets)
    out = []
    for i in range(len(GROUP_FIELDS)):
        has = present & (lengths > i)
        codes = np.zeros(len(ids), np.int32)
        codes[has] = index[offsets[:-1][has] + i]
        out.append(_dictionary(codes, has, words))
    return out


def _shape_columns(t: tape.Tape, g: _Graph, ids: np.ndarray) -> tuple[pa.DictionaryArray, pa.Array]:
    """A sizes field's shape text and element count (`flatten.shapes_derived`), from the lists of lists of
    ints `ids`: told apart by content in one compiled pass over the tape (`tape.sizes_codes`), and each
    distinct shape then read once (never a nested list per entry, as the unpickler's way builds:
    `derive._shape_columns`)."""
    codes, reps, ok = tape.sizes_codes(t, g.order, g.start, g.count, ids)
    if not ok:
        raise _Unsupported
    shapes = [[t.value[g.children(int(tensor))].tolist() for tensor in g.children(int(ids[row])).tolist()]
              for row in reps.tolist()]
    return shape_dictionary(codes, codes < 0, shapes)


def _stacks(t: tape.Tape, g: _Graph, ids: np.ndarray) -> tuple[pa.Array, dict[int, list]]:
    """As `flatten._stacks`: an entry's stack is its frames list (a list, not empty), its id the hash of the
    frames' (name, filename, line). Stacks are first told apart by their frame objects, in one compiled pass
    over every entry's frames (`tape.list_codes`): a file's writer shares its frame dicts, so its entries hold
    a few distinct stacks. Only those are then told apart by content: their frames in one compiled pass
    (`tape.frame_codes`: texts by content, checked byte by byte), the stacks by those codes in order, checked
    frame by frame; text is decoded and the id computed once per distinct stack."""
    n = len(ids)
    kind = np.where(ids >= 0, t.kind[np.maximum(ids, 0)], NONE)
    has = (kind == LIST) & (g.count[np.maximum(ids, 0)] > 0)
    lists = np.where(has, ids, -1)
    if not has.any():
        return pa.nulls(n, pa.uint64()), {}
    by_objects, firsts = tape.list_codes(t, g.order, g.start, g.count, lists, _BY_IDENTITY)
    reps = lists[firsts]   # a list object per stack of distinct frame objects
    distinct = tape.distinct_children(t, g.order, g.start, g.count, reps)
    if (t.kind[distinct] != DICT).any():
        raise _Unsupported
    field = _fields(t, g, distinct, ("name", "filename", "line"))
    # (in one compiled pass: each frame's texts by content and its line, each checked for its kind; a None is
    # made -1 in `field`, as an absent one is)
    codes, frame_firsts, ok = tape.frame_codes(t, field["name"], field["filename"], field["line"])
    if not ok:
        raise _Unsupported
    parts = [(field[name], field[name] >= 0) for name in ("name", "filename", "line")]
    # Per object: its frame's code, then its frame's index in `distinct`, in the tape's table of -1 (one made
    # here per call cost 6 ms at 1,024 files, twice), which is left as it was found.
    per_object = t.code_table()
    try:
        return _stack_ids(t, g, per_object, distinct, codes, frame_firsts, reps, by_objects, has, parts)
    finally:
        per_object[distinct] = -1


# The stacks a worker has met, by their frames as (name, filename, line) tuples: every file of a job holds the same
# few, and each batch met them anew, hashing each one (repr + blake2b: 1.7 us a file at 8,192 x 200) and building
# its frames.
# Bounded: a job with more distinct stacks than this only hashes the rest each time, as before.
_KNOWN_STACKS: dict[tuple, tuple[int, list]] = {}
_KNOWN_STACKS_MAX = 4096


def _known_stack(members: tuple) -> tuple[int, list]:
    """The id of the stack of frames `members` and its frames as dicts (as `flatten._stacks` makes them)."""
    known = _KNOWN_STACKS.get(members)
    if known is None:
        sid = stack_hash(list(members))   # (a frame as a (name, filename, line) tuple hashes as its dict does)
        known = (sid, [{"name": as_str(name), "filename": as_str(filename), "line": as_int(line)}
                       for name, filename, line in members])
        if len(_KNOWN_STACKS) < _KNOWN_STACKS_MAX:
            _KNOWN_STACKS[members] = known
    return known


def _stack_ids(t: tape.Tape, g: _Graph, per_object: np.ndarray, distinct: np.ndarray, codes: np.ndarray,
               frame_firsts: np.ndarray, reps: np.ndarray, by_objects: np.ndarray, has: np.ndarray,
               parts: list) -> tuple[pa.Array, dict[int, list]]:
    """`_stacks`' second half: the stacks of distinct frame objects (`reps`, each entry's index among them
    `by_objects`) grouped by their frames' codes (`codes`, each code's first frame `frame_firsts`), then an id
    and frames per distinct one. `per_object` (-1 each) is free to write at `distinct`."""
    per_object[distinct] = codes
    # (checked frame by frame against its code's first stack: `tape.list_codes`)
    by_content, first = tape.list_codes(t, g.order, g.start, g.count, reps, per_object)
    rows = np.flatnonzero(has)
    inverse = by_content[by_objects[rows]]
    # Each distinct frame decoded once, as (name, filename, line): the stacks of a batch share most of their
    # frames (decoded per stack, a frame was decoded ~4 times a batch, 3% of a worker's time).
    frames = [tuple((t.text(int(vid[f])) if allowed == STR else int(t.value[vid[f]])) if present[f] else None
                    for allowed, (vid, present) in zip((STR, STR, INT), parts)) for f in frame_firsts.tolist()]
    stacks: dict[int, list] = {}
    sid_of_key = np.empty(len(first), np.uint64)
    for j, rep in enumerate(reps[first].tolist()):
        members = tuple([frames[c] for c in per_object[g.children(rep)].tolist()])
        sid, stack = _known_stack(members)
        sid_of_key[j] = sid
        stacks.setdefault(sid, stack)
    out = np.zeros(len(has), np.uint64)
    out[rows] = sid_of_key[inverse]
    return masked_array(out, pa.uint64(), has), stacks
