"""Every recorded fixture through the API and the CLI: the injected culprit is named, healthy is healthy."""

import json
import warnings

import jsonschema
import polars as pl
import pytest
from click.testing import CliRunner

from flightrec import analyze
from flightrec.cli import main

from . import golden
from .conftest import FIXTURES, expected, recorded_cases
from .test_analyze_synth import SCHEMA

ROOT_KINDS = {"not_joined", "missing_dump", "mismatch"}


def _has_root_cause(fault: dict) -> bool:
    # a straggler is a root cause when it made a collective time out (late_rank), else a warning (straggler)
    return fault.get("kind") in ROOT_KINDS or (fault.get("kind") == "straggler" and bool(fault.get("collective_seq_id")))


def _analyze(case):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return analyze(FIXTURES / case)


@pytest.mark.parametrize("case", recorded_cases())
def test_api_names_the_injected_fault(case):
    truth = expected(case)
    fault = truth["fault"] or {}
    report = _analyze(case)
    jsonschema.validate(report.to_dict(), SCHEMA)
    if _has_root_cause(fault):
        assert report.verdict == "fault"
        assert report.culprits["ranks"] == fault["ranks"]
        root = report.root_causes[0]
        assert root.kind == fault["kind"]
        if fault["kind"] != "missing_dump":
            assert root.collective_seq_id == fault["collective_seq_id"]
            assert root.process_group.desc == fault["process_group_desc"]
    else:
        assert report.verdict == "healthy", report.summary
        assert report.culprits == {"ranks": [], "hosts": [], "links": [], "switches": []}


def test_per_host_folders_name_the_host():
    report = _analyze("subgroups_per_host")
    truth = expected("subgroups_per_host")
    assert report.culprits["hosts"] == [h for h, ranks in truth["hosts"].items() if 5 in ranks] == ["node1"]
    # the groups flightrec inferred from the Gloo dumps are the ones the job created
    groups = report.trace.groups
    for name, g in truth["groups"].items():
        row = groups.filter(groups["pg_name"] == name)
        assert (row["pg_desc"][0], row["ranks"][0].to_list()) == (g["desc"], g["ranks"])


@pytest.mark.parametrize("case", ["healthy_json", "skip_collective_json"])
def test_json_fixtures_match_their_pickle_twins(case):
    twin = case.removesuffix("_json")
    assert _analyze(case).culprits == _analyze(twin).culprits


@pytest.mark.parametrize("case", recorded_cases())
def test_cli_json_and_exit_code(case):
    result = CliRunner().invoke(main, ["analyze", str(FIXTURES / case), "--format", "json", "--quiet"])
    data = json.loads(result.stdout)
    assert result.exit_code == {"healthy": 0, "fault": 1, "inconclusive": 1}[data["verdict"]]
    assert data["verdict"] == ("fault" if _has_root_cause(expected(case)["fault"] or {}) else "healthy")


def test_golden_reports_are_current():
    assert golden.main(["--check"]) == 0


def test_gloo_sends_and_receives_are_not_collectives_a_rank_is_missing():
    """Gloo records no entry for a send or receive, yet counts it in pg_status's enqueued counter: in
    straggler_pipeline the default group reads 122 enqueued against its 42 recorded collectives (80 sends and
    receives). Progress is the newest entry, so nobody looks 80 collectives ahead of what the dumps show and the
    timing window still holds the default group's collectives."""
    report = _analyze("straggler_pipeline")
    status = report.trace.pg_status.filter(pl.col("pg_id") == 0)
    assert set(status["last_enqueued"].to_list()) == {122}
    prog = report.matching.progress.filter(pl.col("group") == "0")
    assert set(prog["last_enqueued"].to_list()) == {42} and set(prog["behind"].to_list()) == {0}
    assert report.timing.lateness.filter(pl.col("group") == "0").height > 0
