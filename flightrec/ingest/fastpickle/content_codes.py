"""Compiled passes that tell things apart by content, in one pass over a tape (shapes, lists of shapes, texts,
stack frames, lists): each thing's code, in the order first met, and each code's first thing. Found by hash
in an open table (`kernels`), then compared in full, so a crafted file's collisions cannot merge two things."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from flightrec.ingest.fastpickle.kernels import compiled, told_apart
from flightrec.ingest.fastpickle.kinds import INT, LIST, NONE, STR, TUPLE

if TYPE_CHECKING:
    from flightrec.ingest.fastpickle.tape import Tape  # (tape reads its texts with these passes)

# (the helpers these passes inline: set by `kernels.compiled` as a pass is compiled)
_open_table = None
_claim = None
_same_text = None
_text_code = None   # (`_text_code_py`, inlined into `_frame_codes_py`)
_edge = None


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
                    c, n_texts = _text_code(data, value, text_start, text_len, o, text_held, text_code, text_key,
                                            n_texts)
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


def _text_code_py(data, value, text_start, text_len, o, text_held, text_code, text_key, n_texts):
    """Str object o's code among the texts met so far (by the walker's content hash, then byte by byte), a new
    one where none has its bytes: (its code, the count of codes)."""
    mask = text_held.size - 1
    h = np.uint64(value[o])
    h = (h ^ (h >> np.uint64(31))) * np.uint64(0xBF58476D1CE4E5B9)
    slot = np.int64((h >> np.uint64(20)) & np.uint64(mask))
    while True:
        r = text_held[slot]
        if r < 0:
            text_held[slot] = o
            text_code[slot] = n_texts
            text_key[slot] = h
            return np.int64(n_texts), n_texts + 1
        if text_key[slot] == h and _same_text(data, text_start, text_len, o, r):
            return np.int64(text_code[slot]), n_texts
        slot = (slot + 1) & mask


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


def frame_codes(t: Tape, name: np.ndarray, filename: np.ndarray,
                line: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """`_frame_codes_py` over the tape's objects; `name`, `filename` and `line` (int64) are set to -1 where the
    object is None, in place."""
    frames = told_apart("frame_codes", _frame_codes_py, len(name), _FRAME_HELPERS)
    return frames(np.frombuffer(t.data, dtype=np.uint8), t.kind, t.value, t.text_start, t.text_len, name, filename,
                  line, t.code_table())


def list_codes(t: Tape, order: np.ndarray, start: np.ndarray, count: np.ndarray, lists: np.ndarray,
               code_of_object: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`_list_codes_py` over the tape's edges: (each list's code, each code's first index)."""
    return told_apart("list_codes", _list_codes_py, len(lists))(t.child, order, start, count,
                                                                 np.ascontiguousarray(lists, dtype=np.int64),
                                                                 code_of_object)


def shape_codes(outer: np.ndarray, inner: np.ndarray, values: np.ndarray,
                null: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`_shape_codes_py`: (each entry's shape code, each code's first entry)."""
    # (no copies where the arrays are as the pass takes them already; a bool is a byte)
    null = np.ascontiguousarray(null).view(np.uint8) if null.dtype == np.bool_ else null.astype(np.uint8)
    outer, inner, values = (np.ascontiguousarray(a, dtype=np.int64) for a in (outer, inner, values))
    return told_apart("shape_codes", _shape_codes_py, len(null))(outer, inner, values, null)


def sizes_codes(t: Tape, order: np.ndarray, start: np.ndarray, count: np.ndarray,
                ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """`_sizes_codes_py` over the tape: (each entry's shape code, each code's first entry, ok)."""
    return told_apart("sizes_codes", _sizes_codes_py, len(ids))(t.kind, t.value, t.child, order, start, count,
                                                                 np.ascontiguousarray(ids, dtype=np.int64))


_FRAME_HELPERS = {"_text_code": _text_code_py}


def text_codes(data, value, text_start, text_len, objs, code_of, long_text):
    """`_text_codes_py`: (each text's code, each code's first object, long pairs to compare, ok)."""
    return told_apart("text_codes", _text_codes_py, len(objs))(data, value, text_start, text_len, objs, code_of,
                                                                long_text)


def warm() -> None:
    """Compile every pass here (or load it from numba's cache), on inputs of one item."""
    i32, i64, none = np.zeros(1, np.int32), np.zeros(1, np.int64), np.full(1, -1, np.int64)
    compiled("text_codes", _text_codes_py)(np.frombuffer(b"\0", np.uint8), i64, i64, i64, i64,   # (read-only)
                                           none.copy(), 1, 2)
    compiled("frame_codes", _frame_codes_py, _FRAME_HELPERS)(np.frombuffer(b"\0", np.uint8), np.zeros(1, np.int8),
                                                             i64, i64, i64, none.copy(), none.copy(), none.copy(),
                                                             none.copy(), 2)
    compiled("shape_codes", _shape_codes_py)(np.zeros(2, np.int64), i64, i64, np.zeros(1, np.uint8), 2)
    compiled("list_codes", _list_codes_py)(i32, i32, i32, i32, i64, i64, 2)
    compiled("sizes_codes", _sizes_codes_py)(np.zeros(1, np.int8), i64, i32, i32, i32, i32, none.copy(), 2)
