"""A pickle read as a flat table of objects and edges (the walker's output), with its texts decoded once per
distinct content."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from flightrec.ingest.fastpickle.content_codes import text_codes


@dataclass(frozen=True)
class Tape:
    """Objects 0..n-1 in the order the pickle built them, and container edges in the order items were added.

    kind: one of NONE..TUPLE; value: an int's value, a bool as 0/1, a float's IEEE bits, a str's 64-bit
    hash of its bytes (`_text_hash`: equal texts, equal values, across files); text_start, text_len: a str's UTF-8
    bytes in `data`. Edge i: child `child[i]` of `parent[i]`, under key `key[i]` (an
    object) for dicts, -1 for lists and tuples. `root`: the object the pickle returns."""

    data: bytes
    kind: np.ndarray
    value: np.ndarray
    text_start: np.ndarray
    text_len: np.ndarray
    parent: np.ndarray
    key: np.ndarray
    child: np.ndarray
    root: int
    _long_texts: dict = field(default_factory=dict, compare=False, repr=False)
    _scratch: dict = field(default_factory=dict, compare=False, repr=False)

    def code_table(self) -> np.ndarray:
        """An int64 -1 per object, the scratch table of `dense_codes`, `texts`, `pivot` and the stacks' codes,
        each of which leaves it so: made once per tape. (One made per call cost 23 ms at 1,024 files, 4.9M
        objects, mostly page faults: 22 calls, a third of the batch.)"""
        table = self._scratch.get("code_of")
        if table is None:
            table = self._scratch["code_of"] = np.full(len(self.kind), -1, np.int64)
        return table

    def texts(self, objs: np.ndarray) -> tuple[list[str], np.ndarray]:
        """The distinct texts of str objects `objs` and each one's index among them: decoded once per
        distinct content, not once per object (each file has its own objects). Told apart in one compiled pass
        (`_text_codes_py`: by the walker's content hash, each checked against its code's first object); a
        collision (a crafted file) makes the grouping go by decoded text instead."""
        objs = np.ascontiguousarray(objs, dtype=np.int64)
        codes, firsts, longs, ok = text_codes(np.frombuffer(self.data, dtype=np.uint8), self.value, self.text_start,
                                              self.text_len, objs, self.code_table(), _LONG_TEXT)
        if ok and self._same_long_texts(longs):
            return [self.text(int(objs[i])) for i in firsts.tolist()], codes
        words: dict[str, int] = {}
        by_text = np.array([words.setdefault(self.text(o), len(words)) for o in objs.tolist()], dtype=np.int64)
        return list(words), by_text

    def text(self, obj: int) -> str:
        start, size = int(self.text_start[obj]), int(self.text_len[obj])
        if size < _LONG_TEXT:
            return self.data[start:start + size].decode("utf-8", "surrogatepass")
        # a long text (the world group's rank list, in every file) is decoded once: the same str object
        # then also hashes once where it is a key (`values.rank_list_key`). Found by hash, kept if the bytes agree.
        raw = self.data[start:start + size]
        known = self._long_texts.get(int(self.value[obj]))
        if known is not None and known[0] == raw:
            return known[1]
        text = raw.decode("utf-8", "surrogatepass")
        self._long_texts[int(self.value[obj])] = (raw, text)
        return text

    def _same_long_texts(self, pairs: np.ndarray) -> bool:
        """Whether the long texts `_text_codes_py` left to compare, laid flat as (object, its code's first
        object) pairs, have the same bytes: compared as bytes (memcmp), not by a compiled byte loop."""
        for a, b in pairs.reshape(-1, 2).tolist():
            size, sa, sb = int(self.text_len[a]), int(self.text_start[a]), int(self.text_start[b])
            if self.data[sa:sa + size] != self.data[sb:sb + size]:
                return False
        return True


_LONG_TEXT = 1024
