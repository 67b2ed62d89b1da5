"""Past one machine's disk (issue 7): 131,072 ranks through the shard path of docs/scale.md.

    python -m bench.sharded [--size 131072x200] [--slice 4096] [--repeat 3]

At 131,072 ranks every dump carries the world group's rank list (~1 MB of text), so the job's pickles would
be ~150 GB: more than this machine's disk, and on a real cluster they are spread over 16,384 hosts anyway.
So the job is generated one slice of ranks at a time (512 hosts of 8 ranks by default); each slice is
converted to a shard exactly as `flightrec convert DUMPS OUT --shard-only` does next to the job, timed in a
fresh process, and its pickles are deleted. `flightrec analyze` then reads the shards only.

Columns: convert = the sum over slices (on a cluster each host converts its own dumps, in parallel),
analyze = `flightrec.analyze(SHARDS)` in a fresh process (median of --repeat), peak RSS of each.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time

from flightrec.testing import synth

from .data import job_dir, job_for
from .ingest import parse_sizes
from .measure import ANALYZE, gib, median_of, run

CONVERT = """
import json, time, warnings
warnings.simplefilter("ignore")
from flightrec.model.trace import LoadOptions
from flightrec.ingest.load import load_raw
from flightrec.store.shards import write_shard
t = time.perf_counter()
raw = load_raw({src!r}, LoadOptions(use_cache=False))
write_shard(raw, {out!r}, source={src!r}, host=None)
print(json.dumps({{"s": time.perf_counter() - t, "entries": raw["entries"].height}}))
"""


def shard_dataset(ranks: int, entries: int, ranks_per_slice: int, log=print) -> tuple[dict, dict]:
    """Shards of the job (built once, cached under bench/.data/) with their conversion costs, and the truth."""
    out = job_dir(ranks, entries, "_shards")
    stats_path = out / "convert-stats.json"
    if stats_path.exists():
        return json.loads(stats_path.read_text()), json.loads(synth.truth_path(out).read_text())
    shutil.rmtree(out, ignore_errors=True)
    pickles = job_dir(ranks, entries, "_slices")
    shutil.rmtree(pickles, ignore_errors=True)
    t0 = time.perf_counter()
    slices = []
    gen = synth.generate_slices(job_for(ranks, entries), pickles, ranks_per_slice, per_host_folders=True)
    for folder, rank_range in gen:
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        r = run(CONVERT.format(src=str(folder), out=str(out / folder.name)))
        slices.append({"ranks": len(rank_range), "bytes": size, "s": r["s"], "peak_rss": r["peak_rss"],
                       "entries": r["entries"]})
        log(f"  slice {folder.name}: {len(rank_range):,} ranks, {size / 2**30:.2f} GiB of pickles, "
            f"converted in {r['s']:.1f} s, peak RSS {gib(r['peak_rss'])}")
        shutil.rmtree(folder)
    shutil.move(str(synth.truth_path(pickles)), str(synth.truth_path(out)))
    shutil.rmtree(pickles, ignore_errors=True)
    stats = {"slices": slices, "wall_s": time.perf_counter() - t0}
    stats_path.write_text(json.dumps(stats, indent=1))
    return stats, json.loads(synth.truth_path(out).read_text())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="131072x200")
    ap.add_argument("--slice", type=int, default=4096, help="ranks per slice (generated, converted, deleted)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    [(ranks, entries)] = parse_sizes(args.size)
    stats, truth = shard_dataset(ranks, entries, args.slice)
    slices = stats["slices"]
    r = median_of(ANALYZE.format(d=str(job_dir(ranks, entries, "_shards")), cache=False, cache_dir=None), args.repeat)
    convert_s = sum(s["s"] for s in slices)
    print("| ranks x entries | entries | pickles (GiB, never on disk at once) | convert (sum of slices) | "
          "convert peak RSS (largest slice) | analyze from shards | analyze peak RSS | per rank (convert + analyze) "
          "| culprit right |")
    print("|" + "---|" * 9)
    print(f"| {ranks:,} x {entries:,} | {r['entries']:,} | {sum(s['bytes'] for s in slices) / 2**30:.1f} | "
          f"{convert_s:.0f} s | {gib(max(s['peak_rss'] for s in slices))} | {r['s']:.1f} s | {gib(r['peak_rss'])} | "
          f"{(convert_s + r['s']) / ranks * 1e3:.2f} ms | {'yes' if r['culprits'] == truth['ranks'] else 'NO'} |")
    print(f"(analyze: median of {args.repeat} fresh processes, runs {[round(x, 1) for x in r['runs']]}; "
          f"{r['ranks_loaded']:,} ranks loaded; verdict: {r['summary']})")


if __name__ == "__main__":
    main()
