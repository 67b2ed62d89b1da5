"""The history for people (text, markdown) and for automation (JSON)."""

from __future__ import annotations

import json

import polars as pl

from flightrec.model.wording import listed


def _when(value) -> str:
    return value.strftime("%Y-%m-%d %H:%M") if value is not None else "?"


def headline(offenders: pl.DataFrame, incidents: pl.DataFrame, since: str | None, min_incidents: int = 2) -> str:
    window = f"since {since}" if since else "in the whole log"
    if not incidents.height:
        return f"No analysis recorded {window}: record some with `flightrec analyze DUMPS --record`."
    verdicts = incidents["verdict"].value_counts()
    count = dict(verdicts.iter_rows())
    kinds = ", ".join(f"{count[v]:,} {v}" for v in ("fault", "inconclusive", "healthy") if count.get(v))
    head = f"{incidents.height:,} analyses recorded {window} ({kinds})"
    repeat = offenders.filter(pl.col("repeat"))
    if repeat.height == 0:
        return f"{head}; nothing named as a root cause in {min_incidents} or more of them."
    names = listed([f"{w} {n}" for w, n in repeat.select("what", "name").iter_rows()], 4)
    return f"{head}; named in {min_incidents} or more: {names}."


def as_text(offenders: pl.DataFrame, incidents: pl.DataFrame, since: str | None, min_incidents: int,
            top: int = 20) -> str:
    lines = [headline(offenders, incidents, since, min_incidents)]
    if offenders.height:
        lines += ["", f"{'':2}{'what':7}{'name':24}{'incidents':>10}  {'first seen':17}{'last seen':17}kinds"]
        for row in offenders.head(top).iter_rows(named=True):
            flag = "! " if row["repeat"] else "  "
            lines.append(f"{flag}{row['what']:7}{row['name'][:23]:24}{row['incidents']:>10}  "
                         f"{_when(row['first_seen']):17}{_when(row['last_seen']):17}{', '.join(row['kinds'])}")
            if row["recommendation"]:
                lines.append(f"{'':9}-> {row['recommendation']}")
                lines.append(f"{'':9}   in: {listed(row['jobs'], 4)}")
        if offenders.height > top:
            lines.append(f"  ... ({offenders.height:,} in all; --top to see more)")
    return "\n".join(lines) + "\n"


def as_markdown(offenders: pl.DataFrame, incidents: pl.DataFrame, since: str | None, min_incidents: int,
                top: int = 20) -> str:
    lines = ["## flightrec history", "", f"**{headline(offenders, incidents, since, min_incidents)}**", ""]
    if offenders.height:
        lines += ["| | what | name | incidents | first seen | last seen | kinds | what to do | in |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for row in offenders.head(top).iter_rows(named=True):
            lines.append(f"| {'**repeat**' if row['repeat'] else ''} | {row['what']} | {row['name']} | "
                         f"{row['incidents']} | {_when(row['first_seen'])} | {_when(row['last_seen'])} | "
                         f"{', '.join(row['kinds'])} | {row['recommendation']} | {listed(row['jobs'], 4)} |")
        if offenders.height > top:
            lines += ["", f"({offenders.height:,} in all; --top to see more)"]
    return "\n".join(lines) + "\n"


def as_json(offenders: pl.DataFrame, incidents: pl.DataFrame, since: str | None, min_incidents: int) -> str:
    """Every row (`--top` is for people: automation gets them all)."""
    return json.dumps({
        "since": since, "min_incidents": min_incidents, "incidents": incidents.height,
        "offenders": [{**row, "first_seen": _iso(row["first_seen"]), "last_seen": _iso(row["last_seen"])}
                      for row in offenders.iter_rows(named=True)],
    }, indent=2) + "\n"


def _iso(value) -> str | None:
    return value.isoformat(timespec="seconds") if value is not None else None
