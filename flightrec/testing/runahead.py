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
dump taken on demand from a running job. `SCENARIOS` are small jobs built with it, each with the right answer.

What is modelled is a hypothesis about real jobs (`docs/findings.md`): the rules checked only on these jobs are
marked so there. The writer's facts (keys, counters, states) are PyTorch's (FlightRecorder*.hpp,
ProcessGroupNCCL.cpp); nothing here imports the analyser.
"""

from __future__ import annotations

import json
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


class _Run:
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


def _dump(job: Job, run: _Run, rank: int, at: int) -> dict:
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
    run = _Run(job)
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


# ---------------------------------------------------------------------------------------------- scenarios


def _hosts(world: int, per_host: int) -> dict[int, str]:
    return {r: f"node{r // per_host}" for r in range(world)}


def moe(fault: Fault | None = None, steps: int = 2, layers: int = 2, timing: bool = False, only_active: bool = False,
        snapshot_ns: int | None = None, seed: int = 0, cpu_skew_ns: int = 0) -> Job:
    """8 ranks on 4 hosts of 2: tensor-parallel pairs within a host, two expert-parallel groups of 4 across the
    hosts, data parallel over the world. Each layer: a tp all_gather, the token counts gathered in the ep group
    (the CPU waits for them: `.item()`), the tokens sent by an uneven all_to_all and sent back, a tp
    reduce_scatter; each step ends with the gradients' async all_reduce and the loss's, which the CPU reads."""
    world, rng = 8, random.Random(seed)
    groups = {"0": ("default_pg", list(range(world)))}
    for h in range(4):
        groups[f"tp{h}"] = ("TENSOR_MODEL_PARALLEL_GROUP", [2 * h, 2 * h + 1])
    for e in range(2):
        groups[f"ep{e}"] = ("EXPERT_MODEL_PARALLEL_GROUP", [e, e + 2, e + 4, e + 6])
    progs = {r: Program(r) for r in range(world)}
    for step in range(steps):
        for layer in range(layers):
            # tokens each ep member sends each other member: rows of 5120, 4096 sent by each in all
            splits = {}
            for e in range(2):
                for r in groups[f"ep{e}"][1]:
                    cuts = sorted(rng.sample(range(1, 4096), 3))
                    splits[r] = [a - b for a, b in zip([*cuts, 4096], [0, *cuts])]
            for r, p in progs.items():
                tp, ep = f"tp{r // 2}", f"ep{r % 2}"
                members = groups[ep][1]
                got = sum(splits[m][members.index(r)] for m in members)
                p.coll(tp, "_all_gather_base", [[4096, 1, 5120]], [[8192, 1, 5120]])
                counts = p.coll(ep, "_all_gather_base", [[4]], [[16]], dtype="Long")
                p.sync(counts)
                p.coll(ep, "all_to_all", [[4096, 5120]], [[got, 5120]])
                p.coll(ep, "all_to_all", [[got, 5120]], [[4096, 5120]])
                p.coll(tp, "_reduce_scatter_base", [[8192, 1, 5120]], [[4096, 1, 5120]])
        for r, p in progs.items():
            grads = p.coll("0", "all_reduce", [[1 << 20]], dtype="Float", blocking=False)
            p.wait(grads)
            loss = p.coll("0", "all_reduce", [[1]], dtype="Float")
            p.sync(loss)
    return Job(groups, progs, _hosts(world, 2), fault or Fault(), timing, only_active, snapshot_ns,
               cpu_skew_ns=cpu_skew_ns)


def context_ring(fault: Fault | None = None, layers: int = 3, timing: bool = False) -> Job:
    """8 ranks on 4 hosts of 2: tensor-parallel pairs within a host, two context-parallel rings of 4 across the
    hosts. Each layer: a tp all_gather, then ring attention: each ring step sends this rank's key/value block to
    the next rank and receives the previous rank's, both async, and the next step's attention waits for the
    received block; a tp reduce_scatter closes the layer, and the CPU reads the loss at the end."""
    world = 8
    groups = {"0": ("default_pg", list(range(world)))}
    for h in range(4):
        groups[f"tp{h}"] = ("TENSOR_MODEL_PARALLEL_GROUP", [2 * h, 2 * h + 1])
    for c in range(2):
        groups[f"cp{c}"] = ("CONTEXT_PARALLEL_GROUP", [c, c + 2, c + 4, c + 6])
    progs = {r: Program(r) for r in range(world)}
    for _ in range(layers):
        for r, p in progs.items():
            ring = groups[f"cp{r % 2}"][1]
            me = ring.index(r)
            nxt, prv = ring[(me + 1) % 4], ring[(me - 1) % 4]
            p.coll(f"tp{r // 2}", "_all_gather_base", [[2048, 1, 4096]], [[4096, 1, 4096]])
            for _step in range(3):
                p.send(f"cp{r % 2}", nxt, [2, 2048, 8, 128])
                got = p.recv(f"cp{r % 2}", prv, [2, 2048, 8, 128])
                p.wait(got)
            p.coll(f"tp{r // 2}", "_reduce_scatter_base", [[4096, 1, 4096]], [[2048, 1, 4096]])
    for r, p in progs.items():
        p.sync(p.coll("0", "all_reduce", [[1]], dtype="Float"))
    return Job(groups, progs, _hosts(world, 2), fault or Fault(), timing)


def pipeline(fault: Fault | None = None, stages: int = 4, chunks: int = 2, microbatches: int = 4,
             timing: bool = False, tp: int = 2, no_dump: tuple[int, ...] = ()) -> Job:
    """`stages` x `tp` ranks, a host per stage: tensor-parallel groups within a host, pipelines across them.
    Interleaved 1F1B with `chunks` model chunks a stage (chunk c of stage s is virtual stage c x stages + s): each
    microbatch's forward receives its activation from the previous virtual stage (blocking: the compute waits
    for it), runs two tp collectives, and sends to the next (async); then the backward the other way. Single
    sends and receives, each its own NCCL work, as Megatron runs them unbatched."""
    world = stages * tp
    groups = {"0": ("default_pg", list(range(world)))}
    for s in range(stages):
        groups[f"tp{s}"] = ("TENSOR_MODEL_PARALLEL_GROUP", list(range(s * tp, (s + 1) * tp)))
    for t in range(tp):
        groups[f"pp{t}"] = ("PIPELINE_MODEL_PARALLEL_GROUP", [s * tp + t for s in range(stages)])
    progs = {r: Program(r) for r in range(world)}
    virtual = stages * chunks
    shape = [4096, 1, 5120]
    for r, p in progs.items():
        s, t = divmod(r, tp)
        pp, tpg = f"pp{t}", f"tp{s}"
        ranks = groups[pp][1]
        for direction in ("forward", "backward"):
            for m in range(microbatches):
                for c in (range(chunks) if direction == "forward" else reversed(range(chunks))):
                    v = c * stages + s
                    src = v - 1 if direction == "forward" else v + 1
                    dst = v + 1 if direction == "forward" else v - 1
                    if 0 <= src < virtual:
                        got = p.recv(pp, ranks[src % stages], shape)
                        p.wait(got)
                    p.coll(tpg, "_all_gather_base", [[4096, 1, 5120]], [[4096 * tp, 1, 5120]])
                    p.coll(tpg, "_reduce_scatter_base", [[4096 * tp, 1, 5120]], [[4096, 1, 5120]])
                    if 0 <= dst < virtual:
                        p.send(pp, ranks[dst % stages], shape)
        p.sync(p.coll("0", "all_reduce", [[1]], dtype="Float"))
    job = Job(groups, progs, {r: f"node{r // tp}" for r in range(world)}, fault or Fault(), timing)
    job.no_dump = no_dump
    return job


def three_stage_ring(fault: Fault | None = None, steps: int = 4) -> Job:
    """3 ranks on 3 hosts, one pipeline group: each step every stage receives from the one before it (stage 0
    from the last) and sends to the one after it, blocking receives, then the loss all_reduce the CPU reads."""
    world = 3
    groups = {"0": ("default_pg", [0, 1, 2])}
    progs = {r: Program(r) for r in range(world)}
    for _ in range(steps):
        for r, p in progs.items():
            if r == 0:
                p.send("0", 1, [64, 1024])
                p.wait(p.recv("0", 2, [64, 1024]))
            else:
                p.wait(p.recv("0", r - 1, [64, 1024]))
                p.send("0", (r + 1) % 3, [64, 1024])
        for r, p in progs.items():
            p.sync(p.coll("0", "all_reduce", [[1]], dtype="Float"))
    return Job(groups, progs, {r: f"node{r}" for r in range(world)}, fault or Fault(), timing=False)


def _op_index(job: Job, rank: int, nth: int, kind: str = "coll", name: str | None = None, group: str | None = None) -> int:
    """Index in rank's program of its `nth` (from 0) op of this kind (and name, group)."""
    found = [i for i, op in enumerate(job.programs[rank].ops)
             if op.kind == kind and (name is None or op.name == name) and (group is None or op.group.startswith(group))]
    return found[nth]


def _enqueued_at(job: Job, rank: int, index: int) -> int:
    """When rank's CPU enqueues op `index` in the healthy run (to place a fault in time)."""
    healthy = Job(job.groups, job.programs, job.hosts)
    return _Run(healthy).enq[(rank, index)] - T0


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str
    job: Job
    # the right answer: {"verdict", "kind" (first root cause's), "ranks", "hosts", "links"}; "trigger": passed
    expect: dict


def scenarios() -> list[Scenario]:
    """The jobs and their right answers."""
    out = []
    job = moe()
    stop = _op_index(job, 5, 5, name="all_to_all")    # rank 5's third all_to_all (step 1, layer 0)
    out.append(Scenario("moe_cpu_stops", "rank 5's CPU stops (a held GIL) before an expert-parallel all_to_all; the "
                        "others' CPUs ran ahead to the next token-count sync", moe(Fault("cpu_stop", 5, at=stop)),
                        {"verdict": "fault", "kind": "not_joined", "ranks": [5]}))
    job = moe()
    t = _enqueued_at(job, 6, _op_index(job, 6, 4, name="all_to_all"))
    out.append(Scenario("moe_gpu_error", "rank 6's GPU stops answering during step 1 (NVIDIA's GPU error): its "
                        "kernels run on with its peers, its recorder never sees one finish, its CPU blocks at the next "
                        "sync", moe(Fault("gpu_error", 6, at_ns=T0 + t)),
                        {"verdict": "fault", "kind": "gpu_stalled", "ranks": [6]}))
    for timing in (True, False):
        job = moe(timing=timing)
        i = _op_index(job, 3, 4, name="all_to_all")
        t = _enqueued_at(job, 3, i) - 1
        out.append(Scenario(f"moe_gpu_freeze{'_timing' if timing else ''}",
                            f"rank 3's GPU freezes just before an expert-parallel all_to_all begins on it (NCCL timing "
                            f"{'on: its peers began it, it never did' if timing else 'off: the dumps cant tell it apart'})",
                            moe(Fault("gpu_freeze", 3, at_ns=T0 + t), timing=timing),
                            {"verdict": "fault", "kind": "gpu_stalled", "ranks": [3], "hosts": ["node1"]} if timing
                            else {"verdict": "inconclusive", "stuck_ranks": [1, 3, 5, 7], "trigger": "timeout"}))
    job = moe(timing=True)
    t = _enqueued_at(job, 3, _op_index(job, 3, 4, name="all_to_all")) + OP_NS // 2
    out.append(Scenario("moe_gpu_freeze_inside", "rank 3's GPU freezes inside an expert-parallel all_to_all every "
                        "member began: the same dumps as a NIC or link under it among the four hosts",
                        moe(Fault("gpu_freeze", 3, at_ns=T0 + t), timing=True),
                        {"verdict": "inconclusive", "stuck_ranks": [1, 3, 5, 7]}))
    for timing in (True, False):
        out.append(Scenario(f"context_ring_dead_link{'_timing' if timing else ''}",
                            f"the link node1 <-> node2 dies under the context-parallel rings (NCCL timing "
                            f"{'on' if timing else 'off'})", context_ring(Fault("dead_link", hosts=("node1", "node2")),
                                                                          timing=timing),
                            {"verdict": "fault", "kind": "stuck_in_flight", "links": [["node1", "node2"]],
                             **({} if timing else {"trigger": "timeout"})}))
    for timing in (True, False):
        job = moe(steps=3, cpu_skew_ns=300_000)
        middle = _enqueued_at(job, 0, _op_index(job, 0, 9, name="all_to_all")) + OP_NS // 3
        out.append(Scenario(f"moe_live_snapshot{'_timing' if timing else ''}",
                            "a healthy MoE job dumped on demand mid-run (the debug pipe), read where it was written: "
                            "every rank has collectives in flight, its CPU ahead of its GPU, some ranks a few ops "
                            f"behind others (NCCL timing {'on' if timing else 'off'})",
                            moe(steps=3, snapshot_ns=middle, timing=timing, cpu_skew_ns=300_000),
                            {"verdict": "healthy"}))
    job = pipeline()
    stop = _op_index(job, 4, 3, kind="send")           # stage 2's fourth send
    out.append(Scenario("interleaved_1f1b_cpu_stops", "interleaved 1F1B (4 stages x 2 chunks, tp 2): rank 4 (stage 2) "
                        "stops before a send", pipeline(Fault("cpu_stop", 4, at=stop)),
                        {"verdict": "fault", "ranks": [4]}))
    job = three_stage_ring()
    bad = _op_index(job, 1, 2, kind="recv")             # rank 1's third receive (from 0)
    out.append(Scenario("p2p_receive_from_the_wrong_stage", "rank 1 posts a receive from stage 2, which never sends "
                        "to it, where it always received from stage 0: stages 0, 1 and 2 wait on each other in a cycle",
                        three_stage_ring(Fault("wrong_recv", 1, at=bad, peer=2)),
                        {"verdict": "fault", "ranks": [1]}))
    job = pipeline(stages=2, chunks=1, tp=8)
    stop = _op_index(job, 3, 5, group="tp")
    out.append(Scenario("tp_peer_died_without_a_dump", "16 ranks, 2 pipeline stages of tp 8 (a host each): rank 3 "
                        "dies before a tensor-parallel collective and writes no dump (pytorch#196968); its 7 tp peers "
                        "wait on it, and the other stage on them", pipeline(Fault("cpu_stop", 3, at=stop), stages=2,
                                                                            chunks=1, tp=8, no_dump=(3,)),
                        {"verdict": "fault", "kind": "missing_dump", "ranks": [3], "hosts": ["node0"]}))
    return out


def write_scenario(s: Scenario, out: str | os.PathLike) -> dict:
    """Write one scenario's dumps into `out` and its answer beside them (`expected.json`)."""
    facts = write(s.job, out)
    (Path(out) / "expected.json").write_text(json.dumps({"scenario": s.name, "what": s.what, "expect": s.expect,
                                                        "dump_ns": facts["dump_ns"]}, indent=1))
    return facts
