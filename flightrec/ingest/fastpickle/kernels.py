"""numba, for the passes over a tape: each pass compiled once a process (numba's on-disk cache makes a later
process load it instead), with the small helpers it calls compiled to be inlined into it, and the open hash
tables the passes that tell things apart by content share."""

from __future__ import annotations

import numpy as np

_kernels: dict = {}   # pass name -> its compiled function, in this process

# The first table of an open-addressing pass (`_open_table_py`): a batch's thousands of entries hold a few dozen
# distinct shapes, texts or stacks, and a table with room for every entry cost a fill of up to a MB and a cache
# miss a probe (1.6% of a worker's instructions at 8,192 x 200; its time gain is under this machine's noise).
FIRST_SLOTS = 1024


def compiled(name: str, fn, inline: dict | None = None):
    """`fn` compiled by numba (once a process; from numba's cache where a process compiled it before). The
    helpers the passes call by global name (`_open_table`, `_claim`, `_same_text`, `_edge`) are compiled first,
    to be inlined, and set in `fn`'s module: numba reads a global's value when it compiles the function, and
    their modules hold None there until then (numba is imported only when the fast reader is used: ~0.5 s).
    `inline`: more such helpers, by global name, for this pass."""
    if name not in _kernels:
        import numba

        to_inline = numba.njit(cache=True, nogil=True, inline="always")
        for helper, py in {**INLINED, **(inline or {})}.items():
            if helper in fn.__globals__ and fn.__globals__[helper] is None:   # (declared in its module, not made)
                fn.__globals__[helper] = to_inline(py)
        _kernels[name] = numba.njit(cache=True, nogil=True)(fn)
    return _kernels[name]


def slots_for(n: int) -> int:
    """The slots of a table that holds `n` things at most half full: a power of two, 2 at least."""
    return 1 << max(1, (2 * n - 1).bit_length())


def told_apart(name: str, fn, n: int, inline: dict | None = None):
    """Compiled pass `name` (`fn`), telling up to `n` things apart in an open table: it is called with a table
    of `FIRST_SLOTS` slots (fewer where `n` needs fewer), then, where the things did not fit, again with room
    for all; it returns what the pass returns but the flag saying they fit."""
    def call(*args):
        full = slots_for(n)
        out = compiled(name, fn, inline)(*args, min(full, FIRST_SLOTS))
        if not out[-1]:
            out = compiled(name, fn, inline)(*args, full)
        return out[:-1]

    return call


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


def _edge_py(order, j):
    """The j-th edge in parent order: `order[j]`, or j itself where `order` is empty (the edges came grouped:
    the passes then read them in place, one indirection fewer per item)."""
    return j if order.size == 0 else order[j]


_helpers: dict = {}


# The first table of an open-addressing pass (`_open_table_py`): a batch's thousands of entries hold a few dozen
# distinct shapes, texts or stacks, and a table with room for every entry cost a fill of up to a MB and a cache
# miss a probe (1.6% of a worker's instructions at 8,192 x 200; its time gain is under this machine's noise).
_FIRST_SLOTS = 1024


INLINED = {"_open_table": _open_table_py, "_claim": _claim_py, "_same_text": _same_text_py, "_edge": _edge_py}
