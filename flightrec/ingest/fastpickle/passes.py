"""Compiled passes over a tape's objects and edges: each container's edges, its children or keys, the kinds
and scalar values of many objects at once, dicts pivoted into one column per key."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from flightrec.ingest.fastpickle.kernels import compiled
from flightrec.ingest.fastpickle.kinds import NONE, STR

if TYPE_CHECKING:
    from flightrec.ingest.fastpickle.tape import Tape  # (tape reads its texts with these passes)

# (the helpers these passes inline: set by `kernels.compiled` as a pass is compiled)
_edge = None


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


def group_by_parent(t: Tape) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order, start, count): the edges of object i are `order[start[i]:start[i] + count[i]]`, as added (the
    order groups edges by parent, not necessarily in parent order); an empty order where the edges came
    grouped (the usual case): object i's are then edges start[i] to start[i] + count[i] - 1 (`edge_ids`)."""
    return compiled("group_by_parent", _group_by_parent_py)(t.parent, len(t.kind))


def edge_ids(order: np.ndarray, first: int, n: int) -> np.ndarray:
    """Edges first .. first + n - 1 in parent order (`group_by_parent`), as ids into the tape's edge arrays."""
    return np.arange(first, first + n, dtype=np.int32) if order.size == 0 else order[first:first + n]


def dense_codes(values: np.ndarray, code_of: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(values, return_inverse=True)` in one pass, distinct values in order of first appearance.
    `code_of`: an int64 table of -1, one per object (`Tape.code_table`), left as it was found."""
    return compiled("dense_codes", _dense_codes_py)(values.astype(np.int64), code_of)


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


def distinct_children(t: Tape, order: np.ndarray, start: np.ndarray, count: np.ndarray,
                      parents: np.ndarray) -> np.ndarray:
    return compiled("distinct_items", _distinct_items_py)(t.child, order, start, count, parents.astype(np.int64),
                                                           len(t.kind))


def children_of(t: Tape, order: np.ndarray, start: np.ndarray, count: np.ndarray,
                parents: np.ndarray, of: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, children) of each of `parents`; with `of=t.key`, their keys instead."""
    return compiled("children_of", _children_of_py)(t.child if of is None else of, order, start, count,
                                                     parents.astype(np.int64))


def kinds_of(t: Tape, ids: np.ndarray, allowed: int) -> tuple[np.ndarray, bool]:
    """`_kinds_of_py`: (each of `ids`' kind, NONE where -1; whether all are in the bitmask `allowed`)."""
    return compiled("kinds_of", _kinds_of_py)(t.kind, np.ascontiguousarray(ids, dtype=np.int64), allowed)


def scalars(t: Tape, ids: np.ndarray, allowed: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """`_scalars_py` over the tape's objects: `ids` an int64 (fields, n) array, `allowed` int64 bitmasks."""
    return compiled("scalars", _scalars_py)(t.kind, t.value, np.ascontiguousarray(ids, dtype=np.int64), allowed)


def pivot(t: Tape, order: np.ndarray, start: np.ndarray, count: np.ndarray, dicts: np.ndarray, names: np.ndarray,
          name_ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """`_pivot_py` over the tape's dicts `dicts`: (value object per (name, dict), unmatched keys, ok)."""
    return compiled("pivot", _pivot_py)(np.frombuffer(t.data, dtype=np.uint8), t.kind, t.text_start, t.text_len,
                                         t.key, t.child, order, start, count, dicts.astype(np.int64), names,
                                         name_ends, t.code_table())


def warm() -> None:
    """Compile every pass here (or load it from numba's cache), on inputs of one item."""
    i32, i64, none = np.zeros(1, np.int32), np.zeros(1, np.int64), np.full(1, -1, np.int64)
    dense_codes(i64, none.copy())
    compiled("group_by_parent", _group_by_parent_py)(i32, 1)
    compiled("distinct_items", _distinct_items_py)(i32, i32, i32, i32, i64, 1)
    compiled("children_of", _children_of_py)(i32, i32, i32, i32, i64)
    compiled("pivot", _pivot_py)(np.frombuffer(b"\0", np.uint8), np.zeros(1, np.int8), i64, i64, i32, i32, i32, i32,
                                 i32, i64, np.zeros(1, np.uint8), i64, none.copy())   # (read-only)
    compiled("scalars", _scalars_py)(np.zeros(1, np.int8), i64, np.zeros((1, 1), np.int64), i64)
    compiled("kinds_of", _kinds_of_py)(np.zeros(1, np.int8), i64, 1)
