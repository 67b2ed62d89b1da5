"""Run one measurement in a fresh process: wall time and peak RSS of the whole process tree.

RSS counts the pages of files a process has memory-mapped (the column files of flightrec's cache and spool)
while they are in memory; the kernel drops those under pressure, so the memory a run really needs is nearer
its anonymous peak (RSS without file-backed and shared pages), measured beside it."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time

import psutil

# `flightrec.analyze` in a fresh process: fill in d (dump or shard folder), cache (bool), cache_dir.
ANALYZE = """
import json, time, warnings
warnings.simplefilter("ignore")
import flightrec
t = time.perf_counter()
report = flightrec.analyze({d!r}, use_cache={cache}, cache_dir={cache_dir!r})
print(json.dumps({{"s": time.perf_counter() - t, "summary": report.summary, "culprits": report.culprits["ranks"],
                   "entries": report.trace.entries.height, "ranks_loaded": report.dumps.loaded}}))
"""


def warm_numba_cache(log=print) -> None:
    """Compile the fast reader into numba's on-disk cache, in a process of its own, as the first run after an
    install does: the runs measured then load it, as every run after the first does."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "from flightrec.ingest.fastpickle import walker; walker.warm()"], check=True)
    log(f"numba's cache of the fast reader filled in {time.perf_counter() - start:.1f} s")


def run(code: str, timeout: float = 3600) -> dict:
    """Execute `code` in `python -c`; it must print one JSON line with at least {"s": seconds}.
    Adds "peak_rss" and "peak_anon" (bytes, main process plus its workers, sampled every 20 ms: `run_argv`)."""
    return run_argv([sys.executable, "-c", code], timeout)


def run_command(argv: list[str], timeout: float = 3600) -> dict:
    """Time any command from outside (wall clock, peak RSS); its output is not parsed."""
    start = time.perf_counter()
    result = run_argv(argv, timeout, parse=False)
    result["s"] = time.perf_counter() - start
    return result


# The process tree is listed every LIST_EVERY samples, its members' RSS read at every one (every 20 ms):
# listing reads every process's /proc entry (1.6 ms of CPU here), which at every sample took ~7.5% of a core
# from the process measured, one of two here: ~4% of a parallel run's wall time, nothing of a serial one's.
LIST_EVERY = 10


def run_argv(argv: list[str], timeout: float = 3600, parse: bool = True) -> dict:
    # (output into files, not pipes: a child whose output outgrows a pipe's buffer would block on it while this
    # process only samples its memory, and neither would ever finish)
    with tempfile.TemporaryFile("w+") as out_file, tempfile.TemporaryFile("w+") as err_file:
        proc = subprocess.Popen(argv, stdout=out_file, stderr=err_file, text=True)
        peak, peak_anon = _sample_until_done(proc, timeout, argv)
        out_file.seek(0)
        err_file.seek(0)
        out, err = out_file.read(), err_file.read()
    if not parse:
        return {"peak_rss": peak, "peak_anon": peak_anon, "returncode": proc.returncode, "stdout": out, "stderr": err}
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark child failed ({proc.returncode}):\n{err[-3000:]}")
    result = json.loads(out.strip().splitlines()[-1])
    result["peak_rss"] = peak
    result["peak_anon"] = peak_anon
    return result


def _sample_until_done(proc: subprocess.Popen, timeout: float, argv: list[str]) -> tuple[int, int]:
    """The peak RSS of `proc` and its workers until it exits, and their peak anonymous memory."""
    ps = psutil.Process(proc.pid)
    tree = [ps]
    peak = peak_anon = samples = 0
    start = time.monotonic()
    while proc.poll() is None:
        if samples % LIST_EVERY == 0:
            try:
                tree = [ps, *ps.children(recursive=True)]
            except psutil.Error:
                pass
        memory = [_memory(p) for p in tree]
        peak = max(peak, sum(rss for rss, _ in memory))
        peak_anon = max(peak_anon, sum(anon for _, anon in memory))
        samples += 1
        if time.monotonic() - start > timeout:
            proc.kill()
            raise TimeoutError(" ".join(argv)[:200])
        time.sleep(0.02)
    proc.wait()
    return peak, peak_anon


def _memory(process: psutil.Process) -> tuple[int, int]:
    """(RSS, anonymous RSS): on Linux `shared` is the resident file-backed and shared-memory pages."""
    try:
        info = process.memory_info()
    except psutil.Error:   # (gone since it was listed)
        return 0, 0
    return info.rss, info.rss - getattr(info, "shared", 0)


def runs_alternated(codes: list[str], repeat: int) -> list[list[dict]]:
    """`repeat` runs of each of `codes`, taken in turn (A B A B ...): on a shared, noisy machine a side-by-side
    then sees the same noise."""
    runs: list[list[dict]] = [[] for _ in codes]
    for _ in range(repeat):
        for i, code in enumerate(codes):
            runs[i].append(run(code))
    return runs


def medians_alternated(codes: list[str], repeat: int) -> list[dict]:
    """`median_of` for each of `codes`, their runs taken in turn (`runs_alternated`)."""
    return [medians(r) for r in runs_alternated(codes, repeat)]


def medians(runs: list[dict]) -> dict:
    keys = runs[0].keys()
    return {k: statistics.median(r[k] for r in runs) if isinstance(runs[0][k], (int, float)) else runs[0][k]
            for k in keys} | {"runs": [r["s"] for r in runs]}


def median_of(code: str, repeat: int) -> dict:
    return medians([run(code) for _ in range(repeat)])


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"
