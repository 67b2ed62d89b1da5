import os
from pathlib import Path

import pytest

from flightrec.errors import MultipleJobsError, NoDumpsError
from flightrec.ingest.discover import discover


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


@pytest.mark.parametrize("folder, ranks, host", [
    ("node1", range(8, 16), "node1"),                 # the one host left of two: node0, down, wrote nothing
    ("node00001/tmp", [8, 9, 10, 11, 12, 13, 15], "node00001"),   # (a lost dump leaves a hole in its block)
    ("node0", range(0, 8), "node0"),                  # (the whole job, if it is: `resolve` drops one host of all)
    ("traces", range(8, 16), None),                   # no number: a folder, not a host
    ("run2", range(0, 32), None),                     # its number is not its block's
    ("node1", [3, 9], None),                          # ranks of two blocks
    ("attempt_1", range(8, 16), None),                # a run's folder, numbered like the block by chance
    ("Retry-1", range(8, 16), None),
])
def test_a_lone_folder_is_a_host_where_it_holds_the_block_its_number_says(tmp_path, folder, ranks, host):
    for r in ranks:
        touch(tmp_path / folder / f"nccl_trace_rank_{r}")
    assert {f.host for f in discover(tmp_path)} == {host}


def test_explicit_prefix_filters_other_files(tmp_path):
    touch(tmp_path / "fr_0")
    touch(tmp_path / "fr_1")
    touch(tmp_path / "core.1234")
    assert [f.rank for f in discover(tmp_path, prefix="fr_")] == [0, 1]


def test_two_files_for_one_rank_keep_newer(tmp_path):
    """One rank's dump written twice in one folder (a pickle and its gzip): the newer is read, and said."""
    touch(tmp_path / "a" / "rank_3")
    touch(tmp_path / "a" / "rank_3.gz")
    os.utime(tmp_path / "a" / "rank_3", ns=(1, 1))
    with pytest.warns(UserWarning, match="two dumps claim rank 3"):
        files = discover(tmp_path)
    assert [Path(f.path).name for f in files] == ["rank_3.gz"]


def test_two_folders_claiming_the_same_ranks_are_two_jobs(tmp_path):
    """`flightrec analyze fixtures`: folders whose ranks overlap are jobs of their own, listed, with the command
    that analyses one; per-host folders (ranks apart) stay one job."""
    for r in range(4):
        touch(tmp_path / "run1" / f"rank_{r}")
        touch(tmp_path / "run2" / "node0" / f"rank_{r}")
        touch(tmp_path / "run2" / "node1" / f"rank_{r + 4}")
    with pytest.raises(MultipleJobsError) as err:
        discover(tmp_path)
    text = str(err.value)
    assert "2 jobs" in text and "run1: ranks 0-3 (4 dumps)" in text and "run2: ranks 0-7 (8 dumps)" in text
    assert f"flightrec analyze {tmp_path / 'run1'}" in text
    assert len(discover(tmp_path / "run2")) == 8


def test_two_writers_files_in_one_folder_are_two_jobs(tmp_path):
    for r in range(2):
        touch(tmp_path / f"nccl_trace_rank_{r}")
        touch(tmp_path / f"comm_lib_trace_rank_{r}")
    with pytest.raises(MultipleJobsError, match="--prefix comm_lib_trace_rank_"):
        discover(tmp_path)
    assert len(discover(tmp_path, prefix="nccl_trace_rank_")) == 2


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


def test_files_that_end_in_a_number_but_are_no_dump_claim_no_rank(tmp_path):
    """A core file or a rotated log beside the dumps is not rank 4242 (`8 of 4243 ranks`), nor does it shadow
    the real dump of its rank; one alone in its name that starts like a dump is still taken."""
    for r in range(4):
        (tmp_path / f"nccl_trace_rank_{r}").write_bytes(b"\x80\x04dump")
    (tmp_path / "core.4242").write_bytes(b"\x7fELF....")
    (tmp_path / "train.log.1").write_text("[rank1]: step 1 loss 2.3\n")   # ('[' opens JSON too)
    (tmp_path / "rescued_rank_7.json").write_text("{}")
    with pytest.warns(UserWarning, match="no dump: core.4242, train.log.1"):
        files = discover(tmp_path)
    assert [(f.rank, Path(f.path).name) for f in files] == [
        (0, "nccl_trace_rank_0"), (1, "nccl_trace_rank_1"), (2, "nccl_trace_rank_2"), (3, "nccl_trace_rank_3"),
        (7, "rescued_rank_7.json")]


def test_of_two_files_claiming_a_rank_the_one_that_starts_like_a_dump_is_kept(tmp_path):
    import os

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    good, bad = tmp_path / "a" / "rank_1", tmp_path / "b" / "rank_1"
    good.write_bytes(b"\x80\x04dump")
    bad.write_bytes(b"garbage")
    os.utime(good, ns=(1, 1))   # the dump is the older one
    with pytest.warns(UserWarning, match="keeping the readable"):
        files = discover(tmp_path)
    assert [f.path for f in files] == [str(good)]


def test_hosts_from_names_and_folders_when_one_name_or_level_is_plain(tmp_path):
    """One renamed file (`node0-nccl_trace_rank_2` beside plain `nccl_trace_rank_*`) names its host and leaves
    the others without one (not all 'nccl'); per-host folders copied with a level below them (`node01/tmp/`)
    are named by the host level, not 'tmp'."""
    flat = tmp_path / "flat"
    flat.mkdir()
    for r in (0, 1, 3):
        touch(flat / f"nccl_trace_rank_{r}")
    touch(flat / "node0-nccl_trace_rank_2")
    assert ranks_hosts(discover(flat)) == [(0, None), (1, None), (2, "node0"), (3, None)]
    nested = tmp_path / "nested"
    for host, ranks in (("node01", (0, 1)), ("node02", (2, 3))):
        (nested / host / "tmp").mkdir(parents=True)
        for r in ranks:
            touch(nested / host / "tmp" / f"nccl_trace_rank_{r}")
    assert ranks_hosts(discover(nested)) == [(0, "node01"), (1, "node01"), (2, "node02"), (3, "node02")]


def test_a_folder_that_cannot_be_listed_is_warned_about(tmp_path, monkeypatch):
    """Its dumps would read as ranks that left none (a host down): say so. (Simulated: root reads anything.)"""
    for host, r in (("node01", 0), ("node02", 1)):
        touch(tmp_path / host / f"nccl_trace_rank_{r}")
    real = os.scandir

    def scandir(path):
        if str(path).endswith("node02"):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)
    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.warns(UserWarning, match="cannot list .*node02 .Permission denied"):
        files = discover(tmp_path)
    assert ranks_hosts(files) == [(0, None)]


def test_an_empty_dump_alone_in_its_name_is_kept_for_the_reader_to_refuse(tmp_path):
    """One rank per host, host-prefixed names: every name is alone in its kind. The culprit's empty file (it
    died dumping) must still reach the reader, which refuses it with that reason and keeps its host."""
    for r in range(4):
        touch(tmp_path / f"node{r:03d}-nccl_trace_rank_{r}", b"" if r == 3 else b"\x80\x04dump")
    (tmp_path / "node004-nccl_trace_rank_4.json").write_bytes(b"\xef\xbb\xbf\t{}")
    assert ranks_hosts(discover(tmp_path)) == [(r, f"node{r:03d}") for r in range(5)]
