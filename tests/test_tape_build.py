"""The tape reader compiled ahead of time (`flightrec build-reader`): every tape test passes with it, it
starts without numba, and a build is only ever loaded by the reader, numba, Python and machine it was made for."""

import importlib.util
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba")
from flightrec.errors import FlightrecError  # noqa: E402
from flightrec.ingest import pool as parse_pool
from flightrec.ingest.fastpickle import build as tape_build
from flightrec.ingest.fastpickle import walker as tape

ROOT = Path(__file__).resolve().parent.parent


def _compiler_probes() -> set[str]:
    """The folders in the system's temporary directory holding a compiler probe (temp.c or temp.cxx), as numba
    makes to check that a C compiler works."""
    root = Path(tempfile.gettempdir())
    return {str(p.parent) for pattern in ("*/temp.c", "*/temp.cxx") for p in root.glob(pattern)}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One build for the module (~20-40 s of the compiler), in a folder of its own; and the compiler probes it
    left in the system's temporary directory."""
    from numba.core.errors import NumbaPendingDeprecationWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NumbaPendingDeprecationWarning)   # (pycc: as tape_build imports it)
        from numba.pycc import platform

    folder = tmp_path_factory.mktemp("reader")
    this_cpu = tape_build.module_name()[:len(tape_build._PREFIX) + 8]
    (folder / tape_build._file_name(this_cpu + "_0123456789abcdef")).write_bytes(b"an earlier build")
    (folder / tape_build._file_name("_flightrec_tape_ffffffff_0123456789abcdef")).write_bytes(b"another CPU's")
    platform.external_compiler_works.cache_clear()   # (numba probes once a process: this build probes, as a CLI's)
    before = _compiler_probes()
    path = tape_build.build(folder)
    return folder, path, _compiler_probes() - before


def test_a_build_leaves_nothing_in_the_temporary_directory(built):
    _, _, left = built
    assert left == set()


def _env(folder: Path) -> dict:
    return {**os.environ, "FLIGHTREC_READER_DIR": str(folder)}


def test_every_tape_test_passes_with_the_built_reader(built):
    folder, _, _ = built
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_tape.py"],
                          capture_output=True, text=True, timeout=900, cwd=ROOT, env=_env(folder))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def test_the_built_reader_starts_without_numba(built):
    folder, path, _ = built
    code = ("import sys\n"
            "from flightrec.ingest.fastpickle import walker as tape\n"
            "assert tape.built()\n"
            "tape.warm(own_process=True)\n"
            "print(tape._walk.__module__, 'numba' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=_env(folder))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["flightrec.ingest.fastpickle.build", "False"]
    # (the earlier build for this CPU was removed, another CPU's kept)
    assert sorted(p.name for p in folder.iterdir()) == sorted([path.name, tape_build._file_name(
        "_flightrec_tape_ffffffff_0123456789abcdef")])


def test_the_built_functions_refuse_what_their_signature_does_not_declare(built):
    """The compiled code checks nothing (an int32 array where int64 is declared crashed the process, a strided
    one was read as contiguous): the wrappers refuse them, and the batch goes the unpickler's way."""
    import numpy as np

    folder, path, _ = built
    spec = importlib.util.spec_from_file_location(path.name.split(".")[0], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dense_codes = tape_build.checked("dense_codes", module.dense_codes)
    codes = np.full(32, -1, np.int64)
    assert [a.tolist() for a in dense_codes(np.array([4, 8, 4]), codes)] == [[4, 8], [0, 1, 0]]
    for bad in (np.array([4, 8, 4], np.int32), np.arange(20)[::4], [4, 8, 4], np.zeros((2, 2), np.int64)):
        with pytest.raises(TypeError):
            dense_codes(bad, codes)
    with pytest.raises(TypeError):
        dense_codes(np.array([1]))


def test_a_build_others_can_write_over_is_not_loaded(tmp_path, monkeypatch):
    """A native module runs as whoever loads it: not one in a folder other users can write to."""
    folder = tmp_path / "shared"
    folder.mkdir()
    name = tape_build.module_name()
    (folder / tape_build._file_name(name)).write_bytes(b"anything")
    monkeypatch.setenv("FLIGHTREC_READER_DIR", str(folder))
    monkeypatch.delitem(sys.modules, name, raising=False)
    os.chmod(folder, 0o777)
    assert not tape_build._trusted(folder / tape_build._file_name(name))
    assert tape_build.load() is None
    os.chmod(folder, 0o700)
    assert tape_build._trusted(folder / tape_build._file_name(name))


def test_installed_without_sources_the_reader_is_the_jit(monkeypatch):
    def no_source(obj):
        raise OSError("could not get source code")

    monkeypatch.setattr(tape_build.inspect, "getsource", no_source)
    assert tape_build.module_name() is None and tape_build.load() is None and not tape.built()


def test_a_build_is_named_for_its_machine_and_versions(monkeypatch):
    names = set()
    for cpu in ("AMD EPYC|avx avx2", "AMD EPYC|avx avx2 avx512f", None):
        monkeypatch.setattr(tape_build, "_host_cpu", lambda cpu=cpu: cpu)
        names.add(tape_build.module_name())
    assert len(names) == 3 and len({n[:len(tape_build._PREFIX) + 8] for n in names}) == 3


def test_a_broken_build_is_passed_over(tmp_path, monkeypatch):
    monkeypatch.setenv("FLIGHTREC_READER_DIR", str(tmp_path))
    monkeypatch.setattr(tape_build, "module_name", lambda: "_flightrec_tape_broken0000000000")
    (tmp_path / tape_build._file_name("_flightrec_tape_broken0000000000")).write_bytes(b"\x7fELF cut short")
    assert tape_build.load() is None


def test_with_a_build_the_tape_reads_dumps_of_any_size():
    """Started by the JIT, the tape only pays above TAPE_MIN_BYTES; built, at any size."""
    assert not parse_pool._use_tape("auto", 1 << 20, built=False)
    assert parse_pool._use_tape("auto", parse_pool.TAPE_MIN_BYTES, built=False)
    assert parse_pool._use_tape("auto", 1 << 20, built=True)
    assert not parse_pool._use_tape("unpickler", 1 << 20, built=True)


def test_a_build_that_fails_says_what_is_missing_and_that_the_reader_still_works(tmp_path, monkeypatch):
    def no_compiler(name, scratch):
        raise OSError("gcc: command not found")

    monkeypatch.setattr(tape_build, "_compile", no_compiler)
    with pytest.raises(FlightrecError, match="still works without it.*C compiler is needed"):
        tape_build.build(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_build_reader_command_reports_where_it_wrote(monkeypatch, tmp_path):
    from click.testing import CliRunner

    from flightrec.cli import main

    monkeypatch.setattr(tape_build, "build", lambda: tmp_path / "reader.so")
    result = CliRunner().invoke(main, ["build-reader"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("built the compiled reader in ") and str(tmp_path / "reader.so") in result.output


def test_a_build_into_a_folder_others_can_write_to_says_it_would_not_be_loaded(tmp_path, monkeypatch):
    def fake_compile(name, scratch):
        out = scratch / tape_build._file_name(name)
        out.write_bytes(b"a module")
        return out

    monkeypatch.setattr(tape_build, "_compile", fake_compile)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(FlightrecError, match="won't be loaded.*chmod go-w"):
        tape_build.build(shared)
    os.chmod(shared, 0o755)
    assert tape_build.build(shared).read_bytes() == b"a module"


def test_every_signature_declares_each_argument_of_its_function():
    """The wrappers' checks are read from the signatures: one per parameter of the Python function."""
    import inspect

    assert tape_build._arguments("int64[::1](int32[::1], int64[:, ::1], int64)") == (("int32", 1), ("int64", 2),
                                                                                    None)
    for name, fn in tape_build._sources().items():
        assert len(tape_build.ARGUMENTS[name]) == len(inspect.signature(fn).parameters), name
        # each array's item type a numpy dtype by that name (numba's 'boolean' is numpy's 'bool': the check
        # would refuse every call, and each batch would quietly go the unpickler's way)
        for arg in tape_build.ARGUMENTS[name]:
            if arg is not None:
                assert np.dtype(arg[0]).name == arg[0], (name, arg)
