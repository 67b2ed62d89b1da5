"""The recorder's dump of each rank of a simulated job, in the exact shape PyTorch's writer emits (each
recorder version's keys, NCCL or Gloo, pickle or JSON), with its ring buffer's limit."""

from __future__ import annotations

import json
import random
import sys
from collections import defaultdict

from flightrec.testing.synth_job import Job
from flightrec.testing.synth_schedule import OP_NS, T0, Group, Op, pieces_per_step, step_length_ns
from flightrec.testing.synth_stacks import STACKS as _STACKS

# PyTorch's watchdog polls every kWatchdogThreadSleepMillis (100 ms in ProcessGroupNCCL): the writer's own
# constant, stated here, not the analyser's (the generator models the writer, not our reading of it).
_WATCHDOG_NS = 100_000_000


_TIMEOUT_MS = 600_000   # the default process-group timeout every synthetic entry records


_DUMP_AFTER_END_NS = 1_000_000_000   # a job that ran to its end dumps a moment after (`finally`)


def _prefix_records(job: Job, template: list[Op], first: int, stop: int, last: dict[tuple, int]) -> list[dict]:
    """Healthy steps [first, stop) replicated from the template: everything completes, on a regular clock.
    `last`: per step-0 instance key, the latest member's index in its template (`Sim.template_last`)."""
    step_ns = step_length_ns(job)
    out = []
    for step in range(first, stop):
        t = T0 + step * step_ns
        for i, op in enumerate(template):
            created = t + i * OP_NS
            begin = t + max(last.get(k, i) for k in op.keys) * OP_NS
            out.append({"op": op, "created": created, "started": created + 100_000,
                        "done": begin + 100_000 + 1_000_000 * (2 + len(op.group.ranks).bit_length())})
    return out


def rank_entries(job: Job, rank: int, records: list[dict], by_rank: dict[int, dict[str, Group]],
                 template: list[Op] | None = None, sim_from: int = 0, last: dict[tuple, int] | None = None,
                 dump_ns: int | None = None) -> list[dict]:
    """The recorder's entries for one rank, oldest first, as far back as the ring buffer keeps them. An op in
    flight that began on the GPU (timing on) is found started by the dump itself, at `dump_ns` (`dump_moment`).

    `records` are the simulated ops from step `sim_from` on; earlier steps come from `template`, and only as
    many of them as the buffer can still hold, with every counter advanced past the steps left out.
    """
    recorder = _Recorder(job, rank, by_rank)
    if template is not None and sim_from > 0:
        per_step = pieces_per_step(template)
        keep_from = max(0, sim_from - (job.buffer_size // max(per_step, 1)) - 1)
        for op in template:
            counter = recorder.p2p_seq if op.is_p2p else recorder.coll_seq
            counter[op.group.name] += keep_from
            recorder.op_ids[op.group.name] += keep_from * (len(op.parts) + 1 if op.is_p2p else 1)
        recorder.record_id = per_step * keep_from
        records = _prefix_records(job, template, keep_from, sim_from, last or {}) + records
    return [e for rec in records for e in recorder.entries_of(rec, dump_ns)]


class _Recorder:
    """One rank's flight recorder: its counters, its groups' local ids and watchdog phases, and the fields an
    op's entries share."""

    def __init__(self, job: Job, rank: int, by_rank: dict[int, dict[str, Group]]):
        self.job, self.rank = job, rank
        self.pg_ids = {g.name: i for i, g in enumerate(by_rank[rank].values())}
        self.coll_seq: dict[str, int] = defaultdict(int)
        self.p2p_seq: dict[str, int] = defaultdict(int)
        self.op_ids: dict[str, int] = defaultdict(int)
        self.record_id = 0
        # innermost frame first, as the recorder writes them; the frame dicts are shared between entries, as the
        # writer shares them (each entry gets its own list of them when pickled: `writer_layout`)
        self.frames = {name: [{"name": n, "filename": f, "line": ln} for n, f, ln in reversed(stack)]
                       for name, stack in _STACKS.items()}
        skewed = job.fault.kind == "clock_offset" and job.host_of(rank) in job.fault.hosts
        self.offset = int(job.fault.offset_ms * 1e6) if skewed else 0
        self.threads = _version_minor(job.version) >= 9
        self.static: dict[int, dict] = {}
        # The watchdog thread, not the GPU, stamps "discovered" times: it polls every kWatchdogThreadSleepMillis
        # (100 ms), so a start or completion is seen up to 100 ms late, at the polling phase of the group's
        # watchdog on this rank (one thread per process group).
        self.phases: dict[str, int] = {}

    def discovered(self, t: int, g: Group) -> int:
        if g.name not in self.phases:
            self.phases[g.name] = random.Random(f"{self.job.seed}/{self.rank}/{g.name}").randrange(_WATCHDOG_NS)
        return t + (self.phases[g.name] - t) % _WATCHDOG_NS + self.offset

    def fixed(self, piece: Op, g: Group, is_p2p: bool) -> dict:
        key = id(piece)
        if key not in self.static:
            e = {
                "pg_id": self.pg_ids[g.name], "process_group": (g.name, g.desc),
                "profiling_name": f"nccl:{piece.name}",
                "input_sizes": piece.in_sizes, "input_dtypes": [piece.dtype] * len(piece.in_sizes),
                "output_sizes": piece.out_sizes, "output_dtypes": [piece.dtype] * len(piece.out_sizes),
                "timeout_ms": _TIMEOUT_MS, "is_p2p": is_p2p,
            }
            if self.job.with_stacks:
                e["frames"] = self.frames[piece.stack]
            if self.threads:
                e["thread_id"] = str(140000000000000 + self.rank)
                e["thread_name"] = "pt_main_thread"
            self.static[key] = e
        return self.static[key]

    def entries_of(self, rec: dict, dump_ns: int | None) -> list[dict]:
        """The entries one simulated op leaves: a collective's one, a send/recv batch's members and closer."""
        job, offset = self.job, self.offset
        op: Op = rec["op"]
        g = op.group
        done = rec["done"] is not None
        pieces = op.parts + [op] if op.is_p2p else [op]
        if op.is_p2p:
            self.p2p_seq[g.name] += 1
        else:
            self.coll_seq[g.name] += 1
        out = []
        for piece in pieces:
            self.op_ids[g.name] += 1
            closer_or_coll = piece is op
            if closer_or_coll and done:
                state = "completed"
            elif closer_or_coll:
                state = "started" if job.timing else "scheduled"
            else:
                state = "scheduled"  # batch members stay 'scheduled' forever; the closer carries the state
            e = dict(self.fixed(piece, g, op.is_p2p and not closer_or_coll))
            e.update({
                "record_id": self.record_id,
                "collective_seq_id": self.coll_seq[g.name],
                "p2p_seq_id": self.p2p_seq[g.name] if op.is_p2p else 0,
                "op_id": self.op_ids[g.name],
                "time_created_ns": rec["created"] + offset,
                "state": state,
                "time_discovered_started_ns": (self.discovered(rec.get("started", rec["created"]), g) if done
                                               else (dump_ns if dump_ns is not None else rec["created"]) + offset)
                if job.timing and closer_or_coll else None,
                "time_discovered_completed_ns": self.discovered(rec["done"], g) if done and closer_or_coll else None,
                "retired": done and closer_or_coll,
            })
            if job.timing and closer_or_coll and done:
                e["duration_ms"] = (rec["done"] - rec["started"]) / 1e6
            self.record_id += 1
            out.append(e)
        return out


def _version_minor(version: str) -> int:
    try:
        return int(version.split(".")[1])
    except (IndexError, ValueError):
        return 99


def writer_layout(entry: dict) -> dict:
    """The entry laid out as the recorder's C++ pickler writes it: each entry has its own lists and tuples,
    while strings and frame dicts are shared objects (memoized), as fixtures/writer_sharing shows. The
    simulation reuses one list per op and stack; pickled as is, those lists would be memoized too, and the
    dumps would load faster than real ones (`pickle.load` of 140 files of the 16,384 x 2,000 job, 2-frame
    stacks: 0.4-0.5 s shared, 0.9 s laid out as the writer does)."""
    # the C++ pickler memoizes strings by value; Python's pickle by object: equal strings become one object
    e = {key: sys.intern(value) if isinstance(value, str) else value for key, value in entry.items()}
    e["process_group"] = tuple(sys.intern(part) for part in e["process_group"])
    for key in ("input_sizes", "output_sizes"):
        e[key] = [list(shape) for shape in e[key]]
    for key in ("input_dtypes", "output_dtypes"):
        e[key] = [sys.intern(dtype) for dtype in e[key]]
    if "frames" in e:
        e["frames"] = list(e["frames"])
    return e


def build_dump(job: Job, rank: int, entries: list[dict], by_rank: dict[int, dict[str, Group]]) -> dict:
    if job.backend == "gloo":
        return _as_gloo(job, entries, by_rank[rank])
    minor = _version_minor(job.version)
    kept = entries[-job.buffer_size:] if job.buffer_size else []
    if job.only_active:
        kept = [e for e in kept if e["time_discovered_completed_ns"] is None]
    groups = list(by_rank[rank].values())
    status = {}
    for i, g in enumerate(groups):
        # One work per collective and per batch of sends and receives (its closer); the counters hold the seq
        # of the latest work enqueued, started, completed: a batch's p2p seq, a collective's collective seq.
        # The writer makes a group's key at its first entry: a group the rank never used has none.
        works = [e for e in entries if e["process_group"][0] == g.name and not e["is_p2p"]]
        if not works:
            continue
        seq = [e["p2p_seq_id"] or e["collective_seq_id"] for e in works]
        status[str(i)] = {
            "last_enqueued_collective": seq[-1],
            "last_started_collective": next((q for q, e in zip(seq[::-1], works[::-1]) if e["state"] != "scheduled"),
                                            -1) if job.timing else -1,
            "last_completed_collective": next((q for q, e in zip(seq[::-1], works[::-1])
                                               if e["state"] == "completed"), -1)}
    dump = {
        "version": job.version,
        "pg_config": {g.name: {"name": g.name, "desc": g.desc, "ranks": str(g.ranks)} for g in groups},
        "pg_status": status,
        "entries": kept,
    }
    if minor >= 10:
        dump["comm_lib_version"] = "2.21.5"
    elif minor >= 7:
        dump["nccl_version"] = "2.21.5"
    return dump


def _as_gloo(job: Job, entries: list[dict], groups: dict[str, Group]) -> dict:
    """The same run as ProcessGroupGloo's recorder writes it (as the real dumps in fixtures/ show): sends and
    receives not recorded at all, every entry 'scheduled' with no start or completion time (`retired` says it
    left the work queue), 'gloo:' profiling names, one unnamed pg_config entry with the world's ranks while the
    job has no other group (fixtures/dead_rank) and with none once it has (every 8-rank fixture: '[]'), and a
    pg_status key only for a group with a recorded entry (none for a pipeline group: fixtures/record_p2p_keys.py),
    whose counters move only at a recorded op (fixtures/pipeline_stall)."""
    recorded = [e for e in entries if not e["is_p2p"] and not e["p2p_seq_id"]]   # (no batch closers either)
    out = []
    for record_id, e in enumerate(recorded):
        g = {k: v for k, v in e.items() if k != "duration_ms"}
        g.update(record_id=record_id, profiling_name=e["profiling_name"].replace("nccl:", "gloo:", 1),
                 state="scheduled", time_discovered_started_ns=None, time_discovered_completed_ns=None,
                 retired=e["state"] == "completed")
        out.append(g)
    status = {}
    for i, grp in enumerate(groups.values()):
        # (the generator's collective groups carry no sends or receives: seqs number collectives only)
        mine = [e for e in recorded if e["process_group"][0] == grp.name]
        if not mine:
            continue
        done = {e["collective_seq_id"] for e in mine if e["state"] == "completed"}
        status[str(i)] = {"last_enqueued_collective": max(e["collective_seq_id"] for e in mine),
                          "last_started_collective": -1, "last_completed_collective": max(done, default=-1)}
    return {"version": job.version, "comm_lib_version": "",
            "pg_config": {"": {"name": "", "desc": "",
                               "ranks": str(list(range(job.world_size)) if len(groups) == 1 else [])}},
            "pg_status": status, "entries": out[-job.buffer_size:] if job.buffer_size else []}


def to_json_dump(dump: dict) -> str:
    """What `_dump_nccl_trace_json` writes: no frames, 0 for missing times, strings in pg_status."""
    out = {k: v for k, v in dump.items() if k != "entries"}
    out["pg_status"] = {k: {kk: str(vv) for kk, vv in v.items()} for k, v in dump["pg_status"].items()}
    entries = []
    for e in dump["entries"]:
        e = {k: v for k, v in e.items() if k != "frames"}
        e["process_group"] = list(e["process_group"])
        for k in ("time_discovered_started_ns", "time_discovered_completed_ns"):
            e[k] = e[k] or 0
        entries.append(e)
    if entries:
        out["entries"] = entries
    return json.dumps(out)


def dump_moment(records: dict[int, list[dict]]) -> int:
    """When the job's dumps are written: once its first op left unfinished has waited the timeout (the watchdog
    fires, and every rank dumps), or, with none, a moment after the last op finished (a dump at the end)."""
    pending = [rec["created"] for recs in records.values() for rec in recs if rec["done"] is None]
    if pending:
        return min(pending) + _TIMEOUT_MS * 1_000_000 + _WATCHDOG_NS
    ends = [rec["done"] for recs in records.values() for rec in recs]
    return max(ends, default=T0) + _DUMP_AFTER_END_NS
