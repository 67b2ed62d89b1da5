"""The tape reader (optional, numba): the same columns as the unpickler's way, on every dump it takes; None
(the unpickler's way) on anything else; never a crash on a hostile file."""

import pickle
import random
import warnings

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flightrec import LoadOptions, load
from flightrec.ingest.derive import raw_derived
from flightrec.ingest.normalize import flatten_dump, merge_parts
from flightrec.ingest.safe_read import read_dump, read_dump_bytes
from flightrec.model.schema import KNOWN_DUMP_VERSIONS
from flightrec.testing import synth

from .conftest import FIXTURES

pytest.importorskip("numba")
from flightrec.ingest.fastpickle import (
    content_codes,
    entry_columns,
    graph,
    kernels,
    kinds,
    passes,
    tape,
    to_arrow,
    walker,
)

ALL_PICKLES = sorted(p for p in FIXTURES.rglob("*") if p.is_file() and p.read_bytes()[:1] == b"\x80")
# In the hand-built shape of PyTorch's analyzer tests (dtypes as bare strings, seq ids as strings): no writer's,
# so the tape reader declines them and the unpickler reads them (`test_the_tape_declines_what_no_writer_writes`)
NOT_A_WRITERS_SHAPE = sorted(FIXTURES.glob("torch_cases/analyzer_test_shape/*_rank_*"))
PICKLES = [p for p in ALL_PICKLES if p not in NOT_A_WRITERS_SHAPE]


def _same(want: dict, got: dict) -> None:
    """The same part, but that the tape reader gives texts as dictionaries of its own, shapes and lists of text
    as their text, where the unpickler gives strings and nested lists (`derive.raw_derived`): compared as the
    values they make."""
    assert got is not None
    assert set(got) == set(want)
    for key in want:
        if key == "entries" and want[key] is not None and want[key].num_rows == 0:
            # (a dump with no entry, as NVIDIA's only-active dumps of a rank that had nothing in flight: the
            # batch reader gives no table where the unpickler's way gives an empty one; both merge to nothing)
            assert got[key] is None or got[key].num_rows == 0
        elif key == "entries" and want[key] is not None:
            assert got[key] is not None
            assert _decoded(raw_derived(got[key])).equals(_decoded(raw_derived(want[key]))), key
        elif hasattr(want[key], "equals"):
            assert got[key].equals(want[key]), key
        elif key == "metas":   # (the same but for which reader read them, and why the fast one left a file)
            assert [_unread(m) for m in got[key]] == [_unread(m) for m in want[key]], key
        else:
            assert got[key] == want[key], key


def _but_reader(dumps):
    """The dumps' table without which reader read each file (the only columns two readers may differ in)."""
    return dumps.drop("reader", "fast_reader_declined")


def _unread(meta: dict) -> dict:
    return {k: v for k, v in meta.items() if k not in ("reader", "fast_reader_declined")}


def _decoded(table: pa.Table) -> pa.Table:
    for i, field in enumerate(table.schema):
        if pa.types.is_dictionary(field.type):
            table = table.set_column(i, field.name, table[field.name].cast(pa.string()))
    return table.select(sorted(table.column_names)).combine_chunks()   # (the tape's part adds the counts earlier)


@pytest.mark.parametrize("type_", [pa.int64(), pa.int32(), pa.float64(), pa.bool_(), pa.uint64()])
def test_masked_arrays_are_what_arrow_makes_of_a_mask(type_):
    """`derive.masked_array` (validity packed by numpy) against `pa.array(mask=)`: nulls where not present,
    no bitmap where none is null; a value that does not fit the type refused as Arrow refuses it."""
    from flightrec.ingest.derive import masked_array

    values = np.arange(1, 20) % 7
    values = values.astype(bool) if type_ == pa.bool_() else values
    for present in (values % 3 != 0, np.ones(len(values), bool), np.zeros(len(values), bool)):
        got = masked_array(values, type_, present)
        got.validate(full=True)
        assert got.equals(pa.array(values, type=type_, mask=~present))
        assert (got.buffers()[0] is None) == bool(present.all())
    if type_ == pa.int32():
        with pytest.raises(pa.ArrowInvalid):
            masked_array(np.array([2**40]), type_, np.array([True]))


def test_the_tape_declines_what_no_writer_writes():
    assert len(NOT_A_WRITERS_SHAPE) == 3
    for path in NOT_A_WRITERS_SHAPE:
        assert to_arrow.flatten_pickle(read_dump_bytes(path), 0) is None


def test_every_fixture_pickle_reads_the_same():
    assert len(PICKLES) >= 40
    for path in PICKLES:
        _same(flatten_dump(read_dump(path)[0], 5), to_arrow.flatten_pickle(read_dump_bytes(path), 5))


def test_passes_whose_first_table_fills_up_read_the_same_with_room_for_all(monkeypatch):
    """The open-addressing passes start with a small table (`kernels.FIRST_SLOTS`) and, once it is half full,
    run again with room for all: with a first table of two slots the passes of a batch of the fixtures run
    again, and the batch reads as flatten_dump reads it."""
    runs: list[str] = []
    compiled = kernels.compiled
    monkeypatch.setattr(kernels, "compiled", lambda name, fn, inline=None: (runs.append(name), compiled(name, fn, inline))[1])
    datas = [read_dump_bytes(p) for p in PICKLES]
    to_arrow.flatten_pickles(datas, list(range(len(datas))))   # (the default first table)
    first = list(runs)
    runs.clear()
    monkeypatch.setattr(kernels, "FIRST_SLOTS", 2)
    got, read = to_arrow.flatten_pickles(datas, list(range(len(datas))))
    assert len(read) > 30
    _same(merge_parts([flatten_dump(read_dump(PICKLES[i])[0], i) for i in read]), got)
    for name in ("text_codes", "sizes_codes", "frame_codes", "list_codes"):
        assert runs.count(name) > first.count(name), name   # (run again: the first table was too small)


@pytest.mark.parametrize("version", [v for v in KNOWN_DUMP_VERSIONS if v != "1.0"])
def test_every_recorder_version_reads_the_same(tmp_path, version):
    """Each version's field names and quirks (seq_id vs collective_seq_id, time_created_us, no threads...),
    timing on and off, with and without stacks, read through both ways in one batch."""
    paths = []
    for timing in (True, False):
        job = synth.Job(tp=2, pp=2, dp=2, steps=3, version=version, timing=timing, with_stacks=timing,
                        fault=synth.Fault(kind="not_joined") if timing else synth.Fault(kind="none"), seed=7)
        synth.generate(job, tmp_path / str(timing))
        paths += sorted(p for p in (tmp_path / str(timing)).rglob("*_rank_*") if p.is_file())[:4]
    got, read = to_arrow.flatten_pickles([read_dump_bytes(p) for p in paths], list(range(len(paths))))
    assert read == list(range(len(paths)))
    _same(merge_parts([flatten_dump(read_dump(path)[0], rank) for rank, path in enumerate(paths)]), got)


def test_a_batch_of_the_recorders_usual_dumps_is_read_by_array_passes(tmp_path, monkeypatch):
    """Not a file at a time (the fallback for older layouts): that path is made to fail here."""
    synth.generate(synth.Job(tp=2, pp=2, dp=2, steps=2, timing=False, fault=synth.Fault(kind="not_joined")), tmp_path)
    paths = sorted(p for p in tmp_path.rglob("*_rank_*") if p.is_file())
    want = merge_parts([flatten_dump(read_dump(path)[0], rank) for rank, path in enumerate(paths)])
    monkeypatch.setattr(to_arrow, "_one_file", None)
    got, read = to_arrow.flatten_pickles([read_dump_bytes(p) for p in paths], list(range(len(paths))))
    assert read == list(range(len(paths)))
    _same(want, got)


def test_a_file_the_tape_does_not_take_leaves_the_rest_of_its_batch():
    """A value of an unexpected type (a string record id): that file goes the unpickler's way, which notes
    the problem; the others in the batch are still read by the tape."""
    good = PICKLES[0].read_bytes()
    dump = pickle.loads(good)
    dump["entries"][0]["record_id"] = "seven"
    odd = pickle.dumps(dump, protocol=2)
    got, read = to_arrow.flatten_pickles([good, odd, good, b"\x80\x02junk"], [0, 1, 2, 3])
    assert read == [0, 2]
    _same(merge_parts([flatten_dump(pickle.loads(good), rank) for rank in (0, 2)]), got)


def _counted(fn, calls: list):
    def counted(*args):
        calls.append(args[:2])
        return fn(*args)
    return counted


def test_input_past_the_tables_int32_range_is_left_to_the_unpickler(monkeypatch):
    """Object ids and edge indexes are int32: a batch of more bytes than that holds (here made small) is
    declined whole, and the workers' way then reads its files with the unpickler, the same."""
    from flightrec.ingest import pool

    good = PICKLES[0].read_bytes()
    items = [(str(PICKLES[0]), 0), (str(PICKLES[0]), 1)]
    by_tape = merge_parts(pool._parse_with_tape(items))
    monkeypatch.setattr(walker, "_MAX_BYTES", 2 * len(good) - 1)
    joined, roots = walker.read_laid_out(good + good, np.array([len(good)] * 2, np.int64))
    assert joined is None and roots.tolist() == [-1, -1]
    assert walker.read(good) is not None
    assert to_arrow.flatten_pickles([good, good], [0, 1]) == (None, [])
    monkeypatch.setattr(pool, "_parse_one", _counted(pool._parse_one, calls := []))
    by_unpickler = merge_parts(pool._parse_with_tape(items))
    _same(by_tape, by_unpickler)
    assert len(calls) == 2   # (both files read by the unpickler, and said so)
    assert {m["reader"] for m in by_tape["metas"]} == {"fast"}
    assert [m["reader"] for m in by_unpickler["metas"]] == ["unpickler"] * 2
    assert all("more than 2 GiB" in m["fast_reader_declined"] for m in by_unpickler["metas"])


def test_each_file_of_a_batch_keeps_its_own_backends():
    """A batch mixing NCCL, Gloo and no entries at all (`_backends_per_file`): each file's backends as
    flatten_dump gives them, not the batch's."""
    dump = pickle.loads(PICKLES[0].read_bytes())
    gloo = pickle.loads(PICKLES[0].read_bytes())
    for i, entry in enumerate(gloo["entries"]):
        op = str(entry["profiling_name"]).split(":")[-1]
        entry["profiling_name"] = f"gloo:{op}" if i % 2 else f"nccl:{op}"
    dumps = [dump, gloo, dict(dump, entries=[]), dump]
    got, read = to_arrow.flatten_pickles([pickle.dumps(d, protocol=4) for d in dumps], [0, 1, 2, 3])
    assert read == [0, 1, 2, 3]
    _same(merge_parts([flatten_dump(d, rank) for rank, d in enumerate(dumps)]), got)
    assert len({m["backend"] for m in got["metas"]}) > 1


@pytest.mark.parametrize("field", ["pg_config", "pg_status"])
def test_a_group_set_twice_in_a_dumps_metadata_reads_as_its_last(field):
    """A pickle can set one key of pg_config or pg_status twice (Python keeps the last): the batch's array
    passes give way and the file reads as flatten_dump reads it."""
    dump = pickle.loads(PICKLES[0].read_bytes())
    first, second = ("groupAAA", "groupBBB") if field == "pg_config" else ("9000001", "9000002")   # (pg ids)
    dump[field] = {first: next(iter(dump[field].values())), second: next(iter(dump[field].values()))}
    data = pickle.dumps(dump, protocol=2)
    twice = data.replace(second.encode(), first.encode())
    assert twice != data and list(pickle.loads(twice)[field]) == [first]
    got, read = to_arrow.flatten_pickles([twice, PICKLES[0].read_bytes()], [0, 1])
    assert read == [0, 1]
    _same(merge_parts([flatten_dump(pickle.loads(twice), 0), flatten_dump(pickle.loads(PICKLES[0].read_bytes()), 1)]),
          got)


def test_load_gives_the_same_trace_either_way(tmp_path):
    out = tmp_path / "job"
    synth.generate(synth.Job(tp=2, pp=2, dp=2, steps=4, fault=synth.Fault(kind="not_joined")), out)
    (out / "nccl_trace_rank_3").write_bytes(b"\x80\x02}q\x00(X\x07\x00\x00\x00entries")   # cut short
    # one the tape doesn't take (a bytes value) but the unpickler reads: its entries join the tape's in a chunk
    dump = pickle.loads((out / "nccl_trace_rank_5").read_bytes())
    dump["entries"][0]["thread_name"] = b"main"
    (out / "nccl_trace_rank_5").write_bytes(pickle.dumps(dump))
    assert to_arrow.flatten_pickles([(out / "nccl_trace_rank_5").read_bytes()], [5]) == (None, [])
    # (a chunk of both: the tape's shapes and texts come as dictionaries, the unpickler's as nested lists and
    # strings, derived on merging)
    good = (out / "nccl_trace_rank_4").read_bytes()
    mixed = merge_parts([to_arrow.flatten_pickle(good, 4), flatten_dump(dump, 5)])
    for name in ("input_sizes", "input_dtypes", "profiling_name", "process_group_desc"):
        assert pa.types.is_dictionary(mixed["entries"].schema.field(name).type), name
    _same(merge_parts([flatten_dump(pickle.loads(good), 4), flatten_dump(dump, 5)]), mixed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = load(out, LoadOptions(use_cache=False, reader="tape", workers=1))
        slow = load(out, LoadOptions(use_cache=False, reader="unpickler", workers=1))
    assert _but_reader(fast.dumps).equals(_but_reader(slow.dumps))
    for name in ("entries", "stacks", "groups", "members", "pg_status"):
        assert getattr(fast, name).equals(getattr(slow, name)), name



def test_a_file_the_fast_reader_declines_is_named_with_why(tmp_path):
    """Read by the unpickler instead, and said so: in the dumps' table, the report's `dumps` and its text."""
    import flightrec

    out = tmp_path / "job"
    synth.generate(synth.Job(tp=2, pp=1, dp=2, steps=2), out)
    odd = min(out.rglob("*_rank_3"))
    dump = pickle.loads(odd.read_bytes())
    dump["entries"][0]["record_id"] = 1 << 70   # (an int over 64 bits: the walker takes none)
    odd.write_bytes(pickle.dumps(dump, protocol=4))
    report = flightrec.analyze(out, reader="tape", use_cache=False, workers=1)
    dumps = report.trace.dumps.sort("rank")
    assert dumps["reader"].to_list() == ["fast", "fast", "fast", "unpickler"]
    assert dumps["fast_reader_declined"].to_list()[:3] == [None] * 3
    assert "plain-data pickle" in dumps["fast_reader_declined"][3]
    assert [x["path"] for x in report.dumps.fast_reader_declined] == [odd.relative_to(out).as_posix()]
    assert "1 file(s) read by the unpickler, as the fast reader found them not a plain-data" in report.to_text()


def test_an_error_inside_the_fast_reader_is_not_hidden(tmp_path, monkeypatch):
    """A bug in the fast reader must fail the load (and so the tests), not send its files quietly the
    unpickler's way."""
    out = tmp_path / "job"
    synth.generate(synth.Job(tp=2, pp=1, dp=2, steps=2), out)

    def broken(*args, **kwargs):
        raise RuntimeError("the fast reader broke")

    monkeypatch.setattr(to_arrow, "_batch", broken)
    with pytest.raises(RuntimeError, match="the fast reader broke"):
        load(out, LoadOptions(use_cache=False, reader="tape", workers=1))
    assert load(out, LoadOptions(use_cache=False, reader="unpickler", workers=1)).dumps.height == 4


def test_pooled_workers_load_the_reader_and_leave_the_caller_alone(tmp_path):
    """With a pool, each worker loads the compiled reader (with numba's BLAS probe answered "absent"): the
    caller's process never imports numba, so its own numba code keeps its linear algebra."""
    import subprocess
    import sys

    out = tmp_path / "job"
    synth.generate(synth.Job(tp=2, pp=2, dp=4, steps=4, fault=synth.Fault(kind="not_joined")), out)
    code = (
        "import sys, warnings; warnings.simplefilter('ignore')\n"
        "from flightrec import LoadOptions, load\n"
        f"fast = load({str(out)!r}, LoadOptions(use_cache=False, reader='tape', workers=2))\n"
        f"slow = load({str(out)!r}, LoadOptions(use_cache=False, reader='unpickler', workers=1))\n"
        "assert all(getattr(fast, n).equals(getattr(slow, n)) for n in ('entries', 'stacks', 'groups'))\n"
        "assert fast.dumps.drop('reader', 'fast_reader_declined').equals(slow.dumps.drop('reader', 'fast_reader_declined'))\n"
        "assert set(fast.dumps['reader']) == {'fast'} and set(slow.dumps['reader']) == {'unpickler'}\n"
        "assert fast.entries.height > 0\n"
        "print('numba' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_a_worker_answers_the_blas_probe_only_while_loading():
    """In a worker, loading the reader doesn't import scipy.linalg (0.3-0.4 s), and the probe's stand-in is
    taken out again: a later import of it in that process still works."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from flightrec.ingest.fastpickle import walker\n"
        "walker.warm(own_process=True)\n"
        "assert walker._walk is not None\n"
        "assert 'scipy.linalg' not in sys.modules\n"
        "assert sys.modules.get('scipy.linalg.cython_blas', 0) is not None\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=30)


@settings(max_examples=150, deadline=None)
@given(values, st.sampled_from([2, 3, 4, 5]))
def test_the_tape_holds_what_pickle_built(value, protocol):
    data = pickle.dumps(value, protocol=protocol)
    t = walker.read(data)
    assert t is not None
    assert to_arrow._materialize(t, graph.Graph(t), t.root) == value


def test_hostile_bytes_never_crash_the_reader():
    """Cut, flipped and spliced bytes of a real dump: the reader says None or reads a table, never reads past
    the buffer or crashes (the unpickler's way then reports what is wrong)."""
    rng = random.Random(7)
    data = bytearray(PICKLES[0].read_bytes())
    for _ in range(400):
        mutated = bytearray(data)
        what = rng.random()
        if what < 0.3:
            mutated = mutated[:rng.randrange(len(mutated))]
        elif what < 0.8:
            for _ in range(rng.randint(1, 8)):
                mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        else:
            i, j = sorted(rng.sample(range(len(mutated)), 2))
            mutated[i:i] = mutated[j:j + 64]
        t = walker.read(bytes(mutated))
        assert t is None or 0 <= t.root < len(t.kind)
        to_arrow.flatten_pickle(bytes(mutated), 0)   # None or a result; no exception


def test_a_deeply_nested_dump_goes_the_unpickler_way_without_costing_its_chunk(tmp_path):
    """Lists nested 5,000 deep in pg_config: the tape walks them (no MARK, no limit), building their Python
    values recurses too deep. That file gets the unpickler's answer; the other files are read as usual."""
    import sys

    synth.generate(synth.Job(tp=2, pp=1, dp=2, steps=2), tmp_path)
    deep = cur = []
    for _ in range(5000):
        cur.append([])
        cur = cur[0]
    dump = pickle.loads((tmp_path / "nccl_trace_rank_1").read_bytes())
    dump["pg_config"]["deep"] = {"name": "x", "ranks": deep}
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(50_000)
    try:
        # (the pure-Python pickler: from Python 3.12 the C one stops at a C recursion limit that
        # sys.setrecursionlimit does not raise; the bytes are the same)
        with open(tmp_path / "nccl_trace_rank_1", "wb") as out:
            pickle._Pickler(out, protocol=2).dump(dump)
    finally:
        sys.setrecursionlimit(limit)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = load(tmp_path, LoadOptions(use_cache=False, reader="tape", workers=1))
        slow = load(tmp_path, LoadOptions(use_cache=False, reader="unpickler", workers=1))
    assert _but_reader(fast.dumps).equals(_but_reader(slow.dumps)) and fast.entries.equals(slow.entries)
    assert fast.dumps.filter(fast.dumps["rank"] != 1)["loaded"].all()


def test_older_layouts_are_read_a_file_at_a_time_the_same():
    """pg_config as the 1.4 recorder wrote it ({pg id: [ranks]}), rank lists as lists, a pg_status key that
    is an int: the batch passes leave these to `_one_file`, which reads them as flatten_dump does."""
    dump = pickle.loads(PICKLES[0].read_bytes())
    older = dict(dump, pg_config={"0": [0, 1, 2, 3], "1": {"name": "1", "desc": "tp", "ranks": [0, 1]}},
                 pg_status={0: {"last_enqueued_collective": 3}})
    datas = [pickle.dumps(dump, protocol=2), pickle.dumps(older, protocol=4)]
    got, read = to_arrow.flatten_pickles(datas, [0, 1])
    assert read == [0, 1]
    _same(merge_parts([flatten_dump(dump, 0), flatten_dump(older, 1)]), got)
    assert [row[1:3] for row in got["pg_config"] if row[0] == 1] == [("0", None), ("1", "tp")]


_text_or_odd = st.one_of(st.text(max_size=6), st.none(), st.integers(-3, 3))
_group = st.one_of(
    st.fixed_dictionaries({}, optional={"name": _text_or_odd, "desc": _text_or_odd,
                                        "ranks": st.one_of(st.sampled_from(["[0, 1]", "[]", " [] ", ""]),
                                                           st.lists(st.integers(0, 3), max_size=3), st.none())}),
    st.lists(st.integers(0, 3), max_size=3))
_status = st.fixed_dictionaries({}, optional={k: st.one_of(st.integers(-1, 9), st.none(), st.just("4"))
                                              for k in ("last_enqueued_collective", "last_started_collective",
                                                        "last_completed_collective")})
_top_level = st.fixed_dictionaries({}, optional={
    "version": st.one_of(st.sampled_from(["2.10", "1.4", "9.9"]), st.none(), st.integers(1, 2)),
    "comm_lib_version": _text_or_odd, "nccl_version": _text_or_odd,
    "pg_config": st.one_of(st.dictionaries(st.sampled_from(["0", "1", "", "tp"]), _group, max_size=3), st.none(),
                           st.lists(st.integers(-2**63, 2**63 - 1), max_size=1)),   # (wider ints: the unpickler's)
    "pg_status": st.one_of(st.dictionaries(st.one_of(st.sampled_from(["0", " 1", "x"]), st.integers(0, 2)), _status,
                                           max_size=3), st.none()),
    "_truncated": st.one_of(st.booleans(), st.just(0), st.none())})


@settings(max_examples=120, deadline=None)
@given(st.lists(_top_level, min_size=1, max_size=4), st.sampled_from([2, 4, 5]), st.booleans())
def test_a_batch_of_any_top_level_layout_reads_as_flatten_dump_does(tops, protocol, no_entries):
    """Random metadata around real entries, several files a batch: every file the tape takes reads as
    flatten_dump reads it (the batch passes or, where they give up, a file at a time)."""
    entries = [] if no_entries else pickle.loads(PICKLES[0].read_bytes())["entries"]
    dumps = [dict(top, entries=entries) for top in tops]
    got, read = to_arrow.flatten_pickles([pickle.dumps(d, protocol=protocol) for d in dumps], list(range(len(dumps))))
    if read:
        _same(merge_parts([flatten_dump(dumps[i], i) for i in read]), got)
    # (a cut file is the unpickler's to report; the tape takes every other one, by one way or the other)
    assert read == [i for i, top in enumerate(tops) if not top.get("_truncated")]


def test_memoize_puts_where_python_puts_it():
    """MEMOIZE stores at len(memo), the number of indexes set, not past the highest one: after BINPUT 1 that
    is index 1 again (a hand-made stream; Python's pickler uses one kind or the other)."""
    data = b"\x80\x04]" b"(" b"\x8c\x042.10q\x01" b"\x8c\x03abc\x94" b"h\x01" b"e."
    t = walker.read(data)
    assert to_arrow._materialize(t, graph.Graph(t), t.root) == pickle.loads(data) == ["2.10", "abc", "abc"]


def test_values_python_reads_but_arrow_cannot_hold_leave_the_file_to_the_unpickler():
    """A lone surrogate (legal in a pickle, not in UTF-8 Arrow text) or a cyclic value: the file is declined,
    never raised on, and the rest of its batch is still read."""
    dump = pickle.loads(PICKLES[0].read_bytes())
    odd = dict(dump, entries=[dict(dump["entries"][0], profiling_name="nccl:\ud800")])
    cyclic = []
    cyclic.append(cyclic)
    looped = dict(dump, pg_config={"d": {"name": "x", "ranks": cyclic}})
    datas = [pickle.dumps(d, protocol=4) for d in (dump, odd, looped, dump)]
    got, read = to_arrow.flatten_pickles(datas, [0, 1, 2, 3])
    assert read == [0, 3]
    _same(merge_parts([flatten_dump(dump, 0), flatten_dump(dump, 3)]), got)


def test_texts_that_share_a_hash_are_still_told_apart():
    """The walker's 64-bit hash only groups texts: with every hash made equal (as a crafted file could make
    two), each object still reads as its own text, long ones (cached by hash) too."""
    value = ["ab", "cd", "".join(["a", "b"]), "c" * 2000, "d" * 2000, "".join(["c"] * 2000)]   # (six str objects)
    t = walker.read(pickle.dumps(value, protocol=2))
    strs = np.flatnonzero(t.kind == kinds.STR)
    assert len(strs) == 6
    t.value[strs] = 42
    words, index = t.texts(strs)
    assert [words[i] for i in index] == value
    assert [t.text(int(o)) for o in strs] == value


def test_stacks_are_told_apart_by_their_frames_in_order():
    """Each entry's stack is its frames in order: the same frames in another order, a prefix, or the same
    frames in a list of its own are each told apart (or not) as the unpickler's way tells them."""
    path = next(p for p in PICKLES if sum(bool(e.get("frames")) for e in read_dump(p)[0]["entries"]) >= 4)
    dump = read_dump(path)[0]
    frames = next(e["frames"] for e in dump["entries"] if len(e.get("frames") or []) >= 2)
    a, b = frames[0], frames[1]
    for entry, stack in zip(dump["entries"], ([a, b], [b, a], [a], [a, b], [b, a, a])):
        entry["frames"] = stack
    data = pickle.dumps(dump, protocol=4)
    got = to_arrow.flatten_pickle(data, 0)
    _same(flatten_dump(pickle.loads(data), 0), got)
    ids = got["entries"]["stack_id"].to_pylist()[:5]
    assert ids[0] == ids[3] and len({ids[0], ids[1], ids[2], ids[4]}) == 4


def test_frames_are_told_apart_by_their_content_and_nones():
    """Frames as the unpickler's way tells them: equal content in different dicts is one frame, a None or a
    missing field is the same None, and another line, name or filename is another frame."""
    path = next(p for p in PICKLES if sum(bool(e.get("frames")) for e in read_dump(p)[0]["entries"]) >= 6)
    dump = read_dump(path)[0]
    base = {"name": "step", "filename": "train.py", "line": 7}
    variants = [
        [dict(base), dict(base)],                        # equal content in two dicts
        [dict(base), dict(base, line=8)],                # another line
        [dict(base), dict(base, name=None)],             # a None name
        [dict(base), {"filename": "train.py", "line": 7}],   # the name missing: the same as None
        [dict(base), dict(base, filename="train.py ")],  # another filename, one byte longer
        [dict(base), dict(base, line=None)],
    ]
    entries = [e for e in dump["entries"] if e.get("frames")][:len(variants)]
    for entry, stack in zip(entries, variants):
        entry["frames"] = stack
    data = pickle.dumps(dump, protocol=4)
    got = to_arrow.flatten_pickle(data, 0)
    _same(flatten_dump(pickle.loads(data), 0), got)
    ids = dict(zip(got["entries"]["record_id"].to_pylist(), got["entries"]["stack_id"].to_pylist()))
    sids = [ids[e["record_id"]] for e in entries]
    assert sids[2] == sids[3] and len({sids[0], sids[1], sids[2], sids[4], sids[5]}) == 5


def test_frame_texts_that_share_a_hash_are_still_told_apart():
    """With every text's hash made equal (a crafted file), frames are still told apart byte by byte."""
    frames = [{"name": "ab", "filename": "x", "line": 1}, {"name": "cd", "filename": "x", "line": 1},
              {"name": "".join(["a", "b"]), "filename": "x", "line": 1}, {"name": "ab", "filename": "y", "line": 1}]
    t = walker.read(pickle.dumps(frames, protocol=2))
    g = graph.Graph(t)
    t.value[t.kind == kinds.STR] = 42
    field = graph.fields(t, g, g.children(t.root), ("name", "filename", "line"))
    codes, firsts, ok = content_codes.frame_codes(t, field["name"], field["filename"], field["line"])
    assert ok and codes.tolist() == [0, 1, 0, 2] and firsts.tolist() == [0, 1, 3]


def test_stacks_met_again_in_later_batches_read_as_the_first_time(monkeypatch):
    """A worker keeps the stacks it has met (`entry_columns._KNOWN_STACKS`): a later batch holding them gives the
    same ids and frames as flatten, whether they were known, and once the memory is full as before."""
    datas = [p.read_bytes() for p in PICKLES if any(e.get("frames") for e in read_dump(p)[0]["entries"])][:4]
    want = [flatten_dump(pickle.loads(d), i) for i, d in enumerate(datas)]
    monkeypatch.setattr(entry_columns, "_KNOWN_STACKS", {})
    for _ in range(2):   # (the first time met, then known)
        for i, data in enumerate(datas):
            _same(want[i], to_arrow.flatten_pickle(data, i))
    assert entry_columns._KNOWN_STACKS
    monkeypatch.setattr(entry_columns, "_KNOWN_STACKS", {})
    monkeypatch.setattr(entry_columns, "_KNOWN_STACKS_MAX", 0)
    for i, data in enumerate(datas):
        _same(want[i], to_arrow.flatten_pickle(data, i))
    assert not entry_columns._KNOWN_STACKS


def test_a_frame_field_of_another_kind_leaves_the_file_to_the_unpickler():
    dump = read_dump(next(p for p in PICKLES if any(e.get("frames") for e in read_dump(p)[0]["entries"])))[0]
    entry = next(e for e in dump["entries"] if e.get("frames"))
    entry["frames"] = [{"name": "step", "filename": "train.py", "line": "7"}]
    assert to_arrow.flatten_pickle(pickle.dumps(dump, protocol=4), 0) is None


_KEYS = ("name", "nam", "names", "line", "é", "x")


@settings(max_examples=80, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(_KEYS), st.integers(-5, 5), max_size=6), min_size=1, max_size=8),
       st.lists(st.sampled_from(_KEYS + ("missing",)), min_size=1, max_size=4, unique=True))
def test_fields_are_each_dicts_value_under_each_name(dicts, names):
    """`passes.pivot` matches keys to names by their bytes (prefixes, longer names and non-ASCII ones among
    them): each dict's value under each name, none where it has no such key."""
    t = walker.read(pickle.dumps(dicts, protocol=2))
    g = graph.Graph(t)
    field = graph.fields(t, g, g.children(t.root), tuple(names))
    for name in names:
        got = [int(t.value[o]) if o >= 0 else None for o in field[name].tolist()]
        assert got == [d.get(name) for d in dicts]
    assert (t.code_table() == -1).all()


def test_a_key_repeated_in_a_dict_reads_as_its_last_and_odd_keys_decline():
    """A pickle can set one key twice (Python keeps the last); a key that is not a str, or one that is not
    UTF-8, declines the batch (the unpickler's way reads or refuses the file)."""
    twice = b"\x80\x02]q\x00}q\x01(X\x01\x00\x00\x00aK\x01X\x01\x00\x00\x00aK\x02ua."
    assert pickle.loads(twice) == [{"a": 2}]
    t = walker.read(twice)
    g = graph.Graph(t)
    assert int(t.value[graph.fields(t, g, g.children(t.root), ("a",))["a"][0]]) == 2
    for odd in (b"\x80\x02]q\x00}q\x01K\x07K\x01sa.", b"\x80\x02]q\x00}q\x01X\x02\x00\x00\x00\xff\xfeK\x01sa."):
        t = walker.read(odd)
        g = graph.Graph(t)
        with pytest.raises(graph.DECLINED):
            graph.fields(t, g, g.children(t.root), ("a",))
        assert (t.code_table() == -1).all()


def test_a_protocol_python_does_not_know_is_left_to_the_unpickler():
    assert walker.read(b"\x80\x05N.") is not None and walker.read(b"\x80\x06N.") is None


def test_a_key_python_cannot_hash_declines_the_file_without_raising():
    """A list as a pg_config key (pickle.load refuses such a file): the file is declined, not raised on."""
    def text(x):
        return b"\x8c" + bytes([len(x)]) + x.encode()
    data = (b"\x80\x04}(" + text("version") + text("2.4") + text("entries") + b"]"
            + text("pg_config") + b"}](K\x01e}s" + b"u.")
    with pytest.raises(TypeError):
        pickle.loads(data)
    assert to_arrow.flatten_pickles([data], [0]) == (None, [])


def test_the_tapes_table_of_codes_is_left_as_found_after_every_pass(monkeypatch):
    """The passes over a batch share one table of -1 per object (`Tape.code_table`: made per pass it was a
    third of the reading time), each resetting what it wrote: a stale code would merge two texts or frames of
    a later pass. Checked after a whole batch."""
    tapes = []
    read_laid_out = walker.read_laid_out
    monkeypatch.setattr(walker, "read_laid_out", lambda *a, **k: tapes.append(read_laid_out(*a, **k)) or tapes[-1])
    datas = [p.read_bytes() for p in PICKLES[:8]]
    got, read = to_arrow.flatten_pickles(datas, list(range(len(datas))))
    assert read == list(range(len(datas)))
    _same(merge_parts([flatten_dump(pickle.loads(d), rank) for rank, d in enumerate(datas)]), got)
    t = tapes[0][0]
    assert "code_of" in t._scratch and (t.code_table() == -1).all()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 30), max_size=8), max_size=12), st.lists(st.integers(-1, 11), max_size=15))
def test_distinct_items_are_each_parents_children_once_in_the_order_first_met(children, parents):
    """The compiled pass behind `distinct_children` (edges grouped by parent, as the walk lays them out): every
    child of the listed parents once, in the order first met; -1 and parents with no children add
    nothing."""
    child = np.array([c for kids in children for c in kids], np.int32)
    count = np.array([len(kids) for kids in children] or [0], np.int32)
    start = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int32)
    order = np.arange(child.size, dtype=np.int32)
    parents = np.array([p for p in parents if p < len(children)], np.int64)
    want = list(dict.fromkeys(c for p in parents if p >= 0 for c in children[p]))
    got = kernels.compiled("distinct_items", passes._distinct_items_py)(child, order, start, count, parents, 31)
    assert got.tolist() == want and got.dtype == np.int64


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-1, 7), max_size=40), st.sets(st.integers(0, 7)))
def test_kinds_of_reads_each_objects_kind_and_checks_it(ids, allowed):
    """`passes.kinds_of`: each object's kind (NONE where the id is -1, a missing value) and whether all are in
    the allowed set, against numpy."""
    kind = np.arange(8, dtype=np.int8)   # (object i is of kind i)
    t = tape.Tape(b"", kind, np.zeros(8, np.int64), np.zeros(8, np.int64), np.zeros(8, np.int64),
                  np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.int32), -1)
    got, ok = passes.kinds_of(t, np.array(ids, np.int64), sum(1 << k for k in allowed))
    want = [kinds.NONE if i < 0 else i for i in ids]
    assert got.tolist() == want and got.dtype == np.int8
    assert ok == all(k in allowed for k in want)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), st.integers(1, 4)), max_size=30), st.integers(8, 10))
def test_edges_are_grouped_by_parent_in_the_order_added(runs, n_obj):
    """`group_by_parent`, on edges laid out as runs of one parent: each object's edges in the order added,
    whether each parent's edges are one run (the order then the identity) or come back later."""
    parent = np.array([p for p, n in runs for _ in range(n)], np.int32)
    t = tape.Tape(b"", np.zeros(n_obj, np.int8), np.zeros(n_obj, np.int64), np.zeros(n_obj, np.int64),
                  np.zeros(n_obj, np.int64), parent, np.full(parent.size, -1, np.int32), parent.copy(), -1)
    order, start, count = passes.group_by_parent(t)
    for obj in range(n_obj):
        edges = passes.edge_ids(order, start[obj], count[obj]).tolist()
        assert edges == np.flatnonzero(parent == obj).tolist()
    merged = [p for i, (p, _) in enumerate(runs) if i == 0 or runs[i - 1][0] != p]
    if len(merged) == len(set(merged)):   # (one run each: read in place, no order made)
        assert order.size == 0
    assert order.dtype == np.int32 and start.dtype == np.int32 and count.dtype == np.int32


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.lists(st.lists(st.integers(-3, 3), max_size=3), max_size=3)), max_size=40))
def test_shape_codes_give_equal_shapes_one_code_in_the_order_first_met(entries):
    """`content_codes.shape_codes` against a dict of the shapes as tuples: few dim values, so shapes repeat, and the
    empty shape, empty tensors and nulls all occur."""
    outer, inner, values = [0], [0], []
    for shape in entries:
        for tensor in shape or []:
            values += tensor
            inner.append(len(values))
        outer.append(len(inner) - 1)
    null = np.array([shape is None for shape in entries], dtype=bool)
    codes, reps = content_codes.shape_codes(np.array(outer), np.array(inner), np.array(values, dtype=np.int64), null)
    seen: dict = {}
    want = [-1 if shape is None else seen.setdefault(tuple(map(tuple, shape)), len(seen)) for shape in entries]
    assert codes.tolist() == want
    first = {}
    for i, code in enumerate(want):
        first.setdefault(code, i)
    assert reps.tolist() == [first[c] for c in range(len(seen))]


_dims = st.lists(st.integers(-3, 3), max_size=3)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.lists(st.one_of(_dims, _dims.map(tuple)), max_size=3),
                          st.tuples(_dims, _dims)), max_size=40),
       st.sampled_from([None, "text", [None], [[1.5]], [["1"]], 7]))
def test_sizes_codes_read_shapes_where_the_tape_holds_them(entries, odd):
    """`content_codes.sizes_codes` against a dict of the shapes as tuples, each entry's sizes read from the pickled
    objects (lists or tuples, shared where the pickle memoizes them); a value of another kind anywhere (a
    text, a None tensor, a float or text dim, an int) is not ok."""
    t = walker.read(pickle.dumps(entries, protocol=4))
    g = graph.Graph(t)
    ids = g.children(t.root).astype(np.int64)
    codes, reps, ok = content_codes.sizes_codes(t, g.order, g.start, g.count, ids)
    seen: dict = {}
    want = [-1 if shape is None else seen.setdefault(tuple(map(tuple, shape)), len(seen)) for shape in entries]
    assert ok and codes.tolist() == want
    first = {}
    for i, code in enumerate(want):
        first.setdefault(code, i)
    assert reps.tolist() == [first[c] for c in range(len(seen))]
    t = walker.read(pickle.dumps([*entries, odd], protocol=4))
    g = graph.Graph(t)
    _, _, ok = content_codes.sizes_codes(t, g.order, g.start, g.count, g.children(t.root).astype(np.int64))
    assert ok == (odd is None)   # (None: a null entry, as the first list holds)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.lists(st.integers(0, 3), max_size=4)), max_size=40))
def test_list_codes_give_lists_of_equal_codes_one_code_in_the_order_first_met(lists):
    """`content_codes.list_codes` (stacks: lists of frames, each frame's code) against a dict of the lists as tuples:
    each list is an object whose items are edges of the tape, the items objects whose codes repeat."""
    child, count, start, code_of_object = [], [], [], []
    for items in lists:   # one object per list, then one per item (edges grouped by parent, as the walk lays out)
        start.append(len(child))
        count.append(len(items or []))
        for code in items or []:
            child.append(len(lists) + len(code_of_object))
            code_of_object.append(code)
    code_of = np.array([-1] * len(lists) + code_of_object, np.int64)
    t = tape.Tape(b"", np.zeros(len(code_of), np.int8), np.zeros(len(code_of), np.int64),
                  np.zeros(len(code_of), np.int64), np.zeros(len(code_of), np.int64), np.zeros(len(child), np.int32),
                  np.full(len(child), -1, np.int32), np.array(child, np.int32), -1)
    order = np.arange(len(child), dtype=np.int32)
    starts = np.array(start + [0] * len(code_of_object), np.int32)
    counts = np.array(count + [0] * len(code_of_object), np.int32)
    objects = np.array([-1 if items is None else i for i, items in enumerate(lists)], np.int64)
    codes, reps = content_codes.list_codes(t, order, starts, counts, objects, code_of)
    seen: dict = {}
    want = [-1 if items is None else seen.setdefault(tuple(items), len(seen)) for items in lists]
    assert codes.tolist() == want
    first = {}
    for i, code in enumerate(want):
        first.setdefault(code, i)
    assert reps.tolist() == [first[c] for c in range(len(seen))]
    # the same read in place (the edges grouped: no order) and, where each code's items are one shared object,
    # by identity (no table of codes)
    in_place = content_codes.list_codes(t, np.zeros(0, np.int32), starts, counts, objects, code_of)
    assert in_place[0].tolist() == want and in_place[1].tolist() == reps.tolist()
    shared = np.array([len(lists) + c for items in lists for c in items or []], np.int32)
    t_shared = tape.Tape(b"", t.kind, t.value, t.text_start, t.text_len, t.parent, t.key, shared, -1)
    by_identity = content_codes.list_codes(t_shared, np.zeros(0, np.int32), starts, counts, objects, np.zeros(0, np.int64))
    assert by_identity[0].tolist() == want and by_identity[1].tolist() == reps.tolist()
