import gzip
import json
import os
import pickle

import pytest

from flightrec.errors import DumpFormatError, UnsafePickleError
from flightrec.readers import loads_plain_pickle, read_dump


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
    (pickle.dumps("text"), "expected a dict"),
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

    from flightrec.readers import _read_to_end

    path = tmp_path / "grown"
    data = bytes(range(256)) * 5000   # 1.28 MB: past the size given, and past one follow-up read
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert _read_to_end(fd, 1000, len(data) * 2) == data
    finally:
        os.close(fd)
