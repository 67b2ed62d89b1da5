"""Read a pickle into a flat object table without building Python objects.

`pickle.load` builds a dict, a list or a str for every value, and then flightrec walks those objects once
more to make Arrow columns: at 16K ranks x 2,000 entries that is ~10 us an entry on one core, most of the
cold `analyze`. Here a compiled loop walks the opcodes once and records each object it would have built as
a row: its kind, its int (or float bits), where its text lies in the buffer. Containers are edges (parent,
key, child); memo references point at rows already made, so the writer's sharing (keys, repeated strings,
frame dicts) costs nothing and is kept as identity. `to_arrow` turns the table into the same columns as
`normalize.flatten_dump`.

Only the opcodes that build plain data are read (protocols 2-5, as the recorder's pickler and Python's write
them); anything else, a truncated stream, a reference out of range or an int wider than 64 bits gives no
root, and the caller reads that file with the safe unpickler (`safe_read`), which reports what is wrong, and
notes that this reader declined it. Every read is bounds-checked: the input is someone else's file, and this
loop must not read past it."""

from __future__ import annotations

import importlib.util

import numpy as np

from flightrec.ingest.fastpickle import content_codes, passes
from flightrec.ingest.fastpickle.kinds import BOOL, DICT, FLOAT, INT, LIST, NONE, STR, TUPLE
from flightrec.ingest.fastpickle.tape import Tape

# the walker's status when its tables are too small for the input (then retried with larger ones)
_TOO_SMALL = -2


_walk = None   # the compiled walker, made by `warm` (numba is imported only then: ~0.5 s)


_walk_one = None


_u32 = None


_uint_arg = None


_text_hash = None


def available() -> bool:
    """numba is installed (a dependency of flightrec: missing only where it was left out on purpose)."""
    return importlib.util.find_spec("numba") is not None


def warm(own_process: bool = False) -> None:
    """Compile the walker and the passes, or load them from numba's on-disk cache (`__pycache__` beside these
    files, or the user's cache where that is read-only): ~0.5 s a process; ~10 s the first time after an
    install or upgrade. `own_process`: this process is flightrec's own (a parsing worker), so numba may be set
    up without its linear algebra, which the walker doesn't use (see below)."""
    if _walk is not None:
        return
    import sys

    # Setting up numba's compiler (even to load a cached function) probes for BLAS by importing
    # scipy.linalg where scipy is installed: 0.3-0.4 s of its ~0.9. In a worker nothing else will use
    # numba, so the probe is answered "absent". Not in a caller's process: its own numba code may need it.
    blocked = own_process and "scipy.linalg.cython_blas" not in sys.modules
    if blocked:
        sys.modules["scipy.linalg.cython_blas"] = None   # (import then raises ImportError)
    try:
        _load_walker()
        passes.warm()
        content_codes.warm()
    finally:
        if blocked and sys.modules.get("scipy.linalg.cython_blas", 0) is None:
            del sys.modules["scipy.linalg.cython_blas"]


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
