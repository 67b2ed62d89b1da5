"""Past one machine (`flightrec.distributed`): conversion a task per host, an analysis that reads each rank's
newest entries a task per shard, in this process or on a Dask cluster, and every failure named in the report."""

import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest
from click.testing import CliRunner

from flightrec import analyze
from flightrec.cli import main
from flightrec.distributed.conversion import convert_hosts, host_jobs, worker_jobs
from flightrec.distributed.driver import analyze_shards, shard_locations
from flightrec.distributed.runner import InProcess, OnDask
from flightrec.distributed.tasks import ConvertJob
from flightrec.distributed.window import newest_entries
from flightrec.errors import FlightrecError
from flightrec.model.cluster_failures import is_cluster_failure
from flightrec.ingest.load import load_raw
from flightrec.model.trace import LoadOptions
from flightrec.testing import synth

from .conftest import FIXTURES

REAL = sorted({p.parent for p in FIXTURES.rglob("expected.json")})


def _quietly(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def _said(report) -> tuple:
    """What an on-call acts on: the verdict, the culprits, and each finding's kind, ranks and action."""
    return report.verdict, report.culprits, [(f.kind, sorted(f.ranks), f.action) for f in report.findings]


def _one_shard(dumps: Path, out: Path) -> str:
    done = convert_hosts([ConvertJob(str(dumps), str(out / "all"))])
    assert not done.failed, done.failed
    return str(out)


@pytest.mark.parametrize("case", REAL, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_real_fixture_reads_the_same_through_a_shard_and_each_ranks_newest_ten_entries(case, tmp_path):
    whole = _quietly(analyze, case, use_cache=False)
    shards = _one_shard(case, tmp_path / "shards")
    for keep in (10, 1_000_000):
        windowed = _quietly(analyze_shards, shards, keep=keep)
        assert _said(windowed) == _said(whole), (keep, windowed.summary, whole.summary)
        assert windowed.dumps.window["entries_per_rank"] == keep
    assert windowed.dumps.window["entries_left_out"] == 0


@pytest.fixture(scope="module")
def hang(tmp_path_factory):
    """A 3D-parallel NCCL job (timing on) whose buffers hold ~200 entries, one rank never joining a tp
    all_gather, dumped in one folder per host as the watchdog writes them."""
    out = tmp_path_factory.mktemp("hang") / "dumps"
    job = synth.Job(tp=2, pp=2, dp=4, steps=12, ranks_per_host=4, buffer_size=2000,
                    fault=synth.Fault(kind="not_joined", rank=5, phase="tp"))
    truth = synth.generate(job, out, per_host_folders=True)
    return out, truth


def test_a_window_is_each_ranks_newest_entries_by_record_id_with_their_stacks(hang):
    raw = _quietly(load_raw, hang[0], LoadOptions(use_cache=False))
    w = newest_entries(raw, keep=30)
    per_rank = raw["entries"].group_by("rank").agg(pl.col("record_id").sort().tail(30)).sort("rank")
    kept = w.tables["entries"].group_by("rank").agg(pl.col("record_id").sort()).sort("rank")
    assert per_rank["rank"].len() == 16 and kept.equals(per_rank)
    assert w.entries_left_out == raw["entries"].height - 16 * 30 > 0
    assert (w.tables["dumps"]["entry_count"] == 30).all()
    assert set(w.tables["stacks"]["stack_id"]) == set(w.tables["entries"]["stack_id"].drop_nulls())
    assert w.tables["pg_status"].equals(raw["pg_status"])


def test_a_dump_of_only_unfinished_entries_is_kept_whole():
    """NVIDIA's real dumps (TORCH_INCLUDE_ONLY_ACTIVE): what was in flight is the evidence, cut nowhere."""
    raw = _quietly(load_raw, FIXTURES / "nvrx" / "lock_gil_2nd", LoadOptions(use_cache=False))
    longer = raw["entries"].group_by("rank").len().filter(pl.col("len") > 10).height
    w = newest_entries(raw, keep=10)
    assert longer >= 4 and w.entries_left_out == 0 and w.ranks_kept_whole == longer


def test_gloo_dumps_are_kept_whole_and_the_report_says_so(tmp_path):
    """Gloo marks no entry completed: nothing tells finished history from what was in flight."""
    case = FIXTURES / "straggler_pipeline"
    report = _quietly(analyze_shards, _one_shard(case, tmp_path / "shards"), keep=10)
    assert report.dumps.window["entries_left_out"] == 0
    assert report.dumps.window["ranks_kept_whole"] == report.dumps.loaded > 0
    assert "ranks' dumps kept whole: their unfinished entries only, or Gloo's" in report.to_text()


def test_a_window_keeps_an_entry_with_no_record_id_and_refuses_fewer_than_ten(hang):
    raw = _quietly(load_raw, hang[0], LoadOptions(use_cache=False))
    raw["entries"] = raw["entries"].with_columns(
        pl.when(pl.int_range(pl.len()) == 0).then(None).otherwise(pl.col("record_id")).alias("record_id"))
    assert newest_entries(raw, keep=10).tables["entries"]["record_id"].null_count() == 1
    with pytest.raises(FlightrecError, match="at least 10"):
        newest_entries(raw, keep=9)


def test_a_hang_reads_the_same_from_per_host_shards_as_from_the_dumps(hang, tmp_path):
    dumps, truth = hang
    whole = _quietly(analyze, dumps, use_cache=False)
    assert whole.culprits["ranks"] == truth["ranks"]
    done = convert_hosts(host_jobs(str(dumps), str(tmp_path / "shards")))
    assert [o.item.host for o in done.outcomes] == [f"node0000{k}" for k in range(4)] and not done.failed
    windowed = _quietly(analyze_shards, str(tmp_path / "shards"), keep=50)
    assert windowed.dumps.window["entries_left_out"] > 0
    assert _said(windowed) == _said(whole)
    assert "the newest 50 entries of each rank analysed" in windowed.to_text()


def test_dumps_and_shards_in_object_storage_through_fsspec(hang, tmp_path):
    fsspec = pytest.importorskip("fsspec")
    store = fsspec.filesystem("memory")
    store.put(str(hang[0]) + "/", "/bucket/job/", recursive=True)
    try:
        done = convert_hosts(host_jobs("memory://bucket/job", "memory://bucket/shards"))
        assert not done.failed, done.failed
        assert len(shard_locations("memory://bucket/shards")) == 4
        windowed = _quietly(analyze_shards, "memory://bucket/shards", keep=50)
        assert _said(windowed) == _said(_quietly(analyze, hang[0], use_cache=False))
        # the command line reads a URL as shards, each rank's newest 200 entries by default
        result = CliRunner().invoke(main, ["analyze", "memory://bucket/shards", "-f", "json", "-q"])
        assert result.exit_code == 1, result.output
        assert json.loads(result.output)["dumps"]["window"]["entries_per_rank"] == 200
    finally:
        store.rm("/bucket", recursive=True)


def test_an_error_of_the_storage_library_is_the_users_to_fix_and_any_other_is_raised(hang, monkeypatch):
    fsspec = pytest.importorskip("fsspec")
    from fsspec.implementations.memory import MemoryFileSystem

    class NoCredentialsError(Exception):   # (as botocore's, without needing it)
        pass
    NoCredentialsError.__module__ = "botocore.exceptions"
    store = fsspec.filesystem("memory")
    store.put(str(hang[0]) + "/", "/bucket/job/", recursive=True)
    try:
        def refuse(*args, **kwargs):
            raise NoCredentialsError("Unable to locate credentials")
        monkeypatch.setattr(MemoryFileSystem, "ls", refuse)
        with pytest.raises(FlightrecError, match="Check the credentials"):
            host_jobs("memory://bucket/job", "memory://bucket/shards")
        result = CliRunner().invoke(main, ["convert-hosts", "memory://bucket/job", "memory://bucket/shards"])
        assert result.exit_code == 2 and "Unable to locate credentials" in result.output, result.output

        def broken(*args, **kwargs):
            raise KeyError("a bug of ours or of fsspec's caller")
        monkeypatch.setattr(MemoryFileSystem, "ls", broken)
        with pytest.raises(KeyError):
            host_jobs("memory://bucket/job", "memory://bucket/shards")
    finally:
        monkeypatch.undo()
        store.rm("/bucket", recursive=True)


def _copy_hosts(src: Path, dst: Path) -> Path:
    for host in sorted(src.iterdir()):
        (dst / host.name).mkdir(parents=True)
        for f in host.iterdir():
            (dst / host.name / f.name).write_bytes(f.read_bytes())
    return dst


def test_a_host_folder_left_empty_reads_as_that_host_gone_as_on_one_machine(hang, tmp_path):
    dumps = _copy_hosts(hang[0], tmp_path / "dumps")
    for f in (dumps / "node00002").iterdir():
        f.unlink()
    whole = _quietly(analyze, dumps, use_cache=False)
    convert_hosts(host_jobs(str(dumps), str(tmp_path / "shards")))
    windowed = _quietly(analyze_shards, str(tmp_path / "shards"), keep=50)
    assert windowed.dumps.empty_host_folders == whole.dumps.empty_host_folders == ["node00002"]
    assert _said(windowed) == _said(whole)


def test_a_folder_that_is_no_host_is_no_host_gone_and_a_missing_one_is_no_host_gone_either(hang, tmp_path):
    dumps = _copy_hosts(hang[0], tmp_path / "dumps")
    (dumps / "logs").mkdir()   # (empty, and not named like the hosts: no host, as on one machine)
    jobs = host_jobs(str(dumps), str(tmp_path / "shards"))
    assert [j.host for j in jobs] == [f"node0000{k}" for k in range(4)]
    typo = ConvertJob(str(dumps / "node0003-typo"), str(tmp_path / "shards" / "node0003-typo"))
    [outcome] = convert_hosts([typo]).outcomes
    assert outcome.failure.endswith("node0003-typo: no such folder")
    with pytest.raises(FlightrecError, match="inside"):
        host_jobs(str(dumps), str(dumps / "shards"))


def test_a_host_that_fails_to_convert_is_named_and_nothing_is_blamed_on_its_missing_ranks(hang, tmp_path):
    dumps = _copy_hosts(hang[0], tmp_path / "dumps")
    for f in (dumps / "node00003").iterdir():
        f.unlink()
    (dumps / "node00003" / "core.txt").write_text("files there, none a dump")
    done = convert_hosts(host_jobs(str(dumps), str(tmp_path / "shards")))
    assert [o.item.host for o in done.failed] == ["node00003"]
    report = _quietly(analyze_shards, str(tmp_path / "shards"), keep=50)
    [unreadable] = report.dumps.unreadable
    assert unreadable["path"].endswith("node00003") and "its conversion failed" in unreadable["reason"]
    assert report.dumps.missing_ranks == [12, 13, 14, 15]
    # rank 5's hang is still there to see, and said to be seen without them; they are not called a host down
    assert report.culprits["ranks"] == hang[1]["ranks"] == [5], report.summary
    [warning] = [f for f in report.findings if f.kind == "unreadable"]
    assert warning.evidence["unreadable_ranks"] == [12, 13, 14, 15] and "analysed without them" in warning.message
    assert not {"missing_dump", "host_down"} & {f.kind for f in report.findings}


def test_a_damaged_shard_is_named_with_its_own_ranks_and_the_rest_analysed(hang, tmp_path):
    convert_hosts(host_jobs(str(hang[0]), str(tmp_path / "shards")))
    shutil.rmtree(tmp_path / "shards" / "node00002")   # (a host whose shard never came: ranks 8-11 just missing)
    entries = tmp_path / "shards" / "node00000" / "entries.parquet"
    entries.write_bytes(entries.read_bytes()[: entries.stat().st_size // 2])
    report = _quietly(analyze_shards, str(tmp_path / "shards"), keep=50)
    [unreadable] = report.dumps.unreadable
    assert unreadable["path"].endswith("node00000")
    assert unreadable["reason"].startswith("damaged (ComputeError: parquet")
    assert report.dumps.loaded == 8 and report.dumps.missing_ranks == [0, 1, 2, 3, 8, 9, 10, 11]
    assert report.trace.unreadable_ranks == [0, 1, 2, 3]
    assert [f.evidence["unreadable_ranks"] for f in report.findings if f.kind == "unreadable"] == [[0, 1, 2, 3]]
    text = report.to_text()
    assert "paths: node00000 (damaged (ComputeError: parquet" in text and "{'path'" not in text
    assert "every entry read analysed" in text or "older ones left out" in text
    # the one-machine path names it too
    assert _quietly(analyze, tmp_path / "shards").dumps.unreadable[0]["path"].endswith("node00000")


def test_a_bug_in_a_task_is_raised_not_reported_as_a_bad_shard():
    def buggy(_item):
        raise TypeError("a flightrec bug")
    with pytest.raises(TypeError):
        InProcess().map(buggy, [1])
    with pytest.raises(pl.exceptions.ColumnNotFoundError):   # (Polars' own errors too: only a shard's are caught)
        InProcess().map(lambda _: pl.DataFrame({"a": [1]}).select("b"), [1])


def test_a_shard_is_never_written_over_dumps_in_object_storage(hang):
    fsspec = pytest.importorskip("fsspec")
    store = fsspec.filesystem("memory")
    store.put(str(hang[0]) + "/", "/dumps-here/", recursive=True)
    try:
        before = sorted(store.find("/dumps-here"))
        done = convert_hosts(host_jobs("memory://dumps-here", "memory://dumps-here"))
        assert all("no flightrec shard" in o.failure for o in done.outcomes)
        assert sorted(store.find("/dumps-here")) == before
    finally:
        store.rm("/dumps-here", recursive=True)


@pytest.fixture(scope="module")
def cluster():
    distributed = pytest.importorskip("distributed")
    import dask

    # (a task that kills its worker is retried on another once, then named: quick, and still a retry)
    with dask.config.set({"distributed.scheduler.allowed-failures": 1}), \
            distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, memory_limit="2GiB",
                                     dashboard_address=None) as local, distributed.Client(local) as client:
        yield client


def test_on_a_dask_cluster_the_tasks_run_on_its_workers_with_the_same_verdict(hang, tmp_path, cluster):
    runner = OnDask(cluster)
    done = convert_hosts(host_jobs(str(hang[0]), str(tmp_path / "shards")), runner)
    assert not done.failed and {o.value["pid"] for o in done.outcomes}.isdisjoint({os.getpid()})
    windowed = _quietly(analyze_shards, str(tmp_path / "shards"), keep=50, runner=runner)
    assert _said(windowed) == _said(_quietly(analyze, hang[0], use_cache=False))


def test_on_each_worker_each_host_is_converted_by_the_worker_on_it(hang, tmp_path, cluster):
    """On a cluster, one worker per host converts the dumps at one path on its own disk; here both workers share
    this machine's disk, so both convert the same folder, each pinned to its worker and named after it."""
    jobs = worker_jobs(cluster, str(hang[0] / "node00000"), str(tmp_path / "shards"))
    pid_of = {info["name"]: cluster.run(os.getpid, workers=[address])[address]
              for address, info in cluster.scheduler_info(n_workers=-1)["workers"].items()}
    assert [j.host for j in jobs] == ["0", "1"] and [j.worker for j in jobs] == [0, 1]
    done = convert_hosts(jobs, OnDask(cluster))
    assert not done.failed
    assert [o.value["pid"] for o in done.outcomes] == [pid_of[j.worker] for j in jobs]
    assert sorted(p.name for p in (tmp_path / "shards").iterdir()) == ["0", "1"]


def test_a_worker_that_dies_is_named_and_the_other_tasks_answer(cluster):
    outcomes = OnDask(cluster).map(lambda x: os._exit(3) if x == "dies" else x * 2, ["dies", 21])
    assert outcomes[1].value == 42 and outcomes[1].failure is None
    assert outcomes[0].value is None and outcomes[0].failure.startswith("the worker running it died")
    cluster.wait_for_workers(2, timeout=60)   # (the nannies restart the killed workers)


def test_a_task_pinned_to_a_worker_that_dies_is_named_not_waited_on_for_ever(cluster):
    """The task can run on no other worker, and the scheduler would hold it for ever (its worker, restarted by
    the nanny, has a new address): it is named at once."""
    start = time.perf_counter()
    [outcome] = OnDask(cluster, timeout_s=120).map(lambda item: os._exit(3), [SimpleNamespace(worker=0)])
    assert time.perf_counter() - start < 60
    assert outcome.failure.startswith("the worker on that host left the cluster"), outcome.failure
    cluster.wait_for_workers(2, timeout=60)


def test_a_task_that_never_answers_is_named_after_the_deadline(cluster):
    start = time.perf_counter()
    told = []
    outcomes = OnDask(cluster, timeout_s=2).map(lambda s: time.sleep(s) or s, [0, 60], on_done=told.append)
    assert time.perf_counter() - start < 30
    assert outcomes[0].value == 0
    assert outcomes[1].failure == "no answer from the cluster within 2 s (storage or a worker hung)"
    assert is_cluster_failure(outcomes[1].failure)
    assert told == outcomes   # (so a conversion that never answered is marked in its shard too)


def test_the_command_line_converts_and_analyses_on_a_local_cluster(hang, tmp_path):
    runner = CliRunner()
    shards = tmp_path / "shards"
    converted = runner.invoke(main, ["convert-hosts", str(hang[0]), str(shards), "--local-workers", "2", "-q"])
    assert converted.exit_code == 0, converted.output
    assert "converted 4 of 4 hosts" in converted.output
    whole = runner.invoke(main, ["analyze", str(hang[0]), "--no-cache", "-f", "json", "-q"])
    windowed = runner.invoke(main, ["analyze", str(shards), "--local-workers", "2", "--worker-memory", "2GiB",
                                    "--window", "50", "-f", "json", "-q"])
    assert windowed.exit_code == whole.exit_code == 1, windowed.output
    assert '"entries_per_rank": 50' in windowed.output


def test_cluster_options_that_cannot_work_are_refused_with_what_to_do(hang, tmp_path):
    runner = CliRunner()
    cases = [
        (["analyze", str(hang[0]), "--deadline", "5"], "are for a cluster"),
        (["analyze", str(hang[0]), "--window", "5"], "5 is not in the range x>=10"),
        (["analyze", str(tmp_path), "--scheduler", str(tmp_path / "nope.json")], "no such scheduler file"),
        (["analyze", str(tmp_path), "--scheduler", "nonsense"], "could not reach the Dask scheduler"),
        (["analyze", str(tmp_path), "--local-workers", "1", "--worker-memory", "lots"], "is no size"),
        (["convert-hosts", str(hang[0]), str(tmp_path / "o"), "--on-each-worker"], "needs the cluster"),
    ]
    for argv, said in cases:
        result = runner.invoke(main, argv)
        assert result.exit_code == 2 and said in result.output, (argv, result.output)


def test_converting_beside_another_runs_shards_says_so(hang, tmp_path):
    src = _copy_hosts(hang[0], tmp_path / "job")
    out = tmp_path / "shards"
    runner = CliRunner()
    assert runner.invoke(main, ["convert-hosts", str(src), str(out), "-q"]).exit_code == 0
    hosts = sorted(p.name for p in src.iterdir())
    shutil.rmtree(src / hosts[0])
    again = runner.invoke(main, ["convert-hosts", str(src), str(out), "-q"])
    assert again.exit_code == 0
    assert f"also holds 1 shard(s) not written now ({hosts[0]})" in again.output, again.output
    shutil.rmtree(out / hosts[0])
    assert "also holds" not in runner.invoke(main, ["convert-hosts", str(src), str(out), "-q"]).output


class _NoAnswerFor(InProcess):
    """Runs here, but a shard whose path ends in `host` gets the runner's answer for a task past --deadline."""

    def __init__(self, host):
        self.host = host

    def map(self, fn, items, on_done=None):
        from flightrec.distributed.runner import Outcome
        return [Outcome(item, failure="no answer from the cluster within 5 s (storage or a worker hung)")
                if str(item.shard).endswith(self.host) else outcome
                for item, outcome in zip(items, super().map(fn, items, on_done))]


def test_a_shard_the_cluster_never_read_points_the_next_step_at_the_cluster(hang, tmp_path):
    convert_hosts(host_jobs(str(hang[0]), str(tmp_path / "shards")))
    report = _quietly(analyze_shards, str(tmp_path / "shards"), keep=50, runner=_NoAnswerFor("node00000"))
    [f] = [f for f in report.findings if f.kind == "unreadable"]
    assert f.next_step.startswith("the cluster did not read 1 shard"), f.next_step
    assert "--deadline" in f.next_step


def test_a_mistyped_folder_or_a_folder_of_dumps_under_window_says_what_is_wrong(hang, tmp_path):
    runner = CliRunner()
    typo = runner.invoke(main, ["analyze", str(tmp_path / "shrads"), "--window", "50"])
    assert typo.exit_code == 2 and "no such folder" in typo.output, typo.output
    dumps = runner.invoke(main, ["analyze", str(hang[0]), "--window", "50"])
    assert dumps.exit_code == 2 and "without --window" in dumps.output, dumps.output


def test_a_host_placeholder_without_on_each_worker_says_which_flag_it_needs(hang, tmp_path):
    result = CliRunner().invoke(main, ["convert-hosts", str(hang[0] / "{host}"), str(tmp_path / "out")])
    assert result.exit_code == 2 and "only with --on-each-worker" in result.output, result.output


def test_convert_hosts_exits_2_naming_each_host_it_could_not_convert(hang, tmp_path):
    dumps = _copy_hosts(hang[0], tmp_path / "dumps")
    for f in (dumps / "node00001").iterdir():
        f.rename(f.with_name("notes.txt"))
    result = CliRunner().invoke(main, ["convert-hosts", str(dumps), str(tmp_path / "shards"), "-q"])
    assert result.exit_code == 2
    assert "node00001: not converted:" in result.output and "converted 3 of 4 hosts" in result.output


def test_the_documented_launch_a_scheduler_and_a_worker_per_host(hang, tmp_path, monkeypatch):
    """docs/scale.md's commands, with `dask scheduler` and one `dask worker --name HOST` per host as separate
    processes: each worker converts its own host's dumps, then the shards are analysed on the same cluster.
    The workers run in another folder than the command, whose paths are relative: they are read from where the
    command runs."""
    pytest.importorskip("distributed")
    shutil.copytree(hang[0], tmp_path / "dumps")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(tmp_path)

    dask = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
    scheduler_file = tmp_path / "scheduler.json"
    procs = [subprocess.Popen([*dask, "--scheduler-file", str(scheduler_file), "--port", "0",
                               "--dashboard-address", ":0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        for _ in range(100):
            if scheduler_file.exists():
                break
            time.sleep(0.1)
        hosts = sorted(p.name for p in hang[0].iterdir() if p.is_dir())
        procs += [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file",
                                    str(scheduler_file), "--name", host, "--nthreads", "1", "--memory-limit", "1GiB",
                                    "--no-dashboard"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   cwd=elsewhere)
                  for host in hosts]
        runner = CliRunner()
        shards = tmp_path / "shards"
        converted = runner.invoke(main, ["convert-hosts", "dumps/{host}", "shards", "--on-each-worker",
                                         "--expect-hosts", str(len(hosts)), "--scheduler", str(scheduler_file), "-q"])
        assert converted.exit_code == 0, converted.output
        assert f"converted {len(hosts)} of {len(hosts)}" in converted.output
        assert sorted(p.name for p in shards.iterdir()) == hosts
        result = runner.invoke(main, ["analyze", "shards", "--window", "50", "--scheduler", str(scheduler_file),
                                      "-f", "json", "-q"])
        assert result.exit_code == 1, result.output
        report = json.loads(result.output)
        whole = _quietly(analyze, hang[0], use_cache=False)
        assert report["culprits"]["ranks"] == whole.culprits["ranks"] == [5]
        assert [f["kind"] for f in report["findings"]] == [f.kind for f in whole.findings]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
