"""Read one dump file into plain Python data, safely.

Dumps are pickles written on somebody's cluster. A pickle can import and call anything, so we never use
`pickle.load`: the unpickler below allows only the opcodes that build plain data (dict, list, tuple, str,
bytes, int, float, bool, None) and refuses every global, which is the only way a pickle reaches code.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
import re
from pathlib import Path
from typing import Any

from flightrec.errors import DumpFormatError, UnsafePickleError

# A 2,000-entry dump with deep stacks is tens of MB; anything far past that is not a flight-recorder dump.
MAX_DUMP_BYTES = 2 << 30
MAX_TEXT_BYTES = 512 << 20   # JSON has to be read whole; a real JSON dump is a few MB
_GZIP_MAGIC = b"\x1f\x8b"


class _PlainDataUnpickler(pickle.Unpickler):
    """C-speed unpickler that refuses globals and persistent ids, so no pickle can run code."""

    def __init__(self, file: io.BufferedIOBase, source: str):
        super().__init__(file)
        self._source = source

    def find_class(self, module: str, name: str) -> Any:
        raise UnsafePickleError(
            f"{self._source}: refused: the pickle asks to load {module}.{name}; flight-recorder dumps hold "
            "only plain data, so this file was not written by the recorder (it was not executed)"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError(f"{self._source}: refused: the pickle uses persistent ids (it was not executed)")


def loads_plain_pickle(data: bytes, source: str = "<bytes>") -> Any:
    """Unpickle `data` allowing plain data only. Raises UnsafePickleError or DumpFormatError."""
    # A BufferedReader over the whole buffer lets the C unpickler prefetch in one go: as fast as pickle.loads
    # (a bare BytesIO costs it a Python call per small read, ~1.8x slower).
    stream = io.BufferedReader(io.BytesIO(data), buffer_size=max(len(data), io.DEFAULT_BUFFER_SIZE))
    try:
        return _PlainDataUnpickler(stream, source).load()
    except UnsafePickleError:
        raise
    except Exception as exc:  # a corrupt pickle can raise almost anything from the C unpickler
        raise DumpFormatError(f"{source}: not a readable pickle ({type(exc).__name__}: {exc})") from None


class _SalvagingUnpickler(pickle._Unpickler):  # the pure-Python unpickler keeps its stacks inspectable
    def find_class(self, module: str, name: str) -> Any:
        raise UnsafePickleError(f"refused: the pickle asks to load {module}.{name} (it was not executed)")

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError("refused: the pickle uses persistent ids (it was not executed)")


_ENTRY_KEYS = ("profiling_name", "record_id")
_TOP_KEYS = {"version": str, "pg_config": dict, "pg_status": dict, "comm_lib_version": str, "nccl_version": str}


def salvage_truncated_pickle(data: bytes, source: str) -> dict:
    """A dump cut short (the node died mid-write) still holds whole entries before the cut. Run the
    pure-Python unpickler until it fails and collect every complete entry dict it had built."""
    unpickler = _SalvagingUnpickler(io.BytesIO(data))
    try:
        result = unpickler.load()
        if isinstance(result, dict):
            return result
    except UnsafePickleError as exc:
        raise UnsafePickleError(f"{source}: {exc}") from None
    except Exception:  # noqa: BLE001 - the cut can surface as any error; we only look at what was built
        pass
    pools = [list(unpickler.memo.values()), list(unpickler.stack)] + [list(f) for f in unpickler.metastack]
    seen: set[int] = set()
    entries: list[dict] = []
    top: dict = {}
    for pool in pools:
        for obj in pool:
            if not isinstance(obj, dict) or id(obj) in seen:
                continue
            seen.add(id(obj))
            if all(k in obj for k in _ENTRY_KEYS) and "state" in obj:
                entries.append(obj)
            elif "version" in obj and not top:
                top = obj
    # an entry still being filled when the stream ended lacks its last keys: keep only full-width ones
    width = max((len(e) for e in entries), default=0)
    entries = [e for e in entries if len(e) >= width - 1 and isinstance(e.get("record_id"), int)]
    entries.sort(key=lambda e: e["record_id"])
    out = {k: v for k, v in top.items() if k != "entries"} if top else {}
    # The top-level dict is still open at the cut: its finished key/value pairs sit flat on the stacks.
    for pool in pools:
        for key, value in zip(pool, pool[1:]):
            if isinstance(key, str) and key not in out and isinstance(value, _TOP_KEYS.get(key, ())):
                out[key] = value
    # With no entry kept, a whole pg_status (written before the entries; a dict's items are set once all are
    # read, so a cut inside it leaves it empty) still says how far the rank got in each group: a dump with few
    # entries to begin with (`TORCH_INCLUDE_ONLY_ACTIVE`) is mostly its group lists, where a cut lands.
    if not entries and not out.get("pg_status"):
        raise DumpFormatError(f"{source}: truncated or corrupt pickle with no complete entry before the cut")
    out["entries"] = entries
    out["_truncated"] = True
    return out


def salvage_truncated_json(data: bytes) -> dict | None:
    """A JSON dump that just stops (the node died mid-write): the top-level keys whole before the cut, and of
    `entries`, cut inside, the whole entry objects before it; marked with a '_truncated' key. None when the text
    is not a JSON object cut short: corrupt before its end, complete with junk after it, or no whole entry (the
    caller then refuses it). (PyTorch writes the keys in alphabetical order, `entries` second: a cut keeps
    entries and loses the groups, statuses and version.)"""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(data) - 3:
            return None   # (not UTF-8 before the end; at the end, a character the cut split)
        text = data[:exc.start].decode("utf-8")
    decoder = json.JSONDecoder()
    out: dict = {}
    entries: list = []
    at = _skip(text, text.index("{") + 1) if "{" in text else len(text)
    try:
        while at < len(text):
            key, at = decoder.raw_decode(text, at)
            at = _skip(text, at)
            if not isinstance(key, str) or text[at:at + 1] not in (":", ""):
                return None
            at = _skip(text, at + 1)
            if key == "entries" and text[at:at + 1] == "[":
                at = _skip(text, at + 1)
                while text[at:at + 1] not in ("]", "") and len(entries) < _SALVAGED_ENTRIES:
                    entry, at = decoder.raw_decode(text, at)
                    entries.append(entry)
                    at = _skip(text, at)
                    if text[at:at + 1] not in (",", "]", ""):
                        return None
                    at = _skip(text, at + 1) if text[at:at + 1] == "," else at
                if text[at:at + 1] != "]":
                    break   # (the cut, or the cap)
                value, at = entries, at + 1
            else:
                value, at = decoder.raw_decode(text, at)
            out[key] = value
            at = _skip(text, at)
            if text[at:at + 1] != ",":
                # the object closes here: whole, so json.loads failed on something else (junk after it)
                return None if text[at:at + 1] == "}" or at < len(text) else _cut(out, entries)
            at = _skip(text, at + 1)
    except json.JSONDecodeError as exc:
        # A cut: the value the decoder stopped in runs to the end of the text (a string without its closing
        # quote, or any other value whose error is at the end). Anything else is corrupt text.
        if not (exc.msg.startswith("Unterminated string") or exc.pos >= len(text.rstrip())):
            return None
    return _cut(out, entries)


# An entry at a time costs ~1.6 us in Python: a crafted file of millions of empty entries would take minutes.
# A real ring buffer holds thousands (TORCH_FR_BUFFER_SIZE, 2,000 by default).
_SALVAGED_ENTRIES = 1_000_000


def _cut(out: dict, entries: list) -> dict | None:
    if not entries or not all(isinstance(e, dict) for e in entries):
        return None
    out["entries"] = entries
    out["_truncated"] = True
    return out


_WHITESPACE = re.compile(r"[ \t\n\r]*")


def _skip(text: str, at: int) -> int:
    """Past the JSON whitespace at `at` (a compiled match: a Python loop over a file padded with 50 MB of
    spaces took seconds)."""
    return _WHITESPACE.match(text, at).end()


def read_dump(path: Path) -> tuple[dict, str]:
    """Return (the dump as a dict, 'pickle' or 'json'). A truncated pickle gives back what decoded before
    the cut, marked with a '_truncated' key."""
    return parse_dump_bytes(read_dump_bytes(path), str(path))


def read_dump_bytes(path: str | Path) -> bytes:
    """The file's bytes (gunzipped), after the checks that it can be a dump at all."""
    source = str(path)
    # (one descriptor, its size from fstat and one read of that size: a buffered open, stat, peek and seek
    # cost as much again as copying a 100 KB dump out of the page cache)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            raise DumpFormatError(f"{source}: empty file (the rank may have died while dumping)")
        head = os.read(fd, 2)
        os.lseek(fd, 0, os.SEEK_SET)
        if head not in (_GZIP_MAGIC,) and head[:1] not in (b"\x80", b"{", b"[", b" ", b"\n", b"\r", b"\t", b"\xef"):
            raise DumpFormatError(f"{source}: not a flight-recorder dump: a dump is a pickle, a JSON object or "
                                  f"either gzipped, and this starts with {head!r}")
        limit = MAX_DUMP_BYTES if head[:1] == b"\x80" else MAX_TEXT_BYTES
        if size > limit:
            raise DumpFormatError(f"{source}: {size:,} bytes is too large for a flight-recorder dump; skipped")
        data = _read_to_end(fd, size, limit)
    finally:
        os.close(fd)
    if data[:2] == _GZIP_MAGIC:
        data = _gunzip_bounded(data, source)
    return data


def _read_to_end(fd: int, size: int, limit: int) -> bytes:
    """All of `fd` from its offset: `size` bytes in one read, and whatever a file still being written grew
    by since (up to `limit`)."""
    parts = [os.read(fd, size + 1)]
    total = len(parts[0])
    while parts[-1] and total <= limit:
        parts.append(os.read(fd, 1 << 20))
        total += len(parts[-1])
    return parts[0] if len(parts) == 2 else b"".join(parts)


def _gunzip_bounded(data: bytes, source: str) -> bytes:
    """The decompressed bytes, member after member. A stream that just stops (the node died while the file was
    written) gives what it holds up to the cut: the dump's beginning, whose whole entries the readers then
    salvage as for a plain file cut short. Corrupt data is refused."""
    parts, total = [], 0
    with gzip.GzipFile(fileobj=io.BytesIO(data)) as gz:
        while True:
            try:
                # (read1: one read of the stream, which returns what it decompressed before it fails for want of
                # input; `read` gathers several and drops them when one fails)
                part = gz.read1(min(1 << 20, MAX_DUMP_BYTES + 1 - total))
            except EOFError:
                break   # (cut short)
            except OSError as exc:
                raise DumpFormatError(f"{source}: broken gzip stream ({exc})") from None
            if not part:
                break
            parts.append(part)
            total += len(part)
            if total > MAX_DUMP_BYTES:
                raise DumpFormatError(f"{source}: decompresses past {MAX_DUMP_BYTES:,} bytes; skipped")
    return b"".join(parts)


def parse_dump_bytes(data: bytes, source: str) -> tuple[dict, str]:
    stripped = data.lstrip()
    if stripped[:1] in (b"{", b"["):
        try:
            obj = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            obj = salvage_truncated_json(data)
            if obj is None:
                raise DumpFormatError(f"{source}: not valid JSON ({exc})") from None
        fmt = "json"
    elif data[:1] == b"\x80":
        try:
            obj = loads_plain_pickle(data, source)
        except DumpFormatError:
            obj = salvage_truncated_pickle(data, source)
        fmt = "pickle"
    else:
        raise DumpFormatError(f"{source}: not a flight-recorder dump: a dump is a pickle or a JSON object")
    if isinstance(obj, list):  # torch 2.2 pickled the bare entry list, with no version or groups
        if obj and not any(isinstance(e, dict) and _ENTRY_KEYS_ANY & e.keys() for e in obj[:16]):
            raise DumpFormatError(f"{source}: not a flight-recorder dump: a list of {len(obj)} "
                                  f"{_kinds(obj)}, not of recorded entries (torch 2.2's bare list of entries)")
        obj = {"version": "1.0", "entries": obj}
    if not isinstance(obj, dict):
        raise DumpFormatError(f"{source}: not a flight-recorder dump: a {type(obj).__name__}, where a dump is a "
                              "dict with 'version', 'pg_config', 'pg_status' and 'entries'")
    if not _TOP_KEYS_ANY & obj.keys() and not obj.get("_truncated"):
        keys = ", ".join(sorted(map(str, obj))[:5]) or "none"
        raise DumpFormatError(f"{source}: not a flight-recorder dump: a dict with none of the recorder's keys "
                              f"('version', 'pg_config', 'pg_status', 'entries'); its keys: {keys}")
    return obj, fmt


# (a dump has one of these at its top, an entry one of these: what tells a dump from another pickle or JSON)
_TOP_KEYS_ANY = frozenset({"version", "pg_config", "pg_status", "entries", "comm_lib_version", "nccl_version"})
_ENTRY_KEYS_ANY = frozenset({"profiling_name", "record_id", "collective_seq_id", "seq_id", "process_group"})


def _kinds(items: list) -> str:
    """'ints', 'dicts', 'str and int values': what a list holds, for a message."""
    names = sorted({type(x).__name__ for x in items[:16]})
    return (f"{names[0]}s" if len(names) == 1 else " and ".join(names) + " values")
