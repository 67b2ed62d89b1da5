"""Synthetic NCCL-format flight-recorder dumps for a 3D-parallel job, with injected faults and ground truth.

The job: `tp x pp x dp` ranks (tensor parallel innermost, so a TP group sits on one host), a GPipe schedule of
`microbatches` per step (`synth_schedule`), simulated rank by rank (`synth_sim`) and written as the recorder
writes (`synth_writer`).

Used by the tests (any layout, any fault, known answer) and by the benchmarks (16K+ ranks)."""

from __future__ import annotations

import gzip
import json
import os
import pickle
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

from flightrec.testing.synth_job import FAULT_KINDS, Fault, Job
from flightrec.testing.synth_schedule import process_groups, schedule
from flightrec.testing.synth_sim import Sim
from flightrec.testing.synth_writer import build_dump, dump_moment, rank_entries, to_json_dump, writer_layout

__all__ = ["DUMP_LAYOUT", "FAULT_KINDS", "Fault", "Job", "build_dump", "dump_moment", "generate", "generate_slices",
           "link_reach", "to_json_dump", "truth_path"]

# Bump when the bytes generated for a job change: the benchmarks cache generated jobs under this version.
DUMP_LAYOUT = 6


def link_reach(job: Job, hosts: tuple[str, str]) -> dict[str, tuple[int, int]]:
    """Per kind of group (its desc, or 'p2p' for pipeline sends and receives): how many of its groups have an
    op whose partners span both `hosts` (a slow or dead link between them slows or stops those), of how many.
    A link that reaches every group of each kind it reaches has no peer group to be compared with."""
    groups, by_rank = process_groups(job)
    reach: dict[str, set] = defaultdict(set)
    total: dict[str, set] = defaultdict(set)
    for rank in range(job.world_size):
        for op in schedule(job, rank, by_rank):
            kind = "p2p" if op.is_p2p else op.group.desc
            total[kind].add(op.group.name)
            if set(hosts) <= {job.host_of(m) for m in Sim._partners(op)}:
                reach[kind].add(op.group.name)
    return {kind: (len(reach[kind]), len(names)) for kind, names in total.items()}


def truth_path(out_dir: str | Path) -> Path:
    """Where `generate` writes the ground truth: beside the dump folder, not in it."""
    out = Path(out_dir)
    return out.with_name(out.name + ".truth.json")


def generate(job: Job, out_dir: str | Path, *, fmt: str = "pickle", per_host_folders: bool = False,
             prefix: str = "nccl_trace_rank_", compress: bool = False) -> dict:
    """Write one dump per surviving rank under `out_dir`; return the ground truth.

    Returns:
        {"kind", "ranks", "hosts", "links", "op", "pg_desc", "collective_seq_id", "missing_ranks", ...}
    """
    writer = _Writer(job, fmt=fmt, per_host_folders=per_host_folders, prefix=prefix, compress=compress)
    writer.write(range(job.world_size), Path(out_dir))
    return writer.finish(Path(out_dir))


def generate_slices(job: Job, out_dir: str | Path, ranks_per_slice: int, **kwargs) -> Iterator[tuple[Path, range]]:
    """Like `generate`, one slice of ranks at a time: each slice is written to `out_dir/slice-NNNNN` and yielded
    (folder, ranks) before the next is written, so the caller can convert it and delete it. For jobs whose
    dumps don't fit on disk at once (131,072 ranks carry a ~1 MB world rank list each). The ground truth is
    written next to `out_dir` at the end, as by `generate`. Keyword arguments are those of `generate`."""
    writer = _Writer(job, **kwargs)
    out = Path(out_dir)
    for k, first in enumerate(range(0, job.world_size, ranks_per_slice)):
        ranks = range(first, min(first + ranks_per_slice, job.world_size))
        folder = out / f"slice-{k:05d}"
        writer.write(ranks, folder)
        yield folder, ranks
    writer.finish(out)


class _Writer:
    """Simulates the job once, then writes any ranks' dumps on request, each file's time the dump's."""

    def __init__(self, job: Job, *, fmt: str = "pickle", per_host_folders: bool = False,
                 prefix: str = "nccl_trace_rank_", compress: bool = False):
        self.job, self.fmt, self.per_host_folders = job, fmt, per_host_folders
        self.prefix, self.compress = prefix, compress
        self.sim = Sim(job)
        self.records = self.sim.run()
        self.dump_ns = dump_moment(self.records)

    def write(self, ranks: range, out: Path) -> None:
        job, sim = self.job, self.sim
        out.mkdir(parents=True, exist_ok=True)
        for rank in ranks:
            if rank in sim.missing:
                continue
            entries = rank_entries(job, rank, self.records[rank], sim.by_rank, sim.template_of(rank), sim.sim_from,
                               sim.template_last, self.dump_ns)
            dump = build_dump(job, rank, entries, sim.by_rank)
            folder = out / job.host_of(rank) if self.per_host_folders else out
            folder.mkdir(parents=True, exist_ok=True)
            if self.fmt == "json":
                data = to_json_dump(dump).encode()
            else:   # only the pickle has a layout to match (JSON copies every value)
                data = pickle.dumps(dump | {"entries": [writer_layout(e) for e in dump["entries"]]}, protocol=2)
            if self.compress:
                data = gzip.compress(data, compresslevel=1)
            path = folder / f"{self.prefix}{rank}"
            path.write_bytes(data)
            # (the file's time is the dump's, on its host's clock, as a dump read where it was written has it)
            skew = int(job.fault.offset_ms * 1e6) if (job.fault.kind == "clock_offset"
                                                      and job.host_of(rank) in job.fault.hosts) else 0
            os.utime(path, ns=(self.dump_ns + skew, self.dump_ns + skew))

    def finish(self, out: Path) -> dict:
        job, sim = self.job, self.sim
        truth = dict(sim.truth)
        truth["missing_ranks"] = sorted(sim.missing)
        if truth["ranks"] and not truth["hosts"] and job.fault.kind not in ("dead_link",):
            truth["hosts"] = sorted({job.host_of(r) for r in truth["ranks"]})
        truth["world_size"] = job.world_size
        out.mkdir(parents=True, exist_ok=True)
        truth_path(out).write_text(json.dumps(truth, indent=1, sort_keys=True))
        return truth
