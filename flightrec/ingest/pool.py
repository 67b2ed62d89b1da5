"""Parsing in a process pool: each worker reads a chunk of dump files (rank order) and turns it into Arrow
columns (the tape reader a batch at a time where numba is installed and the input is large, else the
plain-data unpickler a file at a time); entries come back through spool files the parent memory-maps.
Errors come back as data: one bad file never stops the job."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import multiprocessing
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pyarrow as pa

from flightrec.errors import FlightrecError
from flightrec.ingest.column_builder import OneChunkTable
from flightrec.ingest.derive import DERIVED_ENTRIES, derive_entries
from flightrec.ingest.fastpickle import to_arrow, walker
from flightrec.ingest.normalize import PG_CONFIG_ROWS, PG_STATUS_ROWS, flatten_dump, merge_parts, rows_table
from flightrec.ingest.safe_read import MAX_DUMP_BYTES, parse_dump_bytes, read_dump_bytes
from flightrec.model.trace import DumpFile, check_reader

# Below this much input the tape reader's start by numba's JIT (each worker importing numba and loading the
# compiled walker: ~0.45 s, all at once) costs more than it saves. Measured on two workers with 8,192 x 200
# dumps (half their bytes the 8,192-rank world list): even at 1,024 files (95 MB), 1.3 s either way; at 2,048
# (190 MB), 1.7 vs 2.5 s.
TAPE_MIN_BYTES = 128 << 20


def _parse_one(path: str, rank: int, data: bytes | None = None) -> dict:
    """Worker: read (unless `data` was) and flatten one file. Errors come back as data so one bad file can't
    stop the job."""
    try:
        dump, fmt = parse_dump_bytes(read_dump_bytes(path) if data is None else data, path)
        out = flatten_dump(dump, rank)
        del dump
        out["metas"][0].update(format=fmt, loaded=True, reader="json" if fmt.startswith("json") else "unpickler")
        return out
    except FlightrecError as exc:
        return _refused(rank, str(exc))
    except OSError as exc:
        # (the file is there and this user can't read it, or the disk failed under it: a collection problem, not
        # a rank that left no dump)
        return _refused(rank, f"{path}: could not be read ({exc.strerror or type(exc).__name__})", unreadable=True)
    except (RecursionError, MemoryError) as exc:
        return _refused(rank, f"{path}: could not be read ({type(exc).__name__}: {exc})")


# The tape's tables take ~10 bytes per byte of input: files go through it a few MB at a time (enough to spread
# its per-call numpy work over dozens of 200-entry files), so a worker's memory stays bounded. 4 MB, not 8: as
# fast once the worker's memory is there (0.421 vs 0.429 ms a file, 8,192 x 200 dumps), and 40% less of it to
# touch the first time (a chunk: 53 vs 90 MB of fresh pages; the pool's workers: 57K vs 83K page faults).
_TAPE_BATCH_BYTES = 4 << 20


def _read_batches(items: list[tuple[str, int]], limit: int, left: dict):
    """The pickles among `items` read a batch at a time, in order: (the batch's items, a buffer holding their
    bytes laid end to end from its start, their sizes), under `limit` bytes a batch (a bigger file alone). Read
    as they are parsed, into one buffer reused batch after batch: a worker holds one batch's bytes, its pages
    touched once (every page first touched is slow on VMs, see `_keep_freed_memory`), and a file costs one
    read (no bytes object per file, no joined copy of the batch). So a batch must be done with before the
    next is asked for. The rest go into `left`: JSON with its bytes, a file that could not be read with None
    (read again, and its reason reported, by `_parse_one`)."""
    buffer = bytearray(limit + 1)
    batch: list[tuple[str, int]] = []
    sizes: list[int] = []
    held = 0

    def room(size: int):
        """Where a file of `size` bytes goes: after the batch's, or (yielding the batch) at the start."""
        nonlocal buffer, batch, sizes, held
        if batch and held + size > limit:
            yield batch, buffer, np.array(sizes, dtype=np.int64)
            batch, sizes, held = [], [], 0
            if len(buffer) > 2 * (limit + 1):   # (a file bigger than a batch was: its room is not kept)
                buffer = bytearray(limit + 1)
        if len(buffer) < held + size + 1:   # (a file bigger than a batch, alone: the batch is empty)
            assert held == 0
            buffer = bytearray(size + 1)

    for item in items:
        fd = _open_dump(item[0])
        if fd is not None:
            # (one open, fstat and read a file: a pickle of exactly the size fstat gave goes straight in)
            try:
                size = os.fstat(fd).st_size
                if 0 < size <= MAX_DUMP_BYTES:
                    yield from room(size)
                    got = os.readv(fd, [memoryview(buffer)[held:held + size + 1]])
                    if got == size and buffer[held] == 0x80:
                        batch.append(item)
                        sizes.append(size)
                        held += size
                        continue
            except OSError:
                pass
            finally:
                os.close(fd)
        # (anything else as before: gzip, JSON, an empty or unreadable file, one that grew or shrank while read)
        try:
            data = read_dump_bytes(item[0])
        except (FlightrecError, OSError):
            left[item] = None
            continue
        if data[:1] != b"\x80":
            left[item] = data   # JSON (and below, pickles the tape leaves): read once, parsed as ever
            continue
        yield from room(len(data))
        buffer[held:held + len(data)] = data
        batch.append(item)
        sizes.append(len(data))
        held += len(data)
    if batch:
        yield batch, buffer, np.array(sizes, dtype=np.int64)


def _open_dump(path: str) -> int | None:
    """A descriptor to read the file, or None where it can't be opened (`read_dump_bytes` then says why)."""
    try:
        return os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    except OSError:
        return None


def _parse_with_tape(items: list[tuple[str, int]]) -> list[dict]:
    """A chunk of files through the tape reader a batch at a time (`to_arrow.flatten_laid_out`): a part per
    batch. The files it declines, and any that fail to read, go `_parse_one`'s way (which reports why), each
    noted with why the tape left it. An error inside the tape reader is not caught: it is a bug to fix."""
    parts, left, why = [], {}, {}
    for batch, buffer, sizes in _read_batches(items, _TAPE_BATCH_BYTES, left):
        declined: dict[int, str] = {}
        part, read = to_arrow.flatten_laid_out(buffer, sizes, [item[1] for item in batch], declined)
        if part is not None:
            for meta in part["metas"]:
                meta.update(format="pickle", loaded=True, reader="fast")
            parts.append(part)
        taken = set(read)
        # (their bytes copied out: the buffer is the next batch's)
        ends = np.cumsum(sizes)
        with memoryview(buffer) as view:
            left.update((batch[j], bytes(view[ends[j] - sizes[j]:ends[j]])) for j in range(len(batch))
                        if j not in taken)
        why.update((batch[j], reason) for j, reason in declined.items())
    for item in items:
        if item in left:
            part = _parse_one(*item, left[item])
            if item in why and part["metas"][0]["loaded"]:
                part["metas"][0]["fast_reader_declined"] = why[item]
            parts.append(part)
    return parts


def _refused(rank: int, reason: str, unreadable: bool = False) -> dict:
    meta = {"rank": rank, "version": None, "backend": None, "comm_lib_version": None, "entry_count": 0,
            "problems": [reason], "format": None, "loaded": False, "unreadable": unreadable}
    return {"metas": [meta], "entries": None, "pg_config": [], "rank_lists": {}, "pg_status": [], "stacks": {}}


def _parse_chunk(items: list[tuple[str, int]], spool: str | None = None, use_tape: bool = False,
                 memory_spool: str | None = None) -> dict:
    """Worker: a chunk of files -> one set of tables, so results cross the process boundary in few pieces.
    Entries go back through a file in `memory_spool` where it has room, else in `spool` (`_spool_entries`)."""
    with paused_gc():
        return _parse_chunk_inner(items, [p for p in (memory_spool, spool) if p is not None], use_tape)


@contextlib.contextmanager
def paused_gc():
    """The cyclic garbage collector paused meanwhile: reading dumps makes millions of dicts, lists and tuples
    that hold no cycles (a file's objects, a file list's tuples), and each burst of them triggers a scan of
    every object alive: ~40% of a worker's time unpickling, 45 ms of the parent's in one full collection
    while listing 8,192 files."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _parse_chunk_inner(items: list[tuple[str, int]], spools: list[str], use_tape: bool) -> dict:
    out = merge_parts(_parse_with_tape(items) if use_tape else [_parse_one(path, rank) for path, rank in items])
    out["pg_config"] = rows_table(out["pg_config"], PG_CONFIG_ROWS)
    out["pg_status"] = rows_table(out["pg_status"], PG_STATUS_ROWS)
    entries = out["entries"] = derive_entries(out["entries"]) if out["entries"] is not None else None
    if entries is not None and spools:
        # Columns go back through a file the parent memory-maps, not through the result pipe: the parent then
        # never unpickles bulk data, which would make it the bottleneck of the pool.
        out["entries"] = _spool_entries(entries, f"chunk{items[0][1]}.arrow", spools)
    return out


def _spool_entries(entries: pa.Table, name: str, folders: list[str]) -> str:
    """Write `entries` as an Arrow file `name` in the first of `folders` it fits in (a memory-backed one can be
    full), and say where."""
    *others, last = folders
    for folder in others:
        try:
            return _write_arrow(entries, os.path.join(folder, name))
        except OSError:
            with contextlib.suppress(OSError):
                os.remove(os.path.join(folder, name))
    return _write_arrow(entries, os.path.join(last, name))


def _write_arrow(table: pa.Table, path: str) -> str:
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return path


# Where the parent gathers the entries as they come (`OneChunkTable`), each chunk's spool file lives for a
# moment: written by a worker, copied, removed. In memory (tmpfs) that is ~3x cheaper for the worker than on
# disk (0.015 vs 0.045 ms a file at 8,192 x 200 dumps: ext4 allocates and journals blocks it then frees), and
# a cold analysis 0.2-0.3 s faster in alternated runs. Only where it has room: a container's /dev/shm is often 64 MB.
MEMORY_SPOOL = "/dev/shm"
MEMORY_SPOOL_MIN_FREE = 256 << 20
_SPOOL_PREFIX = "flightrec-spool-"


def _memory_spool() -> contextlib.AbstractContextManager[str | None]:
    """A temporary folder in MEMORY_SPOOL where it exists and has room, else a context of None. Its name
    holds this process's id, so that one left by a killed run (memory held until reboot) is removed by the
    next (`_remove_orphans`)."""
    try:
        _remove_orphans(MEMORY_SPOOL)
        if shutil.disk_usage(MEMORY_SPOOL).free >= MEMORY_SPOOL_MIN_FREE:
            return tempfile.TemporaryDirectory(prefix=f"{_SPOOL_PREFIX}{os.getpid()}-", dir=MEMORY_SPOOL)
    except OSError:
        pass
    return contextlib.nullcontext(None)


def _remove_orphans(folder: str) -> None:
    """Remove the spool folders in `folder` whose process is gone (a run killed before it could clean up)."""
    with os.scandir(folder) as found:
        names = [e.name for e in found if e.name.startswith(_SPOOL_PREFIX) and e.is_dir(follow_symlinks=False)]
    for name in names:
        pid = name[len(_SPOOL_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(os.path.join(folder, name), ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:   # (another user's: alive)
        return True
    return True


CHUNK_BYTES = 48 << 20  # a worker holds one chunk's columns at a time: this bounds its memory
TAIL_BYTES = 4 << 20    # the smallest chunk made to even out the pool's end (`_chunks`)


def _chunks(files: list[DumpFile], n_chunks: int, workers: int = 1) -> list[list[tuple[str, int]]]:
    """Consecutive files (rank order), at least n_chunks chunks, none much over CHUNK_BYTES of input, and
    smaller towards the end (each at most 1 / (2 x workers) of what is left, down to TAIL_BYTES): the pool's
    last chunks then end close together, where equal ones left a worker idle for up to a chunk's time
    (0.14-0.2 s of ~3 at 8,192 x 200 on two workers)."""
    left = sum(f.size for f in files)
    most = min(CHUNK_BYTES, max(1, left // n_chunks))
    chunks: list[list[tuple[str, int]]] = [[]]
    held = 0
    target = most
    for f in files:
        if chunks[-1] and held + f.size > target:
            chunks.append([])
            held = 0
            target = max(min(most, left // (2 * workers)), min(most, TAIL_BYTES))
        chunks[-1].append((str(f.path), f.rank))
        held += f.size
        left -= f.size
    return chunks


def _keep_freed_memory() -> None:
    """Worker: glibc's malloc keeps what it frees for the next allocation instead of returning it to the
    system. A worker makes and drops the same few big tables for every batch; fresh pages from the system
    cost ~2-7 us each on VMs (a batch's tables are ~10 MB: 2,600 page faults), 10-40% of the tape walk. The
    worker's memory then stays at its high-water mark (one chunk's tables) until the pool closes."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 256 << 20)   # M_MMAP_THRESHOLD: blocks under this come from the heap, reused
        libc.mallopt(-1, 1 << 30)     # M_TRIM_THRESHOLD: the heap's free top is kept up to this
    except (OSError, AttributeError):
        pass   # not glibc: its default behaviour is fine, only slower


def _start_worker(use_tape: bool) -> None:
    _keep_freed_memory()
    if use_tape:
        walker.warm(own_process=True)


def _use_tape(reader: str, total_bytes: int) -> bool:
    """Whether to read with the tape (`reader` as in `LoadOptions`)."""
    check_reader(reader)
    if reader == "tape" and not walker.available():
        raise FlightrecError("the tape reader needs numba, a dependency of flightrec: reinstall it "
                             "(pip install flightrec), or read with the 'unpickler' reader")
    return reader == "tape" or (reader == "auto" and walker.available() and total_bytes >= TAPE_MIN_BYTES)


def parse_all(files: list[DumpFile], workers: int | None, reader: str, progress: Callable[[int, int], None] | None,
              spool: str | None = None) -> list[dict]:
    """Every file parsed into per-chunk tables, by `workers` processes (default: one per core); `reader` as in
    `LoadOptions`; `progress(done_files, total_files)` as chunks come back; entries through `spool` files.
    Up to ONE_CHUNK_MAX_INPUT of input, every chunk's entries are gathered as they come into one table, handed
    back in the first result's "entries" (the others' are None)."""
    workers = workers or os.cpu_count() or 1
    # Several chunks per worker keep the pool busy and the progress bar moving; few enough to stay cheap.
    chunks = _chunks(files, max(1, min(len(files), workers * 8)), workers)
    total_bytes = sum(f.size for f in files)
    use_tape = _use_tape(reader, total_bytes)
    gathered = OneChunkTable(DERIVED_ENTRIES) if total_bytes <= ONE_CHUNK_MAX_INPUT else None
    results: list[dict] = []
    done = 0

    def collect(chunk: list, result: dict) -> None:
        nonlocal done
        entries = result["entries"]
        if gathered is not None and entries is not None:
            _gather(gathered, entries)
            result["entries"] = None
        results.append(result)
        done += len(chunk)
        if progress:
            progress(done, len(files))

    if workers == 1 or len(files) < 8:
        for chunk in chunks:
            collect(chunk, _parse_chunk(chunk, None, use_tape))  # in-process: the table stays in memory
    else:
        # Workers only unpickle and build Arrow arrays (no Polars, whose thread pool is not fork-safe), so fork
        # is safe and starts instantly; spawn would re-import everything and re-run unguarded user scripts.
        ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
        # Each worker loads the compiled reader itself, all at once (`_start_worker`): loaded in this process
        # before the fork it was ~0.9 s of one core while the others waited.
        # (a spool file in memory only while the parent gathers: otherwise the files stay, memory-mapped, and
        # pages on disk are the ones the system can evict)
        with (_memory_spool() if gathered is not None else contextlib.nullcontext(None)) as in_memory, \
                ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_start_worker,
                                    initargs=(use_tape,)) as pool:
            n = len(chunks)
            with _forking_beside_idle_threads():   # (the first submit forks every worker)
                parsed = pool.map(_parse_chunk, chunks, [spool] * n, [use_tape] * n, [in_memory] * n)
            for chunk, result in zip(chunks, parsed):
                collect(chunk, result)
    if gathered is not None and gathered.rows:
        results[0]["entries"] = gathered.finish()
    return results


# Python 3.12+ warns at each fork from a process that has threads (a DeprecationWarning, shown wherever such
# warnings are: each CLI run said twice that fork "may lead to deadlocks" until the CLI hid dependencies'
# deprecation notices; scripts run with `-W default`; test runners). The parent's threads here are idle
# library threads (Polars' jemalloc purgers and spill cleaner, numpy's OpenBLAS server; Polars' own pool, if a
# notebook started it, waits while the load runs): jemalloc and OpenBLAS take their locks around a fork, and a
# worker calls neither Polars nor BLAS. Nothing to act on, so that one warning is not passed on; any other is.
_FORK_WITH_THREADS = r"This process \(pid=\d+\) is multi-threaded, use of fork\(\) may lead to deadlocks"


@contextlib.contextmanager
def _forking_beside_idle_threads():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_FORK_WITH_THREADS, category=DeprecationWarning)
        yield


# Up to this much input the parent gathers the entries into one chunk per column as the pool goes
# (`one_chunk`): the spool files' pages are reused, and the columns need no copy into one chunk later.
# Above it (16,384 x 2,000 is 8.5 GB) they stay in the spool files, memory-mapped: pages the system can evict.
ONE_CHUNK_MAX_INPUT = 4 << 30


def _gather(gathered: OneChunkTable, entries: pa.Table | str) -> None:
    """Copy a chunk's entries (a table, or a spool file then removed) into the gathered columns."""
    if isinstance(entries, pa.Table):
        gathered.add(entries)
        return
    with pa.memory_map(entries, "r") as source:
        gathered.add(pa.ipc.open_file(source).read_all())
    os.remove(entries)
