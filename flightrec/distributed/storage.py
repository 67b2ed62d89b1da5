"""Dumps and shards where they are: a local or shared path, or object storage (`s3://`, `gs://`, ... through
fsspec, whose s3fs and gcsfs packages the user installs for their store). The readers need files on a local
disk (the fast reader reads a batch of files into one buffer), so a worker copies one host's dumps, or one
shard, into a scratch folder of its own, works there, and removes it: a worker's disk holds one host at a time.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from flightrec.errors import FlightrecError


def is_remote(location: str | os.PathLike) -> bool:
    """A URL with a protocol other than the local file system's."""
    text = str(location)
    return "://" in text and not text.startswith("file://")


def absolute(location: str) -> str:
    """A local path made absolute here, where the command runs (a Dask worker would read a relative path from its
    own working folder: another place, or nothing); a URL as it is."""
    return location if is_remote(location) else os.path.abspath(location.removeprefix("file://"))


# Where the exceptions of object storage's client libraries come from. Their errors (no credentials, an
# endpoint that doesn't answer, access denied) are not OSError, yet they are the user's to fix, not a bug.
_STORAGE_LIBRARIES = {"botocore", "aiobotocore", "s3fs", "gcsfs", "google", "adlfs", "azure", "aiohttp", "fsspec"}


def _from_storage_library(exc: BaseException) -> bool:
    return any(cls.__module__.split(".")[0] in _STORAGE_LIBRARIES for cls in type(exc).__mro__)


@contextmanager
def _storage_errors(location: str):
    """An error of the storage's client library as a FlightrecError saying what to check."""
    try:
        yield
    except FlightrecError:
        raise
    except Exception as exc:
        if isinstance(exc, OSError) or not _from_storage_library(exc):
            raise
        raise FlightrecError(f"{location}: the storage refused or did not answer ({type(exc).__name__}: {exc}). "
                             "Check the credentials (e.g. AWS_PROFILE, GOOGLE_APPLICATION_CREDENTIALS), the "
                             "bucket's name and the network") from exc


def _fs(location: str):
    try:
        import fsspec
    except ImportError as exc:   # (the `distributed` extra brings it)
        raise FlightrecError(f"{location}: reading URLs needs fsspec: pip install 'flightrec[distributed]'") from exc
    try:
        return fsspec.core.url_to_fs(location)
    except (ImportError, ValueError) as exc:   # (e.g. s3:// without s3fs installed)
        raise FlightrecError(f"{location}: {exc}") from exc


def join(location: str, name: str) -> str:
    return f"{location.rstrip('/')}/{name}" if is_remote(location) else os.path.join(location, name)


def subfolders(location: str) -> list[str]:
    """The folders directly under `location` (one per host, as `flightrec convert-hosts` expects), sorted."""
    if not is_remote(location):
        root = Path(location.removeprefix("file://"))
        if not root.is_dir():
            raise FlightrecError(f"{location} is not a folder")
        return sorted(str(p) for p in root.iterdir() if p.is_dir())
    fs, path = _fs(location)
    with _storage_errors(location):
        return sorted(fs.unstrip_protocol(e["name"]) for e in fs.ls(path, detail=True) if e["type"] == "directory")


def folders_holding(location: str, filename: str) -> list[str]:
    """Every folder at any depth under the URL `location` holding a file named `filename`, as URLs, sorted."""
    fs, path = _fs(location)
    with _storage_errors(location):
        return sorted(fs.unstrip_protocol(os.path.dirname(p)) for p in fs.glob(f"{path.rstrip('/')}/**/{filename}"))


def read_text(location: str) -> str:
    """A small file's text (a manifest), from a path or URL."""
    if not is_remote(location):
        return Path(location.removeprefix("file://")).read_text()
    fs, path = _fs(location)
    with _storage_errors(location), fs.open(path, "r") as f:
        return f.read()


@contextmanager
def _scratch(location: str, prefix: str):
    """(file system, path, a new local folder removed afterwards) for the URL `location`."""
    fs, path = _fs(location)
    folder = tempfile.mkdtemp(prefix=prefix)   # (under $TMPDIR: a worker's local disk)
    try:
        yield fs, path.rstrip("/") + "/", folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def local_copy(location: str):
    """`location` as a local folder: itself if it is one, else a copy in a scratch folder removed afterwards."""
    if not is_remote(location):
        yield location.removeprefix("file://")
        return
    with _scratch(location, "flightrec-fetch-") as (fs, path, folder):
        with _storage_errors(location):
            fs.get(path, folder + "/", recursive=True)
        yield folder


@contextmanager
def local_target(location: str, replaceable: str):
    """A local folder to write into that ends up at `location`: itself if local, else a scratch folder uploaded
    whole when the block completes (nothing is uploaded if it raises). What is at a remote `location` already is
    replaced only if it holds a file named `replaceable` (a shard's manifest) or nothing: never the dumps."""
    if not is_remote(location):
        yield location.removeprefix("file://")
        return
    with _scratch(location, "flightrec-put-") as (fs, path, folder):
        with _storage_errors(location):
            occupied = fs.exists(path) and fs.ls(path) and not fs.exists(path + replaceable)
        if occupied:
            raise FlightrecError(f"{location} holds files that are no flightrec shard: converting would replace "
                                 "them. Give a new or empty location")
        out = os.path.join(folder, "shard")
        yield out
        with _storage_errors(location):
            if fs.exists(path):
                fs.rm(path, recursive=True)
            fs.put(out + "/", path, recursive=True)
