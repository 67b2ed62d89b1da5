"""The tape reader compiled ahead of time: a native module that starts in milliseconds, without numba.

Loading the reader with numba's JIT, even from its cache, costs ~0.7 s in each parsing worker: numba sets up
its type registries before it can call anything (0.3 s), and imports itself (0.2 s). At 8,192 ranks that is a
tenth of a cold `analyze`, paid on every core at once. `build` compiles the same functions once (numba's
`pycc` and the system's C compiler, ~20 s) into an extension module next to numba's cache; `load` imports
it (~5 ms, no numba) where it exists and matches this version of the reader. Where it doesn't, the JIT is
used as before: the module is only a faster start, never needed.

The module's name carries a digest of the reader's source, numba's, numpy's and Python's versions and the
CPU: an edited reader, another numba or another interpreter never loads a stale build. Only a module this user
(or root) owns, in a folder no one else can write to, is loaded: it runs as whoever loads it.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import inspect
import os
import platform
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import numpy as np

# Each compiled function: its exported signature (the types the callers in `tape` pass: edges, each object's
# first edge and edge count as int32, offsets and object ids as int64). The compiled code checks nothing: an
# array of another item size crashes the process, a strided one is read as if contiguous. So each is called
# through `checked`, which refuses (TypeError) what its signature doesn't declare: the batch then goes the
# unpickler's way.
_EDGES = "int32[::1], int32[::1], int32[::1], int32[::1]"   # child (or key), order, start, count
SIGNATURES = {
    "walk": "Tuple((int64, int64[::1], int8[::1], int64[::1], int64[::1], int64[::1], int32[::1], int32[::1], "
            "int32[::1], int64, int64))(uint8[::1], int64[::1], int64[::1], int64, int64)",
    "dense_codes": "Tuple((int64[::1], int64[::1]))(int64[::1], int64[::1])",
    "group_by_parent": "Tuple((int32[::1], int32[::1], int32[::1]))(int32[::1], int64)",
    "distinct_items": f"int64[::1]({_EDGES}, int64[::1], int64)",
    "children_of": f"Tuple((int64[::1], int64[::1]))({_EDGES}, int64[::1])",
    "pivot": "Tuple((int64[:, ::1], int64[::1], boolean))(uint8[::1], int8[::1], int64[::1], int64[::1], "
             f"int32[::1], {_EDGES}, int64[::1], uint8[::1], int64[::1], int64[::1])",   # (key, then the edges)
    "text_codes": "Tuple((int32[::1], int64[::1], int64[::1], boolean, boolean))(uint8[::1], int64[::1], "
                  "int64[::1], int64[::1], int64[::1], int64[::1], int64, int64)",
    "frame_codes": "Tuple((int32[::1], int64[::1], boolean, boolean))(uint8[::1], int8[::1], int64[::1], "
                   "int64[::1], int64[::1], int64[::1], int64[::1], int64[::1], int64[::1], int64)",
    "shape_codes": "Tuple((int32[::1], int64[::1], boolean))(int64[::1], int64[::1], int64[::1], uint8[::1], int64)",
    "sizes_codes": f"Tuple((int32[::1], int64[::1], boolean, boolean))(int8[::1], int64[::1], {_EDGES}, int64[::1], "
                   "int64)",
    "list_codes": f"Tuple((int32[::1], int64[::1], boolean))({_EDGES}, int64[::1], int64[::1], int64)",
    "kinds_of": "Tuple((int8[::1], boolean))(int8[::1], int64[::1], int64)",
    "scalars": "Tuple((int64[:, ::1], boolean[:, ::1], int8[:, ::1], boolean))(int8[::1], int64[::1], int64[:, ::1], "
               "int64[::1])",
}


def _arguments(signature: str) -> tuple:
    """What a signature's arguments must be, in order: (numpy dtype, dimensions) of an array, or None for an
    int. `"int64[::1](int32[::1], int64[:, ::1], int64)"` -> `(("int32", 1), ("int64", 2), None)`."""
    inside = signature[signature.rindex("(", 0, signature.rindex(")")) + 1:signature.rindex(")")]
    args, depth, current = [], 0, ""
    for ch in inside + ",":
        if ch == "," and depth == 0:
            args.append(current.strip())
            current = ""
            continue
        depth += {"[": 1, "]": -1}.get(ch, 0)
        current += ch
    return tuple((a[:a.index("[")], a.count(",") + 1) if "[" in a else None for a in args)


ARGUMENTS = {name: _arguments(signature) for name, signature in SIGNATURES.items()}


def checked(name: str, fn):
    """`fn`, the compiled `name`, refusing arguments its signature doesn't declare (see SIGNATURES)."""
    expected = ARGUMENTS[name]
    # (dtypes made once, and compared by identity first: ~60 calls a batch, the check was 5 us of each)
    wanted = tuple(None if want is None else (np.dtype(want[0]), want[1]) for want in expected)

    def call(*args):
        if len(args) != len(wanted):
            raise TypeError(f"{name}: {len(args)} arguments, expected {len(wanted)}")
        for i, arg in enumerate(args):
            want = wanted[i]
            if want is None:
                if not isinstance(arg, (int, np.integer)):
                    raise TypeError(f"{name}: argument {i} must be an int, not {type(arg).__name__}")
            elif not (isinstance(arg, np.ndarray) and (arg.dtype is want[0] or arg.dtype == want[0])
                      and arg.ndim == want[1] and arg.flags.c_contiguous):
                raise TypeError(f"{name}: argument {i} must be a C-contiguous {want[1]}-d {want[0]} array")
        return fn(*args)

    call.__name__ = name
    return call


def _sources() -> dict:
    """The Python function behind each compiled one: `tape._<name>_py` for each name of `SIGNATURES`."""
    from flightrec.ingest.fastpickle import walker as tape

    return {name: getattr(tape, f"_{name}_py") for name in SIGNATURES}


def module_name() -> str | None:
    """The compiled module's name for this reader, numba, Python and machine; None without numba (the
    version is read from its metadata: numba is not imported)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        versions = [version("numba"), version("numpy")]
    except PackageNotFoundError:
        return None
    from flightrec.ingest.fastpickle import walker as tape

    try:
        sources = [inspect.getsource(tape), inspect.getsource(_compile)]
    except (OSError, TypeError):
        return None   # (installed without its sources: nothing to tell a build for this reader by)
    cpu = _host_cpu() or "generic"
    key = "\0".join([*sources, repr(SIGNATURES), *versions, sys.version, platform.machine(), cpu])
    return f"{_PREFIX}{_digest(cpu)[:8]}_{_digest(key)[:16]}"


_PREFIX = "_flightrec_tape_"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _host_cpu() -> str | None:
    """This machine's CPU model and instruction set extensions (Linux: the first processor of /proc/cpuinfo),
    None where unknown. A build for the host's instruction set is named by them: a cache folder shared by a
    cluster's machines never hands one a module using instructions its CPU lacks (elsewhere the build is
    generic)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            fields = {}
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        return None
    if not fields.get("flags"):
        return None
    return f"{fields.get('model name', '')}|{' '.join(sorted(fields['flags'].split()))}"


def folders() -> list[Path]:
    """Where a build is looked for, in order, and written (the first that is writable): $FLIGHTREC_READER_DIR
    alone where it is set (a shared folder, for an installation that is not writable); else beside the
    package's numba cache, then `reader/` in flightrec's cache folder ($FLIGHTREC_CACHE_DIR, else
    ~/.cache/flightrec)."""
    chosen = os.environ.get("FLIGHTREC_READER_DIR")
    if chosen:
        return [Path(chosen)]
    user = os.environ.get("FLIGHTREC_CACHE_DIR") or Path.home() / ".cache" / "flightrec"
    return [Path(__file__).parent / "__pycache__", Path(user) / "reader"]


def _file_name(name: str) -> str:
    return name + importlib.machinery.EXTENSION_SUFFIXES[0]


def load() -> ModuleType | None:
    """The compiled module for this reader, or None where none was built (or it can't be loaded)."""
    name = module_name()
    if name is None:
        return None
    if name in sys.modules:
        return sys.modules[name]
    for folder in folders():
        path = folder / _file_name(name)
        if not path.is_file() or not _trusted(path):
            continue
        try:
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        except (ImportError, OSError):
            continue   # (a build for another libc, a file cut short: the JIT still works)
        sys.modules[name] = module
        return module
    return None


def _trusted(path: Path) -> bool:
    """A native module runs as whoever loads it: only one that this user (or root) owns, in a folder no one
    else can write to (a shared $FLIGHTREC_CACHE_DIR must not hand anyone's `analyze` another user's code)."""
    try:
        own, folder = path.stat(), path.parent.stat()
    except OSError:
        return False
    users = {os.getuid(), 0} if hasattr(os, "getuid") else None
    if users is None:
        return True   # (no POSIX owners: as numba's own cache)
    return own.st_uid in users and folder.st_uid in users and not folder.st_mode & 0o022


def build(folder: str | os.PathLike | None = None) -> Path:
    """Compile the reader into `folder` (default: the first of `folders()` that is writable) and return the
    module's path. Needs numba and a C compiler; raises FlightrecError saying what is missing."""
    from flightrec.errors import FlightrecError

    name = module_name()
    if name is None:
        raise FlightrecError("building the compiled reader needs numba: pip install 'flightrec[fast]'")
    targets = [Path(folder)] if folder is not None else folders()
    target = next((f for f in targets if _writable(f)), None)
    if target is None:
        raise FlightrecError(f"no writable folder for the compiled reader (tried {', '.join(map(str, targets))}); "
                             "set FLIGHTREC_READER_DIR to a folder you own")
    with tempfile.TemporaryDirectory(prefix="flightrec-build-") as scratch, _temporary_files_in(scratch):
        try:
            built = _compile(name, Path(scratch))
        except Exception as exc:  # noqa: BLE001 - distutils, the compiler and numba raise many kinds
            raise FlightrecError(f"could not build the compiled reader ({type(exc).__name__}: {exc}); the reader "
                                 "still works without it (numba's JIT). A C compiler is needed: e.g. apt install "
                                 "gcc") from exc
        path = target / _file_name(name)
        fd, staged = tempfile.mkstemp(dir=target, prefix=f".{name}.")
        try:
            with os.fdopen(fd, "wb") as out, open(built, "rb") as src:
                shutil.copyfileobj(src, out)
            os.chmod(staged, 0o755)
            os.replace(staged, path)   # (atomic: a worker loading it meanwhile sees the old file or the new one)
        finally:
            if os.path.exists(staged):
                os.unlink(staged)
    # Earlier builds for this CPU are never loaded again (the reader or a version changed). Other CPUs' builds
    # are kept: a folder shared by a cluster's machines serves each its own.
    cpu_tag = name[:len(_PREFIX) + 8]
    for stale in target.glob(_file_name(cpu_tag + "_*")):
        if stale != path:
            stale.unlink(missing_ok=True)
    if not _trusted(path):
        raise FlightrecError(f"built {path}, but it won't be loaded: {target} is writable by other users (or not "
                             f"yours); run `chmod go-w {target}`, or set FLIGHTREC_READER_DIR to a folder you own")
    return path


@contextmanager
def _temporary_files_in(folder: str):
    """Python's temporary files and folders made meanwhile go into `folder`. numba checks that a C compiler
    works by compiling a probe (temp.c, temp.cxx) in a folder of the system's temporary directory, which it
    never removes (its cleanup hands the file object to os.remove): each build left two such folders in /tmp.
    In the build's scratch folder they go with it."""
    saved = tempfile.tempdir
    tempfile.tempdir = folder
    try:
        yield
    finally:
        tempfile.tempdir = saved


def _writable(folder: Path) -> bool:
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)   # (a new folder: this user's alone, `_trusted`)
    except OSError:
        return False
    return os.access(folder, os.W_OK)


def _compile(name: str, scratch: Path) -> Path:
    import warnings

    import numba
    from numba.core.errors import NumbaPendingDeprecationWarning

    from flightrec.ingest.fastpickle import walker as tape

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NumbaPendingDeprecationWarning)   # (pycc: no successor yet)
        from numba.pycc import CC

        # the walker's helpers, inlined as in the JIT build
        tape._u32 = numba.njit(inline="always")(tape._u32_py)
        tape._text_hash = numba.njit(inline="always")(tape._text_hash_py)
        tape._uint_arg = numba.njit(inline="always")(tape._uint_arg_py)
        tape._walk_one = numba.njit(tape._walk_one_py)
        tape._open_table = numba.njit(inline="always")(tape._open_table_py)   # (the code tables' helpers)
        tape._claim = numba.njit(inline="always")(tape._claim_py)
        tape._same_text = numba.njit(inline="always")(tape._same_text_py)
        tape._edge = numba.njit(inline="always")(tape._edge_py)
        cc = CC(name)
        cc.output_dir = str(scratch)
        cc.verbose = False
        if _host_cpu() is not None:
            cc.target_cpu = "host"   # (as the JIT: the generic instruction set made the reader 20% slower)
        for fn_name, fn in _sources().items():
            cc.export(fn_name, SIGNATURES[fn_name])(fn)
        cc.compile()
    return scratch / _file_name(name)
