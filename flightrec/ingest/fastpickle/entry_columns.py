"""The entries of a batch of dumps as Arrow columns, straight from the tape: scalars, texts as dictionaries,
shapes and stacks told apart by content, the same columns `normalize.flatten_dump` gives."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from flightrec.ingest.derive import GROUP_FIELDS, SIZE_FIELDS, masked_array, shape_dictionary
from flightrec.ingest.fastpickle import content_codes, passes, tape
from flightrec.ingest.fastpickle.graph import (
    BY_IDENTITY,
    SEQUENCES,
    Graph,
    Unsupported,
    dictionary,
    field_table,
    fields,
    kinds,
    mask,
)
from flightrec.ingest.fastpickle.kinds import BOOL, DICT, FLOAT, INT, LIST, NONE, STR
from flightrec.ingest.normalize import RAW_FIELDS
from flightrec.ingest.values import as_int, as_str, stack_hash


def columns_of_entries(t: tape.Tape, g: Graph, entry_ids: np.ndarray) -> tuple[pa.Table, pa.Array, dict[int, list]]:
    if len(passes.dense_codes(entry_ids, t.code_table())[0]) != len(entry_ids) or (
            len(entry_ids) and (t.kind[entry_ids] != DICT).any()):
        raise Unsupported
    names = (*RAW_FIELDS, "frames")
    table = field_table(t, g, entry_ids, names)
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
    pass (a value of another kind is Unsupported, as in `kinds`)."""
    allowed = np.array([_SCALAR_KINDS[RAW_FIELDS[name][1]] for name in names], dtype=np.int64)
    values, present, kinds, ok = passes.scalars(t, ids, allowed)
    if not ok:
        raise Unsupported
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


def _text_column(t: tape.Tape, ids: np.ndarray) -> pa.DictionaryArray:
    """A text field (`flatten.texts_derived`): each distinct text decoded once, never a row of text made."""
    present, _ = kinds(t, ids, (STR,))
    words, index = t.texts(ids[present]) if present.any() else ([], np.zeros(0, np.int64))
    codes = np.zeros(len(ids), np.int32)
    codes[present] = index
    return dictionary(codes, present, words)


def _sequence(t, g, ids: np.ndarray, item_kinds: tuple[int, ...]):
    """(present, offsets, items) of the list (or tuple) objects `ids`; items of `item_kinds` only."""
    present, _ = kinds(t, ids, SEQUENCES)
    # (a missing or None value reads as an object without children: no items, then masked null)
    offsets, items = g.children_of(np.where(present, ids, g.childless))
    if len(items) and not passes.kinds_of(t, items, mask(item_kinds))[1]:
        raise Unsupported
    return present, offsets, items


def _text_items(t, g, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray]:
    """(present, offsets, distinct texts, each item's index among them) of the lists of text `ids`."""
    present, offsets, items = _sequence(t, g, ids, (STR,))
    words, index = t.texts(items) if len(items) else ([], np.zeros(0, np.int64))
    return present, offsets, words, index


def _joined_column(t, g, ids: np.ndarray) -> pa.DictionaryArray:
    """A list-of-text field joined by "," (`flatten.texts_derived`): lists told apart by their items' texts
    in one compiled pass (`content_codes.shape_codes`, each list a shape of one-dim tensors), joined once each."""
    present, offsets, words, index = _text_items(t, g, ids)
    codes, reps = content_codes.shape_codes(offsets, np.arange(len(index) + 1), index, ~present)
    joined = [",".join(words[k] for k in index[offsets[row]:offsets[row + 1]].tolist()) for row in reps.tolist()]
    return dictionary(codes, present, joined)


def _group_columns(t, g, ids: np.ndarray) -> list[pa.DictionaryArray]:
    """The process group's name and desc (items 0 and 1 of its [name, desc] list), none where it has fewer."""
    present, offsets, words, index = _text_items(t, g, ids)
    lengths = np.diff(offsets)
    out = []
    for i in range(len(GROUP_FIELDS)):
        has = present & (lengths > i)
        codes = np.zeros(len(ids), np.int32)
        codes[has] = index[offsets[:-1][has] + i]
        out.append(dictionary(codes, has, words))
    return out


def _shape_columns(t: tape.Tape, g: Graph, ids: np.ndarray) -> tuple[pa.DictionaryArray, pa.Array]:
    """A sizes field's shape text and element count (`flatten.shapes_derived`), from the lists of lists of
    ints `ids`: told apart by content in one compiled pass over the tape (`content_codes.sizes_codes`), and each
    distinct shape then read once (never a nested list per entry, as the unpickler's way builds:
    `derive._shape_columns`)."""
    codes, reps, ok = content_codes.sizes_codes(t, g.order, g.start, g.count, ids)
    if not ok:
        raise Unsupported
    shapes = [[t.value[g.children(int(tensor))].tolist() for tensor in g.children(int(ids[row])).tolist()]
              for row in reps.tolist()]
    return shape_dictionary(codes, codes < 0, shapes)


def _stacks(t: tape.Tape, g: Graph, ids: np.ndarray) -> tuple[pa.Array, dict[int, list]]:
    """As `flatten._stacks`: an entry's stack is its frames list (a list, not empty), its id the hash of the
    frames' (name, filename, line). Stacks are first told apart by their frame objects, in one compiled pass
    over every entry's frames (`content_codes.list_codes`): a file's writer shares its frame dicts, so its entries hold
    a few distinct stacks. Only those are then told apart by content: their frames in one compiled pass
    (`content_codes.frame_codes`: texts by content, checked byte by byte), the stacks by those codes in order, checked
    frame by frame; text is decoded and the id computed once per distinct stack."""
    n = len(ids)
    kind = np.where(ids >= 0, t.kind[np.maximum(ids, 0)], NONE)
    has = (kind == LIST) & (g.count[np.maximum(ids, 0)] > 0)
    lists = np.where(has, ids, -1)
    if not has.any():
        return pa.nulls(n, pa.uint64()), {}
    by_objects, firsts = content_codes.list_codes(t, g.order, g.start, g.count, lists, BY_IDENTITY)
    reps = lists[firsts]   # a list object per stack of distinct frame objects
    distinct = passes.distinct_children(t, g.order, g.start, g.count, reps)
    if (t.kind[distinct] != DICT).any():
        raise Unsupported
    field = fields(t, g, distinct, ("name", "filename", "line"))
    # (in one compiled pass: each frame's texts by content and its line, each checked for its kind; a None is
    # made -1 in `field`, as an absent one is)
    codes, frame_firsts, ok = content_codes.frame_codes(t, field["name"], field["filename"], field["line"])
    if not ok:
        raise Unsupported
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


def _stack_ids(t: tape.Tape, g: Graph, per_object: np.ndarray, distinct: np.ndarray, codes: np.ndarray,
               frame_firsts: np.ndarray, reps: np.ndarray, by_objects: np.ndarray, has: np.ndarray,
               parts: list) -> tuple[pa.Array, dict[int, list]]:
    """`_stacks`' second half: the stacks of distinct frame objects (`reps`, each entry's index among them
    `by_objects`) grouped by their frames' codes (`codes`, each code's first frame `frame_firsts`), then an id
    and frames per distinct one. `per_object` (-1 each) is free to write at `distinct`."""
    per_object[distinct] = codes
    # (checked frame by frame against its code's first stack: `content_codes.list_codes`)
    by_content, first = content_codes.list_codes(t, g.order, g.start, g.count, reps, per_object)
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
