"""Command line: arguments -> Python API -> render -> exit code. No analysis happens here.

Exit codes: 0 healthy, 1 fault, 3 inconclusive, 2 usage error or unusable input, 70 internal error.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import warnings
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import click

from flightrec import __version__
from flightrec.cli.cluster_options import cluster_options, runner_from_options
from flightrec.errors import DumpProblemWarning, FlightrecError

if TYPE_CHECKING:
    from flightrec.model.trace import LoadOptions

EXIT_USAGE = 2
EXIT_INTERNAL = 70


# Each command imports `flightrec.api` (the engine, Polars, Arrow: ~0.6 s) when it runs, not when the CLI
# starts: `flightrec --help` and a usage error then answer at once.


# ---------------------------------------------------------------------------------------------- plumbing


def guard(fn):
    """Library errors become one line on stderr (exit 2); anything else is our bug (exit 70). Every warning is
    shown (each file's problems, one by one), except a dependency's notice that an API it offers will change:
    nothing the person reading the report can act on."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        quiet = kwargs.get("quiet", False)
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", PendingDeprecationWarning)
            warnings.showwarning = lambda msg, *a, **k: None if quiet else click.echo(f"warning: {msg}", err=True)
            try:
                return fn(*args, **kwargs)
            except FlightrecError as exc:
                click.echo(f"error: {exc}", err=True)
                sys.exit(EXIT_USAGE)
            except (click.exceptions.Exit, click.ClickException, SystemExit):
                raise
            except BrokenPipeError:
                # (piped into `head`, which stopped reading: not an error. Python's own advice: point stdout at
                # devnull so the flush at exit doesn't raise again)
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                sys.exit(0)
            except OSError as exc:   # the machine's, not ours: a folder not writable, a full disk
                click.echo(f"error: {exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}", err=True)
                sys.exit(EXIT_USAGE)
            except KeyboardInterrupt:
                click.echo("interrupted", err=True)
                sys.exit(130)
            except Exception as exc:  # noqa: BLE001 - the last line of defence
                click.echo(f"internal error: {type(exc).__name__}: {exc}\nThis is a flightrec bug: please report it "
                           "with the command line and, if you can, the dumps.", err=True)
                sys.exit(EXIT_INTERNAL)

    return wrapper


def _keep_reader(ctx: click.Context, _param, value: str) -> None:
    ctx.meta["flightrec.reader"] = value


def load_options(fn):
    """Options shared by every command that reads dumps."""
    decorators = [
        click.argument("dump_dir", type=click.Path(path_type=str)),   # (str: a URL keeps its "//")
        click.option("--prefix", help="File-name prefix before the rank (default: any name ending in a number)."),
        click.option("--world-size", type=click.IntRange(min=1),
                     help="Ranks in the job, when the dumps don't say (Gloo dumps don't)."),
        click.option("--no-cache", is_flag=True, help="Don't read or write the cache of parsed dumps."),
        click.option("--workers", type=click.IntRange(min=1), help="Processes for parsing (default: all cores)."),
        # (not a parameter of every command: kept in the context, read where the load options are made)
        click.option("--reader", type=click.Choice(["auto", "tape", "unpickler"]), default="auto", expose_value=False,
                     callback=_keep_reader,
                     help="Pickle reader: 'tape' (the compiled fast reader), 'unpickler', or 'auto' (the "
                          "tape from 128 MB of pickles)."),
        click.option("-q", "--quiet", is_flag=True, help="No progress bar and no warnings on stderr."),
    ]
    for d in reversed(decorators):
        fn = d(fn)
    return fn


hosts_option = click.option(
    "--hosts", "hosts_file", type=click.Path(path_type=Path, dir_okay=False),
    help="rank -> host map: CSV 'rank,host' with a header, or JSON {\"rank\": \"host\"}.")
ranks_per_host_option = click.option(
    "--ranks-per-host", type=click.IntRange(min=1), help="Hosts hold N consecutive ranks each.")


table_format_option = click.option("-f", "--format", "fmt", type=click.Choice(["text", "json"]), default="text",
                                   show_default=True, help="Text for people, JSON for scripts.")


@contextlib.contextmanager
def progress_bar(quiet: bool, what: str = "loading dumps"):
    """A progress bar on stderr (for parsing files, or what `what` says), only on a terminal."""
    if quiet or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(what, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


db_option = click.option("--db", type=click.Path(path_type=Path, dir_okay=False),
                         help="The incident log (SQLite); default $FLIGHTREC_HISTORY_DB, else history.sqlite in "
                              "$XDG_DATA_HOME/flightrec (~/.local/share/flightrec).")


def load_opts(prefix, world_size, no_cache, workers, progress) -> LoadOptions:
    from flightrec import api

    reader = click.get_current_context().meta.get("flightrec.reader", "auto")
    return api.LoadOptions(prefix=prefix, world_size=world_size, use_cache=not no_cache, workers=workers,
                           progress=progress, reader=reader)


def _trace(dump_dir, prefix, world_size, no_cache, workers):
    """The dumps under `dump_dir` as frames, for the table commands."""
    from flightrec import api

    return api.load(dump_dir, load_opts(prefix, world_size, no_cache, workers, None))


def _check_writable(output: Path | None) -> None:
    """Before the analysis, not after it: a big job's report must not be lost to a typo in -o."""
    if output is None:
        return
    folder = output.parent
    if str(output) in ("", ".") or output.is_dir():
        raise FlightrecError(f"-o {output!s}: is a folder; give a file name")
    if not folder.is_dir():
        raise FlightrecError(f"-o {output}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (output.exists() and not os.access(output, os.W_OK)):
        raise FlightrecError(f"-o {output}: not writable")


def _emit(text: str, output: Path | None) -> None:
    if output is None:
        click.echo(text, nl=not text.endswith("\n"))
    else:
        output.write_text(text)


# ---------------------------------------------------------------------------------------------- commands


def entry() -> None:
    """The `flightrec` script and `python -m flightrec`: `main`, then out without tearing the interpreter down.
    Nothing is left to do once a command has written its output, and freeing a big analysis object by object
    took 0.18-0.26 s of a 2.7 s `flightrec analyze` at 8,192 ranks (0.06-0.1 s this way). Output is flushed
    first; a message given to sys.exit is printed as Python would."""
    try:
        main(prog_name="flightrec")
        code = 0
    except SystemExit as exc:
        code = exc.code
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:   # (piped into `head`, which stopped reading: not an error)
        pass
    os._exit(code or 0)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="flightrec")
def main():
    """Find the rank, host or link that broke a distributed PyTorch job, from its flight-recorder dumps.

    \b
    Start here:  flightrec analyze /path/to/dumps
    Exit codes:  0 healthy, 1 fault, 3 inconclusive, 2 bad input or usage, 70 internal error.
    """


@main.command("analyze")
@load_options
@click.option("-f", "--format", "fmt", type=click.Choice(["text", "json", "markdown"]), default="text",
              show_default=True, help="text for people, json for automation, markdown for a ticket.")
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False), help="Write the report here.")
@hosts_option
@click.option("--topology", "topology_file", type=click.Path(path_type=Path, dir_okay=False),
              help="host -> switch map: CSV 'host,switch'.")
@ranks_per_host_option
@click.option("--pg", help="Only analyse the process groups with this name or desc (the report says so: a rank "
              "can be waiting in a group left out).")
@click.option("--trigger", type=click.Choice(["auto", "timeout", "on-demand"]), default="auto", show_default=True,
              help="What wrote the dumps: 'timeout' (the watchdog, after a collective timed out: collectives in flight "
              "everywhere are a hang), 'on-demand' (a snapshot of a running job), 'auto' (read from their times).")
@click.option("--record", is_flag=True, help="Also add the report to the incident log (`flightrec history`).")
@db_option
@click.option("--window", type=click.IntRange(min=10), metavar="N",
              help="Shards only (DUMP_DIR may then be a URL): analyse each rank's newest N entries, read by one task "
                   "per shard, as if the recorder kept N (default 200 with --scheduler, --local-workers or a URL).")
@cluster_options
@guard
def analyze_cmd(dump_dir, prefix, world_size, no_cache, workers, quiet, fmt, output, hosts_file, topology_file,
                ranks_per_host, pg, trigger, record, db, window, **cluster):
    """Name the root cause of a hang or crash: rank(s), host(s) or link.

    \b
    Example:
      flightrec analyze /shared/fr_dumps/job1234 --ranks-per-host 8
      flightrec analyze dumps/ --trigger timeout --format json | jq -r '.culprits.hosts_to_drain[]'
      flightrec analyze /shared/fr_dumps/job1234 --record     # and keep it in the incident log
    """
    from flightrec import api

    _check_writable(output)
    # (each dump's problems are findings in the report: said there, not on stderr too)
    warnings.simplefilter("ignore", DumpProblemWarning)
    with progress_bar(quiet) as progress:
        options = api.AnalyzeOptions(
            load=load_opts(prefix, world_size, no_cache, workers, progress), hosts_file=hosts_file,
            topology_file=topology_file, ranks_per_host=ranks_per_host, pg=pg, trigger=trigger)
        on_shards = window is not None or cluster["scheduler"] or cluster["local_workers"] or "://" in dump_dir
        if not on_shards:
            if cluster["deadline"] or cluster["worker_memory"]:
                raise click.UsageError("--deadline and --worker-memory are for a cluster: add --scheduler or "
                                       "--local-workers (and shards: flightrec convert-hosts)")
            report = api.analyze(dump_dir, options)
        else:
            report = _analyze_shards(dump_dir, options, window, cluster, quiet)
    if fmt == "json":
        text = json.dumps(report.to_dict(), indent=2) + "\n"
    elif fmt == "markdown":
        text = report.to_markdown()
    else:
        text = report.to_text()
        if output is None and sys.stdout.isatty():
            colour = {"healthy": "green", "fault": "red", "inconclusive": "yellow"}[report.verdict]
            first, _, rest = text.partition("\n")
            text = click.style(first, fg=colour, bold=True) + "\n" + rest
    _emit(text, output)
    if record:
        _record(report.to_dict(), dump_dir, db, quiet)
    sys.exit(report.exit_code)


def _analyze_shards(root: str, options, window: int | None, cluster: dict, quiet: bool):
    from flightrec.distributed.driver import DEFAULT_KEEP, analyze_shards

    stage = None if quiet else (lambda msg: click.echo(f"{msg} ...", err=True))
    with runner_from_options(**cluster) as runner:
        return analyze_shards(root, replace(options, stage=stage), keep=window or DEFAULT_KEEP, runner=runner)


def _record(report: dict, dump_dir, db, quiet: bool) -> None:
    """Add a report to the incident log; a log that can't be written is a warning: the verdict stands."""
    from flightrec.history import History, HistoryError

    try:
        with History(db) as history:
            done = history.record(report, dump_dir)
        if not quiet:
            click.echo(f"recorded in {history.path} ({'replacing its earlier recording' if done.replaced else 'new'})",
                       err=True)
    except HistoryError as exc:
        click.echo(f"warning: not recorded: {exc}", err=True)


@main.command("load")
@load_options
@table_format_option
@guard
def load_cmd(dump_dir, prefix, world_size, no_cache, workers, quiet, fmt):
    """Load the dumps and print what was found: ranks, entries, groups, versions, refused files.

    \b
    Example:
      flightrec load dumps/
    """
    from flightrec import api

    with progress_bar(quiet) as progress:
        trace = api.load(dump_dir, load_opts(prefix, world_size, no_cache, workers, progress))
    if fmt == "json":
        from flightrec.report.tables import as_json
        click.echo(as_json(trace.summary_dict()), nl=False)
    else:
        click.echo(trace.summary())


@main.command()
@load_options
@click.option("-r", "--rank", "ranks", type=int, multiple=True, help="Only these ranks (repeat the option).")
@click.option("--pg", help="Only the process group with this name or desc.")
@click.option("--last", type=click.IntRange(min=1), default=20, show_default=True, help="Last N entries per rank.")
@click.option("--around", type=int, help="Side by side across ranks: collectives seq-5..seq+5 in --pg.")
@table_format_option
@guard
def entries(dump_dir, prefix, world_size, no_cache, workers, quiet, ranks, pg, last, around, fmt):
    """Print recorded entries, or compare ranks side by side around a sequence id.

    \b
    Examples:
      flightrec entries dumps/ --rank 5 --last 10
      flightrec entries dumps/ --pg tp --rank 4 --rank 5 --around 17
    """
    from flightrec.report import tables as views

    trace = _trace(dump_dir, prefix, world_size, no_cache, workers)
    if around is not None and fmt == "json":
        frames = views.side_by_side_frames(trace, ranks=list(ranks), pg=pg, seq=around)
        click.echo(views.as_json([{**label, "rows": wide} for label, wide in frames]), nl=False)
    elif around is not None:
        click.echo(views.side_by_side(trace, ranks=list(ranks), pg=pg, seq=around))
    elif fmt == "json":
        click.echo(views.as_json(views.entries_frame(trace, ranks=list(ranks), pg=pg, last=last)), nl=False)
    else:
        click.echo(views.entries_table(trace, ranks=list(ranks), pg=pg, last=last))


@main.command()
@load_options
@table_format_option
@guard
def stacks(dump_dir, prefix, world_size, no_cache, workers, quiet, fmt):
    """Group ranks by the stack of their last unfinished entry.

    \b
    Example:
      flightrec stacks dumps/
    """
    from flightrec.report import tables as views

    trace = _trace(dump_dir, prefix, world_size, no_cache, workers)
    click.echo(views.as_json(views.stack_groups_frame(trace)) if fmt == "json" else views.stack_groups(trace),
               nl=fmt != "json")


@main.command()
@load_options
@table_format_option
@guard
def groups(dump_dir, prefix, world_size, no_cache, workers, quiet, fmt):
    """List process groups: size, desc, members and how far they got.

    \b
    Example:
      flightrec groups dumps/
    """
    from flightrec import api
    from flightrec.report import tables as views

    trace = _trace(dump_dir, prefix, world_size, no_cache, workers)
    if fmt == "json":
        click.echo(views.as_json(views.groups_frame(trace, api.run_match(trace), ranks_as_text=False)), nl=False)
    else:
        click.echo(views.groups_table(trace, api.run_match(trace)))


@main.command("cache")
@click.option("--clear", is_flag=True, help="Remove every cache (a write in progress elsewhere is left alone).")
@click.option("-q", "--quiet", is_flag=True, help="No warnings.")
@guard
def cache_cmd(clear, quiet):
    """List the caches of parsed dumps (where, how big, last used), or remove them all.

    The cache lives in $FLIGHTREC_CACHE_DIR, else ~/.cache/flightrec; writing one removes the least recently used
    others until all fit $FLIGHTREC_CACHE_MAX_GB (default 20).

    \b
    Examples:
      flightrec cache
      flightrec cache --clear
    """
    import polars as pl

    from flightrec import api
    from flightrec.report.tables import text_table
    from flightrec.store import cache

    where = cache.cache_root(api.LoadOptions())
    if clear:
        removed = cache.prune(where, keep=None, budget_bytes=0)
        click.echo(f"removed {len(removed)} cache(s) from {where}")
        return
    found = cache.caches(where)
    if found.height:
        click.echo(text_table(found.select(
            "root", pl.col("prefix").fill_null("(any)").alias("--prefix"), "files",
            (pl.col("bytes") / 2**30).round(2).alias("GiB"),
            pl.col("last_used").dt.strftime("%Y-%m-%d %H:%M").alias("last used (UTC)")), max_width=80))
    total, budget = (found["bytes"].sum() or 0) / 2**30, cache.max_bytes()
    limit = "no limit" if budget == sys.maxsize else f"at most {budget / 2**30:g} GiB"
    click.echo(f"{found.height} cache(s), {total:.2f} GiB in {where} ({limit}: FLIGHTREC_CACHE_MAX_GB)")


@main.command("build-reader")
@guard
def build_reader():
    """Compile the fast pickle reader into numba's cache now (~16 s, once per install or upgrade).

    Without this, the first load of 128 MB of dumps or more after an install compiles it (then every later run
    loads it from the cache in ~0.5 s). Run it where you provision flightrec, so that the first incident
    doesn't pay for it.

    \b
    Example:
      pip install flightrec && flightrec build-reader
    """
    import time

    from flightrec.ingest.fastpickle import walker

    start = time.perf_counter()
    walker.warm()
    click.echo(f"the fast reader is compiled and cached ({time.perf_counter() - start:.1f} s)")


@main.command()
@load_options
@hosts_option
@ranks_per_host_option
@click.option("--top", type=click.IntRange(min=1), default=20, show_default=True, help="Rows per table.")
@table_format_option
@guard
def timing(dump_dir, prefix, world_size, no_cache, workers, quiet, hosts_file, ranks_per_host, top, fmt):
    """Lateness per rank and host (clock offsets removed), and slow groups, from the timestamps.

    \b
    Example:
      flightrec timing dumps/ --ranks-per-host 8
    """
    from flightrec import api
    from flightrec.report.lateness import lateness_dict, lateness_table

    report = api.analyze(dump_dir, api.AnalyzeOptions(load=load_opts(prefix, world_size, no_cache, workers, None),
                                              hosts_file=hosts_file, ranks_per_host=ranks_per_host))
    # (a rank late once, past the timeout, is a root cause `analyze` names, not a straggler: a median hides it)
    late_joins = [f for f in report.root_causes if f.kind == "straggler"]
    if fmt == "json":
        from flightrec.report.tables import as_json
        click.echo(as_json({**lateness_dict(report.timing, top=top, late_joins=late_joins),
                            "only_active": report.dumps.only_active}), nl=False)
        return
    if report.dumps.only_active:
        click.echo("These dumps hold only their unfinished entries (TORCH_INCLUDE_ONLY_ACTIVE): nothing finished is "
                   "left to time, so lateness is read from the collectives in flight alone.\n")
    click.echo(lateness_table(report.timing, top=top, late_joins=late_joins))


if __name__ == "__main__":
    main()
