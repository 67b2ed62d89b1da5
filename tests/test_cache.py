"""The local cache: what it keeps, and what it removes to stay within its budget."""

import importlib
import json
import os
import time

import pytest

from flightrec import LoadOptions, load, synth
from flightrec.cache import MANIFEST, prune


def _fake_cache(parent, name, size, used_at):
    folder = parent / name
    (folder / "entries").mkdir(parents=True)
    (folder / "entries" / "000.arrow").write_bytes(b"x" * size)
    (folder / MANIFEST).write_text(json.dumps({"fingerprint": name}))
    os.utime(folder / MANIFEST, (used_at, used_at))
    return folder


def test_prune_removes_the_least_recently_used_caches_and_nothing_else(tmp_path):
    now = time.time()
    old, mid, new = (_fake_cache(tmp_path, f"{i:024x}", 1000, now - 100 * (3 - i)) for i in range(3))
    keep = _fake_cache(tmp_path, "f" * 24, 1000, now - 1000)   # the one just written, though oldest by its manifest
    theirs = tmp_path / "notes"
    theirs.mkdir(parents=True)
    (theirs / MANIFEST).write_text("{}")   # not a hash-named folder: never ours to remove
    stale = tmp_path / f"{5:024x}.tmp123"
    stale.mkdir()
    (stale / "x").write_bytes(b"x" * 1000)
    os.utime(stale, (now - 7200, now - 7200))
    removed = prune(tmp_path, keep=keep, budget_bytes=2500)
    assert removed == [stale, old, mid]
    assert new.exists() and keep.exists() and theirs.exists()
    assert prune(tmp_path, keep=keep, budget_bytes=2500) == []


def test_a_new_cache_makes_room_and_a_read_counts_as_use(make_job, tmp_path, monkeypatch):
    a, b, c = (make_job(synth.Job(tp=2, pp=1, dp=2))[0] for _ in range(3))   # three caches of one size
    opts = LoadOptions(cache_dir=tmp_path / "c")
    load(a, opts)
    one = sum(f.stat().st_size for f in (tmp_path / "c").rglob("*") if f.is_file())
    monkeypatch.setenv("FLIGHTREC_CACHE_MAX_GB", str(2.5 * one / 2**30))   # room for two caches
    load(b, opts)
    time.sleep(0.05)
    load(a, opts)   # a warm read: now a is the more recently used
    load(c, opts)   # makes room by removing b
    assert len(list((tmp_path / "c").iterdir())) == 2
    monkeypatch.setattr(importlib.import_module("flightrec.load"), "_parse_all",
                        lambda *a, **k: pytest.fail("parsed despite the cache"))
    load(a, opts), load(c, opts)


def test_a_budget_that_is_not_a_number_warns_and_uses_the_default(monkeypatch):
    from flightrec.cache import DEFAULT_MAX_GB, max_bytes

    monkeypatch.setenv("FLIGHTREC_CACHE_MAX_GB", "lots")
    with pytest.warns(UserWarning, match="FLIGHTREC_CACHE_MAX_GB"):
        assert max_bytes() == int(DEFAULT_MAX_GB * 2**30)
