"""Fuzzing over mutated dumps: nothing escapes the API but FlightrecError, the CLI never prints a traceback
and exits 0, 1 or 2. CI runs a bounded budget; set FLIGHTREC_FUZZ_EXAMPLES for a longer campaign."""

import atexit
import math
import os
import pickle
import shutil
import tempfile
import warnings
from pathlib import Path

from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightrec import FlightrecError, LoadOptions
from flightrec.api import AnalyzeOptions, analyze
from flightrec.cli import main
from flightrec.testing import synth

EXAMPLES = int(os.environ.get("FLIGHTREC_FUZZ_EXAMPLES", "30"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES <= 30,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

_BASE = Path(tempfile.mkdtemp(prefix="flightrec-fuzz-")) / "job"
atexit.register(shutil.rmtree, _BASE.parent, ignore_errors=True)   # (made at import: no fixture removes it)
synth.generate(synth.Job(tp=2, pp=2, dp=1, steps=2, fault=synth.Fault(kind="not_joined", rank=1)), _BASE)
_RANKS = sorted(int(p.name.rsplit("_", 1)[1]) for p in _BASE.iterdir())

WEIRD = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                  st.text(max_size=5), st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=2),
                  st.integers(), max_size=2), st.just(math.inf))


@st.composite
def mutations(draw):
    rank = draw(st.sampled_from(_RANKS))
    kind = draw(st.sampled_from(["flip", "truncate", "delete_key", "swap_type", "top_level"]))
    return rank, kind, draw(st.data())


def _mutate(path: Path, kind: str, data) -> None:
    raw = path.read_bytes()
    if kind == "flip":
        buf = bytearray(raw)
        for _ in range(data.draw(st.integers(1, 8))):
            i = data.draw(st.integers(0, len(buf) - 1))
            buf[i] ^= 1 << data.draw(st.integers(0, 7))
        path.write_bytes(bytes(buf))
    elif kind == "truncate":
        path.write_bytes(raw[: data.draw(st.integers(0, len(raw) - 1))])
    else:
        dump = pickle.loads(raw)  # our own generated file
        entries = dump["entries"]
        if kind == "top_level":
            key = data.draw(st.sampled_from(["entries", "pg_config", "pg_status", "version"]))
            dump[key] = data.draw(WEIRD)
        else:
            e = entries[data.draw(st.integers(0, len(entries) - 1))]
            key = data.draw(st.sampled_from(sorted(e)))
            if kind == "delete_key":
                del e[key]
            else:
                e[key] = data.draw(WEIRD)
        path.write_bytes(pickle.dumps(dump))


@SETTINGS
@given(mutations())
def test_mutated_dumps_never_crash(tmp_path_factory, mutation):
    rank, kind, data = mutation
    work = tmp_path_factory.mktemp("fuzz") / "job"
    shutil.copytree(_BASE, work)
    _mutate(work / f"nccl_trace_rank_{rank}", kind, data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            report = analyze(work, AnalyzeOptions(load=LoadOptions(use_cache=False, workers=1)))
            assert report.verdict in ("fault", "healthy", "inconclusive")
            report.to_text(), report.to_markdown(), report.to_dict()
        except FlightrecError:
            pass
    result = CliRunner().invoke(main, ["analyze", str(work), "--format", "json", "--no-cache", "--workers", "1"])
    assert result.exit_code in (0, 1, 2), result.stderr
    assert "Traceback" not in result.stderr + result.stdout
