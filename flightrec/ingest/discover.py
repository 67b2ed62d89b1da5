"""Find dump files under a directory and say which rank (and host) each belongs to.

File names vary by cluster: `nccl_trace_rank_12` (the writer's default), `rank_12` (torchtitan),
`node017.pci3_rank_12`, `node017-nccl_trace_rank_12`, anything set through `TORCH_FR_DUMP_TEMP_FILE`, and
per-host folders `DUMP_DIR/<host>/<prefix><rank>`. The rank is the trailing number; the host is the part of
the name that differs between files (or the folder, when dumps sit one folder per host).
"""

from __future__ import annotations

import os
import re
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from flightrec.errors import MultipleJobsError, NoDumpsError
from flightrec.model.schema import UNLISTED
from flightrec.model.trace import DumpFile
from flightrec.model.wording import listed

# Compression or format suffixes people add after the rank: `rank_3.json`, `rank_3.pkl.gz`.
_SUFFIXES = (".gz", ".json", ".pkl", ".pickle", ".bin")
_TRAILING_RANK = re.compile(r"^(?P<prefix>.*?)(?P<rank>\d+)$")
_SEPARATORS = "._-"
_MAX_RANK_DIGITS = 9   # (a longer number is a timestamp or a hash, no rank: ranks are held as 32-bit ints)
CACHE_DIR_NAME = ".flightrec-cache"
_PICKLE_OR_GZIP = (b"\x80", b"\x1f\x8b")
# A pickle, a gzip stream, or JSON (maybe after a BOM or blanks): an object, or an array of objects or lists (a
# log line's "[rank1]:" or "[2024-..." is not)
_DUMP_HEAD = re.compile(rb"^(?:\x80|\x1f\x8b|(?:\xef\xbb\xbf)?\s*(?:\{|\[\s*(?:[\[{\]]|$)|$))")


def _head(path: str | Path) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(64)
    except OSError:
        return None


def _looks_binary_dump(path: str | Path) -> bool:
    """A skipped file is worth a warning when it starts like a pickle or gzip dump (notes, logs and JSON
    reports beside the dumps are skipped quietly)."""
    return (_head(path) or b"").startswith(_PICKLE_OR_GZIP)


def _starts_like_a_dump(path: str | Path) -> bool:
    """The first bytes could begin a pickle, gzip or JSON dump (a core file or a log could not). An empty or
    unreadable file is kept: it is refused with its reason when read ("empty file": the rank died dumping)."""
    head = _head(path)
    return not head or bool(_DUMP_HEAD.match(head))


def _strip_suffixes(name: str) -> str:
    changed = True
    while changed:
        changed = False
        for suffix in _SUFFIXES:
            if name.endswith(suffix) and len(name) > len(suffix):
                name = name[: -len(suffix)]
                changed = True
    return name


def _walk_files(root: Path, unlisted: list[tuple[str, str]] | None = None) -> list[tuple[str, str, str,
                                                                                     os.stat_result]]:
    """Every regular file below root: (path, its folder, its name, its stat), following directory symlinks once
    (loops are cut). One `scandir` a folder, one stat a file, paths kept as the strings `scandir` makes: at 16K
    dumps, `os.walk`, two stats a file and a parsed path each took 0.4 s of a 10 s warm analysis. Folders that
    can't be listed go into `unlisted` as (path, reason)."""
    found: list[tuple[str, str, str, os.stat_result]] = []
    seen_dirs: set[tuple[int, int]] = set()
    pending = [os.fspath(root)]
    while pending:
        folder = pending.pop()
        try:
            stat = os.stat(folder)
            if (stat.st_dev, stat.st_ino) in seen_dirs:
                continue
            seen_dirs.add((stat.st_dev, stat.st_ino))
            with os.scandir(folder) as it:
                listing = sorted(it, key=lambda entry: entry.name)
        except OSError as exc:
            # (skipped, as os.walk does, but kept: a host folder not readable would read as that host's ranks
            # having left no dump, and the runbook drain a healthy host; the report names it unreadable)
            reason = exc.strerror or str(exc)
            if unlisted is not None:
                unlisted.append((folder, reason))
            warnings.warn(f"cannot list {folder} ({reason}): any dumps in it are not read; fix its permissions, "
                          "or run as a user who can read it", stacklevel=3)
            continue
        subfolders = []
        for entry in listing:
            if entry.name.startswith("."):
                continue
            try:
                if entry.is_dir():
                    if entry.name != CACHE_DIR_NAME:
                        subfolders.append(entry.path)
                elif entry.is_file():
                    found.append((entry.path, folder, entry.name, entry.stat()))
            except OSError:
                continue   # (a file removed or a link broken while listing)
        pending.extend(reversed(subfolders))   # depth first, in name order
    return found


def _common_suffix(strings: list[str]) -> str:
    """Longest common suffix, cut back to start at a separator so 'node10-x'/'node00-x' give '-x'."""
    if not strings:
        return ""
    shortest = min(strings, key=len)
    n = 0
    while n < len(shortest) and all(s[len(s) - 1 - n] == shortest[len(shortest) - 1 - n] for s in strings):
        n += 1
    suffix = shortest[len(shortest) - n:] if n else ""
    if len(set(strings)) > 1 and suffix not in strings:   # (a whole name is a suffix: it holds no host)
        while suffix and suffix[0] not in _SEPARATORS:
            suffix = suffix[1:]
    return suffix


def _first_differing_level(paths: list[tuple[str, ...]]) -> int:
    """The index of the first path component that is not the same in all `paths` (or past the shortest)."""
    level = 0
    while all(len(p) > level for p in paths) and len({p[level] for p in paths}) == 1:
        level += 1
    return level


@dataclass(frozen=True)
class Found:
    """What `discover_all` finds: the dump files, and the folders it could not list."""

    files: list[DumpFile]
    unlisted: pl.DataFrame   # (schema.UNLISTED) path, reason
    # host folders beside those holding dumps, named alike (`node1` beside `node0`), that hold none: hosts gone
    empty_hosts: list[str] = field(default_factory=list)


def discover_all(root: str | os.PathLike, prefix: str | None = None) -> Found:
    """`discover`, the folders under `root` that could not be listed (a dump in them is unreadable, not
    missing), and the host folders that hold no dump."""
    unlisted: list[tuple[str, str]] = []
    empty_hosts: list[str] = []
    files = discover(root, prefix, unlisted, empty_hosts)
    return Found(files, pl.DataFrame([(p, why, None) for p, why in unlisted], schema=UNLISTED, orient="row"),
                 empty_hosts)


def discover(root: str | os.PathLike, prefix: str | None = None,
             unlisted: list[tuple[str, str]] | None = None, empty_hosts: list[str] | None = None) -> list[DumpFile]:
    """List dump files under `root` with their rank and host.

    Args:
        root: the dump directory (searched recursively) or a single dump file.
        prefix: the file-name prefix before the rank (e.g. ``nccl_trace_rank_``); by default any name that ends
            in a number is a candidate and the host is taken from the part of the name that varies.

    Raises:
        NoDumpsError: nothing under `root` looks like a dump.
    """
    root = Path(root)
    if not root.exists():
        raise NoDumpsError(f"{root}: no such file or directory; pass the folder the ranks wrote their dumps to")
    paths = [(str(root), "", root.name, root.stat())] if root.is_file() else _walk_files(root, unlisted)

    candidates, skipped, folders = _named_like_dumps(paths, prefix)
    # A name alone in its kind (`core.4242`, `train.log.1` beside `nccl_trace_rank_*`) is a dump only if it
    # starts like one: else it would claim a rank (`rank 4242 of 4243`) and shadow the real dump of its rank.
    # Names shared by several files are not opened here (16K opens: 0.1 s of a warm run).
    if prefix is None:
        counts = Counter(c[1] for c in candidates)
        strays = [c for c in candidates if len(counts) > 1 and counts[c[1]] == 1 and not _starts_like_a_dump(c[0])]
        if strays:
            names = listed((os.path.basename(c[0]) for c in strays), 5)
            warnings.warn(f"ignored {len(strays)} file(s) that end in a number but are no dump: {names}",
                          stacklevel=2)
            stray_paths = {c[0] for c in strays}
            candidates = [c for c in candidates if c[0] not in stray_paths]
    noteworthy = [p for p in skipped if _looks_binary_dump(p)]
    if candidates and noteworthy:
        names = listed((os.path.basename(p) for p in noteworthy), 5)
        why = (f"that look like dumps but don't start with {prefix!r} and a rank number" if prefix is not None
               else "whose name has no rank number (pass --prefix if they are dumps)")
        warnings.warn(f"ignored {len(noteworthy)} file(s) {why}: {names}", stacklevel=2)

    if not candidates:
        raise _no_dumps_error(root, prefix, unlisted)

    # Host from the name: the part of the prefix before what all prefixes share, when it differs per file.
    name_prefixes = [c[1] for c in candidates]
    host_by_name: dict[str, str | None] = {}
    if len(set(name_prefixes)) > 1:
        shared = _common_suffix(name_prefixes)
        for p in set(name_prefixes):
            host = p[: len(p) - len(shared)].rstrip(_SEPARATORS)
            host_by_name[p] = host or None
    # Host from the folder: only when dumps are spread over several folders (one folder a host). It is the
    # first level below the root where the folders' paths differ: `dumps/node01/tmp/rank_5` is on node01.
    folder_is_host = len(folders) > 1
    host_level = _first_differing_level([Path(f).parts for f in folders]) if folder_is_host else 0
    lone_host = None if folder_is_host else _lone_host_folder(root, folders, [c[2] for c in candidates])

    _one_job(root, candidates)
    if empty_hosts is not None and (folder_is_host or lone_host):
        unlisted_paths = {path for path, _ in unlisted or []}
        level = host_level if folder_is_host else len(root.parts)
        empty_hosts += _empty_host_folders(folders, level, unlisted_paths)
    files = []
    host_of_folder: dict[str, str | None] = {}
    for path, name_prefix, rank, stat, folder in candidates:
        host = host_by_name.get(name_prefix)
        if host is None and folder_is_host:
            if folder not in host_of_folder:
                parts = Path(folder).parts
                host_of_folder[folder] = parts[host_level] if host_level < len(parts) else None
            host = host_of_folder[folder]
        host = host or lone_host
        files.append(DumpFile(path=path, rank=rank, host=host, size=stat.st_size, mtime_ns=stat.st_mtime_ns))
    return _one_file_per_rank(files)


def _named_like_dumps(paths: list[tuple[str, str, str, os.stat_result]], prefix: str | None
                      ) -> tuple[list[tuple[str, str, int, os.stat_result, str]], list[str], set[str]]:
    """(files whose name is a dump's: (path, name prefix, rank, stat, folder); the others' paths; the folders
    holding dumps)."""
    candidates: list[tuple[str, str, int, os.stat_result, str]] = []
    skipped: list[str] = []
    folders: set[str] = set()
    for path, folder, name, stat in paths:
        stem = _strip_suffixes(name)
        if prefix is not None:
            if (not stem.startswith(prefix) or not stem[len(prefix):].isdigit()
                    or len(stem) - len(prefix) > _MAX_RANK_DIGITS):
                skipped.append(path)
                continue
            candidates.append((path, "", int(stem[len(prefix):]), stat, folder))
            folders.add(folder)
            continue
        match = _TRAILING_RANK.match(stem)
        if match and len(match["rank"]) <= _MAX_RANK_DIGITS:
            candidates.append((path, match["prefix"], int(match["rank"]), stat, folder))
            folders.add(folder)
        else:
            skipped.append(path)
    return candidates, skipped, folders


def _no_dumps_error(root: Path, prefix: str | None, unlisted: list[tuple[str, str]] | None) -> NoDumpsError:
    """Why nothing under `root` reads as a dump, and what to do about it."""
    if unlisted:
        return NoDumpsError(f"{root}: no dump could be read: {len(unlisted)} folder(s) could not be listed "
                            f"({unlisted[0][0]}: {unlisted[0][1]}); fix their permissions, or run as a user who "
                            "can read them")
    if prefix is not None:
        return NoDumpsError(
            f"{root}: no dump file's name is {prefix!r} and a rank number; check the prefix (the file name "
            "TORCH_FR_DUMP_TEMP_FILE gave, without the rank), or leave out --prefix to take any name ending in "
            "a rank number")
    return NoDumpsError(
        f"{root}: no dump files whose name ends in a rank number; check the path, or pass --prefix with the "
        "file-name prefix your job used (TORCH_FR_DUMP_TEMP_FILE)"
    )


def _one_job(root: Path, candidates: list[tuple[str, str, int, os.stat_result, str]]) -> None:
    """The dumps found are one job's: no rank is claimed by two sets of files. Two folders whose ranks overlap
    (`fixtures/`: many jobs' folders), or two name prefixes in one folder claiming the same ranks (two writers'
    files, or two runs), are more than one job: analysed together they would read as a mix.

    Raises:
        MultipleJobsError: listing the jobs found and how to analyse one.
    """
    def sets(kept) -> dict[tuple[str, str], set[int]]:
        out: dict[tuple[str, str], set[int]] = {}
        for _, name_prefix, rank, _, folder in kept:
            out.setdefault((folder, name_prefix), set()).add(rank)
        return out

    def clashing(by_set) -> set[tuple[str, str]]:
        owner: dict[int, tuple[str, str]] = {}
        out = set()
        for key, ranks in by_set.items():
            for rank in ranks:
                if rank in owner and owner[rank] != key:
                    out |= {key, owner[rank]}
                owner.setdefault(rank, key)
        return out

    by_set = sets(candidates)
    clash = clashing(by_set)
    if clash:
        # (only now are files opened: one that doesn't start like a dump, a stray beside a copy, is no job)
        candidates = [c for c in candidates if (c[4], c[1]) not in clash or _starts_like_a_dump(c[0])]
        by_set = sets(candidates)
        clash = clashing(by_set)
    if not clash:
        return
    jobs = _jobs(root, by_set)
    shown = "\n".join(f"  {where}: ranks {_span(ranks)} ({len(ranks)} dumps)" for where, ranks in jobs[:12])
    more = f"\n  ... ({len(jobs)} in all)" if len(jobs) > 12 else ""
    first = jobs[0][0]
    pick = (f"--prefix {first.split('--prefix ')[1].rstrip(')')}" if "--prefix " in first
            else os.path.join(str(root), first.split(" (")[0]))
    raise MultipleJobsError(
        f"{root} holds the dumps of {len(jobs)} jobs (a rank appears in more than one of them):\n{shown}{more}\n"
        f"analyse one at a time: flightrec analyze {pick if pick.startswith('--') else pick}"
        + (f" {root}" if pick.startswith("--") else ""))


def _jobs(root: Path, by_set: dict[tuple[str, str], set[int]]) -> list[tuple[str, set[int]]]:
    """The jobs among the file sets (folder, name prefix): each folder below `root` whose sets' ranks don't
    overlap is one job (a job's per-host folders split its ranks); one whose do is looked into, down to its
    folders, then to its name prefixes."""
    def under(folder: str) -> list[tuple[str, str]]:
        return [k for k in by_set if k[0] == folder or k[0].startswith(folder.rstrip(os.sep) + os.sep)]

    def overlaps(keys: list[tuple[str, str]]) -> bool:
        seen: set[int] = set()
        for k in keys:
            if seen & by_set[k]:
                return True
            seen |= by_set[k]
        return False

    out: list[tuple[str, set[int]]] = []
    pending = [os.fspath(root)]
    while pending:
        folder = pending.pop(0)
        keys = under(folder)
        if not keys:
            continue
        name = os.path.relpath(folder, root)
        if not overlaps(keys):
            out.append((name, set().union(*(by_set[k] for k in keys))))
            continue
        here = [k for k in keys if k[0] == folder]
        for k in here:   # (files right in this folder: one set per name prefix)
            out.append((f"{name} (--prefix {k[1]})", by_set[k]))
        children = sorted({os.path.join(folder, os.path.relpath(k[0], folder).split(os.sep)[0])
                           for k in keys if k[0] != folder})
        pending.extend(children)
    return out


def _span(ranks: set[int]) -> str:
    low, high = min(ranks), max(ranks)
    return f"{low}-{high}" if high - low + 1 == len(ranks) and high > low else (
        str(low) if low == high else f"{low}-{high}, some missing")


# What numbers a job's runs rather than its hosts: such a folder holding one block of ranks is a partial run
# (`attempt_1/` with ranks 8-15 of 16), not the one host left.
_RUN_FOLDER_WORDS = frozenset({"attempt", "run", "retry", "restart", "try", "trial", "step", "iter", "iteration",
                               "epoch", "job", "rank", "ranks", "dump", "dumps", "trace", "traces", "v", "version"})


def _empty_host_folders(folders: set[str], host_level: int, unlisted: set[str]) -> list[str]:
    """Folders beside the host folders (`node1` beside `node0`, same name but the number) that hold no dump: a
    host whose ranks wrote nothing there, down or not collected. (Only names alike: `logs/` beside `node0/` is
    no host.) A folder that could not be listed is unreadable, not empty."""
    hosts = {Path(f).parts[: host_level + 1] for f in folders if len(Path(f).parts) > host_level}
    stems = {re.sub(r"\d+$", "", parts[-1]) for parts in hosts}
    names = {parts[-1] for parts in hosts}
    found = []
    for parent in sorted({Path(*parts[:-1]) for parts in hosts}):
        try:
            with os.scandir(parent) as it:
                siblings = sorted(e.name for e in it if e.is_dir() and not e.name.startswith("."))
        except OSError:
            continue
        for name in siblings:
            if (name not in names and str(parent / name) not in unlisted and re.search(r"\d+$", name)
                    and re.sub(r"\d+$", "", name) in stems):
                found.append(name)
    return found


def _lone_host_folder(root: Path, folders: set[str], ranks: list[int]) -> str | None:
    """The one folder below the root that holds every dump, where it reads as the only host left of a per-host
    layout (the others, down, wrote nothing): a name ending in the number of the one block of ranks it holds
    (`node1` holding ranks 8-15, blocks of 8). Else None: `traces/`, or `run2/` holding ranks 0-31, is no host.
    (A folder that holds the whole job, as `node0/` for a one-host job may, tells no placement: `resolve`
    drops a single host of every rank.)"""
    if len(folders) != 1 or not ranks:
        return None
    try:
        parts = Path(next(iter(folders))).relative_to(root).parts
    except ValueError:
        return None
    number = re.match(r"^(.*?)(\d+)$", parts[0]) if parts else None
    if number is None or number.group(1).strip("-_. ").lower() in _RUN_FOLDER_WORDS:
        return None
    low, high = min(ranks), max(ranks)
    # (blocks as many as its files, or as wide as its ranks' span: a host's lost dumps leave holes)
    for k in (len(set(ranks)), high - low + 1):
        if low // k == high // k == int(number.group(2)):
            return parts[0]
    return None


def _one_file_per_rank(files: list[DumpFile]) -> list[DumpFile]:
    """Two files claiming one rank (a dump copied twice, a re-run): keep the newer and say so."""
    by_rank: dict[int, DumpFile] = {}
    for f in files:
        kept = by_rank.get(f.rank)
        if kept is None:
            by_rank[f.rank] = f
            continue
        # (one that starts like a dump before one that doesn't, then the newer)
        f_key, kept_key = ((_starts_like_a_dump(x.path), x.mtime_ns, str(x.path)) for x in (f, kept))
        newer, older = (f, kept) if f_key > kept_key else (kept, f)
        why = "newer" if f_key[0] == kept_key[0] else "readable"
        warnings.warn(
            f"two dumps claim rank {f.rank}: keeping the {why} {newer.path}, ignoring {older.path}",
            stacklevel=3,
        )
        by_rank[f.rank] = newer
    return [by_rank[r] for r in sorted(by_rank)]
