"""The workers' entries, copied into one chunk per column as each chunk of files comes back from the pool.

Why: on a VM every page a process touches for the first time can cost a trip to the host (~16 us for 4 KB
on the machine in bench/README.md, 30x a recycled page). The pool's entries used to pass through fresh pages
twice: the workers' spool files (page cache, kept until the end) and the parent's copy of them into one chunk
per column (`assemble`). Here the parent copies each spool file into its columns as soon as it arrives and
removes it, so the next spool files reuse those pages; the one-chunk columns are then the only new memory.

Columns grow by `mremap` where the system has it (Linux: an anonymous map's resize moves pages, never copies
them; elsewhere a bigger map is made and the old one copied in) and are handed to Arrow without a copy. Text
columns come as dictionaries, one per chunk: their indices are mapped to one dictionary for the whole job, a
few hundred texts a chunk, vectorized over the rows.
"""

from __future__ import annotations

import mmap

import numpy as np
import pyarrow as pa

_PAGE = mmap.PAGESIZE
_NARROW_CODES = 1 << 16


class _Growing:
    """One growable anonymous buffer of `dtype` items."""

    def __init__(self, dtype: np.dtype, capacity: int):
        self.dtype = np.dtype(dtype)
        self.capacity = 0
        self.map = _anonymous(_PAGE)
        self.reserve(capacity)

    def reserve(self, items: int) -> None:
        if items <= self.capacity:
            return
        items = max(items, 2 * self.capacity)
        size = -(-max(1, items * self.dtype.itemsize) // _PAGE) * _PAGE
        self.map = _grown(self.map, size)   # (no view of it may be alive here: a resize with exports raises)
        self.capacity = size // self.dtype.itemsize

    def write(self, at: int, values: np.ndarray) -> None:
        self.reserve(at + len(values))
        self.array(at + len(values))[at:] = values   # (the view is dropped at once: the map can grow again)

    def take(self, at: int, table: np.ndarray, indices: np.ndarray) -> None:
        """Write `table[indices]` from `at` on, gathered straight into the buffer (no temporary array).
        Indices must be in range (`mode="clip"` only spares numpy a checked copy)."""
        self.reserve(at + len(indices))
        np.take(table.astype(self.dtype, copy=False), indices, out=self.array(at + len(indices))[at:], mode="clip")

    def fill(self, at: int, end: int, value) -> None:
        self.reserve(end)
        self.array(end)[at:end] = value

    def array(self, n: int) -> np.ndarray:
        """The first n items, as a view (the buffer can't grow while it is alive)."""
        return np.frombuffer(self.map, dtype=self.dtype, count=n)


class _Column:
    """One column of a fixed Arrow type: values, validity bytes made only once a null is seen, and for text
    the job-wide dictionary and each row's code in it: two bytes while it holds up to 65,536 texts (the entries'
    text columns hold a few hundred), four past that."""

    def __init__(self, type_: pa.DataType, capacity: int):
        self.type = type_
        self.text = pa.types.is_dictionary(type_)
        if self.text:
            dtype = np.uint16
            self.codes: dict = {}
        elif pa.types.is_boolean(type_):
            dtype = np.uint8
        else:
            dtype = type_.to_pandas_dtype()
        self.values = _Growing(dtype, capacity)
        self.valid: _Growing | None = None

    def add(self, at: int, arr: pa.Array) -> None:
        n = len(arr)
        valid = None if arr.null_count == 0 else np.asarray(arr.is_valid())
        if self.text:
            words = arr.dictionary.to_pylist()
            mapped = np.fromiter((-1 if w is None else self.codes.setdefault(w, len(self.codes)) for w in words),
                                 dtype=np.int32, count=len(words))
            indices = arr.indices
            if len(self.codes) > _NARROW_CODES and self.values.dtype != np.int32:
                self._widen(at)
            if len(mapped) and (mapped >= 0).all() and indices.null_count < n:
                # (each row's code gathered straight into the column: no int32 copy, no cast; under a null row
                # the index is whatever the buffer holds, clipped into range, and its validity says null)
                self.values.take(at, mapped, raw_values(indices))
            else:   # every row null (maybe with no buffer of indices), or a null among the dictionary's values
                raw = raw_values(indices.fill_null(0) if indices.null_count else indices)
                codes = mapped[raw] if len(mapped) else np.zeros(n, np.int32)
                if len(mapped):
                    valid = (codes >= 0) if valid is None else valid & (codes >= 0)
                    codes = np.maximum(codes, 0)
                self.values.write(at, codes.astype(self.values.dtype, copy=False))
        elif pa.types.is_boolean(self.type):
            self.values.write(at, np.asarray(arr.fill_null(False)).view(np.uint8))
        else:
            self.values.write(at, raw_values(arr))
        if valid is not None:
            if self.valid is None:
                self.valid = _Growing(np.uint8, self.values.capacity)
                self.valid.fill(0, at, 1)
            self.valid.write(at, valid.view(np.uint8))
        elif self.valid is not None:
            self.valid.fill(at, at + n, 1)

    def _widen(self, rows: int) -> None:
        """Codes of four bytes from now on, the first `rows` copied over."""
        wide = _Growing(np.int32, self.values.capacity)
        wide.write(0, self.values.array(rows))
        self.values = wide

    def finish(self, n: int) -> pa.Array:
        validity = None if self.valid is None else pa.py_buffer(_bits(self.valid.array(n)))
        values = self.values.array(n)
        if self.text:
            indices = pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), n, [validity, pa.py_buffer(values)])
            return pa.DictionaryArray.from_arrays(indices, pa.array(list(self.codes), self.type.value_type))
        if pa.types.is_boolean(self.type):
            return pa.Array.from_buffers(self.type, n, [validity, pa.py_buffer(_bits(values))])
        return pa.Array.from_buffers(self.type, n, [validity, pa.py_buffer(values)])


def _anonymous(size: int) -> mmap.mmap:
    """Zeroed memory of `size` bytes whose pages are taken only as they are first written."""
    if hasattr(mmap, "MAP_PRIVATE"):
        # (private: a shared anonymous map is a shmem file of fixed size, which mremap cannot grow)
        return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return mmap.mmap(-1, size)   # (Windows)


def _grown(old: mmap.mmap, size: int) -> mmap.mmap:
    """`old` grown to `size` bytes: in place where the system resizes maps (mremap), else a new map with
    `old`'s bytes copied in (macOS has no mremap: Python raises SystemError)."""
    try:
        old.resize(size)
        return old
    except (SystemError, OSError):
        return _copied(old, size)


def _copied(old: mmap.mmap, size: int) -> mmap.mmap:
    new = _anonymous(size)
    new[:len(old)] = old
    old.close()
    return new


def raw_values(arr: pa.Array) -> np.ndarray:
    """A fixed-width array's values as numpy, without a copy; what lies under its nulls is left as is."""
    dtype = np.dtype(arr.type.to_pandas_dtype())
    return np.frombuffer(arr.buffers()[1], dtype=dtype, count=arr.offset + len(arr))[arr.offset:]


def _bits(flags: np.ndarray) -> np.ndarray:
    return np.packbits(flags.view(bool), bitorder="little")


class OneChunkTable:
    """Tables of `schema` appended in order, held as one chunk per column.

    add(table) copies a table in (it can be freed or unmapped right after); finish() returns every row added,
    as a `pa.Table` with the columns of `schema`. Text is a dictionary<int32, string> column: each table's own
    dictionary is mapped to one for all, whose indices come back as uint16 where it holds up to 65,536 texts."""

    def __init__(self, schema: pa.Schema, capacity_rows: int = 1 << 16):
        for field in schema:
            if pa.types.is_dictionary(field.type) and field.type.index_type != pa.int32():
                raise ValueError(f"{field.name}: dictionary columns are gathered with int32 indices")
        self.schema = schema
        self.columns = [_Column(field.type, capacity_rows) for field in schema]
        self.rows = 0

    def add(self, table: pa.Table) -> None:
        if not table.schema.equals(self.schema):
            raise ValueError(f"a table of schema {table.schema} added to columns of {self.schema}")
        table = table.combine_chunks()
        for column, values in zip(self.columns, table.columns):
            if values.num_chunks:
                column.add(self.rows, values.chunk(0))
        self.rows += table.num_rows

    def finish(self) -> pa.Table:
        return pa.table([c.finish(self.rows) for c in self.columns], names=self.schema.names)
