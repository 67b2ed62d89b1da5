"""`flightrec convert` (one folder of dumps -> a shard) and `flightrec convert-hosts` (every host's dumps -> their
shards, a task per host, here or on a Dask cluster): the first step past one machine (docs/scale.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from flightrec.cli.cluster_options import cluster_options, runner_from_options
from flightrec.cli.commands import EXIT_USAGE, guard, load_options, load_opts, main


@main.command()
@load_options
@click.argument("out", type=click.Path(path_type=Path, file_okay=False))
@click.option("--shard-only", is_flag=True,
              help="Only the parsed tables (a shard for `analyze`), not the matching frames: for one host's dumps.")
@click.option("--host", help="Host name to record for these dumps when their names don't say (e.g. $(hostname)).")
@guard
def convert(dump_dir, prefix, world_size, no_cache, workers, quiet, out, shard_only, host):
    """Export dumps as Parquet into OUT: the parsed tables (a shard `analyze` reads without any pickle) and,
    unless --shard-only, every analysis frame (groups, collectives, progress, p2p...) for other tools.

    \b
    Examples:
      flightrec convert dumps/ dumps_parquet/
      flightrec convert /tmp/fr shards/$(hostname) --shard-only --host $(hostname)   # on each host
      flightrec analyze shards/                                                   # anywhere
    """
    from flightrec import api
    from flightrec.ingest.load import load_raw
    from flightrec.report import tables as views
    from flightrec.store.cache import TABLES
    from flightrec.store.shards import check_replaceable, write_shard

    check_replaceable(out)   # (before the parse, which can take minutes)
    opts = load_opts(prefix, world_size, no_cache, workers, None)
    write_shard(load_raw(dump_dir, opts), out, source=str(dump_dir), host=host)
    click.echo(f"wrote the shard to {out}: {', '.join(TABLES)}")
    if not shard_only:
        trace = api.load(out, opts)
        frames = [p.stem for p in views.export_parquet(trace, api.run_match(trace), out / "frames")]
        click.echo(f"wrote {len(frames)} Parquet tables to {out / 'frames'}: {', '.join(frames)}")


@main.command("convert-hosts")
@click.argument("source")
@click.argument("out")
@click.option("--on-each-worker", is_flag=True,
              help="SOURCE is where every worker finds its own host's dumps on its local disk (e.g. /tmp/fr; {host} "
                   "stands for the worker's name): one task per worker, pinned to it, each shard named after the "
                   "worker (start one per host with `dask worker --name $(hostname)`). Without it, SOURCE holds one "
                   "folder of dumps per host.")
@click.option("--expect-hosts", type=click.IntRange(min=1), metavar="N",
              help="With --on-each-worker: wait (up to a minute) for N workers, and refuse to go on with fewer.")
@click.option("--prefix", help="File-name prefix before the rank (default: any name ending in a number).")
@cluster_options
@click.option("-q", "--quiet", is_flag=True, help="Only the failures (on stderr) and the one-line summary.")
@guard
def convert_hosts(source, out, on_each_worker, expect_hosts, prefix, quiet, **cluster):
    """Convert every host's dumps into its shard in OUT (a folder or URL), a task per host: on a cluster's
    workers in parallel, or here one after another (one host's dumps at a time on one core).

    SOURCE and OUT may be URLs (s3://bucket/job1234, gs://..., through fsspec: install s3fs or gcsfs); relative
    paths are read from here. A host whose conversion fails (files but no dump among them, unreadable, a worker
    that died, storage that timed out) gets a shard that says why, which `analyze` names; the command then exits
    2. An empty host folder named like the others (node7 beside node6) is converted as that host gone, as
    `analyze` reads it on one machine.

    \b
    Examples:
      flightrec convert-hosts /shared/fr/job1234 /shared/shards/job1234 --local-workers 8
      flightrec convert-hosts s3://fr/job1234 s3://fr-shards/job1234 --scheduler tcp://head:8786
      flightrec convert-hosts /tmp/fr /shared/shards/job1234 --on-each-worker --scheduler tcp://head:8786
      flightrec analyze /shared/shards/job1234 --window 200 --scheduler tcp://head:8786
    """
    from flightrec.distributed.conversion import convert_hosts as run
    from flightrec.distributed.conversion import host_jobs, worker_jobs

    if on_each_worker and not cluster["scheduler"]:
        raise click.UsageError("--on-each-worker needs the cluster whose workers run on the job's hosts: "
                               "--scheduler ADDRESS")
    if expect_hosts and not on_each_worker:
        raise click.UsageError("--expect-hosts counts the workers of --on-each-worker")
    with runner_from_options(**cluster) as runner:
        if on_each_worker:
            jobs = worker_jobs(runner.client, source, out, prefix, expect=expect_hosts)
        else:
            jobs = host_jobs(source, out, prefix)

        def said(outcome) -> None:
            if outcome.failure is not None:
                click.echo(f"{outcome.item.host}: not converted: {outcome.failure}", err=True)
            elif not quiet:
                click.echo(f"{outcome.item.host}: {outcome.value['dumps']:,} dumps, {outcome.value['entries']:,} "
                           f"entries -> {outcome.item.out}", err=True)
        done = run(jobs, runner, on_done=said)
    others = _other_shards(out, {job.host for job in jobs})
    if others:
        click.echo(f"note: {out} also holds {len(others):,} shard(s) not written now ({', '.join(others[:3])}"
                   f"{', ...' if len(others) > 3 else ''}): analyze reads them with these. If they are another "
                   "job's, convert into a new OUT", err=True)
    failed = len(done.failed)
    click.echo(f"converted {len(jobs) - failed} of {len(jobs)} hosts into {out}"
               + (f"; {failed} failed, each marked in its shard (analyze names them)" if failed else ""))
    if failed:
        sys.exit(EXIT_USAGE)


def _other_shards(out: str, hosts: set[str]) -> list[str]:
    """The shards under `out` of hosts this run did not convert (an earlier run's, maybe another job's)."""
    from flightrec.distributed.driver import shard_locations

    return sorted(name for name in (s.rstrip("/").rsplit("/", 1)[-1] for s in shard_locations(out))
                  if name not in hosts)
