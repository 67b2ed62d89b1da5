import importlib
import math
import os
import pickle
import warnings
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flightrec import LoadOptions, analyze, load
from flightrec.ingest.derive import _shape_columns
from flightrec.ingest.safe_read import loads_plain_pickle
from flightrec.model.schema import GROUPS, MEMBERS, PG_STATUS, STACKS
from flightrec.model.trace import DUMPS_WITH_LOADED, ENTRIES_WITH_GROUP, format_ranks
from flightrec.testing import synth

from .conftest import FIXTURES, recorded_cases


def test_schemas(make_job):
    out, _ = make_job(synth.Job(tp=2, pp=2, dp=2))
    trace = load(out)
    assert trace.entries.collect_schema() == ENTRIES_WITH_GROUP
    assert trace.dumps.collect_schema() == DUMPS_WITH_LOADED
    assert trace.groups.collect_schema() == GROUPS
    assert trace.members.collect_schema() == MEMBERS
    assert trace.pg_status.collect_schema() == PG_STATUS
    assert trace.stacks.collect_schema() == STACKS


def test_round_trip_values(make_job):
    """Every field the generator wrote comes back, typed, for one rank's entries."""
    out, _ = make_job(synth.Job(tp=2, pp=2, dp=1, steps=2))
    raw = loads_plain_pickle((out / "nccl_trace_rank_2").read_bytes())
    trace = load(out, LoadOptions(use_cache=False))
    mine = trace.entries.filter(pl.col("rank") == 2).sort("record_id")
    assert mine.height == len(raw["entries"])
    for e, row in zip(raw["entries"], mine.iter_rows(named=True)):
        assert (row["pg_name"], row["pg_desc"]) == e["process_group"]
        assert row["collective_seq_id"] == e["collective_seq_id"]
        assert row["p2p_seq_id"] == e["p2p_seq_id"]
        assert row["profiling_name"] == e["profiling_name"]
        assert row["state"] == e["state"]
        assert row["time_started_ns"] == e["time_discovered_started_ns"]
        assert row["time_completed_ns"] == e["time_discovered_completed_ns"]
        assert row["duration_ms"] == (None if e.get("duration_ms") is None else pytest.approx(e["duration_ms"], rel=1e-6))
        assert row["input_sizes"] == repr(e["input_sizes"])
        assert row["input_numel"] == sum(math.prod(s) for s in e["input_sizes"])
    # stage 1 of the pipeline receives from stage 0: group-local '1<-0' maps to global rank 0
    recv = mine.filter(pl.col("op") == "recv").row(0, named=True)
    assert (recv["peer_local"], recv["peer"]) == (0, 0)
    frames = trace.stacks.filter(pl.col("stack_id") == mine["stack_id"][0])["frames"][0]
    assert frames[0]["filename"].endswith(".py")


def test_json_dump_loads_like_pickle(make_job):
    job = synth.Job(tp=2, pp=1, dp=2)
    p_dir, _ = make_job(job)
    j_dir, _ = make_job(job, fmt="json")
    cols = ["rank", "group", "collective_seq_id", "op", "state", "input_sizes", "time_completed_ns"]
    a = load(p_dir).entries.select(cols)
    b = load(j_dir).entries.select(cols)
    assert a.equals(b)
    assert load(j_dir).dumps["format"].to_list() == ["json"] * 4


@pytest.mark.parametrize("version", ["2.4", "2.7", "2.9", "2.10"])
def test_recorder_versions(make_job, version):
    out, _ = make_job(synth.Job(tp=2, pp=1, dp=1, version=version))
    trace = load(out)
    assert trace.dumps["version"].to_list() == [version] * 2
    has_threads = trace.entries["thread_name"].is_not_null().any()
    assert has_threads == (version in ("2.9", "2.10"))
    assert trace.dumps["comm_lib_version"].is_not_null().all() == (version != "2.4")


def test_unknown_newer_version_warns_and_loads(make_job):
    out, _ = make_job(synth.Job(tp=2, pp=1, dp=1, version="2.99"))
    with pytest.warns(UserWarning, match="newer than this flightrec knows"):
        trace = load(out)
    assert trace.entries.height > 0


def test_gzip_and_per_host_folders(make_job):
    out, _ = make_job(synth.Job(tp=2, pp=2, dp=2, ranks_per_host=4), per_host_folders=True, compress=True)
    trace = load(out)
    assert trace.hosts == {r: f"node{r // 4:05d}" for r in range(8)}


def test_ring_buffer_wrap_is_flagged(make_job):
    out, _ = make_job(synth.Job(tp=2, pp=1, dp=1, steps=5, buffer_size=10))
    trace = load(out)
    assert trace.dumps["wrapped"].all()
    assert trace.entries.group_by("rank").len()["len"].to_list() == [10, 10]


def test_missing_rank_and_world_size(make_job):
    out, _ = make_job(synth.Job(tp=2, pp=1, dp=2, fault=synth.Fault(kind="missing_dump", rank=3)))
    trace = load(out)
    assert trace.world_size == 4
    assert trace.missing_ranks == [3]


def test_cache_is_used_and_invalidated(make_job, tmp_path, monkeypatch):
    out, _ = make_job(synth.Job(tp=2, pp=1, dp=1))
    opts = LoadOptions(cache_dir=tmp_path / "c")
    first = load(out, opts)
    assert len(list((tmp_path / "c").rglob("entries/*.arrow"))) == len(first.entries.columns) - 1   # (+ group)
    with monkeypatch.context() as patched:   # the second load must not parse a single dump
        patched.setattr(importlib.import_module("flightrec.ingest.load"), "_parse_all", lambda *a, **k: pytest.fail("parsed despite the cache"))
        second = load(out, opts)
    for name in ("entries", "dumps", "stacks", "groups", "members", "pg_status"):
        a, b = getattr(first, name), getattr(second, name)
        assert a.schema == b.schema and a.equals(b), name
    assert all(n == 1 for n in second.entries.n_chunks("all"))
    # a changed dump must not be served from the cache
    path = out / "nccl_trace_rank_1"
    dump = loads_plain_pickle(path.read_bytes())
    dump["entries"] = dump["entries"][:3]
    path.write_bytes(pickle.dumps(dump))
    assert load(out, opts).entries.filter(pl.col("rank") == 1).height == 3


def test_refused_file_is_reported_not_fatal(make_job):
    out, _ = make_job(synth.Job(tp=2, pp=1, dp=2))
    (out / "nccl_trace_rank_2").write_bytes(b"\x80\x02garbage")
    with pytest.warns(UserWarning, match="rank 2"):
        trace = load(out)
    assert trace.missing_ranks == [2]
    assert "refused" in trace.summary()


@pytest.mark.parametrize("case", recorded_cases() + ["healthy_json", "skip_collective_json"])
def test_every_recorded_fixture_loads(case):
    if not (FIXTURES / case).is_dir():
        pytest.skip(f"{case} not recorded")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trace = load(FIXTURES / case)
    assert trace.entries.height > 0
    assert set(trace.dumps["backend"].drop_nulls().to_list()) == {"gloo"}
    assert trace.entries["group"].is_not_null().all()


def test_format_ranks():
    assert format_ranks([0, 1, 2, 3, 7, 9, 10]) == "0-3, 7, 9-10"
    assert format_ranks(range(0, 100, 2), limit=3).endswith("(50 ranks)")


def _old_entry(rank, seq, **extra):
    e = {"pg_id": 0, "seq_id": seq, "profiling_name": "nccl:all_reduce", "input_sizes": [[8]],
         "output_sizes": [[8]], "state": "completed", "retired": True, "frames": []}
    e.update(extra)
    return e


def test_torch_2_2_bare_list_dumps(tmp_path):
    """torch 2.2 pickled a bare list of entries: no version, seq_id, microsecond timestamps."""
    for rank in (0, 1):
        entries = [_old_entry(rank, s, time_created_us=1_700_000_000_000_000 + s) for s in (1, 2)]
        (tmp_path / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(entries, protocol=2))
    trace = load(tmp_path)
    assert trace.dumps["version"].to_list() == ["1.0", "1.0"]
    e = trace.entries.filter(pl.col("rank") == 0)
    assert e["collective_seq_id"].to_list() == [1, 2]
    assert e["time_created_ns"].to_list() == [1_700_000_000_000_001_000, 1_700_000_000_000_002_000]
    assert e["group"].to_list() == ["0", "0"]


def test_narrow_columns_clamp_out_of_range_values(tmp_path):
    """timeout_ms and peer_local are stored as int32: a value past it is clamped or nulled, never an error;
    a missing one stays null."""
    entries = [_old_entry(0, 1, timeout_ms=10**13, duration_ms=1.25),
               _old_entry(0, 2, timeout_ms=600_000, profiling_name="nccl:send 0->99999999999", input_sizes=[[8]]),
               _old_entry(0, 3)]   # no timeout recorded: stays null
    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps({"version": "2.4", "entries": entries}, protocol=2))
    e = load(tmp_path, LoadOptions(use_cache=False)).entries.sort("collective_seq_id")
    assert e["timeout_ms"].to_list() == [2**31 - 1, 600_000, None]
    assert e["peer_local"].to_list() == [None, None, None]
    assert e["duration_ms"].to_list()[0] == 1.25


def test_recorder_1_4_pg_config_lists(tmp_path):
    """'1.4' (torch 2.3): pg_config is {pg_id: [ranks]}, entries carry seq_id and record_id, no process_group."""
    for rank in (0, 1, 2):
        dump = {"version": "1.4", "pg_config": {0: [0, 1, 2]},
                "entries": [_old_entry(rank, s, record_id=s - 1, op_id=s, time_created_ns=10 + s) for s in (1, 2, 3)
                            if not (rank == 2 and s == 3)]}
        (tmp_path / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(dump, protocol=2))
    trace = load(tmp_path)
    assert trace.groups.select("group", "size").rows() == [("0", 3)]
    from flightrec import analyze
    report = analyze(tmp_path)
    assert report.culprits["ranks"] == [2] and report.root_causes[0].collective_seq_id == 3


@pytest.mark.parametrize("gathered", [True, False])
@pytest.mark.parametrize("spill", [False, True])
@pytest.mark.parametrize("use_cache", [False, True])
def test_worker_batches_come_back_as_one_chunk(make_job, tmp_path, monkeypatch, use_cache, spill, gathered):
    """Workers hand over one batch of entries each; the trace holds one chunk per column (gathered as they
    come; or, from big input, read back from the cache or a spool file when big, copied in memory when small),
    with the same rows as in-process."""
    monkeypatch.setattr(importlib.import_module("flightrec.ingest.load"), "SPILL_BYTES", 0 if spill else 1 << 60)
    monkeypatch.setattr(importlib.import_module("flightrec.ingest.pool"), "ONE_CHUNK_MAX_INPUT",
                        1 << 60 if gathered else 0)
    out, _ = make_job(synth.Job(tp=2, pp=2, dp=4, steps=3))
    pooled = load(out, LoadOptions(use_cache=use_cache, cache_dir=tmp_path / "cache", workers=2))
    assert set(pooled.entries.n_chunks("all")) == {1}
    in_process = load(out, LoadOptions(use_cache=False, workers=1))
    assert pooled.entries.equals(in_process.entries)
    if use_cache:   # and the warm load reads the same one chunk
        warm = load(out, LoadOptions(use_cache=True, cache_dir=tmp_path / "cache", workers=2))
        assert set(warm.entries.n_chunks("all")) == {1} and warm.entries.equals(in_process.entries)


def test_a_reused_group_name_means_the_group_its_rank_declared(make_job):
    """Two groups with one name but different members (split groups reuse names): each rank's entries go to
    the group it declared, name#1 or name#2, not to one of them by name."""
    out, _ = make_job(synth.Job(tp=2, pp=1, dp=2, steps=2))
    for path in out.iterdir():   # our own synthetic files: rename both tp groups to "tp"
        dump = loads_plain_pickle(path.read_bytes())
        tp = next(k for k, v in dump["pg_config"].items() if v["desc"] == "tp")
        dump["pg_config"]["tp"] = dict(dump["pg_config"].pop(tp), name="tp")
        for e in dump["entries"]:
            if e["process_group"][0] == tp:
                e["process_group"] = ("tp", "tp")
        path.write_bytes(pickle.dumps(dump))
    trace = load(out, LoadOptions(use_cache=False))
    declared = trace.memberships.filter(pl.col("pg_name") == "tp").select("rank", "group")
    assert sorted(declared["group"].cast(pl.String).unique().to_list()) == ["tp#1", "tp#2"]
    used = trace.entries.filter(pl.col("pg_name") == "tp").select("rank", "group").unique()
    assert used.sort("rank").equals(declared.sort("rank"))
    report = analyze(out, use_cache=False)
    assert report.verdict == "healthy", report.summary


_dims = st.lists(st.one_of(st.integers(-2**40, 2**40), st.integers(0, 4), st.none()), max_size=4)
_sizes = st.one_of(st.none(), st.lists(st.one_of(_dims, st.none()), max_size=3))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(_sizes, st.sampled_from([[[1024, 8], [8]], [[8]], [], [[]]])), max_size=40),
       st.integers(0, 5))
def test_shape_text_and_numel_are_what_python_prints_and_counts(values, cut):
    """Entries are told apart by a hash of their dims; each gets exactly Python's text of its list (null when
    any part is null) and its element count (null past int64: a hostile file's dims), whatever the nesting,
    and in a sliced chunk too."""
    arr = pa.chunked_array([pa.array(values, type=pa.list_(pa.list_(pa.int64())))]).slice(min(cut, len(values)))
    text, numel = _shape_columns(arr)
    want = [None if v is None or any(t is None or None in t for t in v) else v for v in values[min(cut, len(values)):]]
    assert text.to_pylist() == [None if v is None else str(v) for v in want]
    counts = [None if v is None else sum(math.prod(t) for t in v) for v in want]
    assert numel.to_pylist() == [n if n is not None and -2**63 <= n < 2**63 else None for n in counts]


def test_shapes_sharing_a_hash_still_get_their_own_text(monkeypatch):
    """The hash only proposes: with one that makes every shape collide, each entry is checked against its
    group's first entry and gets its own shape by value (a crafted file can make hashes collide)."""
    from flightrec.ingest import derive

    monkeypatch.setattr(derive, "_segment_hash", lambda values, lengths: np.zeros(len(lengths), np.uint64))
    values = [[[1, 2471, 1622, 1, 1]], [[59, 1, 1, 2627, 1776]], [[8]], [[8], [8]], [], [[]], None, [[8]], [[2, 4]]]
    text, numel = _shape_columns(pa.chunked_array([pa.array(values, type=pa.list_(pa.list_(pa.int64())))]))
    assert text.to_pylist() == [None if v is None else str(v) for v in values]
    assert numel.to_pylist() == [None if v is None else sum(math.prod(t) for t in v) for v in values]


@pytest.mark.parametrize("at", [1, 999, 1000, 65_536, 65_537, 131_073, 299_999])
def test_the_rank_and_record_order_check_finds_one_step_back_anywhere(at):
    """The check runs in the streaming engine, a morsel at a time: a step back at a morsel's edge counts too."""
    check = importlib.import_module("flightrec.ingest.assemble")._sorted_by_rank_and_record
    rank, record = np.repeat(np.arange(300), 1000), np.tile(np.arange(1000), 300)
    assert check(pl.DataFrame({"rank": rank, "record_id": record}))
    if record[at] == 0:
        rank = rank.copy()
        rank[at] -= 2   # a rank that goes back
    else:
        record = record.copy()
        record[at] = record[at - 1] - 1   # a record that goes back within its rank
    assert not check(pl.DataFrame({"rank": rank, "record_id": record}))


@pytest.mark.parametrize("bad", [dict(world_size=0), dict(workers=0), dict(reader="bogus"), dict(ranks_per_host=0)])
def test_the_api_refuses_a_bad_option_as_the_command_line_does(bad):
    """world_size=0 read as "not given" and reported a faulty job healthy; the others were silently taken."""
    from flightrec.errors import FlightrecError

    with pytest.raises(FlightrecError, match=next(iter(bad))):
        analyze(FIXTURES / "skip_collective", use_cache=False, **bad)


def test_the_api_refuses_options_and_keywords_together():
    from flightrec.api import AnalyzeOptions
    from flightrec.errors import FlightrecError

    with pytest.raises(FlightrecError, match="not both"):
        analyze(FIXTURES / "skip_collective", AnalyzeOptions(), world_size=4)


def test_the_api_names_the_options_it_knows_when_given_one_it_does_not():
    """hosts= (for hosts_file=) raised a bare TypeError from a dataclass."""
    from flightrec.errors import FlightrecError

    with pytest.raises(FlightrecError, match="unknown option hosts; known: .*hosts_file"):
        analyze(FIXTURES / "skip_collective", hosts="hosts.csv")


def test_without_the_default_groups_config_a_refused_top_rank_still_counts(make_job):
    """No dump lists the default group (only tp/pp/dp subgroups of 2), and rank 7's file is junk. The largest
    subgroup (2) was taken for a declared world: the refused rank 7 dropped out, 'HEALTHY: all 7 ranks agree',
    and a right --world-size 8 was warned about (diff review helper). The tp group [6, 7] names rank 7."""
    out, _ = make_job(synth.Job(tp=2, pp=2, dp=2))
    for path in out.iterdir():
        dump = loads_plain_pickle(path.read_bytes())
        dump["pg_config"] = {k: v for k, v in dump["pg_config"].items() if v.get("desc") != "default_pg"}
        path.write_bytes(pickle.dumps(dump))
    (out / "nccl_trace_rank_7").write_bytes(b"\x80\x04junk")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        report = analyze(out, use_cache=False, world_size=8)
    assert report.trace.world_size == 8 and report.dumps.missing_ranks == [7], report.to_text()
    assert report.verdict != "healthy"
    assert not [w for w in said if "declares a world" in str(w.message)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert analyze(out, use_cache=False).trace.world_size == 8


def test_a_missing_host_is_named_when_every_known_host_has_a_hole_too():
    """Hosts of 8 ranks: node00000 down (no dump), node00001 and node00002 each missing one dump. The most ranks
    a host showed (7) was taken for the block size, matched nothing, and the whole host down was named rank by
    rank with no host."""
    from flightrec.model.topology import _fill_missing_hosts

    known = {r: f"node{r // 8:05d}" for r in range(8, 24) if r not in (14, 17)}
    filled = _fill_missing_hosts(known, 24)
    assert [filled[r] for r in (0, 7, 14, 17)] == ["node00000", "node00000", "node00001", "node00002"]


def test_the_workers_row_tables_are_the_arrow_twins_of_the_raw_frames():
    """Workers send groups and statuses as Arrow tables (`normalize.rows_table`), which the parent reads as
    the raw frames: the two schemas must agree column for column, type for type."""
    from flightrec.ingest.normalize import PG_CONFIG_ROWS, PG_STATUS_ROWS
    from flightrec.model.schema import PG_STATUS, RAW_PG_CONFIG

    assert pl.from_arrow(PG_CONFIG_ROWS.empty_table()).schema == RAW_PG_CONFIG
    assert pl.from_arrow(PG_STATUS_ROWS.empty_table()).schema == PG_STATUS


def test_chunks_cover_the_files_in_rank_order_and_shrink_towards_the_end():
    """The pool's chunks (`pool._chunks`): every file once, in order; none over CHUNK_BYTES (a bigger file
    alone); towards the end each at most 1 / (2 x workers) of what is left, down to TAIL_BYTES, so the workers
    finish together."""
    from pathlib import Path

    from flightrec.ingest import pool
    from flightrec.model.trace import DumpFile

    mb = 1 << 20
    sizes = [mb] * 700 + [pool.CHUNK_BYTES * 2] + [mb // 2] * 300
    files = [DumpFile(path=Path(f"r{i}"), rank=i, host=None, size=s, mtime_ns=0) for i, s in enumerate(sizes)]
    chunks = pool._chunks(files, 16, workers=2)
    assert [rank for chunk in chunks for _, rank in chunk] == list(range(len(files)))
    held = [sum(sizes[rank] for _, rank in chunk) for chunk in chunks]
    assert all(h <= pool.CHUNK_BYTES or len(c) == 1 for h, c in zip(held, chunks))
    left = sum(sizes)
    for h, chunk in zip(held, chunks):
        if len(chunk) > 1:   # (a chunk ends before the file that would take it past its share of what is left)
            assert h - sizes[chunk[-1][1]] < max(min(pool.CHUNK_BYTES, left // 4), pool.TAIL_BYTES)
        left -= h
    assert held[-2] < held[0] / 4 and held[-2] >= pool.TAIL_BYTES


def test_a_worker_reads_its_files_a_batch_at_a_time(tmp_path):
    """`pool._read_batches`: pickles in order, in batches under the limit (a bigger file alone), laid end
    to end in one buffer, each read as its batch is taken; a gzipped pickle joins them unzipped; JSON and
    unreadable files are left aside, with their bytes or None."""
    import gzip

    from flightrec.ingest import pool

    contents = [b"\x80" + b"a" * 99, b"\x80" + b"b" * 99, b'{"entries": []}', b"\x80" + b"c" * 299,
                b"\x80" + b"d" * 49, b"\x80" + b"e" * 59]
    items = []
    for i, data in enumerate(contents):
        (tmp_path / f"rank_{i}").write_bytes(gzip.compress(data) if i == 5 else data)
        items.append((str(tmp_path / f"rank_{i}"), i))
    items.append((str(tmp_path / "rank_9"), 9))   # (no such file)
    left: dict = {}
    batches = pool._read_batches(items, 250, left)
    seen = []
    for batch, buffer, sizes in batches:
        ranks = [rank for _, rank in batch]
        assert bytes(buffer[:int(sizes.sum())]) == b"".join(contents[r] for r in ranks)   # (before the next)
        if not seen:
            # (read so far: up to the pickle that starts the next batch, not the rest of the chunk)
            assert ranks == [0, 1] and left == {items[2]: b'{"entries": []}'}
        seen.append(ranks)
    assert seen == [[0, 1], [3], [4, 5]]
    assert left == {items[2]: b'{"entries": []}', items[6]: None}


@pytest.mark.parametrize("case", ["healthy", "healthy_json", "skip_collective", "writer_sharing", "rolled_past_dp"])
@pytest.mark.parametrize("use_tape", [False, True])
def test_every_chunk_of_entries_has_the_one_derived_schema(case, use_tape):
    """The parent gathers the workers' chunks column by column (`one_chunk`): whatever a chunk held (JSON,
    pickles through either reader, recorder versions with columns absent), its entries have DERIVED_ENTRIES."""
    from flightrec.ingest import pool
    from flightrec.ingest.derive import DERIVED_ENTRIES
    from flightrec.ingest.discover import discover

    from .conftest import FIXTURES
    files = discover(FIXTURES / case, None)
    result = pool._parse_chunk([(str(f.path), f.rank) for f in files], None, use_tape)
    assert result["entries"].num_rows > 0 and result["entries"].schema.equals(DERIVED_ENTRIES)


@pytest.mark.parametrize("enabled", [True, False])
def test_the_garbage_collector_is_paused_while_loading_and_left_as_it_was(make_job, enabled, monkeypatch):
    """Loading and analysing pause the cyclic collector (full scans of every object, per file listed), and
    leave it as the caller had it."""
    import gc

    from flightrec import analyze
    seen = []
    real_parse = importlib.import_module("flightrec.ingest.load")._parse_all

    def parse_noting_gc(*args, **kwargs):
        seen.append(gc.isenabled())
        return real_parse(*args, **kwargs)

    monkeypatch.setattr(importlib.import_module("flightrec.ingest.load"), "_parse_all", parse_noting_gc)
    out, _ = make_job(synth.Job(tp=2, pp=1, dp=2, steps=2))
    (gc.enable if enabled else gc.disable)()
    try:
        load(out, LoadOptions(use_cache=False))
        assert gc.isenabled() is enabled
        analyze(out, use_cache=False)
        assert gc.isenabled() is enabled
    finally:
        gc.enable()
    assert seen == [False, False]


@pytest.mark.parametrize("gathered", [True, False])
def test_spool_files_are_in_memory_only_while_gathered(make_job, tmp_path, monkeypatch, gathered):
    """Gathered as they come, the chunks' spool files live in a memory-backed folder (removed with it); kept
    memory-mapped (big input), they stay on disk, where the system can evict their pages."""
    pool = importlib.import_module("flightrec.ingest.pool")
    memory = tmp_path / "shm"
    memory.mkdir()
    monkeypatch.setattr(pool, "MEMORY_SPOOL", str(memory))
    monkeypatch.setattr(pool, "MEMORY_SPOOL_MIN_FREE", 0)
    monkeypatch.setattr(pool, "ONE_CHUNK_MAX_INPUT", 1 << 60 if gathered else 0)
    gathered_from, real_gather = [], pool._gather
    monkeypatch.setattr(pool, "_gather", lambda table, entries: (gathered_from.append(entries),
                                                                       real_gather(table, entries)))
    out, _ = make_job(synth.Job(tp=2, pp=2, dp=4, steps=3))
    pooled = load(out, LoadOptions(use_cache=False, workers=2))
    if gathered:
        assert gathered_from and all(Path(p).parent.parent == memory for p in gathered_from)
    else:
        assert not gathered_from
    assert pooled.entries.equals(load(out, LoadOptions(use_cache=False, workers=1)).entries)
    assert list(memory.iterdir()) == []


def test_forking_the_pool_beside_idle_library_threads_warns_no_one(make_job, monkeypatch):
    """From Python 3.12, os.fork warns in a process that has threads, as the parent always has (Polars' and
    numpy's idle library threads): wherever such warnings are shown (the CLI did until this round, test
    runners, `-W default`), each load said twice that fork "may lead to deadlocks". That one is not passed on
    (`ingest.pool` says why the fork is safe). Emulated here by a fork that warns as 3.12's does, so that the
    test runs on any Python."""
    real_fork = os.fork

    def fork():
        warnings.warn(f"This process (pid={os.getpid()}) is multi-threaded, use of fork() may lead to deadlocks "
                      "in the child.", DeprecationWarning, stacklevel=2)
        return real_fork()

    monkeypatch.setattr(os, "fork", fork)
    out, _ = make_job(synth.Job(tp=2, pp=2, dp=4, steps=3))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        pooled = load(out, LoadOptions(use_cache=False, workers=2))
    assert pooled.dumps["loaded"].all() and pooled.dumps.height == 16
    assert [str(w.message) for w in seen if "fork()" in str(w.message)] == []


def test_a_spool_file_that_does_not_fit_goes_to_the_next_folder(tmp_path, monkeypatch):
    """A full memory-backed folder (ENOSPC part-way through) or a missing one: the file goes to the next
    folder, and no partial file is left behind."""
    pool = importlib.import_module("flightrec.ingest.pool")
    full, gone, disk = tmp_path / "full", tmp_path / "gone", tmp_path / "disk"
    full.mkdir()
    disk.mkdir()
    real_write = pool._write_arrow

    def write(table, path):
        if Path(path).parent == full:
            Path(path).write_bytes(b"ARROW1 partial")
            raise OSError(28, "No space left on device")
        return real_write(table, path)

    monkeypatch.setattr(pool, "_write_arrow", write)
    table = pa.table({"a": [1, 2, 3]})
    path = pool._spool_entries(table, "chunk0.arrow", [str(full), str(gone), str(disk)])
    assert Path(path) == disk / "chunk0.arrow" and list(full.iterdir()) == []
    with pa.memory_map(path) as source:
        assert pa.ipc.open_file(source).read_all().equals(table)
    with pytest.raises(OSError):
        pool._spool_entries(table, "chunk1.arrow", [str(gone)])


def test_no_memory_spool_where_the_folder_is_missing_or_short_of_room(tmp_path, monkeypatch):
    pool = importlib.import_module("flightrec.ingest.pool")
    monkeypatch.setattr(pool, "MEMORY_SPOOL", str(tmp_path))
    monkeypatch.setattr(pool, "MEMORY_SPOOL_MIN_FREE", 0)
    with pool._memory_spool() as folder:
        assert folder is not None and Path(folder).parent == tmp_path
    assert not Path(folder).exists()
    monkeypatch.setattr(pool, "MEMORY_SPOOL_MIN_FREE", 1 << 62)
    with pool._memory_spool() as folder:
        assert folder is None
    monkeypatch.setattr(pool, "MEMORY_SPOOL", str(tmp_path / "missing"))
    monkeypatch.setattr(pool, "MEMORY_SPOOL_MIN_FREE", 0)
    with pool._memory_spool() as folder:
        assert folder is None


def test_a_memory_spool_left_by_a_killed_run_is_removed_by_the_next(tmp_path, monkeypatch):
    """A run killed mid-parse leaves its spool folder in memory (held until reboot): the next run removes the
    folders whose process is gone, and leaves a live process's alone."""
    pool = importlib.import_module("flightrec.ingest.pool")
    monkeypatch.setattr(pool, "MEMORY_SPOOL", str(tmp_path))
    monkeypatch.setattr(pool, "MEMORY_SPOOL_MIN_FREE", 0)
    import subprocess
    import sys
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphan = tmp_path / f"flightrec-spool-{int(gone.stdout)}-abc"
    live = tmp_path / f"flightrec-spool-{os.getppid()}-def"
    other = tmp_path / "flightrec-spool-notapid"
    for folder in (orphan, live, other):
        folder.mkdir()
        (folder / "chunk0.arrow").write_bytes(b"x")
    with pool._memory_spool() as folder:
        assert Path(folder).name.startswith(f"flightrec-spool-{os.getpid()}-")
    assert not orphan.exists() and live.exists() and other.exists()


def test_rank_lists_parsed_together_read_as_one_at_a_time():
    """The one-call parse of every group's rank list gives what parsing each alone gives, bad ones included."""
    from flightrec.ingest.assemble import _parse_rank_lists

    def alone(texts):
        return [_parse_rank_lists([t])[0] if t is not None else None for t in texts]

    good = ["[3, 1, 2]", "[0]", "[]", "[" + ", ".join(map(str, range(64))) + "]"]
    assert _parse_rank_lists(good) == [[1, 2, 3], [0], [], list(range(64))]
    for bad in (["[1],[2", "3]"], ["[1, 2]", "x"], ["[1, 2]", None], ["[3, 1.5]", "[2]"], ["[true]", "[2]"],
                ["[1, [2]]", "[0]"], [' [1]', "[0]"], ['["a"]', "[0]"]):
        assert _parse_rank_lists(bad) == alone(bad), bad
    assert _parse_rank_lists(["[1],[2", "3]"]) == [None, None]


def test_op_and_state_become_enums_straight_from_their_codes_as_the_cast_made_them():
    """`_entries_frame` maps op and state's dictionary codes to the enums' own: the same frame as reading them
    as categoricals and casting, with chunks of different dictionaries, nulls, a slice and an all-null chunk;
    a text outside the enum still goes the cast's way, which names it."""
    from flightrec.ingest.raw_frames import _as_enum, _entries_frame
    from flightrec.model.schema import ENTRIES, Op, State, conform

    def chunk(states, ops):
        n = len(states)
        return pa.table({"rank": pa.array(range(n), pa.int64()),
                         "state": pa.array(states, pa.string()).dictionary_encode(),
                         "op": pa.array(ops, pa.string()).dictionary_encode()})

    first = chunk(["completed", None, "scheduled", "started"], ["all_gather", "send", None, "send"])
    second = chunk(["started", "started", "unknown", "completed", None], ["recv", None, "barrier", "recv", "send"])
    parts = [first, second.slice(1), chunk([None, None], [None, None])]

    def by_cast(tables):
        return conform(pl.from_arrow(pa.concat_tables(tables, promote_options="permissive"), rechunk=False), ENTRIES)

    together = pa.concat_tables(parts, promote_options="permissive")
    assert _as_enum(together.column("state"), State) is not None and _as_enum(together.column("op"), Op) is not None
    got = _entries_frame(parts)
    assert got.equals(by_cast(parts))
    assert got["state"].to_list() == ["completed", None, "scheduled", "started", "started", "unknown", "completed",
                                      None, None, None]
    assert got["op"].n_chunks() == got["rank"].n_chunks()   # (aligned chunks: `assemble` checks them)
    with pytest.raises(pl.exceptions.InvalidOperationError, match="cancelled"):
        _entries_frame([chunk(["cancelled"], ["send"])])


def test_op_and_p2p_flag_from_the_profiling_name_where_the_dump_lacks_them(tmp_path):
    """An entry's op comes from its profiling name ("unknown" with none, or none known), and `is_p2p`, where the
    recorder wrote none, from that op; a send or receive is point-to-point whatever the flag says (torchcomms
    writes False on every entry, its sends and receives included). Names of several backends for one op share
    its one value; old and new seq and time fields mix within a file."""
    entries = [_old_entry(0, 1, profiling_name="nccl:send 0->1", is_p2p=None),
               _old_entry(0, 2, profiling_name="gloo:send", is_p2p=None, time_created_ns=5_000),
               _old_entry(0, 3, profiling_name=None, is_p2p=None, time_created_us=7),
               _old_entry(0, 4, profiling_name="nccl:recv 1->0", is_p2p=False),
               _old_entry(0, 5, profiling_name="nccl:something_new", is_p2p=None, collective_seq_id=9)]
    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps({"version": "2.4", "entries": entries}, protocol=2))
    e = load(tmp_path, LoadOptions(use_cache=False)).entries.sort("record_id", "collective_seq_id")
    assert e["op"].to_list() == ["send", "send", "unknown", "recv", "unknown"]
    assert e["is_p2p"].to_list() == [True, True, False, True, False]
    assert e["collective_seq_id"].to_list() == [1, 2, 3, 4, 9]
    assert e["time_created_ns"].to_list() == [None, 5_000, 7_000, None, None]
