import gzip
import json
import os
import pickle

import pytest

from flightrec.errors import DumpFormatError, UnsafePickleError
from flightrec.ingest.safe_read import loads_plain_pickle, read_dump


class _Payload:
    """Unpickling this with plain pickle would create the marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_reduce_payload_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps({"version": "2.10", "entries": [_Payload(marker)]}))
    with pytest.raises(UnsafePickleError, match="refused.*system"):
        read_dump(path)
    assert not marker.exists()


def test_plain_data_round_trips():
    obj = {"a": [1, 2.5, None, True], "b": ("x", "y"), "c": {"d": -(2**70)}}
    assert loads_plain_pickle(pickle.dumps(obj, protocol=2)) == obj
    obj["e"] = b"raw"  # bytes are a native opcode from protocol 3 on (protocol 2 needs _codecs: refused)
    assert loads_plain_pickle(pickle.dumps(obj, protocol=5)) == obj


def test_json_and_gzip(tmp_path):
    doc = {"version": "2.10", "entries": []}
    (tmp_path / "j").write_text(json.dumps(doc))
    (tmp_path / "g").write_bytes(gzip.compress(pickle.dumps(doc)))
    assert read_dump(tmp_path / "j") == (doc, "json")
    assert read_dump(tmp_path / "g") == (doc, "pickle")


@pytest.mark.parametrize("data, match", [
    (b"", "empty file"),
    (b"\x00\x01\x02junk", "not a flight-recorder dump: a dump is a pickle, a JSON object or either gzipped"),
    (b"null", "not a flight-recorder dump.*starts with b'nu'"),   # (valid JSON, but no dump)
    (b"42\n", "not a flight-recorder dump.*starts with b'42'"),
    (pickle.dumps({"entries": list(range(100))})[:-20], "no complete entry before the cut"),
    (b"{not json", "not valid JSON"),
    (pickle.dumps("text"), "not a flight-recorder dump: a str"),
])
def test_bad_files_raise_format_errors(tmp_path, data, match):
    path = tmp_path / "rank_0"
    path.write_bytes(data)
    with pytest.raises(DumpFormatError, match=match):
        read_dump(path)


def test_a_dump_that_grew_after_its_size_was_read_is_read_to_the_end(tmp_path):
    """The reader reads the size fstat gave in one go, then whatever the file grew by since (a rank still
    writing): nothing is cut at the first size."""
    import os

    from flightrec.ingest.safe_read import _read_to_end

    path = tmp_path / "grown"
    data = bytes(range(256)) * 5000   # 1.28 MB: past the size given, and past one follow-up read
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert _read_to_end(fd, 1000, len(data) * 2) == data
    finally:
        os.close(fd)


def _real_dump() -> bytes:
    """A dump PyTorch's recorder wrote (Gloo, fixtures/healthy)."""
    from .conftest import FIXTURES
    return (FIXTURES / "healthy" / "nccl_trace_rank_1").read_bytes()


def test_a_gzip_stream_cut_short_gives_the_whole_entries_before_the_cut(tmp_path):
    """The node died while writing a gzipped dump: the stream just stops. What it holds decompresses to the
    dump's beginning, and its whole entries are salvaged as for a plain pickle cut short (before, the file was
    refused as a broken gzip stream, and the rank read as having left no dump)."""
    whole = loads_plain_pickle(_real_dump())
    packed = gzip.compress(_real_dump())
    (tmp_path / "cut").write_bytes(packed[: int(len(packed) * 0.7)])
    dump, fmt = read_dump(tmp_path / "cut")
    assert fmt == "pickle" and dump["_truncated"] and dump["pg_status"] == whole["pg_status"]
    assert 0 < len(dump["entries"]) < len(whole["entries"])
    assert dump["entries"] == whole["entries"][: len(dump["entries"])]


def test_gzip_members_are_read_one_after_another_and_corrupt_data_is_refused(tmp_path):
    data = _real_dump()
    half = len(data) // 2
    (tmp_path / "two").write_bytes(gzip.compress(data[:half]) + gzip.compress(data[half:]) + b"\0" * 8)
    assert read_dump(tmp_path / "two")[0] == loads_plain_pickle(data)
    packed = bytearray(gzip.compress(data))
    packed[len(packed) // 2: len(packed) // 2 + 64] = b"\xff" * 64
    (tmp_path / "bad").write_bytes(bytes(packed))
    with pytest.raises(DumpFormatError, match="broken gzip stream"):
        read_dump(tmp_path / "bad")


@pytest.mark.parametrize("keep", [0.3, 0.6, 0.97])
def test_a_json_dump_cut_short_gives_the_whole_entries_before_the_cut(tmp_path, keep):
    """A real JSON dump (PyTorch writes its keys in alphabetical order: entries second) cut short: the whole
    entries before the cut are kept, marked truncated; before, the file was refused as invalid JSON."""
    from .conftest import FIXTURES
    data = (FIXTURES / "healthy_json" / "nccl_trace_rank_0").read_bytes()
    whole = json.loads(data)
    (tmp_path / "cut").write_bytes(data[: int(len(data) * keep)])
    dump, fmt = read_dump(tmp_path / "cut")
    assert fmt == "json" and dump["_truncated"] and dump["comm_lib_version"] == whole["comm_lib_version"]
    assert 0 < len(dump["entries"]) <= len(whole["entries"])
    assert dump["entries"] == whole["entries"][: len(dump["entries"])]
    if keep > 0.95:   # (cut in the keys after the entries: every entry is whole)
        assert len(dump["entries"]) == len(whole["entries"])
    else:
        assert len(dump["entries"]) < len(whole["entries"]) and "pg_config" not in dump


def test_a_cut_json_dump_is_noted_as_cut_not_as_missing_its_version(tmp_path):
    """PyTorch's JSON keys are alphabetical: a cut dump keeps its entries and loses `version` after them. The
    dump's problem is the cut; "no 'version' field" beside it sent readers looking for another writer."""
    from flightrec.ingest.normalize import flatten_dump

    from .conftest import FIXTURES
    data = (FIXTURES / "healthy_json" / "nccl_trace_rank_0").read_bytes()
    (tmp_path / "cut").write_bytes(data[: len(data) // 2])
    problems = flatten_dump(read_dump(tmp_path / "cut")[0], 0)["metas"][0]["problems"]
    assert len(problems) == 1 and problems[0].startswith("truncated file: kept the"), problems


@pytest.mark.parametrize("damage", ["garbage in the middle", "junk after the end", "bad UTF-8 in the middle"])
def test_a_corrupt_json_dump_is_refused_not_read_as_cut(tmp_path, damage):
    """Only text that just stops is a cut: corrupt text before its end, or a whole dump with junk after it, is
    refused as before (a review found both read as 'truncated', the rest of the dump dropped without a word)."""
    from .conftest import FIXTURES
    data = (FIXTURES / "healthy_json" / "nccl_trace_rank_0").read_bytes()
    middle = data.index(b"},{", len(data) // 2) + 2   # (between two entries)
    data = {"garbage in the middle": data[:middle] + b" GARBAGE " + data[middle:],
            "junk after the end": data + b"\n}",
            "bad UTF-8 in the middle": data[:middle] + b"\xff" + data[middle:]}[damage]
    (tmp_path / "bad").write_bytes(data)
    with pytest.raises(DumpFormatError, match="not valid JSON"):
        read_dump(tmp_path / "bad")


def test_a_group_name_and_desc_are_read_from_lists_of_any_length():
    """process_group is [name, desc] since recorder 2.1, [name] or absent before (and null in a dump that has
    it for some entries only); the element is taken by offset, also from a slice of the column."""
    import pyarrow as pa

    from flightrec.ingest.derive import _list_get

    lists = pa.array([["x"], ["a", "b"], ["c"], None, [], ["d", "e", "f"]], type=pa.list_(pa.string()))
    column = pa.chunked_array([lists.slice(1)])
    assert _list_get(column, 0).to_pylist() == ["a", "c", None, None, "d"]
    assert _list_get(column, 1).to_pylist() == ["b", None, None, None, "e"]
