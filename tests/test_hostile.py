"""Hostile and broken input (docs/input-errors.md): never execute, never crash, never lose what can be read."""

import gzip
import json
import os
import pickle
import warnings

import pytest
from click.testing import CliRunner

from flightrec import FlightrecError, LoadOptions, analyze, load
from flightrec.cli import main
from flightrec.errors import NoDumpsError
from flightrec.ingest.safe_read import loads_plain_pickle
from flightrec.testing import synth


@pytest.fixture
def job_dir(make_job):
    out, _ = make_job(synth.Job(tp=4, pp=1, dp=2, fault=synth.Fault(kind="not_joined", rank=6)))
    return out


def _quiet_load(path, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trace = load(path, LoadOptions(use_cache=False, **kw))
    return trace, [str(w.message) for w in caught]


def _rewrite(path, fn):
    dump = loads_plain_pickle(path.read_bytes())
    fn(dump)
    path.write_bytes(pickle.dumps(dump))


class Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_refused_the_rest_analysed(job_dir, tmp_path):
    marker = tmp_path / "payload-ran"
    (job_dir / "nccl_trace_rank_3").write_bytes(pickle.dumps({"version": "2.10", "entries": [Payload(marker)]}))
    report = analyze(job_dir, use_cache=False)
    assert not marker.exists()
    assert len(report.dumps.refused) == 1
    assert "refused: the pickle asks to load" in report.dumps.refused[0]["reason"]
    assert "system" in report.dumps.refused[0]["reason"] and "not executed" in report.dumps.refused[0]["reason"]
    assert report.dumps.missing_ranks == [3]
    assert 6 in report.culprits["ranks"]


def test_truncated_pickle_keeps_entries_before_the_cut(job_dir):
    path = job_dir / "nccl_trace_rank_2"
    full = loads_plain_pickle(path.read_bytes())
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    trace, msgs = _quiet_load(job_dir)
    kept = trace.entries.filter(trace.entries["rank"] == 2)
    assert 0 < kept.height < len(full["entries"])
    assert kept["record_id"].to_list() == [e["record_id"] for e in full["entries"][: kept.height]]
    assert any("truncated file" in m for m in msgs)


@pytest.mark.parametrize("data", [b"", os.urandom(4096), b"\x80\x04\x95garbage", b"{\"entries\": [1, 2"])
def test_junk_files_are_refused_with_a_reason(job_dir, data):
    (job_dir / "nccl_trace_rank_1").write_bytes(data)
    trace, msgs = _quiet_load(job_dir)
    assert 1 in trace.missing_ranks
    refused = trace.dumps.filter(~trace.dumps["loaded"])
    assert refused["rank"].to_list() == [1] and refused["problems"][0][0]


def test_gzip_dumps_are_read(job_dir):
    path = job_dir / "nccl_trace_rank_0"
    (job_dir / "nccl_trace_rank_0.gz").write_bytes(gzip.compress(path.read_bytes()))
    path.unlink()
    trace, _ = _quiet_load(job_dir)
    assert trace.missing_ranks == []


def test_json_with_wrong_types_and_missing_keys(job_dir):
    path = job_dir / "nccl_trace_rank_5"
    dump = loads_plain_pickle(path.read_bytes())
    doc = json.loads(synth.to_json_dump(dump))
    for e in doc["entries"][:5]:
        e["collective_seq_id"] = str(e["collective_seq_id"])   # ints as strings
        e["input_sizes"] = "not a list"
        del e["state"]
    doc["entries"][6]["record_id"] = -(10**30)                  # absurd
    doc["entries"][7]["timeout_ms"] = {"a": 1}
    doc["pg_status"] = ["not", "a", "dict"]
    path.write_text(json.dumps(doc))
    trace, msgs = _quiet_load(job_dir)
    mine = trace.entries.filter(trace.entries["rank"] == 5)
    assert mine.height == len(doc["entries"])
    assert mine["collective_seq_id"].null_count() == 0           # "3" was read as 3
    assert any("pg_status" in m for m in msgs) and any("input_sizes" in m for m in msgs)


@pytest.mark.parametrize("mutate, problem", [
    (lambda d: d.__setitem__("entries", {"not": "a list"}), "not a list"),
    (lambda d: d["entries"].append("not a dict"), "not dicts"),
    (lambda d: d.pop("version"), "no 'version'"),
    (lambda d: d.__setitem__("pg_config", "nope"), "pg_config"),
])
def test_structural_damage_is_noted(job_dir, mutate, problem):
    _rewrite(job_dir / "nccl_trace_rank_4", mutate)
    trace, msgs = _quiet_load(job_dir)
    assert any(problem in m for m in msgs)


def test_file_without_rank_is_reported(job_dir):
    (job_dir / "nccl_trace_rank_final").write_bytes((job_dir / "nccl_trace_rank_0").read_bytes())
    _, msgs = _quiet_load(job_dir)
    assert any("no rank number" in m and m.endswith(": nccl_trace_rank_final") for m in msgs)


def test_mixed_versions_are_analysed_with_a_warning(job_dir):
    _rewrite(job_dir / "nccl_trace_rank_0", lambda d: d.__setitem__("version", "2.9"))
    report = analyze(job_dir, use_cache=False)
    assert any(f.kind == "mixed_versions" for f in report.findings)
    assert report.culprits["ranks"] == [6]


def test_directory_without_dumps_exits_2(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(NoDumpsError):
        analyze(tmp_path)
    result = CliRunner().invoke(main, ["analyze", str(tmp_path)])
    assert result.exit_code == 2 and "Traceback" not in result.stderr


def test_every_file_unreadable_exits_2(tmp_path):
    (tmp_path / "rank_0").write_bytes(b"junk")
    (tmp_path / "rank_1").write_bytes(b"junk")
    result = CliRunner().invoke(main, ["analyze", str(tmp_path)])
    assert result.exit_code == 2 and "none of the 2 dump files could be read" in result.stderr


def test_unreadable_file_is_refused(job_dir, monkeypatch):
    """Root reads any file, so the permission error is injected where the reader opens the file."""
    from flightrec.ingest import pool

    real, real_open = pool.read_dump_bytes, pool._open_dump

    def deny(path):
        if str(path).endswith("_7"):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    def deny_open(path):   # (the tape's batches open the files themselves)
        return None if str(path).endswith("_7") else real_open(path)
    monkeypatch.setattr(pool, "read_dump_bytes", deny)
    monkeypatch.setattr(pool, "_open_dump", deny_open)
    trace, _ = _quiet_load(job_dir, workers=1)
    assert trace.missing_ranks == [7]
    assert "Permission denied" in trace.dumps.filter(trace.dumps["rank"] == 7)["problems"][0][0]


def test_one_gigabyte_of_junk_is_refused_fast(job_dir):
    path = job_dir / "nccl_trace_rank_2"
    with open(path, "wb") as fh:
        fh.write(b"\x00\x01junk")
        fh.truncate(1 << 30)  # sparse: costs no disk
    trace, _ = _quiet_load(job_dir)
    assert 2 in trace.missing_ranks


def test_huge_json_is_refused_without_reading(job_dir):
    path = job_dir / "nccl_trace_rank_2"
    with open(path, "wb") as fh:
        fh.write(b'{"entries": [')
        fh.truncate((512 << 20) + 10)
    trace, _ = _quiet_load(job_dir)
    assert "too large" in trace.dumps.filter(trace.dumps["rank"] == 2)["problems"][0][0]


def test_flightrec_error_is_a_value_error():
    assert issubclass(FlightrecError, ValueError)


def test_the_culprits_own_dump_cut_short_still_names_it(make_job):
    """The rank that hung is the likeliest to leave a damaged dump. Cut while it hung (entries first, as
    torch's writer orders the keys, so its pg_status is lost too), it is named as its waiters' cause, as a
    rank that left no dump would be, not a link between hosts."""
    out, _ = make_job(synth.Job(tp=2, pp=1, dp=4, ranks_per_host=4,
                                fault=synth.Fault(kind="not_joined", rank=5, phase="dp")))
    path = out / "nccl_trace_rank_5"
    dump = loads_plain_pickle(path.read_bytes())
    data = pickle.dumps({k: dump[k] for k in ("version", "entries", "pg_config", "pg_status")}, 2)
    path.write_bytes(data[: int(len(data) * 0.85)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = analyze(out, use_cache=False, ranks_per_host=4)
    assert report.culprits["ranks"] == [5] and report.culprits["links"] == []
    assert "damaged dump" in report.summary and "cut short" in report.root_causes[0].message
    assert report.root_causes[0].evidence["damaged_dumps"] == [5]


@pytest.mark.parametrize("damage", ["cut", "no_entries", "no_dtypes", "no_shapes", "no_op_names"])
def test_a_damaged_dump_is_not_blamed_for_the_hang(make_job, damage):
    """A dump cut short lost its newest entries, one with no entries while its pg_status counts collectives
    kept none (either rank only looks behind), and one whose recorder left out a field says nothing about it
    (not a mismatch): either way the rank that hung is named, not the damaged one."""
    out, truth = make_job(synth.Job(tp=2, pp=2, dp=2, ranks_per_host=4, fault=synth.Fault(kind="not_joined", rank=5)))
    path = out / "nccl_trace_rank_3"
    if damage == "cut":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif damage == "no_entries":   # (its pg_status still counts the collectives it ran)
        dump = loads_plain_pickle(path.read_bytes())
        path.unlink()
        (out / "nccl_trace_rank_3.json").write_text(synth.to_json_dump(dict(dump, entries=[])))
    else:
        dump = loads_plain_pickle(path.read_bytes())
        field = {"no_dtypes": "input_dtypes", "no_shapes": "input_sizes", "no_op_names": "profiling_name"}[damage]
        for e in dump["entries"]:
            e.pop(field, None)
        path.write_bytes(pickle.dumps(dump))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = analyze(out, use_cache=False)
    assert report.culprits["ranks"] == [5]


def test_odd_names_and_ids_are_read_not_a_flightrec_bug(make_job, tmp_path, monkeypatch):
    """A file name that isn't UTF-8, a number too long to be a rank, and negative seq ids: the analysis runs
    (cached and not) and still names the rank that hung, instead of exit 70."""
    out, _ = make_job(synth.Job(tp=2, pp=2, dp=2, ranks_per_host=4, fault=synth.Fault(kind="not_joined", rank=5)))
    os.rename(out / "nccl_trace_rank_4", os.fsencode(out) + b"/\xff\xfe-nccl_trace_rank_4")
    (out / "nccl_trace_rank_99999999999999999999").write_bytes((out / "nccl_trace_rank_0").read_bytes())
    dump = loads_plain_pickle((out / "nccl_trace_rank_3").read_bytes())
    dump["entries"][0]["collective_seq_id"] = -1
    (out / "nccl_trace_rank_3").write_bytes(pickle.dumps(dump))
    json_dump = json.loads(synth.to_json_dump(dump))
    (out / "nccl_trace_rank_3").unlink()
    (out / "nccl_trace_rank_3.json").write_text(json.dumps(json_dump))
    monkeypatch.setenv("FLIGHTREC_CACHE_DIR", str(tmp_path / "cache"))
    for extra in (["--no-cache"], [], []):   # (then written to the cache, then read from it)
        result = CliRunner().invoke(main, ["analyze", str(out), "--format", "json", "-q", *extra])
        assert result.exit_code == 1, result.output
        assert json.loads(result.stdout)["culprits"]["ranks"] == [5]


def test_ranks_waiting_on_a_member_seen_behind_are_said_to_wait_on_it_not_on_the_lost_dumps(tmp_path):
    """Real Gloo dumps (subgroups_per_host: rank 5 skips a tp all_reduce) with the other host's four dumps made
    junk. Gloo's groups have inferred members, so the lost ranks may be members of the tp group too; the ranks
    waiting there are still said to wait on the member seen behind, as the root cause says."""
    import shutil

    from .conftest import FIXTURES
    shutil.copytree(FIXTURES / "subgroups_per_host", tmp_path / "job")
    for dump in (tmp_path / "job" / "node0").iterdir():
        dump.write_bytes(b"junk")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = analyze(tmp_path / "job", use_cache=False)
    assert report.culprits["ranks"] == [5]
    waiting = [f for f in report.findings if f.kind == "waiting"]
    assert [f.ranks for f in waiting] == [[4, 6, 7]]
    assert waiting[0].message.endswith("for members that have not joined")


def test_dumps_of_two_incidents_in_one_folder_are_said_to_be_mixed(tmp_path):
    """Real Gloo dumps: one host's from one recorded job, the other's from another recorded a day apart (an
    earlier run's files left beside this one's). Matched as one job they still name a culprit; the report says
    the dumps look like two incidents, in its summary and as a warning, with what to do."""
    import shutil

    from .conftest import FIXTURES
    shutil.copytree(FIXTURES / "order_swap" / "node0", tmp_path / "job" / "node0")
    shutil.copytree(FIXTURES / "subgroups_per_host" / "node1", tmp_path / "job" / "node1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = analyze(tmp_path / "job", use_cache=False)
    [mixed] = [f for f in report.findings if f.kind == "mixed_incidents"]
    assert mixed.evidence["older_ranks"] == [4, 5, 6, 7] and mixed.evidence["newer_ranks"] == [0, 1, 2, 3]
    assert mixed.evidence["gap_hours"] > 24
    assert report.summary.endswith("but the dumps look like two incidents mixed: analyze each alone")
    assert mixed.action == "recollect_dumps" and "folder of its own" in mixed.next_step
    # each incident alone: not said
    for case in ("order_swap", "subgroups_per_host"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            alone = analyze(FIXTURES / case, use_cache=False)
        assert not [f for f in alone.findings if f.kind == "mixed_incidents"]
