"""The cases of PyTorch's own analyzer tests, as the real writers dump them (fixtures/torch_cases): each reads as
its test expects, or as the writer's shape says it must where PyTorch's analyzer is wrong about it."""

import importlib.util
import json
import warnings

import pytest

from flightrec import analyze

from .conftest import FIXTURES

CASES = FIXTURES / "torch_cases"
NAMES = sorted(p.parent.name for p in CASES.glob("*/expected.json"))


def _expected(name: str) -> dict:
    return json.loads((CASES / name / "expected.json").read_text())


def test_every_case_is_here_and_as_the_script_writes_it(tmp_path):
    spec = importlib.util.spec_from_file_location("make_cases", CASES / "make_cases.py")
    make_cases = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_cases)
    make_cases.write(tmp_path)
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    kept = sorted(p.relative_to(CASES) for p in CASES.rglob("*")
                  if p.is_file() and p.parent != CASES and not p.name.startswith("report."))   # (goldens)
    assert written == kept
    for path in written:
        assert (tmp_path / path).read_bytes() == (CASES / path).read_bytes(), path
    assert len(NAMES) >= 25


@pytest.mark.parametrize("name", NAMES)
def test_case_reads_as_expected(name):
    want = _expected(name)["expect"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = analyze(CASES / name, use_cache=False)
    assert report.verdict == want["verdict"], report.summary
    if want["verdict"] == "healthy":
        assert report.culprits["ranks"] == []
        return
    first = report.root_causes[0]
    assert first.kind == want["kind"], first.message
    assert first.ranks == want["ranks"], first.message
    assert bool(first.evidence.get("ambiguous")) == want.get("ambiguous", False), first.message
    if "text" in want:
        assert want["text"] in first.message


def test_writers_are_told_apart():
    from flightrec import load

    def writers(name):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return set(load(CASES / name).dumps["writer"].to_list())

    assert writers("type_mismatch") == {"pytorch"}
    assert writers("hook_list_shapes") == {"c10d_hook"}
    assert writers("recv_from_any_source") == {"c10d_hook"}
    assert writers("torchcomms_pipeline") == {"torchcomms"}


def test_a_new_dialects_broken_forms_get_a_line_each_and_the_rest_is_analysed(tmp_path):
    """A torchcomms dump cut short and one whose profiling names carry a backend no writer we know writes: one
    warning each naming its file; rank 3, which never joined, is still named."""
    import pickle
    import shutil

    from flightrec.ingest.safe_read import loads_plain_pickle

    job = tmp_path / "job"
    shutil.copytree(CASES / "torchcomms_not_joined", job)
    cut = job / "comm_lib_trace_rank_1"
    cut.write_bytes(cut.read_bytes()[: int(cut.stat().st_size * 0.6)])
    odd = job / "comm_lib_trace_rank_2"
    dump = loads_plain_pickle(odd.read_bytes())
    for e in dump["entries"]:
        e["profiling_name"] = e["profiling_name"].replace("ncclx:", "weird:")
    odd.write_bytes(pickle.dumps(dump, protocol=2))
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        report = analyze(job, use_cache=False)
    assert report.culprits["ranks"] == [3], report.summary
    problems = {f.evidence["path"]: f.message for f in report.findings if f.kind == "dump_problem"}
    assert "weird" in problems["comm_lib_trace_rank_2"]
    assert [r["path"] for r in report.to_dict()["dumps"]["refused"]] == ["comm_lib_trace_rank_1"]
