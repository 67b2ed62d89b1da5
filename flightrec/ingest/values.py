"""Writer values read as one type each: ints, floats, texts and shapes as any recorder version or writer
spells them (a wrong type reads as None), op names in our vocabulary, and the Arrow types of the columns."""

from __future__ import annotations

import functools
import hashlib
import math
import re
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from flightrec.model.schema import ANY_SOURCE

# Raw op names the writers emit (NCCL, Gloo, and older spellings) -> our vocabulary (schema.OPS).
_OP_ALIASES = {
    "all_reduce": "all_reduce", "allreduce": "all_reduce",
    "allreduce_coalesced": "all_reduce_coalesced", "all_reduce_coalesced": "all_reduce_coalesced",
    "all_gather": "all_gather", "allgather": "all_gather", "_allgather_base": "all_gather",
    "all_gather_into_tensor": "all_gather", "all_gather_base": "all_gather", "allgather_base": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather_coalesced", "allgather_coalesced": "all_gather_coalesced",
    "allgather_into_tensor_coalesced": "all_gather_coalesced",
    "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_coalesced",
    "reduce_scatter_coalesced": "reduce_scatter_coalesced",
    "all_to_all": "all_to_all", "alltoall": "all_to_all", "alltoall_base": "all_to_all",
    "all_to_all_single": "all_to_all",
    "broadcast": "broadcast", "reduce": "reduce", "gather": "gather", "scatter": "scatter",
    "barrier": "barrier", "send": "send", "recv": "recv", "coalesced": "coalesced",
    # spellings read from the 2.x writers
    "_all_gather_base": "all_gather", "all_gather_single": "all_gather",
    "reduce_scatter_single": "reduce_scatter",
    "all_to_all_v_single": "all_to_all", "all_reduce_barrier": "barrier", "_broadcast_oop": "broadcast",
    "_reduce_oop": "reduce", "all_reduce_sparse": "all_reduce", "sparse_all_reduce": "all_reduce",
    "recvanysource": "recv",
    # the c10d hook and torchcomms writers' names (research: PyTorch's hooks/FlightRecorderHook.cpp, torchcomms'
    # TorchCommHooks.hpp): the "_v" forms are uneven, their members' shapes differ by design
    "all_gather_v": "all_gather_v", "reduce_scatter_v": "reduce_scatter_v", "gather_single": "gather",
    "batch_op_issue": "p2p_batch", "split": "split", "new_window": "new_window",
}


# torch's dtype names -> the c10 ScalarType names the C++ writers record (`c10::toString`): PyTorch's analyzer
# tests write "float32", the profiler's CUPTI writer "torch.float32"; every C++ writer writes "Float".
_DTYPE_NAMES = {
    "float32": "Float", "float": "Float", "float64": "Double", "double": "Double", "float16": "Half",
    "half": "Half", "bfloat16": "BFloat16", "int8": "Char", "uint8": "Byte", "int16": "Short", "short": "Short",
    "int32": "Int", "int": "Int", "int64": "Long", "long": "Long", "bool": "Bool", "complex64": "ComplexFloat",
    "complex128": "ComplexDouble", "complex32": "ComplexHalf", "float8_e4m3fn": "Float8_e4m3fn",
    "float8_e5m2": "Float8_e5m2", "float8_e4m3fnuz": "Float8_e4m3fnuz", "float8_e5m2fnuz": "Float8_e5m2fnuz",
    "uint16": "UInt16", "uint32": "UInt32", "uint64": "UInt64",
}


def canonical_dtypes(joined: str | None) -> str | None:
    """'float32,torch.bfloat16' -> 'Float,BFloat16': a dtypes list (joined by ",") in the C++ writers' names."""
    if not joined:
        return joined
    return ",".join(_DTYPE_NAMES.get(d.strip().removeprefix("torch."), d) for d in joined.split(","))


_P2P_PEER = re.compile(r"(\d+)\s*(->|<-)\s*(\d+)")


_ANY_SOURCE = re.compile(r"\d+\s*<-\s*\?")


def normalize_op(profiling_name: str | None) -> tuple[str, int | None, str | None]:
    """'nccl:send 0->3' -> ('send', 3, 'nccl'): op, group-local peer, backend prefix."""
    if not isinstance(profiling_name, str) or not profiling_name:
        return "unknown", None, None
    backend, sep, rest = profiling_name.partition(":")
    if not sep:
        backend, rest = None, profiling_name
    word = rest.strip().split(" ", 1)[0].lower()
    op = _OP_ALIASES.get(word, "unknown")
    peer = None
    if op in ("send", "recv"):
        m = _P2P_PEER.search(rest)
        if m:
            peer = int(m.group(3))
        elif op == "recv" and _ANY_SOURCE.search(rest):
            peer = ANY_SOURCE
    return op, peer, backend


def as_int(v: Any) -> int | None:
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, float) and math.isfinite(v):
        return int(v)
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            return None
    return None


def as_float(v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def as_bool(v: Any) -> bool | None:
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return bool(v)
    if isinstance(v, str) and v.lower() in ("true", "false", "1", "0"):
        return v.lower() in ("true", "1")
    return None


def as_str(v: Any) -> str | None:
    if v is None:
        return None
    return v if isinstance(v, str) else str(v)




I64, I32, F64, STR, BOOL = pa.int64(), pa.int32(), pa.float64(), pa.string(), pa.bool_()


I32_MAX = 2**31 - 1


SIZES, STRS = pa.list_(pa.list_(I64)), pa.list_(STR)


def as_str_list(v: Any) -> list[str] | None:
    if isinstance(v, (list, tuple)):
        return [x if isinstance(x, str) else str(x) for x in v]
    if isinstance(v, str):
        # one dtype written as a bare string (PyTorch's analyzer tests: "float32"; "" for none), not a list
        return [v] if v else []
    return None


def text_as_characters(table: pa.Table) -> bool:
    """Arrow reads a bare string where a list of strings is expected as the list of its characters ("float32"
    -> f,l,o,a,t,3,2). The recorder writes one dtype per tensor, so a dtypes list longer or shorter than its
    sizes list is such a string (or a file that needs the careful, value-by-value way anyway)."""
    for dtypes, sizes in (("input_dtypes", "input_sizes"), ("output_dtypes", "output_sizes")):
        both = pc.and_(pc.is_valid(table[dtypes]), pc.is_valid(table[sizes]))
        differ = pc.not_equal(pc.list_value_length(table[dtypes]), pc.list_value_length(table[sizes]))
        if pc.any(pc.and_(both, differ)).as_py():
            return True
    return False


def as_sizes(v: Any) -> list[list[int]] | None:
    if not isinstance(v, (list, tuple)):
        return None
    try:
        out = [[int(d) for d in shape] for shape in v]
    except (TypeError, ValueError):
        return None
    return out if all(abs(d) < 2**63 for shape in out for d in shape) else None


def stack_hash(frames: list) -> int:
    text = repr([(f.get("name"), f.get("filename"), f.get("line")) if isinstance(f, dict) else f for f in frames])
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


@functools.lru_cache(maxsize=64)
def rank_list_key(ranks_text: str) -> int:
    """The content hash of a rank list. Every file of a chunk carries the world group's (~110 KB at 16K
    ranks): hashed once, then found by the string's own (cached) hash."""
    return int.from_bytes(hashlib.blake2b(ranks_text.encode(), digest_size=8).digest(), "little")
