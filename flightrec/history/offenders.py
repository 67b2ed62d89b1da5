"""Across incidents: the hosts, links, switches and ranks named most often as a root cause in a window, first
and last seen, and the ones named in several incidents flagged with what to do about them for good."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import polars as pl

from flightrec.errors import FlightrecError
from flightrec.history.store import History

_UNITS = {"h": "hours", "d": "days", "w": "weeks"}


def since_time(since: str | None, now: datetime | None = None) -> str | None:
    """'12h', '7d', '2w' before `now`, or an ISO date or time (UTC unless it says otherwise), as ISO 8601 UTC,
    the form the log holds times in; None: no window."""
    if since is None:
        return None
    now = now or datetime.now(UTC)
    found = re.fullmatch(r"\s*(\d+)\s*([hdw])\s*", since)
    try:
        if found:
            return (now - timedelta(**{_UNITS[found[2]]: int(found[1])})).isoformat(timespec="seconds")
        when = datetime.fromisoformat(since)
    except (ValueError, OverflowError):
        raise FlightrecError(f"--since {since!r}: give a span in hours, days or weeks (12h, 7d, 2w) or a date "
                             "(2026-11-30)") from None
    return (when.astimezone(UTC) if when.tzinfo else when.replace(tzinfo=UTC)).isoformat(timespec="seconds")


def _times(column: str) -> pl.Expr:
    # (a time the log can't read, from a report written by hand, is unknown rather than the query's end)
    return pl.col(column).str.to_datetime(time_zone="UTC", strict=False)


def incidents(history: History, since: str | None = None) -> pl.DataFrame:
    """One row per incident in the window (by when its newest entry was enqueued, else when it was recorded)."""
    start = since_time(since)
    rows = history.rows(
        "SELECT id, job, path, coalesce(hang_at, recorded_at) AS at, verdict, summary, world_size, versions, "
        "flightrec_version FROM incidents WHERE ? IS NULL OR coalesce(hang_at, recorded_at) >= ? ORDER BY at",
        (start, start))
    schema = {"incident": pl.String, "job": pl.String, "path": pl.String, "at": pl.String, "verdict": pl.String,
              "summary": pl.String, "world_size": pl.Int64, "versions": pl.String, "flightrec_version": pl.String}
    return pl.DataFrame(rows, schema=schema, orient="row").with_columns(_times("at"))


def named(history: History, since: str | None = None) -> pl.DataFrame:
    """One row per (incident, host/link/switch/rank) a root cause named, in the window: incident, job, at, what,
    name, kind, action. A rank is listed only where its finding named no host: else its host stands for it
    (a host down names its host and every rank on it)."""
    start = since_time(since)
    rows = history.rows(
        "SELECT c.incident_id, i.job, coalesce(i.hang_at, i.recorded_at), c.what, c.name, c.kind, c.action "
        "FROM culprits c JOIN incidents i ON i.id = c.incident_id "
        "WHERE (? IS NULL OR coalesce(i.hang_at, i.recorded_at) >= ?) AND NOT (c.what = 'rank' AND EXISTS ("
        "SELECT 1 FROM culprits h WHERE h.incident_id = c.incident_id AND h.position = c.position "
        "AND h.what = 'host'))", (start, start))
    schema = {"incident": pl.String, "job": pl.String, "at": pl.String, "what": pl.String, "name": pl.String,
              "kind": pl.String, "action": pl.String}
    return pl.DataFrame(rows, schema=schema, orient="row").with_columns(_times("at"))


def offenders(history: History, since: str | None = None, min_incidents: int = 2) -> pl.DataFrame:
    """Each host, link, switch and rank named as a root cause in the window: in how many incidents (and which:
    `jobs`, their folders' names), by which kinds and actions, first and last seen; `repeat` where named in
    `min_incidents` or more, with what to do. Most often named first."""
    frame = named(history, since)
    per = (frame.group_by("what", "name")
           .agg(pl.col("incident").n_unique().alias("incidents"),
                pl.col("kind").unique().sort().alias("kinds"),
                pl.col("action").unique().sort().alias("actions"),
                pl.col("at").min().alias("first_seen"), pl.col("at").max().alias("last_seen"),
                pl.col("job").sort_by("at", "job").unique(maintain_order=True).alias("jobs"))   # (oldest first)
           .with_columns((pl.col("incidents") >= min_incidents).alias("repeat")))
    recommend = [_recommendation(what, actions, n) if repeat else ""
                 for what, actions, n, repeat in per.select("what", "actions", "incidents", "repeat").iter_rows()]
    order = {"switch": 0, "link": 1, "host": 2, "rank": 3}
    return (per.with_columns(pl.Series("recommendation", recommend, pl.String),
                             pl.col("what").replace_strict(order, return_dtype=pl.Int8).alias("_order"))
            .sort(["repeat", "incidents", "_order", "name"], descending=[True, True, False, False]).drop("_order"))


def _recommendation(what: str, actions: list[str], count: int) -> str:
    """What to do for good about a host, link, switch or rank named in `count` incidents."""
    n = f"{count} incident{'s' if count != 1 else ''}"
    if set(actions) <= {"fix_code", "recollect_dumps", "rerun_with_world_size", "rerun_with_trigger", "none"}:
        return (f"named in {n} for the job's code (ranks that ran other code) or its dumps, not its "
                "hardware: nothing to drain; see each incident's next step")
    if what == "switch":
        return f"check the switch: every host under it was implicated in {n}"
    if what == "link":
        return f"replace or test the cable and NICs of this link: named in {n}"
    if what == "host" and "drain_host" in actions:
        return f"drain it permanently and send it for repair: its hardware failed in {n}"
    if what == "host":
        return (f"look at the host itself (memory, disk, kernel log, its GPUs' Xid errors): its processes stopped "
                f"in {n}")
    return f"the same rank slot in {n}: check which host it ran on each time, and what runs there"


def hosts_by_week(history: History, since: str | None = None) -> pl.DataFrame:
    """Hosts x weeks: how many incidents named each host as a root cause each week (for the heat map)."""
    frame = named(history, since).filter(pl.col("what") == "host")
    return (frame.with_columns(pl.col("at").dt.truncate("1w").alias("week"))
            .group_by("name", "week").agg(pl.col("incident").n_unique().alias("incidents"))
            .sort("week", "name"))
