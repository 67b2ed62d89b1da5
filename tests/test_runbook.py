"""The runbook in README.md and docs/runbook.md, run end to end as an on-call script would: a hardware fault
drains its host, a mismatch drains nothing and says it is a bug, an unreadable dump asks for the dumps again,
a healthy job does nothing. `drain_host` is a stand-in that records what it was asked to drain."""

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from flightrec.testing import runahead_scenarios

from .conftest import FIXTURES

ROOT = Path(__file__).resolve().parent.parent


def _snippet(path: Path) -> str:
    text = path.read_text()
    found = re.findall(r"```bash\n(flightrec analyze \"\$DUMPS\".*?)```", text, re.DOTALL)
    assert len(found) == 1, f"{path}: one runbook snippet expected"
    return found[0]


SNIPPET = _snippet(ROOT / "docs" / "runbook.md")

# `flightrec` as the snippet calls it, with a way to make one dump unreadable (as for a user without the
# permission: the suite may run as root, whom permissions don't stop)
_FLIGHTREC = """#!{python}
import os, sys
deny = os.environ.get("FLIGHTREC_TEST_DENY")
if deny:
    real = os.open
    def denied(path, *args, **kwargs):
        if str(path).endswith(deny):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, *args, **kwargs)
    os.open = denied
from flightrec.cli import entry
sys.argv[0] = "flightrec"
entry()
"""

# `jq`, where the machine has none: the two forms the snippet uses
_JQ = """#!{python}
import json, sys
path = sys.argv[-2].lstrip(".")
value = json.load(open(sys.argv[-1]))
many = path.endswith("[]")
for key in path.removesuffix("[]").split("."):
    value = value[key]
for v in (value if many else [value]):
    print(v)
"""


def _tool(bin_dir: Path, name: str, text: str) -> None:
    path = bin_dir / name
    path.write_text(text.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def run_runbook(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _tool(bin_dir, "flightrec", _FLIGHTREC)
    (bin_dir / "drain_host").write_text(f'#!/bin/sh\necho "$1" >> {tmp_path / "drained"}\n')
    (bin_dir / "drain_host").chmod(0o755)
    if shutil.which("jq") is None:
        _tool(bin_dir, "jq", _JQ)

    def run(dumps: Path, deny: str | None = None) -> tuple[str, list[str]]:
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "DUMPS": str(dumps),
               "FLIGHTREC_CACHE_DIR": str(tmp_path / "cache")}
        if deny:
            env["FLIGHTREC_TEST_DENY"] = deny
        done = subprocess.run(["bash", "-c", SNIPPET], cwd=tmp_path, env=env, capture_output=True, text=True, check=False,
                              timeout=300)
        assert done.returncode == 0, done.stderr
        drained = tmp_path / "drained"
        return done.stdout, drained.read_text().split() if drained.exists() else []
    return run


def test_readme_and_docs_runbook_are_the_same_script():
    assert _snippet(ROOT / "README.md") == SNIPPET


def test_a_gpu_that_stopped_drains_its_host(run_runbook, tmp_path):
    scenario = next(s for s in runahead_scenarios.scenarios() if s.name == "moe_gpu_freeze_timing")
    runahead_scenarios.write_scenario(scenario, tmp_path / "job")
    out, drained = run_runbook(tmp_path / "job")
    assert drained == scenario.expect["hosts"] == ["node1"]
    assert out.startswith("drain host node1")


def test_a_mismatch_drains_nothing_and_says_it_is_a_bug(run_runbook):
    out, drained = run_runbook(FIXTURES / "dtype_mismatch")
    assert drained == []
    assert "ran other code" in out and "drain nothing" in out


def test_an_unreadable_dump_asks_for_the_dumps_again_and_drains_nothing(run_runbook, tmp_path):
    shutil.copytree(FIXTURES / "skip_collective", tmp_path / "job")
    out, drained = run_runbook(tmp_path / "job", deny="nccl_trace_rank_2")
    assert drained == []
    assert out.startswith("collect the dumps again")


def test_a_healthy_job_does_nothing(run_runbook):
    out, drained = run_runbook(FIXTURES / "healthy")
    assert (out, drained) == ("healthy\n", [])
