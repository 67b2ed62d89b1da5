"""Read a pickle into a flat object table without building Python objects (optional: needs numba).

`pickle.load` builds a dict, a list or a str for every value, and then flightrec walks those objects once
more to make Arrow columns: at 16K ranks x 2,000 entries that is ~10 us an entry on one core, most of the
cold `analyze`. Here a compiled loop walks the opcodes once and records each object it would have built as
a row: its kind, its int (or float bits), where its text lies in the buffer. Containers are edges (parent,
key, child); memo references point at rows already made, so the writer's sharing (keys, repeated strings,
frame dicts) costs nothing and is kept as identity. `fastflat` turns the table into the same columns as
`flatten.flatten_dump`.

Only the opcodes that build plain data are read (protocols 2-5, as the recorder's pickler and Python's write
them); anything else, a truncated stream, a reference out of range or an int wider than 64 bits gives `None`
and the caller goes the safe unpickler's way (readers.py), which reports what is wrong. Every read is bounds-
checked: the input is someone else's file, and this loop must not read past it.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field

import numpy as np

NONE, INT, FLOAT, STR, BOOL, LIST, DICT, TUPLE = range(8)

# the walker's status when its tables are too small for the input (then retried with larger ones)
_TOO_SMALL = -2

_walk = None   # the compiled walker, made by `warm` (numba is imported only then: ~0.5 s)
_walk_one = None
_u32 = None
_uint_arg = None
_text_hash = None
_open_table = None   # the passes' inlined helpers (`_open_table_py`, `_claim_py`, `_same_text_py`, `_edge_py`),
_claim = None        # made as the first pass compiles
_same_text = None
_edge = None


def available() -> bool:
    """numba is installed (`pip install flightrec[fast]`)."""
    return importlib.util.find_spec("numba") is not None


def built() -> bool:
    """The reader was compiled ahead of time for this version (`flightrec build-reader`): it starts in
    milliseconds, so it pays at any input size."""
    from flightrec.ingest.fastpickle import build as tape_build

    return tape_build.load() is not None


def warm(own_process: bool = False) -> None:
    """Load the reader compiled ahead of time (`tape_build`, ~5 ms) where it was built; else compile the walker,
    or load it from numba's cache next to this file (~0.7 s; ~3 s the first time).
    `own_process`: this process is flightrec's own (a parsing worker), so numba may be set up without its
    linear algebra, which the walker doesn't use (see below)."""
    global _walk
    if _walk is None and _load_built():
        return
    if _walk is None:
        import sys

        # Setting up numba's compiler (even to load a cached function) probes for BLAS by importing
        # scipy.linalg where scipy is installed: 0.3-0.4 s of its ~0.9. In a worker nothing else will use
        # numba, so the probe is answered "absent". Not in a caller's process: its own numba code may need it.
        blocked = own_process and "scipy.linalg.cython_blas" not in sys.modules
        if blocked:
            sys.modules["scipy.linalg.cython_blas"] = None   # (import then raises ImportError)
        try:
            _load_walker()
        finally:
            if blocked and sys.modules.get("scipy.linalg.cython_blas", 0) is None:
                del sys.modules["scipy.linalg.cython_blas"]


def _load_built() -> bool:
    """Use the reader compiled ahead of time (`tape_build`), where it was built for this version: no numba
    start. False where there is none."""
    from flightrec.ingest.fastpickle import build as tape_build

    module = tape_build.load()
    if module is None:
        return False
    global _walk
    for name in tape_build.SIGNATURES:
        if name != "walk":
            _helpers[name] = tape_build.checked(name, getattr(module, name))
    _walk = tape_build.checked("walk", module.walk)
    return True


def _load_walker() -> None:
    import numba

    global _walk, _walk_one, _u32, _uint_arg, _text_hash
    _u32 = numba.njit(cache=True, nogil=True, inline="always")(_u32_py)
    _text_hash = numba.njit(cache=True, nogil=True, inline="always")(_text_hash_py)
    _uint_arg = numba.njit(cache=True, nogil=True, inline="always")(_uint_arg_py)
    _walk_one = numba.njit(cache=True, nogil=True)(_walk_one_py)
    walk = numba.njit(cache=True, nogil=True)(_walk_py)
    walk(np.frombuffer(b"\x80\x02N.", dtype=np.uint8), np.zeros(1, np.int64), np.full(1, 4, np.int64), 64, 64)
    _walk = walk
    dense_codes(np.zeros(1, np.int64), np.full(1, -1, np.int64))
    _compiled("group_by_parent", _group_by_parent_py)(np.zeros(1, np.int32), 1)
    i32, i64 = np.zeros(1, np.int32), np.zeros(1, np.int64)
    _compiled("distinct_items", _distinct_items_py)(i32, i32, i32, i32, i64, 1)
    _compiled("children_of", _children_of_py)(i32, i32, i32, i32, i64)
    _compiled("pivot", _pivot_py)(np.frombuffer(b"\0", np.uint8), np.zeros(1, np.int8), i64, i64, i32, i32, i32, i32,
                                  i32, i64, np.zeros(1, np.uint8), i64, np.full(1, -1, np.int64))   # (read-only)
    _compiled("scalars", _scalars_py)(np.zeros(1, np.int8), i64, np.zeros((1, 1), np.int64), i64)
    _compiled("kinds_of", _kinds_of_py)(np.zeros(1, np.int8), i64, 1)
    _compiled("text_codes", _text_codes_py)(np.frombuffer(b"\0", np.uint8), i64, i64, i64, i64,   # (read-only)
                                            np.full(1, -1, np.int64), 1, 2)
    none = np.full(1, -1, np.int64)
    _compiled("frame_codes", _frame_codes_py)(np.frombuffer(b"\0", np.uint8), np.zeros(1, np.int8), i64, i64, i64,
                                              none, none.copy(), none.copy(), np.full(1, -1, np.int64), 2)
    _compiled("shape_codes", _shape_codes_py)(np.zeros(2, np.int64), np.zeros(1, np.int64), i64, np.zeros(1, np.uint8),
                                              2)
    _compiled("list_codes", _list_codes_py)(i32, i32, i32, i32, i64, i64, 2)
    _compiled("sizes_codes", _sizes_codes_py)(np.zeros(1, np.int8), i64, i32, i32, i32, i32, none, 2)


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
        codes, firsts, longs, ok = _told_apart("text_codes", _text_codes_py, len(objs))(
            np.frombuffer(self.data, dtype=np.uint8), self.value, self.text_start, self.text_len, objs,
            self.code_table(), _LONG_TEXT)
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


def read(data: bytes) -> Tape | None:
    """The object table of a pickle, or None when this reader doesn't take it (see the module doc)."""
    tapes, roots = read_many([data])
    if tapes is None or roots[0] < 0:
        return None
    return Tape(tapes.data, tapes.kind, tapes.value, tapes.text_start, tapes.text_len, tapes.parent, tapes.key,
                tapes.child, int(roots[0]))


def read_many(datas: list[bytes]) -> tuple[Tape | None, np.ndarray]:
    """One table for many pickles (ids run on from file to file, text offsets point into the joined bytes), and
    each one's root object: -1 for a file this reader doesn't take (its objects are left out)."""
    if not datas:
        return None, np.zeros(0, np.int64)
    return read_laid_out(b"".join(datas), np.array([len(d) for d in datas], dtype=np.int64))


# The tables hold object ids and edge indexes as int32 (half the bytes for the passes to bring into cache):
# every object and edge takes a byte of input at least, so input under 2 GiB keeps them in range, and more is
# left to the unpickler (the readers take files up to 2 GiB; a direct call may pass more).
_MAX_BYTES = 2**31 - 128


def read_laid_out(data: bytes | bytearray, sizes: np.ndarray) -> tuple[Tape | None, np.ndarray]:
    """`read_many` of files laid end to end from the start of `data` (which may run on past them: a reader's
    buffer, reused batch after batch), file i `sizes[i]` bytes. The tape keeps `data`: it must not change while
    the tape is read."""
    if not len(sizes):
        return None, np.zeros(0, np.int64)
    warm()
    buf = np.frombuffer(data, dtype=np.uint8)
    ends = np.cumsum(sizes)
    starts = ends - sizes
    total = int(ends[-1])
    if total > _MAX_BYTES:
        return None, np.full(len(sizes), -1, np.int64)
    memo_capacity = int(sizes.max()) // 2 + 64   # a memo slot follows an object: two bytes at least
    # (dumps hold an edge per 5-18 bytes, an object per 8-32: start there, double when short, up to a slot
    # per byte, which is always enough: every object, edge or stack slot takes a byte of input at least)
    capacity = total // 4 + 64
    while True:
        status, roots, kind, value, start, length, parent, key, child, n_obj, n_edge = _walk(
            buf, starts, ends, capacity, memo_capacity)
        if status == _TOO_SMALL and capacity < total + 64:
            capacity = min(2 * capacity, total + 64)
            continue
        break
    if status < 0:
        return None, np.full(len(sizes), -1, np.int64)
    return Tape(data, kind[:n_obj], value[:n_obj], start[:n_obj], length[:n_obj], parent[:n_edge],
                key[:n_edge], child[:n_edge], -1), roots


def _walk_py(data, file_starts, file_ends, capacity, memo_capacity):
    """Opcode walker over the files `data[file_starts[i]:file_ends[i]]` (compiled by numba in `warm`).
    Returns (status: 0 or _TOO_SMALL, each file's root or -1, tables..., objects, edges)."""
    kind = np.empty(capacity, np.int8)
    value = np.empty(capacity, np.int64)
    start = np.empty(capacity, np.int64)
    length = np.empty(capacity, np.int64)
    parent = np.empty(capacity, np.int32)
    key = np.empty(capacity, np.int32)
    child = np.empty(capacity, np.int32)
    memo = np.full(memo_capacity, -1, np.int32)
    stack = np.empty(capacity, np.int32)
    marks = np.empty(1024, np.int64)
    roots = np.full(file_starts.size, -1, np.int64)
    n_obj = 0
    n_edge = 0
    for f in range(file_starts.size):
        first_obj, first_edge = n_obj, n_edge
        root, n_obj, n_edge, used = _walk_one(data, file_starts[f], file_ends[f], kind, value, start, length,
                                              parent, key, child, memo, stack, marks, n_obj, n_edge, capacity)
        memo[:used] = -1
        if root == _TOO_SMALL:
            return _TOO_SMALL, roots, kind, value, start, length, parent, key, child, 0, 0
        if root < 0:   # not taken: its objects are dropped
            n_obj, n_edge = first_obj, first_edge
        roots[f] = root
    return 0, roots, kind, value, start, length, parent, key, child, n_obj, n_edge


def _u32_py(data, pos):
    """The little-endian unsigned 32-bit int at `pos` (the caller checked that 4 bytes are there; read by
    unsigned index, as `_text_hash_py` explains)."""
    at = np.uint64(pos)
    return (np.int64(data[at]) | (np.int64(data[at + np.uint64(1)]) << 8)
            | (np.int64(data[at + np.uint64(2)]) << 16) | (np.int64(data[at + np.uint64(3)]) << 24))


def _text_hash_py(data, pos, size):
    """A 64-bit hash of `data[pos:pos + size]`, FNV-1a style but eight bytes a step, in four lanes over each
    32 bytes: the world group's rank list (~110 KB at 16K ranks) is in every file, a byte a step made hashing
    it a third of the walk, and one lane waits on each multiplication (hence four).
    Each step is a bijection of its lane, and the lanes are joined by one (odd multipliers, xor), so texts of
    one length that differ in one word never collide; it is no cryptographic hash (texts can be crafted to
    collide), so equal hashes are checked (`Tape.texts`). Indexes are unsigned: numba checks a signed index
    for a negative one (Python's wraparound) at each read, and those checks kept LLVM from joining a word's
    eight byte reads into one (a 48 KB rank list: 19 -> 2.1 us)."""
    prime = np.uint64(1099511628211)
    h = np.uint64(14695981039346656037) ^ np.uint64(size)
    k = np.uint64(pos)
    end = np.uint64(pos + size)
    if k + np.uint64(32) <= end:
        b = np.uint64(0x9E3779B97F4A7C15)
        c = np.uint64(0xC2B2AE3D27D4EB4F)
        d = np.uint64(0x165667B19E3779F9)
        while k + np.uint64(32) <= end:
            w0 = np.uint64(0)
            w1 = np.uint64(0)
            w2 = np.uint64(0)
            w3 = np.uint64(0)
            for i in range(8):
                shift = np.uint64(8 * i)
                at = k + np.uint64(i)
                w0 |= np.uint64(data[at]) << shift
                w1 |= np.uint64(data[at + np.uint64(8)]) << shift
                w2 |= np.uint64(data[at + np.uint64(16)]) << shift
                w3 |= np.uint64(data[at + np.uint64(24)]) << shift
            h = (h ^ w0) * prime
            b = (b ^ w1) * prime
            c = (c ^ w2) * prime
            d = (d ^ w3) * prime
            k += np.uint64(32)
        h ^= b * np.uint64(31) ^ c * np.uint64(961) ^ d * np.uint64(29791)
    while k + np.uint64(8) <= end:
        w = np.uint64(0)
        for i in range(8):
            w |= np.uint64(data[k + np.uint64(i)]) << np.uint64(8 * i)
        h = (h ^ w) * prime
        k += np.uint64(8)
    while k < end:
        h = (h ^ np.uint64(data[k])) * prime
        k += np.uint64(1)
    h ^= h >> np.uint64(32)   # (the multiplications move entropy up only: fold the high half down)
    return np.int64(h)


def _uint_arg_py(data, pos, n, width):
    """An opcode's unsigned argument of `width` bytes (1 or 4, little-endian) at `pos`; -1 when the input
    ends before it (memo indexes and text lengths)."""
    if pos + width > n:
        return np.int64(-1)
    return _u32(data, pos) if width == 4 else np.int64(data[pos])


def _walk_one_py(data, pos, n, kind, value, start, length, parent, key, child, memo, stack, marks, n_obj, n_edge,
                 capacity):
    """One file, from `pos` to `n`: returns (its root, -1 when not taken, or _TOO_SMALL; objects and edges
    so far; memo slots used, to clear for the next file)."""
    memo_capacity = memo.size
    sp = 0
    mp = 0
    n_memo = 0   # indexes set: MEMOIZE (protocol 4) puts at len(memo)
    used = 0
    root = -1
    while pos < n:
        op = data[pos]
        pos += 1
        made = -1   # a new object to push
        # (tested in order of frequency in the recorder's dumps: memo references are ~half their opcodes,
        # puts a tenth, new lists and small ints most of the rest)
        if op == 0x68 or op == 0x6A:  # BINGET, LONG_BINGET
            width = 4 if op == 0x6A else 1
            index = _uint_arg(data, pos, n, width)
            if index < 0:
                break
            pos += width
            if index >= memo_capacity or memo[index] < 0:
                break
            made = memo[index]
        elif op == 0x71 or op == 0x72 or op == 0x94:  # BINPUT, LONG_BINPUT, MEMOIZE
            if sp == 0:
                break
            if op == 0x94:
                index = n_memo
            else:
                width = 4 if op == 0x72 else 1
                index = _uint_arg(data, pos, n, width)
                if index < 0:
                    break
                pos += width
            if index >= memo_capacity:
                break
            if memo[index] < 0:
                n_memo += 1   # (Python's memo is a dict: MEMOIZE puts at its size, the count of indexes set)
            memo[index] = stack[sp - 1]
            used = max(used, index + 1)
        elif op == 0x7D or op == 0x5D or op == 0x29:  # EMPTY_DICT, EMPTY_LIST, EMPTY_TUPLE
            if n_obj >= capacity:
                return _TOO_SMALL, n_obj, n_edge, used
            kind[n_obj] = DICT if op == 0x7D else (LIST if op == 0x5D else TUPLE)
            made = n_obj
            n_obj += 1
        elif op == 0x4B or op == 0x4D or op == 0x4A or op == 0x8A:  # BININT1, BININT2, BININT, LONG1
            v = np.int64(0)
            if op == 0x4B:
                if pos + 1 > n:
                    break
                v = np.int64(data[pos])
                pos += 1
            elif op == 0x4D:
                if pos + 2 > n:
                    break
                v = np.int64(data[pos]) | (np.int64(data[pos + 1]) << 8)
                pos += 2
            elif op == 0x4A:
                if pos + 4 > n:
                    break
                v = _u32(data, pos)
                if v >= 2147483648:
                    v -= 4294967296
                pos += 4
            else:
                if pos + 1 > n:
                    break
                size = np.int64(data[pos])
                pos += 1
                if size > 8 or pos + size > n:
                    break   # wider than 64 bits: the unpickler's way
                for k in range(size):
                    v |= np.int64(data[pos + k]) << (8 * k)
                if 0 < size < 8 and data[pos + size - 1] >= 128:
                    v -= np.int64(1) << (8 * size)
                pos += size
            if n_obj >= capacity:
                return _TOO_SMALL, n_obj, n_edge, used
            kind[n_obj] = INT
            value[n_obj] = v
            made = n_obj
            n_obj += 1
        elif op == 0x61 or op == 0x73:  # APPEND (list, item), SETITEM (dict, key, value)
            items = 1 if op == 0x61 else 2
            if sp < items + 1:
                break
            target = stack[sp - items - 1]
            if kind[target] != (LIST if op == 0x61 else DICT):
                break
            if n_edge >= capacity:
                return _TOO_SMALL, n_obj, n_edge, used
            parent[n_edge] = target
            key[n_edge] = -1 if op == 0x61 else stack[sp - 2]
            child[n_edge] = stack[sp - 1]
            n_edge += 1
            sp -= items
        elif op == 0x65 or op == 0x75:  # APPENDS, SETITEMS: the items since the last MARK
            if mp == 0:
                break
            mp -= 1
            m = marks[mp]
            step = 1 if op == 0x65 else 2
            if m < 1 or (sp - m) % step != 0:
                break
            target = stack[m - 1]
            if kind[target] != (LIST if op == 0x65 else DICT):
                break
            if n_edge + (sp - m) // step > capacity:
                return _TOO_SMALL, n_obj, n_edge, used
            for k in range(m, sp, step):
                parent[n_edge] = target
                key[n_edge] = -1 if step == 1 else stack[k]
                child[n_edge] = stack[k + step - 1]
                n_edge += 1
            sp = m
        elif op == 0x28:  # MARK
            if mp >= marks.size:
                break
            marks[mp] = sp
            mp += 1
        elif op == 0x74 or op == 0x85 or op == 0x86 or op == 0x87:  # TUPLE (since MARK), TUPLE1/2/3
            if op == 0x74:
                if mp == 0:
                    break
                mp -= 1
                m = marks[mp]
            else:
                m = sp - (op - 0x84)
                if m < 0:
                    break
            if n_obj >= capacity or n_edge + (sp - m) > capacity:
                return _TOO_SMALL, n_obj, n_edge, used
            kind[n_obj] = TUPLE
            for k in range(m, sp):
                parent[n_edge] = n_obj
                key[n_edge] = -1
                child[n_edge] = stack[k]
                n_edge += 1
            sp = m
            made = n_obj
            n_obj += 1
        elif op == 0x4E or op == 0x88 or op == 0x89:  # NONE, NEWTRUE, NEWFALSE
            if n_obj >= capacity:
                return _TOO_SMALL, n_obj, n_edge, used
            kind[n_obj] = NONE if op == 0x4E else BOOL
            value[n_obj] = 1 if op == 0x88 else 0
            made = n_obj
            n_obj += 1
        elif op == 0x47:  # BINFLOAT: 8 bytes, big-endian
            if pos + 8 > n:
                break
            bits = np.int64(0)
            for k in range(8):
                bits = (bits << 8) | np.int64(data[pos + k])
            pos += 8
            if n_obj >= capacity:
                return _TOO_SMALL, n_obj, n_edge, used
            kind[n_obj] = FLOAT
            value[n_obj] = bits
            made = n_obj
            n_obj += 1
        elif op == 0x58 or op == 0x8C:  # BINUNICODE (4-byte length), SHORT_BINUNICODE (1-byte)
            width = 4 if op == 0x58 else 1
            size = _uint_arg(data, pos, n, width)
            if size < 0:
                break
            pos += width
            if pos + size > n:
                break
            if n_obj >= capacity:
                return _TOO_SMALL, n_obj, n_edge, used
            kind[n_obj] = STR
            start[n_obj] = pos
            length[n_obj] = size
            value[n_obj] = _text_hash(data, pos, size)
            pos += size
            made = n_obj
            n_obj += 1
        elif op == 0x80:  # PROTO
            if pos + 1 > n or data[pos] > 5:   # (Python refuses a protocol it doesn't know: so does this)
                break
            pos += 1
        elif op == 0x95:  # FRAME: an 8-byte length, framing only
            if pos + 8 > n:
                break
            pos += 8
        elif op == 0x2E:  # STOP
            if sp == 1 and mp == 0:
                root = stack[0]
            break
        else:
            break   # anything else (globals, reduce, bytes, persistent ids...): not plain recorder data
        if made >= 0:
            if sp >= capacity:
                return _TOO_SMALL, n_obj, n_edge, used
            stack[sp] = made
            sp += 1
    return root, n_obj, n_edge, used


def _group_by_parent_py(parent, n_obj):
    """Counting sort of edges by parent, stable: (order, first edge of each object, its edge count). Edges
    usually come grouped already (a container's items are added by one opcode, up to 1,000 at a time): then
    one pass over the runs of equal parents finds each object's run (a parent met in a second run means they
    are not) and the order is the identity, given as an empty array (`_edge_py`). (Per run, not per edge:
    counting each edge into its parent's slot took 2.4x as long, 0.79 vs 0.33 ms for a 43-file batch's 371K
    edges.) The first edges are int32, as `order` is (edges are fewer than 2**31: `_MAX_BYTES`): every pass
    that reads a container's items reads them, and half the bytes is less of the batch's tables to bring
    into cache again each pass."""
    count = np.zeros(n_obj, np.int32)
    start = np.zeros(n_obj, np.int32)
    grouped = True
    e = 0
    n_edges = parent.size
    while e < n_edges:
        p = parent[e]
        end = e + 1
        while end < n_edges and parent[end] == p:
            end += 1
        if count[p] != 0:
            grouped = False
            break
        start[p] = e
        count[p] = end - e
        e = end
    if grouped:
        return np.empty(0, np.int32), start, count
    count[:] = 0
    for p in parent:
        count[p] += 1
    start = np.empty(n_obj, np.int32)
    total = 0
    for i in range(n_obj):
        start[i] = total
        total += count[i]
    order = np.empty(parent.size, np.int32)
    for e in range(parent.size):
        p = parent[e]
        order[start[p]] = e
        start[p] += 1
    for i in range(n_obj):
        start[i] -= count[i]
    return order, start, count


def _edge_py(order, j):
    """The j-th edge in parent order: `order[j]`, or j itself where `order` is empty (the edges came grouped:
    the passes then read them in place, one indirection fewer per item)."""
    return j if order.size == 0 else order[j]


def _children_of_py(child, order, start, count, parents):
    """(offsets, children) of each of `parents`, concatenated in order."""
    offsets = np.empty(parents.size + 1, np.int64)
    offsets[0] = 0
    for i in range(parents.size):
        offsets[i + 1] = offsets[i] + count[parents[i]]
    out = np.empty(offsets[-1], np.int64)
    for i in range(parents.size):
        s = start[parents[i]]
        for k in range(count[parents[i]]):
            out[offsets[i] + k] = child[_edge(order, s + k)]
    return offsets, out


def _kinds_of_py(kind, ids, allowed):
    """Each of `ids`' kind, NONE where it is -1 (missing), and whether every one is in the bitmask `allowed`:
    what a field's values are, in one pass (numpy took three arrays and a table)."""
    out = np.empty(ids.size, np.int8)
    ok = True
    for i in range(ids.size):
        k = np.int8(NONE) if ids[i] < 0 else kind[ids[i]]
        out[i] = k
        if not (allowed >> k) & 1:
            ok = False
    return out, ok


def _dense_codes_py(values, code_of):
    """Object ids `values` -> (the distinct ones in order of first appearance, each value's index among them).
    `code_of`: -1 per object, and so again on return (only the entries used are reset)."""
    distinct = np.empty(values.size, np.int64)
    codes = np.empty(values.size, np.int64)
    n = 0
    for i in range(values.size):
        v = values[i]
        if code_of[v] < 0:
            code_of[v] = n
            distinct[n] = v
            n += 1
        codes[i] = code_of[v]
    for j in range(n):
        code_of[distinct[j]] = -1
    return distinct[:n], codes


_helpers: dict = {}


def group_by_parent(t: "Tape") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order, start, count): the edges of object i are `order[start[i]:start[i] + count[i]]`, as added (the
    order groups edges by parent, not necessarily in parent order); an empty order where the edges came
    grouped (the usual case): object i's are then edges start[i] to start[i] + count[i] - 1 (`edge_ids`)."""
    return _compiled("group_by_parent", _group_by_parent_py)(t.parent, len(t.kind))


def edge_ids(order: np.ndarray, first: int, n: int) -> np.ndarray:
    """Edges first .. first + n - 1 in parent order (`group_by_parent`), as ids into the tape's edge arrays."""
    return np.arange(first, first + n, dtype=np.int32) if order.size == 0 else order[first:first + n]


def dense_codes(values: np.ndarray, code_of: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(values, return_inverse=True)` in one pass, distinct values in order of first appearance.
    `code_of`: an int64 table of -1, one per object (`Tape.code_table`), left as it was found."""
    return _compiled("dense_codes", _dense_codes_py)(values.astype(np.int64), code_of)


# The first table of an open-addressing pass (`_open_table_py`): a batch's thousands of entries hold a few dozen
# distinct shapes, texts or stacks, and a table with room for every entry cost a fill of up to a MB and a cache
# miss a probe (1.6% of a worker's instructions at 8,192 x 200; its time gain is under this machine's noise).
_FIRST_SLOTS = 1024


def _slots_for(n: int) -> int:
    """The slots of a table that holds `n` things at most half full: a power of two, 2 at least."""
    return 1 << max(1, (2 * n - 1).bit_length())


def _told_apart(name: str, fn, n: int):
    """Compiled pass `name` (`fn`), telling up to `n` things apart in an open table: it is called with a table
    of `_FIRST_SLOTS` slots (fewer where `n` needs fewer), then, where the things did not fit, again with room
    for all; it returns what the pass returns but the flag saying they fit."""
    def call(*args):
        full = _slots_for(n)
        out = _compiled(name, fn)(*args, min(full, _FIRST_SLOTS))
        if not out[-1]:
            out = _compiled(name, fn)(*args, full)
        return out[:-1]

    return call


def _compiled(name: str, fn):
    if name not in _helpers:
        import numba

        global _open_table, _claim, _same_text, _edge
        if _open_table is None:   # (resolved as the pass compiles, at its first call)
            _open_table = numba.njit(cache=True, nogil=True, inline="always")(_open_table_py)
            _claim = numba.njit(cache=True, nogil=True, inline="always")(_claim_py)
            _same_text = numba.njit(cache=True, nogil=True, inline="always")(_same_text_py)
            _edge = numba.njit(cache=True, nogil=True, inline="always")(_edge_py)
        _helpers[name] = numba.njit(cache=True, nogil=True)(fn)
    return _helpers[name]


def _pivot_py(data, kind, text_start, text_len, key, child, order, start, count, dicts, names, name_ends, code_of):
    """(slot, i) -> the value object of the item of dicts[i] whose key is the slot's name; -1 where none (the
    last one where a key repeats, as a dict keeps). Names are UTF-8 laid flat in `names`, name j ending at
    `name_ends[j]`; keys are matched by their bytes, once per key object (`code_of`: -1 per object, and so
    again on return). Also returns the distinct key objects that match no name (for the caller to decode, so
    that a key Python cannot read declines the batch), and False where a key is not a str (the unpickler's
    way reads those)."""
    n_slots = name_ends.size
    out = np.full((n_slots, dicts.size), -1, np.int64)
    total = 0
    for i in range(dicts.size):
        total += count[dicts[i]]
    touched = np.empty(total, np.int64)
    n_touched = 0
    ok = True
    for i in range(dicts.size):
        d = dicts[i]
        for j in range(start[d], start[d] + count[d]):
            e = _edge(order, j)
            k = key[e]
            s = code_of[k]
            if s == -1:
                if kind[k] != STR:
                    ok = False
                    break
                s = -2   # (no name: -2 until reset)
                lo = 0
                for m in range(n_slots):
                    hi = name_ends[m]
                    if hi - lo == text_len[k]:
                        same = True
                        for b in range(hi - lo):
                            if data[text_start[k] + b] != names[lo + b]:
                                same = False
                                break
                        if same:
                            s = m
                            break
                    lo = hi
                code_of[k] = s
                touched[n_touched] = k
                n_touched += 1
            if s >= 0:
                out[s, i] = child[e]
        if not ok:
            break
    n_other = 0
    for j in range(n_touched):
        if code_of[touched[j]] == -2:
            touched[n_other] = touched[j]
            n_other += 1
        code_of[touched[j]] = -1
    return out, touched[:n_other].copy(), ok


def _scalars_py(kind, value, ids, allowed):
    """Many scalar fields at once: `ids` (field, i) -> an object (-1: none), `allowed[field]` a bitmask of the
    kinds it may be besides NONE. Returns (value, present, kind) per (field, i), 0 / False / NONE where absent
    or None, and False when some object's kind is not allowed (then the rest is not filled in)."""
    n_fields, n = ids.shape
    values = np.zeros((n_fields, n), np.int64)
    present = np.zeros((n_fields, n), np.bool_)
    kinds = np.zeros((n_fields, n), np.int8)
    for f in range(n_fields):
        for i in range(n):
            o = ids[f, i]
            if o < 0:
                continue
            k = kind[o]
            if k == NONE:
                continue
            if not (allowed[f] >> k) & 1:
                return values, present, kinds, False
            present[f, i] = True
            values[f, i] = value[o]
            kinds[f, i] = k
    return values, present, kinds, True


def _distinct_items_py(child, order, start, count, parents, n_obj):
    """The distinct children of `parents` (-1: none), in the order first met; given the edges' keys for
    `child`, the distinct keys of dicts."""
    seen = np.zeros(n_obj, np.bool_)
    # (room for every item up front: an array grown inside the loop, reassigned there, made each item's step
    # ~3.5x slower compiled, 7 ms against 1.9 for the 382K item keys of an 88-file batch)
    total = 0
    for i in range(parents.size):
        if parents[i] >= 0:
            total += count[parents[i]]
    out = np.empty(total, np.int64)
    n = 0
    for i in range(parents.size):
        p = parents[i]
        if p < 0:
            continue
        for j in range(start[p], start[p] + count[p]):
            c = child[_edge(order, j)]
            if not seen[c]:
                seen[c] = True
                out[n] = c
                n += 1
    return out[:n].copy()


def _open_table_py(n, slots):
    """An open hash table of `slots` slots (a power of two) to tell `n` things apart by content: each slot's
    first thing (-1: empty), code and hash; then each thing's code (-1: none yet) and each code's first thing.
    (The passes that fill it differ only in what a thing is. Each stops, not fitting, once it is half full:
    `_told_apart` starts them with a small table.)"""
    return (np.full(slots, -1, np.int64), np.empty(slots, np.int32), np.empty(slots, np.uint64),
            np.full(n, -1, np.int32), np.empty(n, np.int64))


def _claim_py(held, held_code, held_key, codes, reps, slot, i, h, n_codes):
    """Thing i, of hash h, found no equal: the empty `slot` holds its new code. Returns the count of codes."""
    held[slot] = i
    held_code[slot] = n_codes
    held_key[slot] = h
    reps[n_codes] = i
    codes[i] = n_codes
    return n_codes + 1


def _same_text_py(data, text_start, text_len, x, y):
    """Whether str objects x and y have the same bytes (read by unsigned index, as `_text_hash_py` explains)."""
    if text_len[x] != text_len[y]:
        return False
    a, b = np.uint64(text_start[x]), np.uint64(text_start[y])
    for k in range(np.uint64(text_len[x])):
        if data[a + k] != data[b + k]:
            return False
    return True


def _shape_codes_py(outer, inner, values, null, slots):
    """Entries told apart by the shape they hold: entry i (none where `null[i]`, a uint8) has tensors outer[i] to
    outer[i + 1] - 1, tensor k the dims `values[inner[k]:inner[k + 1]]`. Returns each entry's code (-1 where
    null; codes in the order first met) and each code's first entry. A hash finds the candidates in an open
    table of `slots` slots, and each is checked dim by dim against the code's first entry: no two shapes ever
    share a code. Last, whether they fit in the table (half full at most; else the codes are not to be used)."""
    held, held_code, held_key, codes, reps = _open_table(null.size, slots)
    mask = held.size - 1
    n_codes = 0
    for i in range(null.size):
        if null[i]:
            continue
        h = np.uint64(0x9E3779B97F4A7C15) ^ np.uint64(outer[i + 1] - outer[i])
        for k in range(outer[i], outer[i + 1]):
            h = (h ^ np.uint64(inner[k + 1] - inner[k])) * np.uint64(1099511628211)
            for d in range(inner[k], inner[k + 1]):
                h = (h ^ np.uint64(values[d])) * np.uint64(1099511628211)
        h ^= h >> np.uint64(29)
        slot = np.int64(h & np.uint64(mask))
        while True:
            r = held[slot]
            if r < 0:
                n_codes = _claim(held, held_code, held_key, codes, reps, slot, i, h, n_codes)
                break
            if held_key[slot] == h and outer[i + 1] - outer[i] == outer[r + 1] - outer[r]:
                same = True
                for j in range(outer[i + 1] - outer[i]):
                    a, b = outer[i] + j, outer[r] + j
                    if inner[a + 1] - inner[a] != inner[b + 1] - inner[b]:
                        same = False
                        break
                    for d in range(inner[a + 1] - inner[a]):
                        if values[inner[a] + d] != values[inner[b] + d]:
                            same = False
                            break
                    if not same:
                        break
                if same:
                    codes[i] = held_code[slot]
                    break
            slot = (slot + 1) & mask
        if 2 * n_codes > held.size:
            return codes, reps[:0].copy(), False
    return codes, reps[:n_codes].copy(), True


def _sizes_codes_py(kind, value, child, order, start, count, ids, slots):
    """Entries told apart by the shape their sizes field holds, read where the tape holds it: ids[i] a list (or
    tuple) of tensors, each a list (or tuple) of int dims; -1 or None: null. Returns each entry's code (-1 where
    null; codes in the order first met), each code's first entry, False where a value is of another kind
    (the unpickler's way reads those; the rest is then not filled in), and whether the shapes fit in the table
    of `slots` slots. As `_shape_codes_py`, but without the entries' tensors and dims laid flat first (two
    `children_of` passes, a kind check and a gather: with their numpy glue, 6-8% of a worker at 8,192 x 200)."""
    held, held_code, held_key, codes, reps = _open_table(ids.size, slots)
    mask = held.size - 1
    n_codes = 0
    for i in range(ids.size):
        o = ids[i]
        if o < 0 or kind[o] == NONE:
            continue
        if kind[o] != LIST and kind[o] != TUPLE:
            return codes, reps[:0].copy(), False, True
        h = np.uint64(0x9E3779B97F4A7C15) ^ np.uint64(count[o])
        for j in range(start[o], start[o] + count[o]):
            tensor = child[_edge(order, j)]
            if kind[tensor] != LIST and kind[tensor] != TUPLE:
                return codes, reps[:0].copy(), False, True
            h = (h ^ np.uint64(count[tensor])) * np.uint64(1099511628211)
            for k in range(start[tensor], start[tensor] + count[tensor]):
                dim = child[_edge(order, k)]
                if kind[dim] != INT:
                    return codes, reps[:0].copy(), False, True
                h = (h ^ np.uint64(value[dim])) * np.uint64(1099511628211)
        h ^= h >> np.uint64(29)
        slot = np.int64(h & np.uint64(mask))
        while True:
            r = held[slot]
            if r < 0:
                n_codes = _claim(held, held_code, held_key, codes, reps, slot, i, h, n_codes)
                break
            b = ids[r]
            if held_key[slot] == h and count[o] == count[b]:
                same = True
                for j in range(count[o]):
                    x = child[_edge(order, start[o] + j)]
                    y = child[_edge(order, start[b] + j)]
                    if count[x] != count[y]:
                        same = False
                        break
                    for k in range(count[x]):
                        if value[child[_edge(order, start[x] + k)]] != value[child[_edge(order, start[y] + k)]]:
                            same = False
                            break
                    if not same:
                        break
                if same:
                    codes[i] = held_code[slot]
                    break
            slot = (slot + 1) & mask
        if 2 * n_codes > held.size:
            return codes, reps[:0].copy(), True, False
    return codes, reps[:n_codes].copy(), True, True


def _text_codes_py(data, value, text_start, text_len, objs, code_of, long_text, slots):
    """Str objects `objs` told apart by content, as `_shape_codes_py` does for shapes: each one's code (in the
    order first met) and each code's first index. Candidates are found by the walker's content hash
    (`value`), and each is checked byte by byte against its code's first object, once per object (`code_of`:
    -1 per object, and so again on return). Texts of `long_text` bytes or more (a world group's rank list,
    in every file) are left to the caller to compare as bytes: their (object, first object) pairs come back
    laid flat. `ok` is False where two texts of one hash differ (a crafted file): the codes are then not
    to be used; nor are they where the texts did not fit in the table of `slots` slots (the last value)."""
    held, held_code, held_key, codes, reps = _open_table(objs.size, slots)
    mask = held.size - 1
    n_codes = 0
    longs = np.empty(2 * objs.size, np.int64)
    n_long = 0
    ok = True
    fits = True
    for i in range(objs.size):
        o = objs[i]
        if code_of[o] >= 0:
            codes[i] = code_of[o]
            continue
        h = np.uint64(value[o])
        h = (h ^ (h >> np.uint64(31))) * np.uint64(0xBF58476D1CE4E5B9)   # (a bijection: equal keys, equal hashes)
        slot = np.int64((h >> np.uint64(20)) & np.uint64(mask))
        while True:
            r = held[slot]
            if r < 0:
                n_codes = _claim(held, held_code, held_key, codes, reps, slot, i, h, n_codes)
                break
            if held_key[slot] == h:
                b = objs[r]
                if text_len[o] >= long_text and text_len[o] == text_len[b]:
                    longs[n_long] = o
                    longs[n_long + 1] = b
                    n_long += 2
                elif not _same_text(data, text_start, text_len, o, b):
                    ok = False
                codes[i] = held_code[slot]
                break
            slot = (slot + 1) & mask
        if not ok:
            break
        code_of[o] = codes[i]
        if 2 * n_codes > held.size:
            fits = False
            break
    for i in range(objs.size):
        code_of[objs[i]] = -1
    return codes, reps[:n_codes].copy(), longs[:n_long].copy(), ok, fits


def _frame_codes_py(data, kind, value, text_start, text_len, name, filename, line, code_of, slots):
    """Stack frames told apart by content: frame i has the str objects name[i] and filename[i] and the int
    object line[i] (-1: absent; an absent or None one is a frame's None). Returns each frame's code (in the
    order first met) and each code's first frame, as `_shape_codes_py` does for shapes. Each distinct str
    object is told apart by content once (by the walker's content hash, then byte by byte against the first of
    its hash: texts that share a hash but differ get codes of their own), its code kept in `code_of` (-1 per
    object, and so again on return); frames are then told apart by (name's code, filename's code, line), ints
    compared exactly. (Comparing each frame's texts byte by byte with its code's first frame's took ~4% of a
    worker at 8,192 x 200: a batch holds ~100 frame dicts a file, sharing ~45 str objects.) `ok` is False
    where a name or filename is not a str, or a line not an int (the unpickler's way reads those); last,
    whether the frames fit in a table of `slots` slots and their texts in one of twice as many."""
    n = name.size
    held, held_code, held_key, codes, reps = _open_table(n, slots)
    mask = held.size - 1
    size = 2 * slots   # (texts: up to two a frame)
    text_held = np.full(size, -1, np.int64)
    text_code = np.empty(size, np.int64)
    text_key = np.empty(size, np.uint64)
    text_mask = size - 1
    texts = np.empty((n, 2), np.int64)   # each frame's name and filename codes, -1 for none
    touched = np.empty(2 * n, np.int64)
    n_touched = 0
    n_texts = 0
    n_codes = 0
    ok = True
    fits = True
    for i in range(n):
        a, f, ln = name[i], filename[i], line[i]
        # (each part: -1 when absent or None, else checked for its kind)
        if a >= 0 and kind[a] == NONE:
            a = -1
        if f >= 0 and kind[f] == NONE:
            f = -1
        if ln >= 0 and kind[ln] == NONE:
            ln = -1
        if (a >= 0 and kind[a] != STR) or (f >= 0 and kind[f] != STR) or (ln >= 0 and kind[ln] != INT):
            ok = False
            break
        name[i], filename[i], line[i] = a, f, ln
        for part in range(2):
            o = a if part == 0 else f
            c = np.int64(-1)
            if o >= 0:
                c = code_of[o]
                if c < 0:
                    h = np.uint64(value[o])
                    h = (h ^ (h >> np.uint64(31))) * np.uint64(0xBF58476D1CE4E5B9)
                    slot = np.int64((h >> np.uint64(20)) & np.uint64(text_mask))
                    while True:
                        r = text_held[slot]
                        if r < 0:
                            text_held[slot] = o
                            text_code[slot] = n_texts
                            text_key[slot] = h
                            c = n_texts
                            n_texts += 1
                            break
                        if text_key[slot] == h and _same_text(data, text_start, text_len, o, r):
                            c = text_code[slot]
                            break
                        slot = (slot + 1) & text_mask
                    code_of[o] = c
                    touched[n_touched] = o
                    n_touched += 1
            texts[i, part] = c
        lv = value[ln] if ln >= 0 else np.int64(0)
        h = np.uint64(0x9E3779B97F4A7C15)
        h = (h ^ np.uint64(texts[i, 0] + 1)) * np.uint64(1099511628211)
        h = (h ^ np.uint64(texts[i, 1] + 1)) * np.uint64(1099511628211)
        h = (h ^ np.uint64(ln >= 0)) * np.uint64(1099511628211)
        h = (h ^ np.uint64(lv)) * np.uint64(1099511628211)
        h ^= h >> np.uint64(29)
        slot = np.int64(h & np.uint64(mask))
        while True:
            r = held[slot]
            if r < 0:
                n_codes = _claim(held, held_code, held_key, codes, reps, slot, i, h, n_codes)
                break
            if (held_key[slot] == h and texts[r, 0] == texts[i, 0] and texts[r, 1] == texts[i, 1]
                    and (line[r] >= 0) == (ln >= 0) and (ln < 0 or value[line[r]] == lv)):
                codes[i] = held_code[slot]
                break
            slot = (slot + 1) & mask
        if 2 * n_codes > held.size or 2 * n_texts > size:
            fits = False
            break
    for j in range(n_touched):
        code_of[touched[j]] = -1
    if not ok or not fits:
        return codes, reps[:0].copy(), ok, fits
    return codes, reps[:n_codes].copy(), True, True


def _list_codes_py(child, order, start, count, lists, code_of_object, slots):
    """Lists told apart by their items' codes in order: list object lists[i] (none where -1) has items
    child[order[start[l]]..], each standing for `code_of_object[item]` (the item itself where that is empty:
    by identity). Returns each list's code (-1 where none; codes in the order first met) and each code's first
    index, as `_shape_codes_py` does for shapes, but reading the items where the tape holds them (no copy of
    them laid flat first). Last, whether they fit in the table of `slots` slots."""
    held, held_code, held_key, codes, reps = _open_table(lists.size, slots)
    mask = held.size - 1
    n_codes = 0
    # (an item's code read inline, each way chosen by a flag: an inlined helper for it made the pass 20x slower)
    by_code = code_of_object.size > 0
    for i in range(lists.size):
        a = lists[i]
        if a < 0:
            continue
        h = np.uint64(0x9E3779B97F4A7C15) ^ np.uint64(count[a])
        for j in range(start[a], start[a] + count[a]):
            x = np.int64(child[_edge(order, j)])
            if by_code:
                x = code_of_object[x]
            h = (h ^ np.uint64(x)) * np.uint64(1099511628211)
        h ^= h >> np.uint64(29)
        slot = np.int64(h & np.uint64(mask))
        while True:
            r = held[slot]
            if r < 0:
                n_codes = _claim(held, held_code, held_key, codes, reps, slot, i, h, n_codes)
                break
            b = lists[r]
            if held_key[slot] == h and count[a] == count[b]:
                same = True
                for k in range(count[a]):
                    x = np.int64(child[_edge(order, start[a] + k)])
                    y = np.int64(child[_edge(order, start[b] + k)])
                    if by_code:
                        x = code_of_object[x]
                        y = code_of_object[y]
                    if x != y:
                        same = False
                        break
                if same:
                    codes[i] = held_code[slot]
                    break
            slot = (slot + 1) & mask
        if 2 * n_codes > held.size:
            return codes, reps[:0].copy(), False
    return codes, reps[:n_codes].copy(), True


def frame_codes(t: "Tape", name: np.ndarray, filename: np.ndarray,
                line: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """`_frame_codes_py` over the tape's objects; `name`, `filename` and `line` (int64) are set to -1 where the
    object is None, in place."""
    return _told_apart("frame_codes", _frame_codes_py, len(name))(np.frombuffer(t.data, dtype=np.uint8), t.kind,
                                                                   t.value, t.text_start, t.text_len, name,
                                                                   filename, line, t.code_table())


def list_codes(t: "Tape", order: np.ndarray, start: np.ndarray, count: np.ndarray, lists: np.ndarray,
               code_of_object: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`_list_codes_py` over the tape's edges: (each list's code, each code's first index)."""
    return _told_apart("list_codes", _list_codes_py, len(lists))(t.child, order, start, count,
                                                                 np.ascontiguousarray(lists, dtype=np.int64),
                                                                 code_of_object)


def shape_codes(outer: np.ndarray, inner: np.ndarray, values: np.ndarray,
                null: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`_shape_codes_py`: (each entry's shape code, each code's first entry)."""
    # (no copies where the arrays are as the pass takes them already; a bool is a byte)
    null = np.ascontiguousarray(null).view(np.uint8) if null.dtype == np.bool_ else null.astype(np.uint8)
    outer, inner, values = (np.ascontiguousarray(a, dtype=np.int64) for a in (outer, inner, values))
    return _told_apart("shape_codes", _shape_codes_py, len(null))(outer, inner, values, null)


def sizes_codes(t: "Tape", order: np.ndarray, start: np.ndarray, count: np.ndarray,
                ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """`_sizes_codes_py` over the tape: (each entry's shape code, each code's first entry, ok)."""
    return _told_apart("sizes_codes", _sizes_codes_py, len(ids))(t.kind, t.value, t.child, order, start, count,
                                                                 np.ascontiguousarray(ids, dtype=np.int64))


def distinct_children(t: "Tape", order: np.ndarray, start: np.ndarray, count: np.ndarray,
                      parents: np.ndarray) -> np.ndarray:
    return _compiled("distinct_items", _distinct_items_py)(t.child, order, start, count, parents.astype(np.int64),
                                                           len(t.kind))


def children_of(t: "Tape", order: np.ndarray, start: np.ndarray, count: np.ndarray,
                parents: np.ndarray, of: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, children) of each of `parents`; with `of=t.key`, their keys instead."""
    return _compiled("children_of", _children_of_py)(t.child if of is None else of, order, start, count,
                                                     parents.astype(np.int64))


def kinds_of(t: "Tape", ids: np.ndarray, allowed: int) -> tuple[np.ndarray, bool]:
    """`_kinds_of_py`: (each of `ids`' kind, NONE where -1; whether all are in the bitmask `allowed`)."""
    return _compiled("kinds_of", _kinds_of_py)(t.kind, np.ascontiguousarray(ids, dtype=np.int64), allowed)


def scalars(t: "Tape", ids: np.ndarray, allowed: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """`_scalars_py` over the tape's objects: `ids` an int64 (fields, n) array, `allowed` int64 bitmasks."""
    return _compiled("scalars", _scalars_py)(t.kind, t.value, np.ascontiguousarray(ids, dtype=np.int64), allowed)


def pivot(t: "Tape", order: np.ndarray, start: np.ndarray, count: np.ndarray, dicts: np.ndarray, names: np.ndarray,
          name_ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """`_pivot_py` over the tape's dicts `dicts`: (value object per (name, dict), unmatched keys, ok)."""
    return _compiled("pivot", _pivot_py)(np.frombuffer(t.data, dtype=np.uint8), t.kind, t.text_start, t.text_len,
                                         t.key, t.child, order, start, count, dicts.astype(np.int64), names,
                                         name_ends, t.code_table())
