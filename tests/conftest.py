"""Shared fixtures: paths to the recorded dumps and a factory for synthetic jobs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flightrec.testing import synth

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def recorded_cases() -> list[str]:
    return sorted(p.parent.name for p in FIXTURES.glob("*/expected.json"))


@pytest.fixture(scope="session", autouse=True)
def _session_cache(tmp_path_factory):
    """Module-scoped fixtures analyse too, before any test's own cache is set: never into the user's cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FLIGHTREC_CACHE_DIR", str(tmp_path_factory.mktemp("session_cache")))
        yield


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    """Every test gets its own cache folder so runs never see each other's tables."""
    monkeypatch.setenv("FLIGHTREC_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture
def make_job(tmp_path):
    """make_job(job, **generate_kwargs) -> (dump_dir, ground_truth)."""
    counter = [0]

    def _make(job: synth.Job, **kwargs):
        counter[0] += 1
        out = tmp_path / f"job{counter[0]}"
        truth = synth.generate(job, out, **kwargs)
        return out, truth

    return _make


def expected(case: str) -> dict:
    return json.loads((FIXTURES / case / "expected.json").read_text())
