"""Column names, Polars schemas and closed vocabularies shared by every stage.

Every frame that crosses a module boundary has a schema here; tests check `collect_schema()` against it.
"""

from __future__ import annotations

import polars as pl

from flightrec.model.vocab import DISAGREEMENTS, MatchStatus, PairStatus

REPORT_VERSION = 2
# bumped whenever reading a file gives another table (12: which reader read each file, and why not the fast one)
CACHE_FORMAT_VERSION = 12

# Recorder versions we have read the writer for. Newer ones load with a warning (known keys only).
# "1.0" is our name for torch 2.2's unversioned bare list of entries.
KNOWN_DUMP_VERSIONS = (
    "1.0", "1.1", "1.2", "1.3", "1.4", "1.5",
    "2.0", "2.1", "2.2", "2.3", "2.4", "2.5", "2.6", "2.7", "2.8", "2.9", "2.10",
)

# Normalized collective names. The raw text stays in `profiling_name`.
OPS = (
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all",
    "barrier", "gather", "scatter", "send", "recv", "coalesced", "all_reduce_coalesced",
    "all_gather_coalesced", "reduce_scatter_coalesced",
    # uneven all_gather / reduce_scatter as the hook and torchcomms writers name them: members' inputs (outputs)
    # legitimately differ
    "all_gather_v", "reduce_scatter_v",
    # torchcomms' one tensor-less entry for a batch of sends and receives (`batch_op_issue`)
    "p2p_batch",
    "split", "new_window", "unknown",
)
# Point-to-point ops: never matched as collectives (torchcomms writes them with is_p2p False)
P2P_OPS = ("send", "recv", "p2p_batch")
# `peer_local` of a receive from any source (`recv 1<-?`, the c10d hook writer's spelling)
ANY_SOURCE = -1
# The NCCL watchdog stamps the "discovered" start and completion times when it next polls, every
# kWatchdogThreadSleepMillis (FlightRecorder::retire_id / update_state): they are up to this late.
WATCHDOG_POLL_MS = 100.0
STATES = ("scheduled", "started", "completed", "unknown")
FORMATS = ("pickle", "json")

Op = pl.Enum(list(OPS))
State = pl.Enum(list(STATES))
Format = pl.Enum(list(FORMATS))

# Tensor shapes, dtypes and the raw profiling name repeat a lot: categoricals keep them one integer a row.
Text = pl.Categorical()
# A process group's identity (see GROUPS): categorical, since every stage groups and joins on it.
GroupId = pl.Categorical()

# Backends whose recorder marks entries completed (CUDA/XPU events). Gloo's never does.
COMPLETION_BACKENDS = ("nccl", "ncclx", "xccl", "rccl", "rcclx", "hccl", "mccl", "nccl2")


def reports_completion(backend: pl.Expr) -> pl.Expr:
    """A dump's `backend` ("nccl", "gloo", "nccl,gloo": from its entries' names) includes one whose recorder
    marks entries completed."""
    return backend.fill_null("").str.split(",").list.eval(pl.element().is_in(COMPLETION_BACKENDS)).list.any()


def ran_collectives(pg_status: pl.DataFrame) -> pl.DataFrame:
    """(rank, _ran): the rank's pg_status counts an enqueued collective in some group."""
    return pg_status.group_by("rank").agg((pl.col("last_enqueued").max() > 0).alias("_ran"))


# The dump problem (prefix) meaning its newest entries are lost (written last): how far the rank got is unknown.
TRUNCATED = "truncated file"

DUMPS = pl.Schema({
    "rank": pl.Int64,
    "host": pl.String,
    "path": pl.String,
    "format": Format,
    "version": pl.String,
    "backend": pl.String,
    "comm_lib_version": pl.String,
    "entry_count": pl.Int64,
    "wrapped": pl.Boolean,       # holds part of the rank's history: older entries rolled out or left out (load)
    "only_active": pl.Boolean,   # the job's writer kept only unfinished entries (TORCH_INCLUDE_ONLY_ACTIVE)
    "problems": pl.List(pl.String),
    "writer": pl.Enum(["pytorch", "c10d_hook", "torchcomms"]),   # who wrote it (`writers`)
    "mtime_ns": pl.Int64,        # the file's modification time (`dump_times`: when it was written, if kept)
    "unreadable": pl.Boolean,    # the file is there and could not be read (permissions, an I/O error): not refused
    "reader": pl.String,         # what read it: "fast" (the compiled reader), "unpickler", "json"; null if refused
    "fast_reader_declined": pl.String,   # why the fast reader left it to the unpickler, where it did
})

# Folders under the dump folder that could not be listed, or shards that could not be read: any dumps in them
# were not read. `ranks`: theirs where known (a shard's manifest lists them), else null: any missing rank's
UNLISTED = pl.Schema({"path": pl.String, "reason": pl.String, "ranks": pl.List(pl.Int64)})

ENTRIES = pl.Schema({
    "rank": pl.Int64,
    "pg_name": Text,              # few distinct values over millions of rows: categorical, like every text here
    "pg_desc": Text,
    "pg_id": pl.Int64,            # local process-group id on this rank
    "record_id": pl.Int64,        # per process, shared by all groups: never compare across ranks
    "collective_seq_id": pl.Int64,
    "p2p_seq_id": pl.Int64,
    "op_id": pl.Int64,
    "op": Op,
    "profiling_name": Text,
    "is_p2p": pl.Boolean,
    "peer": pl.Int64,             # global rank of the other end of a send/recv, else null
    "peer_local": pl.Int32,       # the same, group-local as written in profiling_name
    "state": State,
    "retired": pl.Boolean,
    "timeout_ms": pl.Int32,       # columns never joined on are as narrow as their values (31M rows at 16K ranks)
    "time_created_ns": pl.Int64,
    "time_started_ns": pl.Int64,  # null when the recorder did not see it
    "time_completed_ns": pl.Int64,
    "duration_ms": pl.Float32,
    "input_sizes": Text,          # canonical text like "[[1024, 8], [8]]": equal shapes compare equal
    "output_sizes": Text,
    "input_dtypes": Text,
    "output_dtypes": Text,
    "input_numel": pl.Int64,
    "output_numel": pl.Int64,
    "thread_id": Text,
    "thread_name": Text,
    "stack_id": pl.UInt64,        # into `stacks`; null when the dump has no frames
})

FRAME = pl.Struct({"name": pl.String, "filename": pl.String, "line": pl.Int64})
STACKS = pl.Schema({"stack_id": pl.UInt64, "frames": pl.List(FRAME)})

# One row per (rank, process group) as that rank's pg_config declares it. `ranks_key` points into `groups`.
MEMBERSHIPS = pl.Schema({
    "rank": pl.Int64,
    "pg_name": pl.String,
    "pg_desc": pl.String,
    "ranks_key": pl.UInt64,
    "group": GroupId,
})

# One row per distinct process group: name plus member set (split groups reuse names).
GROUPS = pl.Schema({
    "group": GroupId,           # stable identity: "<name>" or "<name>#<n>" when a name has several member sets
    "pg_name": pl.String,
    "pg_desc": pl.String,
    "size": pl.Int64,
    "ranks": pl.List(pl.Int64),
    "source": pl.Enum(["pg_config", "inferred"]),
})

MEMBERS = pl.Schema({"group": GroupId, "rank": pl.Int64, "local_rank": pl.Int64})

PG_STATUS = pl.Schema({
    "rank": pl.Int64,
    "pg_id": pl.Int64,
    "last_enqueued": pl.Int64,
    "last_started": pl.Int64,
    "last_completed": pl.Int64,
})

# The raw per-file group table a reader emits; `load` turns it into MEMBERSHIPS and GROUPS.
RAW_PG_CONFIG = pl.Schema({
    "rank": pl.Int64,
    "pg_name": pl.String,
    "pg_desc": pl.String,
    "ranks_key": pl.UInt64,
})
# Distinct `ranks` strings of pg_config, once each (the world group's is the same on every rank).
RANK_LISTS = pl.Schema({"ranks_key": pl.UInt64, "ranks_text": pl.String})


def empty(schema: pl.Schema) -> pl.DataFrame:
    return pl.DataFrame(schema=schema)


def conform(frame: pl.DataFrame, schema: pl.Schema) -> pl.DataFrame:
    """Select and cast `frame` to exactly `schema` (missing columns become nulls)."""
    columns = [
        (pl.col(name) if name in frame.columns else pl.lit(None)).cast(dtype).alias(name)
        for name, dtype in schema.items()
    ]
    return frame.select(columns)


# ---------------------------------------------------------------------------------------------- matching

MATCH_STATUSES = tuple(s.value for s in MatchStatus)   # (worst first: `classify` keeps a collective's worst)
MatchStatusType = pl.Enum(list(MATCH_STATUSES))
MISMATCH_STATUSES = tuple(s.value for s in DISAGREEMENTS)   # (a rank did something else, not just waiting)

# One row per (group, member rank), every member, dumped or not.
PROGRESS = pl.Schema({
    "group": GroupId,
    "rank": pl.Int64,
    "has_dump": pl.Boolean,
    "tracks_completion": pl.Boolean,   # the rank's recorder reports completion (NCCL); Gloo never does
    "first_seq": pl.Int64,             # oldest collective seq of this group still in the rank's buffer
    "last_enqueued": pl.Int64,         # null: unknown (no dump, or the buffer lost every entry of the group)
    "last_completed": pl.Int64,
    "last_op": Op,
    "last_state": State,
    "frontier": pl.Int64,              # the furthest any member got in this group
    "behind": pl.Int64,                # frontier - last_enqueued
    "pending_seq": pl.Int64,           # first collective this rank enqueued and has not completed (NCCL)
    # a member whose dump can't say how far it got (none, or cut short): the newest collective it provably
    # enqueued here, as a member completed it (all joined), by its newest entry kept or (NCCL, groups without
    # sends and receives) its pg_status counter: it joined what the others wait in up to there
    "enqueued_at_least": pl.Int64,
})

COLLECTIVES = pl.Schema({
    "group": GroupId,
    "collective_seq_id": pl.Int64,
    "op": Op,
    "size": pl.Int64,
    "n_present": pl.Int64,             # members with an entry for it
    "n_known": pl.Int64,               # members whose progress in the group is known
    "n_completed": pl.Int64,
    "n_tracking": pl.Int64,            # present members whose recorder reports completion
    "n_unretired": pl.Int64,           # present members without completion states whose entry is not retired
    "type_ok": pl.Boolean,
    "dtype_ok": pl.Boolean,
    "size_ok": pl.Boolean,
    "status": MatchStatusType,
})

DIVERGENCES = pl.Schema({
    "group": GroupId,
    "collective_seq_id": pl.Int64,
    "status": MatchStatusType,
    "op": Op,
    "ranks": pl.List(pl.Int64),        # the minority, or the members that did not join
    "majority": pl.String,             # what the others did (op, dtype or shape), for the message
    "minority": pl.String,
    "ambiguous": pl.Boolean,           # a tie or a 2-member group: no side can be blamed
    "peer_groups": pl.Int64,           # a tie settled by this many groups of the same kind, all doing `majority`
    "later_mismatches": pl.Int64,      # mismatched collectives after this one in the same group
})

P2P_OPS_SCHEMA = pl.Schema({
    "group": GroupId,
    "src": pl.Int64,
    "dst": pl.Int64,
    "ordinal": pl.Int64,               # k-th transfer src -> dst (in the window, or among pending ones)
    "send_rank": pl.Int64,
    "recv_rank": pl.Int64,
    "send_pending": pl.Boolean,
    "recv_pending": pl.Boolean,
    "send_record": pl.Int64,           # the entries' record ids (per rank: where in its program each end is)
    "recv_record": pl.Int64,
    "send_started": pl.Boolean,        # the end's GPU began it (NCCL timing on: `started`, or its batch's closer)
    "recv_started": pl.Boolean,
    "send_sizes": Text,
    "recv_sizes": Text,
    "status": pl.Enum([s.value for s in PairStatus]),
})


def of_a_kind(groups: pl.DataFrame) -> pl.DataFrame:
    """The inferred groups of a kind (pg_desc: tp, dp, ...) that covers the world: every rank in one group of
    it. Not the default group, nor groups of no kind (PyTorch's default desc "undefined", or none)."""
    return groups.filter((pl.col("source") == "inferred")
                         & ~pl.col("pg_desc").fill_null("").is_in(["", "default_pg", "undefined"]))
