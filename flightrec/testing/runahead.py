"""Small NCCL jobs with the CPU running ahead of the GPU, written as PyTorch's recorder (version 2.10) dumps them.

`flightrec.testing.synth` records an op only once the one before it finished: one op in flight per rank. Real jobs
don't run so. The CPU enqueues (records, `scheduled`) its ops until Python needs a result (an `.item()`, the
token counts of an MoE layer, a blocking receive); the GPU runs each process group's ops on a stream of its
own (and each peer pair's single sends and receives on another), a stream's ops in order; a blocking
collective makes everything enqueued after it wait for it (the compute stream waits on it), an async one only
what waits on it. So a rank's later ops are in the dump while its GPU is still in an earlier one, and at a
hang most collectives read in flight on every member.

This module models that, event by event: each rank's program (ops, sync points, waits), its CPU, its GPU
streams, and faults that only such a model shows: a CPU that stops (a held GIL, a hang in host code), a GPU
that stops answering (its kernels run on, its recorder never sees them finish: NVIDIA's GPU-error dumps), a GPU
frozen inside a collective, a dead link, a receive posted from the wrong peer, a rank that leaves no dump, and a
dump taken on demand from a running job. `runahead_scenarios` holds small jobs built with it, each with the
right answer.

What is modelled is a hypothesis about real jobs (`docs/findings.md`): the rules checked only on these jobs are
marked so there. The writer's facts (keys, counters, states) are PyTorch's (FlightRecorder*.hpp,
ProcessGroupNCCL.cpp); nothing here imports the analyser."""

from __future__ import annotations

import os
import pickle
import random
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

T0 = 1_766_000_000_000_000_000


CPU_NS = 50_000            # the CPU's time to enqueue one op


OP_NS = 2_000_000          # a collective's or a transfer's time on the GPU, once every member began it


POLL_NS = 100_000_000      # PyTorch's watchdog polls every kWatchdogThreadSleepMillis: 100 ms


TIMEOUT_MS = 600_000       # the default process-group timeout


@dataclass
class Op:
    """One op of a rank's program. `kind`: "coll", "send", "recv" or "sync" (the CPU waits for `waits`, not
    recorded). `blocking`: everything enqueued after it waits for it on the GPU (a collective called without
    `async_op`); an async op makes only what `waits` on it wait."""

    kind: str
    group: str = ""
    name: str = ""
    ins: list = field(default_factory=list)
    outs: list = field(default_factory=list)
    dtype: str = "BFloat16"
    peer: int | None = None          # the other end's global rank (send, recv)
    blocking: bool = True
    waits: tuple[int, ...] = ()      # earlier ops of this rank the GPU (or, for a sync, the CPU) waits for
    key: tuple = ()                  # the instance it is part of, across ranks (set by `Program.finish`)


class Program:
    """A rank's ops in program order, built call by call; each call returns the op's index."""

    def __init__(self, rank: int):
        self.rank, self.ops = rank, []
        self._fence: list[int] = []    # ops everything enqueued from now on waits for on the GPU

    def _add(self, op: Op) -> int:
        op.waits = tuple(sorted(set(op.waits) | set(self._fence)))
        self.ops.append(op)
        i = len(self.ops) - 1
        if op.kind == "coll" and op.blocking:
            self._fence = [i]
        return i

    def coll(self, group: str, name: str, ins: list, outs: list | None = None, dtype: str = "BFloat16",
             blocking: bool = True) -> int:
        return self._add(Op("coll", group, name, ins, ins if outs is None else outs, dtype, blocking=blocking))

    def send(self, group: str, peer: int, shape: list) -> int:
        return self._add(Op("send", group, "send", [shape], [shape], peer=peer, blocking=False))

    def recv(self, group: str, peer: int, shape: list) -> int:
        return self._add(Op("recv", group, "recv", [shape], [shape], peer=peer, blocking=False))

    def wait(self, *ops: int) -> None:
        """`work.wait()`: what is enqueued from now on waits for these ops on the GPU."""
        self._fence = sorted(set(self._fence) | set(ops))

    def sync(self, *ops: int) -> int:
        """The CPU waits for these ops (all enqueued so far, with none given) to finish: an `.item()`."""
        waits = ops or tuple(i for i, o in enumerate(self.ops) if o.kind != "sync")
        return self._add(Op("sync", waits=tuple(waits)))


@dataclass
class Fault:
    """What breaks. `kind`: "none", "cpu_stop" (rank's CPU never enqueues op `at` or later), "gpu_error" (from
    `at_ns` on, rank's recorder never sees an op finish and its CPU blocks at its next sync), "gpu_freeze" (from
    `at_ns` on, rank's GPU begins nothing and finishes nothing), "dead_link" (ops spanning `hosts` never
    finish), "wrong_recv" (rank's `at`-th op, a receive, is posted from `peer`)."""

    kind: str = "none"
    rank: int = -1
    at: int = -1
    at_ns: int = 0
    hosts: tuple[str, ...] = ()
    peer: int = -1


@dataclass
class Job:
    groups: dict[str, tuple[str, list[int]]]          # name -> (desc, global ranks)
    programs: dict[int, Program]
    hosts: dict[int, str]
    fault: Fault = field(default_factory=Fault)
    timing: bool = False                                # TORCH_NCCL_ENABLE_TIMING
    only_active: bool = False                           # TORCH_INCLUDE_ONLY_ACTIVE
    snapshot_ns: int | None = None                      # dumped on demand at T0 + this, not on a timeout
    no_dump: tuple[int, ...] = ()                       # ranks that write no dump
    cpu_skew_ns: int = 0                                # rank r's CPU takes r x this more to enqueue each op


def _keys(job: Job) -> None:
    """Each op's instance key: the k-th collective of a group, the k-th transfer src -> dst in a group."""
    for rank, prog in job.programs.items():
        seen: dict[tuple, int] = defaultdict(int)
        for op in prog.ops:
            if op.kind == "coll":
                seen[("c", op.group)] += 1
                op.key = ("c", op.group, seen[("c", op.group)])
            elif op.kind in ("send", "recv"):
                src, dst = (rank, op.peer) if op.kind == "send" else (op.peer, rank)
                seen[("p", op.group, src, dst)] += 1
                op.key = ("p", op.group, src, dst, seen[("p", op.group, src, dst)])


class Run:
    """The job run event by event to its end (or its hang): when each op was enqueued, began and finished."""

    def __init__(self, job: Job):
        self.job = job
        _keys(job)
        f = job.fault
        if f.kind == "wrong_recv":
            op = job.programs[f.rank].ops[f.at]
            op.peer = f.peer
            op.key = ("p", op.group, f.peer, f.rank, -1)   # (a transfer nobody sends)
        self.enq: dict[tuple[int, int], int] = {}
        self.start: dict[tuple[int, int], int] = {}
        self.done: dict[tuple[int, int], int] = {}
        self.members: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
        for rank, prog in job.programs.items():
            for i, op in enumerate(prog.ops):
                if op.key:
                    self.members[op.key].append((rank, i))
        self._run()

    def _expected(self, key: tuple) -> int:
        return len(self.job.groups[key[1]][1]) if key[0] == "c" else 2

    def _dead(self, key: tuple) -> bool:
        f = self.job.fault
        if f.kind != "dead_link":
            return False
        hosts = {self.job.hosts[r] for r, _ in self.members[key]}
        return set(f.hosts) <= hosts

    def _run(self) -> None:
        job, f = self.job, self.job.fault
        cpu = {r: (0, T0 + r * 10_000) for r in job.programs}   # (next op, the CPU's clock)
        prev_on_stream: dict[tuple[int, int], int | None] = {}
        for rank, prog in job.programs.items():
            last: dict[tuple, int] = {}
            for i, op in enumerate(prog.ops):
                stream = (op.group,) if op.kind == "coll" else (op.group, op.peer)
                prev_on_stream[(rank, i)] = last.get(stream) if op.kind != "sync" else None
                if op.kind != "sync":
                    last[stream] = i
        changed = True
        while changed:
            changed = False
            for rank, prog in job.programs.items():          # the CPUs, as far as each can go
                i, t = cpu[rank]
                while i < len(prog.ops):
                    op = prog.ops[i]
                    if f.kind == "cpu_stop" and rank == f.rank and i >= f.at:
                        break
                    if op.kind == "sync":
                        ends = [self.done.get((rank, j)) for j in op.waits]
                        if any(e is None for e in ends):
                            break
                        if f.kind == "gpu_error" and rank == f.rank and max(ends, default=0) > f.at_ns:
                            break   # (the sync needs the GPU's answer, which never comes)
                        t = max([t, *ends]) + CPU_NS
                    else:
                        self.enq[(rank, i)] = t
                        t += CPU_NS + rank * job.cpu_skew_ns
                    i += 1
                    changed = True
                cpu[rank] = (i, t)
            for (rank, i), t_enq in list(self.enq.items()):   # the GPUs: each op begins once it may
                if (rank, i) in self.start:
                    continue
                op = self.job.programs[rank].ops[i]
                before = [j for j in (prev_on_stream[(rank, i)], *op.waits) if j is not None]
                ends = [self.done.get((rank, j)) for j in before]
                if any(e is None for e in ends):
                    continue
                begin = max([t_enq, *ends])
                if f.kind == "gpu_freeze" and rank == f.rank and begin > f.at_ns:
                    continue
                self.start[(rank, i)] = begin
                changed = True
            for key, parts in self.members.items():          # an instance finishes once every member began it
                if any(p in self.done for p in parts) or len(parts) < self._expected(key):
                    continue
                if any(p not in self.start for p in parts) or self._dead(key):
                    continue
                end = max(self.start[p] for p in parts) + OP_NS
                if f.kind == "gpu_freeze" and any(r == f.rank for r, _ in parts) and end > f.at_ns:
                    continue
                for p in parts:
                    self.done[p] = end
                changed = True

    def dump_moment(self) -> int:
        """On demand: the snapshot's moment. On a timeout: once the first op left unfinished had waited its
        timeout (the watchdog fires and every rank dumps); with none, a moment after the last op finished."""
        if self.job.snapshot_ns is not None:
            return T0 + self.job.snapshot_ns
        stuck = [t for p, t in self.enq.items() if p not in self.done]
        if stuck:
            return min(stuck) + TIMEOUT_MS * 1_000_000 + POLL_NS
        return max(self.done.values(), default=T0) + 10**9


def _dump(job: Job, run: Run, rank: int, at: int) -> dict:
    """What rank's recorder dumps at `at`: its entries, pg_config and pg_status, as version 2.10 writes them."""
    f = job.fault
    prog = job.programs[rank]
    mine = [name for name, (_, ranks) in job.groups.items() if rank in ranks]
    pg_id = {name: i for i, name in enumerate(mine)}
    seeing = (lambda t: t <= f.at_ns) if (f.kind == "gpu_error" and rank == f.rank) else (lambda t: True)
    counters: dict[str, dict[str, int]] = {g: defaultdict(int) for g in mine}
    status: dict[str, dict] = {}
    entries = []
    phase = random.Random(f"{rank}").randrange(POLL_NS)

    def polled(t: int) -> int:
        return t + (phase - t) % POLL_NS

    for i, op in enumerate(prog.ops):
        t_enq = run.enq.get((rank, i))
        if op.kind == "sync" or t_enq is None or t_enq > at:
            continue
        c = counters[op.group]
        c["op"] += 1
        p2p = op.kind != "coll"
        if p2p:
            c["p2p"] += 1
        else:
            c["coll"] += 1
        seq = c["p2p"] if p2p else c["coll"]
        begin, end = run.start.get((rank, i)), run.done.get((rank, i))
        finished = end is not None and end <= at and seeing(end)
        began = begin is not None and begin <= at and seeing(begin)
        state = "completed" if finished else "started" if job.timing and began else "scheduled"
        members = job.groups[op.group][1]
        if p2p:
            me, peer = members.index(rank), members.index(op.peer)
            name = f"nccl:send {me}->{peer}" if op.kind == "send" else f"nccl:recv {me}<-{peer}"
        else:
            name = f"nccl:{op.name}"
        e = {"record_id": len(entries), "pg_id": pg_id[op.group], "process_group": (op.group, job.groups[op.group][0]),
             "thread_name": "pt_main_thread", "thread_id": str(140_000_000 + rank),
             "collective_seq_id": c["coll"], "p2p_seq_id": c["p2p"], "op_id": c["op"], "profiling_name": name,
             "time_created_ns": t_enq, "input_sizes": op.ins, "input_dtypes": [op.dtype] * len(op.ins),
             "output_sizes": op.outs, "output_dtypes": [op.dtype] * len(op.outs), "state": state,
             "time_discovered_started_ns": (polled(begin) if finished else at) if job.timing and began else None,
             "time_discovered_completed_ns": polled(end) if finished else None,
             "retired": finished, "timeout_ms": TIMEOUT_MS, "is_p2p": p2p}
        if job.timing and finished:
            e["duration_ms"] = (end - begin) / 1e6
        entries.append(e)
        st = status.setdefault(str(pg_id[op.group]), {"last_enqueued_collective": -1, "last_started_collective": -1,
                                                       "last_completed_collective": -1, "_done_at": -1})
        st["last_enqueued_collective"] = seq
        if job.timing and began:
            st["last_started_collective"] = seq
        if finished and end >= st["_done_at"]:
            st["last_completed_collective"], st["_done_at"] = seq, end
    for st in status.values():
        del st["_done_at"]
    if job.only_active:
        entries = [e for e in entries if e["time_discovered_completed_ns"] is None]
    return {"version": "2.10", "comm_lib_version": "2.21.5",
            "pg_config": {g: {"name": g, "desc": job.groups[g][0], "ranks": str(job.groups[g][1])} for g in mine},
            "pg_status": status, "entries": entries}


def write(job: Job, out: str | os.PathLike) -> dict:
    """Run `job`, write every rank's dump into `out` (one folder per host, files timed at the dump); return the
    run's facts: {"dump_ns", "unfinished": [[rank, op index], ...], "enqueued": {rank: ops}}."""
    run = Run(job)
    at = run.dump_moment()
    out = Path(out)
    for rank in job.programs:
        if rank in job.no_dump:
            continue
        folder = out / job.hosts[rank]
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"nccl_trace_rank_{rank}"
        path.write_bytes(pickle.dumps(_dump(job, run, rank, at), protocol=2))
        os.utime(path, ns=(at, at))
    return {"dump_ns": at, "unfinished": sorted([r, i] for (r, i) in run.enq if (r, i) not in run.done),
            "enqueued": {r: sum(1 for (q, _) in run.enq if q == r) for r in job.programs}}
