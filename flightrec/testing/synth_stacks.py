"""Call stacks of the synthetic job's ops, outermost frame first.

Deeper than the 9-10 frames of the toy script in fixtures/writer_sharing: a training job's collective sits under
its loop, its pipeline schedule and the module calls down to the layer, then c10d's logging wrapper and the
collective itself (7-21 frames here). Depth matters to the benchmarks: every frame is a reference the
unpickler resolves and the reader walks.
"""

_LOOP = [("<module>", "pretrain_gpt.py", 412), ("pretrain", "training/training.py", 301),
         ("train", "training/training.py", 1190), ("train_step", "training/training.py", 640)]
_MODULE = [("_wrapped_call_impl", "torch/nn/modules/module.py", 1751),
           ("_call_impl", "torch/nn/modules/module.py", 1762)]
_SCHEDULE = _LOOP + [("forward_backward_pipelining_without_interleaving", "pipeline/schedules.py", 1402)]
_FORWARD = (_SCHEDULE + [("forward_step", "pipeline/schedules.py", 275)]
            + _MODULE + [("forward", "model/gpt_model.py", 264)]
            + _MODULE + [("forward", "model/transformer_block.py", 549)]
            + _MODULE + [("forward", "model/transformer_layer.py", 390)] + _MODULE)
_BACKWARD = _SCHEDULE + [("backward_step", "pipeline/schedules.py", 372),
                         ("backward", "torch/autograd/__init__.py", 353),
                         ("_engine_run_backward", "torch/autograd/graph.py", 824),
                         ("apply", "torch/autograd/function.py", 307)]
_C10D = [("wrapper", "torch/distributed/c10d_logger.py", 81)]
_ALL_GATHER = _C10D + [("all_gather_into_tensor", "torch/distributed/distributed_c10d.py", 3846)]
_REDUCE_SCATTER = _C10D + [("reduce_scatter_tensor", "torch/distributed/distributed_c10d.py", 4301)]
_ALL_REDUCE = _C10D + [("all_reduce", "torch/distributed/distributed_c10d.py", 2950)]
_BATCH_P2P = [("_communicate", "pipeline/p2p.py", 305)] + _C10D + [
    ("batch_isend_irecv", "torch/distributed/distributed_c10d.py", 2781)]

STACKS = {
    "attention_forward": _FORWARD + [("forward", "model/attention.py", 88),
                                     ("_all_gather", "model/parallel.py", 40)] + _ALL_GATHER,
    "mlp_forward": _FORWARD + [("forward", "model/mlp.py", 51),
                               ("_reduce_scatter", "model/parallel.py", 61)] + _REDUCE_SCATTER,
    "mlp_backward": _BACKWARD + [("backward", "model/mlp.py", 77),
                                 ("_all_gather", "model/parallel.py", 40)] + _ALL_GATHER,
    "attention_backward": _BACKWARD + [("backward", "model/attention.py", 120),
                                       ("_reduce_scatter", "model/parallel.py", 61)] + _REDUCE_SCATTER,
    "recv_forward": _SCHEDULE + [("recv_forward", "pipeline/schedule.py", 210)] + _BATCH_P2P,
    "send_forward": _SCHEDULE + [("send_forward", "pipeline/schedule.py", 230)] + _BATCH_P2P,
    "recv_backward": _SCHEDULE + [("recv_backward", "pipeline/schedule.py", 250)] + _BATCH_P2P,
    "send_backward": _SCHEDULE + [("send_backward", "pipeline/schedule.py", 270)] + _BATCH_P2P,
    "grad_all_reduce": _LOOP + [("step", "optim/optimizer.py", 33), ("all_reduce_grads", "model/ddp.py", 140)]
    + _ALL_REDUCE,
    "loss_all_reduce": _LOOP + [("train_step", "train.py", 312)] + _ALL_REDUCE,
}
