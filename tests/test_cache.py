"""The local cache: what it keeps, and what it removes to stay within its budget."""

import importlib
import json
import os
import sys
import time

import pytest

from flightrec import LoadOptions, load
from flightrec.store.cache import MANIFEST, prune
from flightrec.testing import synth


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
    monkeypatch.setattr(importlib.import_module("flightrec.ingest.load"), "_parse_all",
                        lambda *a, **k: pytest.fail("parsed despite the cache"))
    load(a, opts), load(c, opts)


@pytest.mark.parametrize("text", ["lots", "nan", "-1", "-inf"])
def test_a_budget_that_is_not_a_size_warns_and_uses_the_default(monkeypatch, text):
    from flightrec.store.cache import DEFAULT_MAX_GB, max_bytes

    monkeypatch.setenv("FLIGHTREC_CACHE_MAX_GB", text)
    with pytest.warns(UserWarning, match="FLIGHTREC_CACHE_MAX_GB"):
        assert max_bytes() == int(DEFAULT_MAX_GB * 2**30)


def test_an_infinite_budget_means_no_limit(monkeypatch):
    from flightrec.store.cache import max_bytes

    monkeypatch.setenv("FLIGHTREC_CACHE_MAX_GB", "inf")
    assert max_bytes() == sys.maxsize


def test_prune_leaves_links_shards_and_unreadable_manifests_alone(tmp_path):
    now = time.time()
    keep = _fake_cache(tmp_path, "f" * 24, 1000, now)
    elsewhere = _fake_cache(tmp_path / "elsewhere", "e" * 24, 1000, now - 500)
    (tmp_path / ("1" * 24)).symlink_to(elsewhere)   # a link named like a cache: not ours to follow or remove
    shard = _fake_cache(tmp_path, "2" * 24, 1000, now - 500)
    (shard / MANIFEST).write_text(json.dumps({"kind": "shard", "fingerprint": "x"}))
    broken = _fake_cache(tmp_path, "3" * 24, 1000, now - 500)
    (broken / MANIFEST).write_text("not json")
    assert prune(tmp_path, keep=keep, budget_bytes=0) == []
    assert elsewhere.exists() and shard.exists() and broken.exists() and (tmp_path / ("1" * 24)).exists()


def test_a_cache_missing_a_column_file_is_rebuilt_not_read_with_nulls(make_job, tmp_path, monkeypatch):
    """A removal cut short (or a folder damaged by hand) can leave a manifest and only some column files."""
    out, _ = make_job(synth.Job(tp=2, pp=1, dp=2))
    opts = LoadOptions(cache_dir=tmp_path / "c")
    first = load(out, opts)
    victim = sorted((tmp_path / "c").rglob("entries/*.arrow"))[3]
    victim.unlink()
    parsed = []
    real = importlib.import_module("flightrec.ingest.load")._parse_all
    monkeypatch.setattr(importlib.import_module("flightrec.ingest.load"), "_parse_all",
                        lambda *a, **k: parsed.append(1) or real(*a, **k))
    with pytest.warns(UserWarning, match="unreadable"):
        again = load(out, opts)
    assert parsed and again.entries.equals(first.entries)
    assert victim.exists()   # rebuilt whole


def test_failing_to_make_room_warns_and_the_analysis_goes_on(make_job, tmp_path, monkeypatch):
    out, _ = make_job(synth.Job(tp=2, pp=1, dp=2))

    def refuse(*args, **kwargs):
        raise PermissionError("not yours")

    monkeypatch.setattr(importlib.import_module("flightrec.store.cache"), "prune", refuse)
    with pytest.warns(UserWarning, match="could not remove old caches"):
        trace = load(out, LoadOptions(cache_dir=tmp_path / "c"))
    assert trace.entries.height > 0


def test_entries_fall_back_to_the_spool_when_the_cache_vanishes(make_job, tmp_path, monkeypatch):
    """Another process may remove a cache just written (its budget); the load then reads the entries back from
    its own spool files, still as one chunk."""
    load_module = importlib.import_module("flightrec.ingest.load")
    monkeypatch.setattr(load_module, "SPILL_BYTES", 0)
    monkeypatch.setattr(importlib.import_module("flightrec.ingest.pool"), "ONE_CHUNK_MAX_INPUT", 0)  # (big input)
    real_write = load_module._cache.write

    def write_then_lose(raw, files, root, options):
        folder = real_write(raw, files, root, options)
        importlib.import_module("flightrec.store.cache").remove(folder)
        return folder

    monkeypatch.setattr(load_module._cache, "write", write_then_lose)
    out, _ = make_job(synth.Job(tp=2, pp=2, dp=4, steps=3))
    with pytest.warns(UserWarning, match="could not read the entries back"):
        trace = load(out, LoadOptions(cache_dir=tmp_path / "c", workers=2))
    assert set(trace.entries.n_chunks("all")) == {1}
    assert trace.entries.equals(load(out, LoadOptions(use_cache=False, workers=1)).entries)


def test_the_cache_command_lists_caches_and_clears_only_them(make_job, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from flightrec.cli import main

    where = tmp_path / "c"
    monkeypatch.setenv("FLIGHTREC_CACHE_DIR", str(where))
    out, _ = make_job(synth.Job(tp=2, pp=1, dp=2))
    load(out)
    (where / "notes").mkdir()   # someone else's folder beside the caches
    runner = CliRunner()
    listing = runner.invoke(main, ["cache"])
    assert listing.exit_code == 0, listing.output
    assert str(out.resolve()) in listing.output and "1 cache(s)" in listing.output
    cleared = runner.invoke(main, ["cache", "--clear"])
    assert cleared.exit_code == 0 and "removed 1 cache(s)" in cleared.output
    assert [p.name for p in where.iterdir()] == ["notes"]
    assert "0 cache(s)" in runner.invoke(main, ["cache"]).output
