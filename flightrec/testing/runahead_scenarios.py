"""Small jobs built on the run-ahead model (`runahead`), each with the right answer: an MoE layer, a context-
parallel ring, pipelines, and the faults only that model shows."""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

from flightrec.testing.runahead import OP_NS, T0, Fault, Job, Program, Run, write


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
    return Run(healthy).enq[(rank, index)] - T0


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
