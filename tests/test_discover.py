import os

import pytest

from flightrec.discover import discover
from flightrec.errors import NoDumpsError


def touch(path, data=b"\x80\x02}q\x00."):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def ranks_hosts(files):
    return [(f.rank, f.host) for f in files]


def test_default_prefix_has_no_host(tmp_path):
    for r in (0, 1, 10):
        touch(tmp_path / f"nccl_trace_rank_{r}")
    assert ranks_hosts(discover(tmp_path)) == [(0, None), (1, None), (10, None)]


def test_torchtitan_prefix_and_suffixes(tmp_path):
    touch(tmp_path / "rank_0.json")
    touch(tmp_path / "rank_1.pkl.gz")
    assert ranks_hosts(discover(tmp_path)) == [(0, None), (1, None)]


@pytest.mark.parametrize("pattern", ["{host}.pci3_rank_{rank}", "{host}-nccl_trace_rank_{rank}"])
def test_host_in_file_name(tmp_path, pattern):
    layout = {0: "node10", 1: "node10", 8: "node00", 9: "node00"}
    for rank, host in layout.items():
        touch(tmp_path / pattern.format(host=host, rank=rank))
    assert ranks_hosts(discover(tmp_path)) == sorted(layout.items())


def test_per_host_folders(tmp_path):
    touch(tmp_path / "hostA" / "nccl_trace_rank_0")
    touch(tmp_path / "hostB" / "nccl_trace_rank_1")
    assert ranks_hosts(discover(tmp_path)) == [(0, "hostA"), (1, "hostB")]


def test_explicit_prefix_filters_other_files(tmp_path):
    touch(tmp_path / "fr_0")
    touch(tmp_path / "fr_1")
    touch(tmp_path / "core.1234")
    assert [f.rank for f in discover(tmp_path, prefix="fr_")] == [0, 1]


def test_two_files_for_one_rank_keep_newer(tmp_path):
    touch(tmp_path / "a" / "rank_3")
    touch(tmp_path / "b" / "rank_3")
    os.utime(tmp_path / "a" / "rank_3", ns=(1, 1))
    with pytest.warns(UserWarning, match="two dumps claim rank 3"):
        files = discover(tmp_path)
    assert [str(f.path.parent.name) for f in files] == ["b"]


def test_no_dumps_is_a_clear_error(tmp_path):
    touch(tmp_path / "README.txt")
    with pytest.raises(NoDumpsError, match="--prefix"):
        discover(tmp_path)
    with pytest.raises(NoDumpsError, match="no such file"):
        discover(tmp_path / "nope")


def test_symlink_loop_is_cut(tmp_path):
    touch(tmp_path / "d" / "rank_0")
    os.symlink(tmp_path, tmp_path / "d" / "loop")
    assert [f.rank for f in discover(tmp_path)] == [0]


def test_cache_folder_is_not_scanned(tmp_path):
    touch(tmp_path / "rank_0")
    touch(tmp_path / ".flightrec-cache" / "rank_1")
    assert [f.rank for f in discover(tmp_path)] == [0]
