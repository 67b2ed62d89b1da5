"""The generator itself: replicated healthy steps equal simulated ones; ground truth is consistent."""

import pickle

import pytest

from flightrec import synth

FIELDS = ("record_id", "process_group", "collective_seq_id", "p2p_seq_id", "op_id", "profiling_name",
          "state", "input_sizes", "is_p2p")


def _dumps(tmp_path, job, name):
    synth.generate(job, tmp_path / name)
    return {r: pickle.loads((tmp_path / name / f"nccl_trace_rank_{r}").read_bytes()) for r in range(job.world_size)}


@pytest.mark.parametrize("fault", ["none", "not_joined", "wrong_peer"])
def test_template_prefix_equals_full_simulation(tmp_path, monkeypatch, fault):
    job = synth.Job(tp=2, pp=3, dp=2, steps=12, buffer_size=60,
                    fault=synth.Fault(kind=fault, rank=4, phase="p2p" if fault == "wrong_peer" else "tp"))
    full = _dumps(tmp_path, job, "full")
    monkeypatch.setattr(synth, "_SIMULATE_ALL_BELOW", 0)
    fast = _dumps(tmp_path, job, "fast")
    for r in full:
        a = [{k: e[k] for k in FIELDS} for e in full[r]["entries"]]
        b = [{k: e[k] for k in FIELDS} for e in fast[r]["entries"]]
        assert a == b, f"rank {r}"
        assert full[r]["pg_status"] == fast[r]["pg_status"]


def test_frames_are_shared_objects_like_the_writer(tmp_path):
    dump = _dumps(tmp_path, synth.Job(tp=2, pp=1, dp=1, steps=3), "j")[0]
    by_content: dict[str, set[int]] = {}
    for e in dump["entries"]:
        by_content.setdefault(repr(e["frames"]), set()).add(id(e["frames"]))
    assert all(len(ids) == 1 for ids in by_content.values())
    assert len(by_content) < len(dump["entries"])


def test_ring_buffer_keeps_last_k(tmp_path):
    dump = _dumps(tmp_path, synth.Job(tp=2, pp=2, dp=1, steps=10, buffer_size=25), "j")[0]
    ids = [e["record_id"] for e in dump["entries"]]
    assert len(ids) == 25 and ids == list(range(ids[0], ids[0] + 25)) and ids[0] > 0
