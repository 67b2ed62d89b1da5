"""The incident log: one SQLite file, one row per incident and per finding, and each root cause's hosts, links,
switches and ranks laid out one per row for the queries across incidents (`offenders`).

SQLite because it is in every Python, holds a fleet's years of incidents in one file a person can copy, and
gives transactions: a recording either lands whole or not at all. The schema is versioned (`PRAGMA
user_version`) and each version's migration runs once, in a transaction, when an older file is opened.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

from flightrec import __version__
from flightrec.errors import FlightrecError
from flightrec.model.schema import REPORT_VERSION


class HistoryError(FlightrecError):
    """The incident log can't be opened or written (locked, corrupt, another file); the message says what to do."""


def default_path() -> Path:
    """`$FLIGHTREC_HISTORY_DB`, else `history.sqlite` in the user's data folder (`$XDG_DATA_HOME/flightrec`)."""
    if os.environ.get("FLIGHTREC_HISTORY_DB"):
        return Path(os.environ["FLIGHTREC_HISTORY_DB"])
    data = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return data / "flightrec" / "history.sqlite"


# Each version's statements; a file at version k runs those of k+1 onwards, each version in one transaction.
_SCHEMA: dict[int, list[str]] = {
    1: [
        """CREATE TABLE incidents (
            id TEXT PRIMARY KEY,          -- what tells incidents apart: `incident_id`
            job TEXT NOT NULL,            -- the dump folder's name
            path TEXT,                    -- where its dumps were analysed, where known
            hang_at TEXT,                 -- when the job's newest entry was enqueued (ISO 8601 UTC)
            verdict TEXT NOT NULL,
            summary TEXT NOT NULL,
            world_size INTEGER,
            versions TEXT NOT NULL,       -- the recorder versions, a JSON list
            flightrec_version TEXT NOT NULL,
            report_version INTEGER NOT NULL,
            recorded_at TEXT NOT NULL)""",
        """CREATE TABLE findings (
            incident_id TEXT NOT NULL REFERENCES incidents(id) ON DELETE CASCADE,
            position INTEGER NOT NULL,
            kind TEXT NOT NULL, role TEXT NOT NULL, action TEXT NOT NULL, message TEXT NOT NULL,
            ranks TEXT NOT NULL, hosts TEXT NOT NULL, links TEXT NOT NULL,   -- JSON lists
            evidence TEXT NOT NULL,                                           -- JSON
            PRIMARY KEY (incident_id, position))""",
    ],
    2: [
        # each root cause's hosts, links, switches and ranks one per row: "which host, how often" is one index scan
        """CREATE TABLE culprits (
            incident_id TEXT NOT NULL REFERENCES incidents(id) ON DELETE CASCADE,
            position INTEGER NOT NULL,     -- its finding
            what TEXT NOT NULL,            -- host, link, switch or rank
            name TEXT NOT NULL,            -- "node17", "node3 <-> node9", "sw2", "5"
            kind TEXT NOT NULL, action TEXT NOT NULL)""",
        "CREATE INDEX culprits_by_name ON culprits (what, name)",
        "CREATE INDEX incidents_by_time ON incidents (hang_at)",
        "CREATE INDEX incidents_by_path ON incidents (path)",
        # (the findings recorded at version 1, laid out as version 2 records them)
        "__fill_culprits__",
    ],
}
SCHEMA_VERSION = max(_SCHEMA)


@dataclass(frozen=True)
class Recorded:
    """What `record` did: the incident's id, and whether it replaced an earlier recording of it."""
    incident_id: str
    replaced: bool


def incident_id(report: dict[str, Any]) -> str:
    """The same incident gets the same id however often, under whatever folder name or format (pickle or JSON),
    and by whichever flightrec it is recorded: when its newest entry was enqueued, to the nanosecond, and the
    world size (not the verdict, which a newer flightrec may read differently). Dumps with no times fall back
    to the folder's name."""
    d = report["dumps"]
    key = [d.get("last_entry_ns"), d.get("world_size")] if d.get("last_entry_ns") else [d.get("folder", ""),
                                                                                        d.get("world_size")]
    return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]


def check_report(report: Any) -> None:
    """A report this flightrec can record, or HistoryError saying what is wrong with it."""
    if not isinstance(report, dict) or not {"verdict", "summary", "findings", "dumps"} <= report.keys():
        raise HistoryError("not a flightrec report (`flightrec analyze --format json` writes one)")
    version = report.get("report_version")
    if version != REPORT_VERSION:
        raise HistoryError(f"a report of version {version!r}: this flightrec records version {REPORT_VERSION}; "
                           "analyze its dumps again with this flightrec")
    d, findings = report["dumps"], report["findings"]
    if not isinstance(d, dict) or not isinstance(findings, list):
        raise HistoryError("not a flightrec report: its 'dumps' or 'findings' is not what analyze writes")
    try:
        if d.get("last_entry_at") is not None:
            datetime.fromisoformat(d["last_entry_at"])
        if d.get("last_entry_ns") is not None and not isinstance(d["last_entry_ns"], int):
            raise TypeError("last_entry_ns")
        for f in findings:
            if not (isinstance(f["kind"], str) and isinstance(f["role"], str) and isinstance(f["message"], str)
                    and all(isinstance(f[k], list) for k in ("ranks", "hosts", "links"))):
                raise TypeError("finding")
    except (KeyError, TypeError, ValueError) as exc:
        raise HistoryError(f"not a flightrec report: a field is missing or of another type ({exc})") from None


class History:
    """The incident log in `path` (`default_path()` if None), made or migrated on opening. `timeout`: how long
    to wait for another process writing it."""

    def __init__(self, path: str | os.PathLike | None = None, timeout: float = 5.0, create: bool = True):
        self.path = Path(path) if path is not None else default_path()
        self.timeout = timeout
        if not create and not self.path.exists():
            raise HistoryError(f"{self.path}: no incident log there; check --db (or $FLIGHTREC_HISTORY_DB), or record "
                               "incidents first with `flightrec analyze DUMPS --record`")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(self.path, timeout=timeout, isolation_level=None)
            self.db.execute("PRAGMA foreign_keys = ON")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            raise _explained(exc, self.path, timeout) from None
        except OSError as exc:
            raise HistoryError(f"{self.path}: can't make the incident log there ({exc.strerror or exc}); pass --db a "
                               "file in a folder you can write") from None

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _migrate(self) -> None:
        """Bring the file to SCHEMA_VERSION, a version at a time, each read and applied under the write lock: two
        processes opening a new log at once must not both make its tables."""
        while True:
            with self._transaction():
                version = self.db.execute("PRAGMA user_version").fetchone()[0]
                if version > SCHEMA_VERSION:
                    raise HistoryError(f"{self.path}: written by a newer flightrec (schema {version}, this one reads "
                                       f"up to {SCHEMA_VERSION}); upgrade flightrec, or pass --db another file")
                if version == SCHEMA_VERSION:
                    return
                if version == 0 and self.db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
                    raise HistoryError(f"{self.path}: a SQLite file, but not a flightrec incident log; pass --db "
                                       "another file")
                for statement in _SCHEMA[version + 1]:
                    if statement == "__fill_culprits__":
                        self._fill_culprits()
                    else:
                        self.db.execute(statement)
                self.db.execute(f"PRAGMA user_version = {version + 1}")

    def _fill_culprits(self) -> None:
        rows = self.db.execute("SELECT incident_id, position, kind, action, ranks, hosts, links, evidence "
                               "FROM findings WHERE role = 'root_cause'").fetchall()
        for incident, position, kind, action, ranks, hosts, links, evidence in rows:
            finding = {"kind": kind, "action": action, "ranks": json.loads(ranks), "hosts": json.loads(hosts),
                       "links": json.loads(links), "evidence": json.loads(evidence)}
            self.db.executemany("INSERT INTO culprits VALUES (?, ?, ?, ?, ?, ?)",
                                [(incident, position, *row) for row in _culprit_rows(finding)])

    def _transaction(self):
        return _Transaction(self.db, self.path, self.timeout)

    def record(self, report: dict[str, Any], path: str | os.PathLike | None = None) -> Recorded:
        """Add one report (`Report.to_dict()`, or a report JSON file's content) to the log, in one transaction;
        the same incident recorded again replaces its earlier recording (keeping the folder it was read from)."""
        check_report(report)
        key = incident_id(report)
        d = report["dumps"]
        where = None if path is None else str(path) if "://" in str(path) else str(Path(path).resolve())
        with self._transaction():
            earlier = self.db.execute("SELECT path FROM incidents WHERE id = ?", (key,)).fetchone()
            if earlier is not None:
                self.db.execute("DELETE FROM incidents WHERE id = ?", (key,))
                where = where or earlier[0]
            self.db.execute(
                "INSERT INTO incidents VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (key, d.get("folder") or "", where, _utc(d.get("last_entry_at")), report["verdict"], report["summary"],
                 d.get("world_size"), json.dumps(d.get("versions", [])), __version__, report["report_version"],
                 datetime.now(UTC).isoformat(timespec="seconds")))
            for position, f in enumerate(report["findings"]):
                self.db.execute("INSERT INTO findings VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                (key, position, f["kind"], f["role"], f.get("action") or "none", f["message"],
                                 json.dumps(f["ranks"]), json.dumps(f["hosts"]), json.dumps(f["links"]),
                                 json.dumps(f.get("evidence", {}), default=str)))
                if f["role"] == "root_cause":
                    self.db.executemany("INSERT INTO culprits VALUES (?, ?, ?, ?, ?, ?)",
                                        [(key, position, *row) for row in _culprit_rows(f)])
        return Recorded(key, earlier is not None)

    def recorded_paths(self) -> set[str]:
        """The folders recorded from (absolute paths), for a backfill to pass over."""
        return {p for (p,) in self.db.execute("SELECT path FROM incidents WHERE path IS NOT NULL")}

    def rows(self, sql: str, params: Iterable = ()) -> list[tuple]:
        try:
            return self.db.execute(sql, tuple(params)).fetchall()
        except sqlite3.DatabaseError as exc:
            raise _explained(exc, self.path, self.timeout) from None


def _utc(when: str | None) -> str | None:
    """An ISO time as the log holds every time (UTC, to the second), so that times compare as text."""
    if when is None:
        return None
    moment = datetime.fromisoformat(when)
    return (moment.astimezone(UTC) if moment.tzinfo else moment.replace(tzinfo=UTC)).isoformat(timespec="seconds")


def _culprit_rows(finding: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(what, name, kind, action) for each host, link, switch and rank a root cause names."""
    kind, action = finding["kind"], finding.get("action") or "none"
    rows = [("host", h, kind, action) for h in finding["hosts"]]
    rows += [("link", " <-> ".join(sorted(link)), kind, action) for link in finding["links"]]
    if finding.get("evidence", {}).get("switch"):
        rows.append(("switch", str(finding["evidence"]["switch"]), kind, action))
    rows += [("rank", str(r), kind, action) for r in finding["ranks"]]
    return rows


class _Transaction:
    """BEGIN IMMEDIATE .. COMMIT, rolled back on any error: nothing half-recorded, nothing recorded lost."""

    def __init__(self, db: sqlite3.Connection, path: Path, timeout: float):
        self.db, self.path, self.timeout = db, path, timeout

    def __enter__(self):
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except sqlite3.DatabaseError as exc:
            raise _explained(exc, self.path, self.timeout) from None

    def __exit__(self, kind, exc, tb) -> None:
        if kind is None:
            try:
                self.db.execute("COMMIT")
                return
            except sqlite3.DatabaseError as commit_error:
                self.db.execute("ROLLBACK")
                raise _explained(commit_error, self.path, self.timeout) from None
        self.db.execute("ROLLBACK")
        if isinstance(exc, sqlite3.DatabaseError):
            raise _explained(exc, self.path, self.timeout) from None


def _explained(exc: sqlite3.DatabaseError, path: Path, timeout: float = 5.0) -> HistoryError:
    text = str(exc)
    if "locked" in text or "busy" in text:
        return HistoryError(f"{path}: the incident log is in use by another process (waited {timeout:g} s); try again "
                            "once it is done, or pass --db another file. Nothing was written")
    if "not a database" in text or "malformed" in text or "corrupt" in text:
        return HistoryError(f"{path}: not a readable incident log ({text}); move it aside (flightrec starts a new "
                            "one) or pass --db another file. Nothing was written")
    if "unable to open" in text or "readonly" in text or "read-only" in text:
        return HistoryError(f"{path}: can't open or write the incident log there ({text}); pass --db a file in a "
                            "folder you can write. Nothing was written")
    return HistoryError(f"{path}: {text}; nothing was written")
