"""A tape read as containers: each one's children and keys in order, a dict's fields found by name, and
values checked for their kind (a value of another kind is `Unsupported`: the unpickler's way reads that file)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from flightrec.ingest.derive import masked_array
from flightrec.ingest.fastpickle import passes, tape
from flightrec.ingest.fastpickle.kinds import LIST, NONE, TUPLE

SEQUENCES = (LIST, TUPLE)


class Unsupported(Exception):
    """The tape holds something only the unpickler's way reads as flatten_dump expects."""


# What makes a batch go a file at a time, and a file go the unpickler's way: a layout the array passes don't
# take; text that is not UTF-8, or that Arrow cannot hold (a lone surrogate; the unpickler's way reports
# both); a value too deeply nested, or cyclic, to build as a Python value.
DECLINED = (Unsupported, UnicodeError, RecursionError)


class Graph:
    """Children of each container, in the order they were added (edges grouped by parent)."""

    def __init__(self, t: tape.Tape):
        self.t = t
        self.order, self.start, self.count = passes.group_by_parent(t)
        fewest = int(np.argmin(self.count)) if len(self.count) else 0   # (an object without children, if any)
        self.childless = fewest if len(self.count) and self.count[fewest] == 0 else 0

    def edges(self, obj: int) -> np.ndarray:
        return passes.edge_ids(self.order, int(self.start[obj]), int(self.count[obj]))

    def children(self, obj: int) -> np.ndarray:
        return self.t.child[self.edges(obj)]

    def children_of(self, parents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(offsets, children) of each of `parents`, concatenated (compiled: no per-parent Python)."""
        return passes.children_of(self.t, self.order, self.start, self.count, parents)

    def keys_of(self, parents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(offsets, keys) of each of the dicts `parents`, aligned with `children_of`."""
        return passes.children_of(self.t, self.order, self.start, self.count, parents, of=self.t.key)


def fields(t: tape.Tape, g: Graph, dicts: np.ndarray, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """For the dict objects `dicts`, per name in `names`: each one's value object for that key (-1 where it
    has none). Keys are matched by text (each file memoizes its own key strings), in two compiled passes over
    those dicts' items."""
    table = field_table(t, g, dicts, names)
    return {name: table[i] for i, name in enumerate(names)}


def field_table(t: tape.Tape, g: Graph, dicts: np.ndarray, names: tuple[str, ...]) -> np.ndarray:
    """`fields` as one (name, dict) array of value objects: keys matched to `names` by their bytes in the
    pass that pivots the items (`passes.pivot`)."""
    table, others, ok = passes.pivot(t, g.order, g.start, g.count, dicts, *_utf8_names(names))
    if not ok:
        raise Unsupported
    if len(others):
        t.texts(others)   # (decoded for the check alone: a key Python can't read declines the batch)
    return table


_NAMES: dict[tuple[str, ...], tuple[np.ndarray, np.ndarray]] = {}


BY_IDENTITY = np.zeros(0, np.int64)   # (`content_codes.list_codes`: items told apart by identity)


def _utf8_names(names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """`names` as `passes.pivot` takes them: their UTF-8 bytes laid flat, and where each one ends."""
    if names not in _NAMES:
        encoded = [name.encode() for name in names]
        _NAMES[names] = (np.frombuffer(b"".join(encoded), np.uint8).copy(),
                         np.cumsum([len(e) for e in encoded], dtype=np.int64))
    return _NAMES[names]


def kinds(t: tape.Tape, ids: np.ndarray, allowed: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(present: not missing and not None, kind per entry); a kind outside `allowed` is unsupported."""
    kind, ok = passes.kinds_of(t, ids, mask((NONE, *allowed)))   # (missing or None: not present)
    if not ok:
        raise Unsupported
    return kind != NONE, kind


def dictionary(codes: np.ndarray, present: np.ndarray, words: list[str]) -> pa.DictionaryArray:
    """Entry i has `words[codes[i]]`, or none where not `present[i]`; each word once in the dictionary."""
    distinct = dict.fromkeys(words)
    if len(distinct) < len(words):   # (lists that join alike: ["a,b"] and ["a", "b"])
        position = {word: i for i, word in enumerate(distinct)}
        codes = np.array([position[word] for word in words], np.int32)[codes]
        words = list(distinct)
    at = masked_array(codes.astype(np.int32, copy=False), pa.int32(), present)
    return pa.DictionaryArray.from_arrays(at, pa.array(words, type=pa.string()))


def mask(kinds: tuple[int, ...]) -> int:
    """`kinds` as a bitmask over tape kinds (`passes.kinds_of`)."""
    return sum(1 << k for k in set(kinds))
