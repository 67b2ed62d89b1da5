"""The generator itself: replicated healthy steps equal simulated ones; ground truth is consistent."""


import pytest

from flightrec.ingest.safe_read import loads_plain_pickle
from flightrec.testing import synth, synth_sim, synth_writer

from .conftest import FIXTURES

FIELDS = ("record_id", "process_group", "collective_seq_id", "p2p_seq_id", "op_id", "profiling_name",
          "state", "input_sizes", "is_p2p")


def _dumps(tmp_path, job, name):
    synth.generate(job, tmp_path / name)
    return {r: loads_plain_pickle((tmp_path / name / f"nccl_trace_rank_{r}").read_bytes()) for r in range(job.world_size)}


@pytest.mark.parametrize("fault", ["none", "not_joined", "wrong_peer"])
def test_template_prefix_equals_full_simulation(tmp_path, monkeypatch, fault):
    job = synth.Job(tp=2, pp=3, dp=2, steps=12, buffer_size=60,
                    fault=synth.Fault(kind=fault, rank=4, phase="p2p" if fault == "wrong_peer" else "tp"))
    full = _dumps(tmp_path, job, "full")
    monkeypatch.setattr(synth_sim, "_SIMULATE_ALL_BELOW", 0)
    fast = _dumps(tmp_path, job, "fast")
    for r in full:
        a = [{k: e[k] for k in FIELDS} for e in full[r]["entries"]]
        b = [{k: e[k] for k in FIELDS} for e in fast[r]["entries"]]
        assert a == b, f"rank {r}"
        assert full[r]["pg_status"] == fast[r]["pg_status"]


def _sharing(dump: dict) -> dict[str, bool]:
    """Per field: does the pickle share objects between entries (True) or give each entry its own (False)?
    Strings: is every distinct value one object (True)?"""
    entries = [e for e in dump["entries"] if e.get("frames") and e.get("input_sizes")]
    out = {key: len({id(e[key]) for e in entries}) < len(entries)
           for key in ("process_group", "input_sizes", "output_sizes", "input_dtypes", "output_dtypes", "frames")}
    out["input_sizes[0]"] = len({id(e["input_sizes"][0]) for e in entries}) < len(entries)
    for key in ("profiling_name", "state"):
        out[key] = len({id(e[key]) for e in entries}) == len({e[key] for e in entries})
    frames = [f for e in entries for f in e["frames"]]
    out["frames[*]"] = len({id(f) for f in frames}) < len(frames)
    out["frames[*].filename"] = len({id(f["filename"]) for f in frames}) == len({f["filename"] for f in frames})
    return out


def test_objects_are_shared_like_the_writer(tmp_path):
    """The C++ pickler memoizes strings and frame dicts but writes each entry's lists and tuples afresh
    (fixtures/writer_sharing, recorded with torch 2.13): the generated dumps must do the same, or they load
    faster than real ones and the benchmarks flatter the reader."""
    real = loads_plain_pickle((FIXTURES / "writer_sharing" / "nccl_trace_rank_0").read_bytes())
    assert _sharing(real) == {"process_group": False, "input_sizes": False, "output_sizes": False,
                              "input_dtypes": False, "output_dtypes": False, "frames": False,
                              "input_sizes[0]": False, "profiling_name": True, "state": True,
                              "frames[*]": True, "frames[*].filename": True}
    dump = _dumps(tmp_path, synth.Job(tp=2, pp=2, dp=1, steps=6), "j")[0]
    assert _sharing(dump) == _sharing(real)


def test_ring_buffer_keeps_last_k(tmp_path):
    dump = _dumps(tmp_path, synth.Job(tp=2, pp=2, dp=1, steps=10, buffer_size=25), "j")[0]
    ids = [e["record_id"] for e in dump["entries"]]
    assert len(ids) == 25 and ids == list(range(ids[0], ids[0] + 25)) and ids[0] > 0


def test_a_replicated_step_completes_each_collective_at_one_instant(tmp_path, monkeypatch):
    """A collective ends when its last member arrives, on every member at once; the watchdog then finds it
    done at its next poll, up to 100 ms later on each rank. The replicated steps used to end it at each member's
    own arrival + a constant: up to 12 ms apart across pipeline stages, which the clock-offset estimate read
    as skew between hosts that have none."""
    monkeypatch.setattr(synth_sim, "_SIMULATE_ALL_BELOW", 0)
    job = synth.Job(tp=2, pp=3, dp=2, steps=12, buffer_size=60, fault=synth.Fault(kind="not_joined", rank=4))
    sim = synth_sim.Sim(job)
    ends: dict[tuple, set] = {}
    for template in sim.templates.values():
        for step in range(3):
            for rec in synth_writer._prefix_records(job, template, step, step + 1, sim.template_last):
                if not rec["op"].is_p2p:
                    ends.setdefault((step, *rec["op"].keys), set()).add(rec["done"])
    assert len(ends) > 20 and all(len(v) == 1 for v in ends.values())
    # as written: seen by each rank's watchdog within a poll of that instant
    seen: dict[tuple, list] = {}
    for dump in _dumps(tmp_path, job, "fast").values():
        for e in dump["entries"]:
            # (a batch of sends and receives ends with its own partners: not one instant for the pipeline)
            if e["state"] == "completed" and not e["is_p2p"] and not e["profiling_name"].endswith("coalesced"):
                key = (e["process_group"][0], e["collective_seq_id"])
                seen.setdefault(key, []).append(e["time_discovered_completed_ns"])
    assert len(seen) > 50 and all(max(v) - min(v) < synth_writer._WATCHDOG_NS for v in seen.values())
    assert any(len(set(v)) > 1 for v in seen.values())


def test_link_reach_counts_the_groups_a_link_slows_against_their_kind():
    """tp 2 x pp 4 x dp 2, a rank a host: node00008 <-> node00010 joins two pipeline stages (one send/recv group
    of four) and the world; no tp or dp group. tp 2 x dp 8, two ranks a host: node00000 <-> node00003 is in
    both dp groups (no dp peer is left to compare with)."""
    assert synth.link_reach(synth.Job(tp=2, pp=4, dp=2, ranks_per_host=1), ("node00008", "node00010")) == {
        "tp": (0, 8), "p2p": (1, 4), "dp": (0, 8), "default_pg": (1, 1)}
    assert synth.link_reach(synth.Job(tp=2, pp=1, dp=8, ranks_per_host=2), ("node00003", "node00000")) == {
        "tp": (0, 8), "dp": (2, 2), "default_pg": (1, 1)}


def _layout(dump: dict) -> dict:
    """What a writer's dump looks like, values aside: its keys, each entry key's value types, pg_status's."""
    entries = dump["entries"]
    kinds: dict[str, set] = {}
    for e in entries:
        for k, v in e.items():
            kinds.setdefault(k, set()).add(type(v).__name__)
    status = {type(v).__name__ for st in dump["pg_status"].values() for v in st.values()}
    config = {k: type(v).__name__ for cfg in dump["pg_config"].values() for k, v in cfg.items()}
    return {"top": sorted(dump), "entry_types": kinds, "status_types": status, "config_types": config}


def _real(paths) -> dict:
    layouts = [_layout(loads_plain_pickle(p.read_bytes())) for p in paths]
    merged = {"top": layouts[0]["top"], "entry_types": {}, "status_types": set(), "config_types": {}}
    for lay in layouts:
        assert lay["top"] == merged["top"]
        for k, v in lay["entry_types"].items():
            merged["entry_types"].setdefault(k, set()).update(v)
        merged["status_types"] |= lay["status_types"]
        merged["config_types"].update(lay["config_types"])
    return merged


@pytest.mark.parametrize("real, job", [
    # NVIDIA's real GPU dumps: NCCL, recorder 2.9, only unfinished entries, no stacks, NCCL timing off
    ("nvrx/gpu_error_1st", dict(version="2.9", only_active=True, with_stacks=False, timing=False,
                                fault=synth.Fault(kind="not_joined", rank=3, phase="tp"))),
    # torch 2.13's Gloo recorder, with stack traces, on a hang
    ("skip_collective", dict(backend="gloo", version="2.10", fault=synth.Fault(kind="not_joined", rank=3, phase="dp"))),
])
def test_the_generator_writes_what_the_real_writers_write(tmp_path, real, job):
    """The generator models the writer, so its dumps must carry the real writers' keys with the real value
    types (a key ours adds or lacks, an int written as a string, would let the analysis pass on dumps no writer
    writes)."""
    out = tmp_path / "job"
    synth.generate(synth.Job(tp=2, pp=2, dp=2, ranks_per_host=2, **job), out)
    theirs = _real(sorted((FIXTURES / real).glob("*_[0-9]*")))
    ours = _real(sorted(p for p in out.rglob("nccl_trace_rank_*")))
    assert ours["top"] == theirs["top"]
    assert set(ours["entry_types"]) == set(theirs["entry_types"])
    for key, types in theirs["entry_types"].items():
        assert ours["entry_types"][key] <= types | {"NoneType"}, key
    assert ours["status_types"] == theirs["status_types"]
    assert ours["config_types"] == theirs["config_types"]


def test_the_generator_imports_no_analyser_constant():
    """`synth` models the writer; a constant shared with the analyser (the watchdog's poll, once) would make both
    sides share one assumption and hide it from every test."""
    import ast
    from pathlib import Path

    sources = sorted(Path(synth.__file__).parent.glob("synth*.py"))
    assert len(sources) >= 5, sources
    for path in sources:
        tree = ast.parse(path.read_text())
        modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        ours = {m for m in modules if m.startswith("flightrec")}
        assert all(m.startswith("flightrec.testing.synth") for m in ours), (path.name, ours)


