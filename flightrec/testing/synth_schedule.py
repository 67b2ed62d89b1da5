"""Each rank's program in a synthetic 3D-parallel job: its process groups and the ops of one step (a GPipe
schedule of tensor-parallel collectives and batched pipeline sends and receives, then the data-parallel and
world all_reduces), and the clock the simulation runs on."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from flightrec.testing.synth_job import Job


@dataclass
class Group:
    name: str
    desc: str
    ranks: list[int]


def process_groups(job: Job) -> tuple[list[Group], dict[int, dict[str, Group]]]:
    """Created in the same order on every rank (as new_group requires), so names agree across ranks."""
    groups = [Group("0", "default_pg", list(range(job.world_size)))]
    for d in range(job.dp):
        for p in range(job.pp):
            groups.append(Group("", "tp", sorted(job.rank_of(d, p, t) for t in range(job.tp))))
    for d in range(job.dp):
        for t in range(job.tp):
            groups.append(Group("", "pp", sorted(job.rank_of(d, p, t) for p in range(job.pp))))
    for p in range(job.pp):
        for t in range(job.tp):
            groups.append(Group("", "dp", sorted(job.rank_of(d, p, t) for d in range(job.dp))))
    for i, g in enumerate(groups):
        g.name = str(i)
    by_rank: dict[int, dict[str, Group]] = defaultdict(dict)
    for g in groups:
        for r in g.ranks:
            by_rank[r][g.desc] = g
    return groups, by_rank


# One op a rank executes. `keys` are the instances it takes part in (a collective, or each send/recv of a
# batch); it completes when every instance has all its participants.
@dataclass
class Op:
    step: int
    group: Group
    name: str                      # profiling-name op, e.g. 'all_gather', 'send 0->1', 'coalesced'
    keys: list[tuple]
    in_sizes: list
    out_sizes: list
    dtype: str
    stack: str
    is_p2p: bool = False
    parts: list["Op"] = field(default_factory=list)   # a batch's send/recv entries, before its closer


_H = 1024


def schedule(job: Job, rank: int, by_rank: dict[int, dict[str, Group]], steps: range | None = None) -> list[Op]:
    """The ops one rank runs in `steps` (default: every step). Instance keys count from the first step given."""
    dp_i, pp_i, tp_i = job.coords(rank)
    g = by_rank[rank]
    tp, pp = g["tp"], g["pp"]
    counters: dict[tuple, int] = defaultdict(int)
    ops: list[Op] = []

    def coll(step: int, group: Group, name: str, n: int, stack: str, dtype: str = "BFloat16") -> None:
        counters[("c", group.name)] += 1
        size = len(group.ranks)
        if name == "all_gather":
            ins, outs = [[n]], [[n * size]]
        elif name == "reduce_scatter":
            ins, outs = [[n * size]], [[n]]
        else:
            ins, outs = [[n]], [[n]]
        ops.append(Op(step, group, name, [("c", group.name, counters[("c", group.name)])], ins, outs, dtype, stack))

    def p2p(step: int, kind: str, peer_stage: int, stack: str) -> None:
        me, peer = pp.ranks.index(rank), pp.ranks.index(job.rank_of(dp_i, peer_stage, tp_i))
        src, dst = (me, peer) if kind == "send" else (peer, me)
        counters[("p", src, dst)] += 1
        key = ("p", pp.name, src, dst, counters[("p", src, dst)])
        arrow = f"{me}->{peer}" if kind == "send" else f"{me}<-{peer}"
        part = Op(step, pp, f"{kind} {arrow}", [key], [[4, _H]], [[4, _H]], "BFloat16", stack, is_p2p=True)
        ops.append(Op(step, pp, "coalesced", [key], [], [], "BFloat16", stack, is_p2p=True, parts=[part]))

    for step in steps if steps is not None else range(job.steps):
        for m in range(job.microbatches):
            if pp_i > 0:
                p2p(step, "recv", pp_i - 1, "recv_forward")
            for _ in range(job.layers):
                if job.tp > 1:
                    coll(step, tp, "all_gather", 4 * _H, "attention_forward")
                    coll(step, tp, "reduce_scatter", 4 * _H, "mlp_forward")
            if pp_i < job.pp - 1:
                p2p(step, "send", pp_i + 1, "send_forward")
        for m in range(job.microbatches):
            if pp_i < job.pp - 1:
                p2p(step, "recv", pp_i + 1, "recv_backward")
            for _ in range(job.layers):
                if job.tp > 1:
                    coll(step, tp, "all_gather", 4 * _H, "mlp_backward")
                    coll(step, tp, "reduce_scatter", 4 * _H, "attention_backward")
            if pp_i > 0:
                p2p(step, "send", pp_i - 1, "send_backward")
        if job.dp > 1:
            coll(step, g["dp"], "all_reduce", 16 * _H, "grad_all_reduce", "Float")
        coll(step, g["default_pg"], "all_reduce", 1, "loss_all_reduce", "Float")
    return ops


def fault_index(job: Job, ops: list[Op]) -> int:
    """Index in the faulty rank's schedule of the op the fault hits."""
    step = job.fault.step if job.fault.step >= 0 else job.steps - 1
    want = {"tp": ("tp",), "p2p": ("pp",), "dp": ("dp", "default_pg")}[job.fault.phase]
    for i, op in enumerate(ops):
        if (op.step == step and op.group.desc in want
                and (job.fault.phase != "p2p" or op.parts[0].name.startswith("send"))):
            return i
    raise ValueError(f"fault phase {job.fault.phase!r} has no op at step {step} on rank {job.fault.rank}")


T0 = 1_700_000_000_000_000_000


OP_NS = 3_000_000


def step_length_ns(job: Job) -> int:
    return 2 * job.microbatches * (2 * job.layers + 2) * OP_NS + 4 * OP_NS


def pieces_per_step(template: list[Op]) -> int:
    return sum(len(op.parts) + 1 if op.is_p2p else 1 for op in template)
