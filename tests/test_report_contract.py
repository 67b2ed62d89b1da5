"""The JSON report's contract: docs/report.schema.json is generated from the code's vocabulary and is current;
every committed golden report satisfies it; a finding outside the vocabulary fails where it is made."""

import json
from pathlib import Path

import jsonschema
import pytest

from flightrec.model.vocab import Action, FindingKind
from flightrec.report.json_schema import render, report_schema
from flightrec.report.model import Finding

ROOT = Path(__file__).resolve().parent.parent
GOLDENS = sorted(ROOT.glob("fixtures/**/report.json"))


def test_the_schema_file_is_generated_from_the_code():
    committed = (ROOT / "docs" / "report.schema.json").read_text()
    assert committed == render(), "run: python -m flightrec.report.json_schema > docs/report.schema.json"


def test_the_schema_is_a_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(report_schema())


@pytest.mark.parametrize("golden", GOLDENS, ids=lambda p: str(p.parent.relative_to(ROOT / "fixtures")))
def test_every_golden_report_satisfies_the_schema(golden):
    jsonschema.validate(json.loads(golden.read_text()), report_schema())


def test_goldens_cover_the_fixtures():
    assert len(GOLDENS) >= 40


def test_every_kind_and_action_in_the_schema_is_documented():
    findings_md = (ROOT / "docs" / "findings.md").read_text()
    runbook_md = (ROOT / "docs" / "runbook.md").read_text()
    assert [k for k in FindingKind if f"`{k}`" not in findings_md] == []
    assert [a for a in Action if a != Action.NONE and f"`{a}`" not in runbook_md] == []


def test_a_kind_outside_the_vocabulary_fails_where_the_finding_is_made():
    with pytest.raises(ValueError):
        Finding(kind="gpu_melted", role="root_cause", message="x")
    with pytest.raises(ValueError):
        Finding(kind="mismatch", role="culprit", message="x")
