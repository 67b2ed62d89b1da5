"""Collection problems are not faults: a dump there but unreadable, a folder that can't be listed, a file that is
no dump, several jobs in one folder. The suite may run as root, whom file permissions don't stop: the OS errors
are simulated where flightrec meets them (`os.open`, `os.scandir`)."""

import json
import os
import pickle
import shutil
import warnings
from unittest import mock

import pytest
from click.testing import CliRunner

from flightrec import analyze
from flightrec.cli import main
from flightrec.errors import MultipleJobsError
from flightrec.testing import synth

from .conftest import FIXTURES


def _denied(match: str, call: str):
    """`os.<call>` raising PermissionError for paths ending in `match`, as for a user who can't read them."""
    real = getattr(os, call)

    def fake(path, *args, **kwargs):
        if str(path).endswith(match):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, *args, **kwargs)
    return mock.patch(f"os.{call}", fake)


def _analyze(path, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return analyze(path, use_cache=False, **kwargs)


def test_a_culprits_dump_this_user_cant_read_names_no_culprit_and_asks_to_collect_it_again():
    """skip_collective: rank 2 never joined, and its dump is unreadable: the analysis rests on a dump it could not
    read. Not 'rank 2 left no dump' (the runbook would act on that): collect it again."""
    with _denied("nccl_trace_rank_2", "open"):
        report = _analyze(FIXTURES / "skip_collective")
    assert report.verdict == "inconclusive", report.summary
    assert report.exit_code == 3 and not any(report.culprits.values()), report.culprits
    first = report.findings[0]
    assert first.kind == "unreadable" and "Permission denied" in first.message
    assert first.action == "recollect_dumps" and report.next_step.startswith("collect the dumps again")
    assert "left no dump" not in report.to_text()
    assert report.to_dict()["dumps"]["unreadable"] == [{"path": "nccl_trace_rank_2", "reason": "could not be read "
                                                        "(Permission denied)", "rank": 2}]
    assert report.to_dict()["dumps"]["refused"] == []


def test_an_unreadable_dump_beside_the_culprit_is_a_warning():
    with _denied("nccl_trace_rank_1", "open"):
        report = _analyze(FIXTURES / "skip_collective")
    assert report.verdict == "fault" and report.culprits["ranks"] == [2], report.summary
    assert [f.role for f in report.findings if f.kind == "unreadable"] == ["warning"]


def test_a_host_folder_that_cant_be_listed_is_not_a_host_down(tmp_path):
    """subgroups_per_host with node1/ not listable: not 'host node1 is down'."""
    shutil.copytree(FIXTURES / "subgroups_per_host", tmp_path / "job")
    with _denied("node1", "scandir"):
        report = _analyze(tmp_path / "job")
    assert report.verdict == "inconclusive", report.summary
    assert report.culprits["hosts"] == [] and report.culprits["ranks"] == []
    assert report.findings[0].kind == "unreadable" and "node1" in report.findings[0].message
    assert report.to_dict()["dumps"]["unreadable"] == [{"path": "node1", "reason": "Permission denied", "rank": None}]


def test_an_io_error_mid_read_is_unreadable(tmp_path):
    shutil.copytree(FIXTURES / "skip_collective", tmp_path / "job")
    real = os.read

    def failing(fd, n):
        if os.readlink(f"/proc/self/fd/{fd}").endswith("nccl_trace_rank_2"):
            raise OSError(5, "Input/output error")
        return real(fd, n)
    with mock.patch("os.read", failing), mock.patch("os.readv", side_effect=OSError(5, "Input/output error")):
        report = _analyze(tmp_path / "job", reader="unpickler")
    assert report.verdict == "inconclusive" and report.findings[0].kind == "unreadable", report.summary
    assert "Input/output error" in report.findings[0].message


def test_an_unreadable_file_is_read_again_once_it_can_be(tmp_path):
    """(no cache of a run that could not read a file: fixing its permissions changes no size or time)"""
    shutil.copytree(FIXTURES / "skip_collective", tmp_path / "job")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with _denied("nccl_trace_rank_2", "open"):
            first = analyze(tmp_path / "job")
        second = analyze(tmp_path / "job")
    assert first.verdict == "inconclusive" and second.culprits["ranks"] == [2]


def test_a_pickle_that_is_no_dump_is_refused_and_its_rank_is_missing(tmp_path):
    shutil.copytree(FIXTURES / "skip_collective", tmp_path / "job")
    (tmp_path / "job" / "nccl_trace_rank_1").write_bytes(pickle.dumps([1, 2, 3]))
    report = _analyze(tmp_path / "job")
    refused = report.to_dict()["dumps"]["refused"]
    assert refused and "not a flight-recorder dump: a list of 3 ints" in refused[0]["reason"]
    assert 1 in report.trace.missing_ranks
    assert report.culprits["ranks"] == [2], report.summary   # (still the rank that never joined)
    assert not [f for f in report.findings if f.kind == "not_joined" and 1 in f.ranks]


def test_several_jobs_in_one_folder_exit_2_listing_them():
    result = CliRunner().invoke(main, ["analyze", str(FIXTURES), "-q"])
    assert result.exit_code == 2, result.output
    assert "jobs" in result.output and "dead_rank: ranks 0-2 (3 dumps)" in result.output
    assert "flightrec analyze" in result.output and "Traceback" not in result.output


def test_dumps_of_jobs_of_different_sizes_side_by_side_are_refused(tmp_path):
    small, big = tmp_path / "small", tmp_path / "big"
    synth.generate(synth.Job(tp=2, pp=1, dp=2), small)
    synth.generate(synth.Job(tp=2, pp=2, dp=2), big)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for r in (0, 1):
        shutil.copy(small / f"nccl_trace_rank_{r}", mixed)
    for r in range(2, 8):
        shutil.copy(big / f"nccl_trace_rank_{r}", mixed)
    with pytest.raises(MultipleJobsError, match="declare a world of 4 ranks"):
        _analyze(mixed)


def test_the_json_report_names_the_unreadable_folder(tmp_path):
    shutil.copytree(FIXTURES / "subgroups_per_host", tmp_path / "job")
    with _denied("node1", "scandir"):
        result = CliRunner().invoke(main, ["analyze", str(tmp_path / "job"), "-f", "json", "-q"])
    report = json.loads(result.stdout)
    assert report["verdict"] == "inconclusive" and report["dumps"]["unreadable"][0]["path"] == "node1"


def test_an_empty_host_folder_beside_the_others_is_that_host_gone(tmp_path):
    """host_down (node1's four ranks exited and wrote nothing): its folder there but empty reads as that host
    gone, whose dumps to collect, and nothing is drained on it; with the job's size, its ranks are named."""
    shutil.copytree(FIXTURES / "host_down", tmp_path / "job")
    (tmp_path / "job" / "node1").mkdir()
    (tmp_path / "job" / "logs7").mkdir()      # (not named like the host folders: no host)
    (tmp_path / "job" / "node2" / "sub").mkdir(parents=True)
    shutil.copy(FIXTURES / "host_down" / "expected.json", tmp_path / "job" / "node2" / "sub")
    report = _analyze(tmp_path / "job")
    assert report.verdict == "inconclusive" and report.exit_code == 3, report.summary
    gone = [f for f in report.findings if f.evidence.get("empty_host_folders")]
    assert [f.hosts for f in gone] == [["node1", "node2"]] and gone[0].action == "recollect_dumps"
    assert report.to_dict()["dumps"]["empty_host_folders"] == ["node1", "node2"]
    assert not report.culprits["hosts_to_drain"]
    sized = _analyze(tmp_path / "job", world_size=8)
    assert sized.trace.missing_ranks == [4, 5, 6, 7] and "node1" in sized.summary


def test_a_folder_of_a_job_on_one_host_has_no_empty_host(tmp_path):
    shutil.copytree(FIXTURES / "subgroups_per_host", tmp_path / "job")
    (tmp_path / "job" / "plots").mkdir()
    report = _analyze(tmp_path / "job")
    assert report.dumps.empty_host_folders == [] and report.verdict == "fault"
