"""`flightrec record` and `flightrec history`: the incident log on the command line (`flightrec.history`)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from flightrec.cli.commands import db_option, guard, main


@main.command("record")
@click.argument("reports", nargs=-1, required=True, type=click.Path(path_type=Path, dir_okay=False, exists=True))
@db_option
@guard
def record(reports, db):
    """Add reports (`flightrec analyze --format json` files) to the incident log.

    The same incident recorded twice is kept once (the later recording). A file that is no report, or a report
    of another version, is one line on stderr; the others are recorded.

    \b
    Example:
      flightrec analyze dumps/ --format json -o report.json && flightrec record report.json
    """
    from flightrec.history import History, HistoryError

    failed = 0
    with History(db) as history:
        for path in reports:
            try:
                report = json.loads(path.read_text())
                done = history.record(report)
                click.echo(f"{path}: recorded ({'replacing its earlier recording' if done.replaced else 'new'})")
            except (ValueError, HistoryError) as exc:   # (ValueError: not JSON)
                failed += 1
                why = exc if isinstance(exc, HistoryError) else f"not JSON ({exc})"
                click.echo(f"{path}: not recorded: {why}", err=True)
    raise SystemExit(2 if failed else 0)


@main.command("history")
@click.option("--since", help="Only incidents since then: hours, days or weeks (12h, 7d, 2w) or a date (2026-11-30, "
              "UTC unless it says otherwise).")
@click.option("--min-incidents", type=click.IntRange(min=1), default=2, show_default=True,
              help="Flag each host, link, switch or rank named as a root cause in at least this many incidents.")
@click.option("--top", type=click.IntRange(min=1), default=20, show_default=True,
              help="Show this many rows (text and markdown; JSON has them all).")
@click.option("-f", "--format", "fmt", type=click.Choice(["text", "json", "markdown"]), default="text",
              show_default=True)
@click.option("--scan", type=click.Path(path_type=Path, file_okay=False, exists=True),
              help="First analyse and record every incident folder under this one not in the log yet.")
@click.option("--workers", type=click.IntRange(min=1), help="Incidents analysed at once by --scan (default: cores).")
@click.option("--no-cache", is_flag=True, help="--scan: don't read or write the cache of parsed dumps.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
@db_option
@guard
def history(since, min_incidents, top, fmt, scan, workers, no_cache, quiet, db):
    """The hosts, links, switches and ranks named most often across incidents; repeat offenders flagged.

    Exit code 2 where --scan could not record some folder (each said on stderr).

    \b
    Examples:
      flightrec history --since 7d                  # which hosts should leave the pool for good?
      flightrec history --scan /shared/fr --since 30d --format markdown
    """
    from flightrec.cli.commands import progress_bar
    from flightrec.history import History, backfill, incidents, offenders
    from flightrec.history.render import as_json, as_markdown, as_text

    failed = []
    # (a query never makes a log: a mistyped --db must not read as an empty history)
    with History(db, create=scan is not None) as log:
        if scan is not None:
            with progress_bar(quiet, "analysing incidents") as progress:
                done = backfill(log, scan, workers=workers, use_cache=not no_cache, progress=progress)
            failed = done.failed
            for folder, why in failed:
                click.echo(f"{folder}: not recorded: {why}", err=True)
            click.echo(f"scanned {scan}: {len(done.recorded)} recorded, {len(done.known)} already in the log, "
                       f"{len(failed)} failed", err=True)
        found = offenders(log, since, min_incidents)
        recorded = incidents(log, since)
    if fmt == "json":
        click.echo(as_json(found, recorded, since, min_incidents), nl=False)
    elif fmt == "markdown":
        click.echo(as_markdown(found, recorded, since, min_incidents, top), nl=False)
    else:
        click.echo(as_text(found, recorded, since, min_incidents, top), nl=False)
    raise SystemExit(2 if failed else 0)   # (a backfill run by cron sees that some folders failed)
