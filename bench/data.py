"""Synthetic benchmark jobs, generated once and cached under bench/.data/."""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path

from flightrec.testing import synth

DATA = Path(__file__).resolve().parent / ".data"


def job_for(ranks: int, entries: int) -> synth.Job:
    """A 3D-parallel job (tp 8, pp 4, dp = ranks / 32) whose buffers hold `entries` entries, with one rank
    that never joins a tensor-parallel all_gather in the last step (the usual hang)."""
    tp, pp = (8, 4) if ranks >= 32 else (2, 2)
    dp = ranks // (tp * pp)
    assert tp * pp * dp == ranks, f"{ranks} ranks is not a multiple of {tp * pp}"
    per_step = 20  # the sparsest stage records ~20 entries a step with 2 microbatches, 1 layer
    steps = math.ceil(entries / per_step) + 2
    return synth.Job(tp=tp, pp=pp, dp=dp, steps=steps, buffer_size=entries, ranks_per_host=8,
                     fault=synth.Fault(kind="not_joined", rank=ranks // 2 + 5, phase="tp"))


def job_dir(ranks: int, entries: int, suffix: str = "") -> Path:
    """Where this size's job is cached: by the generator's layout version, so old bytes are never reused."""
    return DATA / f"r{ranks}_e{entries}_v{synth.DUMP_LAYOUT}{suffix}"


def dataset(ranks: int, entries: int, log=print) -> tuple[Path, dict]:
    """The dump directory for this size (generated if absent) and its ground truth."""
    out = job_dir(ranks, entries)
    done = synth.truth_path(out)
    if done.exists():
        return out, json.loads(done.read_text())
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    log(f"generating {ranks:,} ranks x {entries:,} entries into {out} ...")
    truth = synth.generate(job_for(ranks, entries), out)
    log(f"  done in {time.perf_counter() - t:.0f} s")
    return out, truth
