"""How the MinHash plan's time grows with its verification partitions: a larger run modelled on a smaller corpus.

    python bench/minhash_plan.py                               # 1M documents, 1, 3 and 22 partitions
    python bench/minhash_plan.py --docs 100000 --partitions 1,8

At ``memory_gb = 0.5`` the plan splits the verification of candidate pairs into buckets: 3 at 1M
documents of ``bench/scale.py``'s corpus, 22 at 10M. This runs ``dedup.minhash`` alone (the
stage's defaults, 2 workers) on the first ``--docs`` documents of that corpus (built if missing)
with the work folder kept, then times the stage's plan (``curate.dedup.grouping.group``) over
those spilled keys with the verification forced into each of ``--partitions`` buckets, everything
else as the budget gives it, and counts the windows of the spill it reads (``curate.dedup.routing``).
Forcing 22 buckets on 1M documents is the 10M run's bucket count on a tenth of its data: if the
plan's time stays flat across the row, the 10M plan grows only with its documents. Each count
runs ``--reps`` times (interleaved); every run must give the same edges.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import scale  # noqa: E402  (the corpus and its cache)

WORK = scale.DATA / "work"


def spill_keys(n_docs: int) -> list[str]:
    """The keys files of ``dedup.minhash`` alone over the first ``n_docs`` documents (the job runs once, then cached)."""
    corpus = scale.DATA / "1000000"
    scale.build(1_000_000, corpus)
    data = corpus if n_docs >= 1_000_000 else scale.subset(corpus, n_docs)
    out = WORK / f"minhash-plan-{n_docs}"
    keys = sorted(str(p) for p in (out / "_work").glob("phase-*/task-*/keys.parquet"))
    if (out / "manifest.json").exists() and keys:
        return keys
    shutil.rmtree(out, ignore_errors=True)
    job = scale.demo_job(data, out, stages_only="dedup.minhash")
    job.write_text(job.read_text().replace("[job]\n", "[job]\nkeep_work = true\n", 1))
    done = subprocess.run(
        [sys.executable, "-m", "winnow.pipelines.cli", "-q", "curate", str(job)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise SystemExit(f"dedup.minhash on {n_docs:,} documents failed:\n{done.stderr[-3000:]}")
    return sorted(str(p) for p in (out / "_work").glob("phase-*/task-*/keys.parquet"))


def plan_once(keys: list[str], buckets: int, memory_gb: float) -> dict:
    """One timed plan with ``buckets`` verification buckets: seconds, edges, and spill windows read per column."""
    import polars as pl

    import winnow.curate.dedup.grouping as grouping
    import winnow.curate.dedup.routing as routing
    from winnow.curate.dedup.minhash import MinHashConfig, band_columns

    budget = grouping.partitions

    def forced(items, bytes_per_item, memory_gb, *, what):
        return buckets if "candidate pairs" in what else budget(items, bytes_per_item, memory_gb, what=what)

    reads: Counter = Counter()
    read_window = routing.read_window

    def counted(frame, column, *args):
        reads[column] += 1
        return read_window(frame, column, *args)

    in_memory = grouping.in_memory_bytes
    # the partitioned plan, whatever fits: what this bench measures is how its reading grows with the buckets
    grouping.partitions, routing.read_window, grouping.in_memory_bytes = forced, counted, lambda *a: float("inf")
    try:
        config = MinHashConfig()
        folder = WORK / "minhash-plan-scratch"
        options = grouping.GroupOptions(
            verify=config.verify, threshold=config.threshold, chunk_pairs=config.verify_chunk_pairs,
            sample=config.verify_sample, seed=config.seed, memory_gb=memory_gb, stage="bench",
        )  # fmt: skip
        t0 = time.perf_counter()
        grouped = grouping.group(pl.scan_parquet(keys), band_columns(config.lsh_shape()[0]), options, folder=folder)
        seconds = time.perf_counter() - t0
    finally:
        grouping.partitions, routing.read_window, grouping.in_memory_bytes = budget, read_window, in_memory
    labels = grouped.labels  # sorted by row: its bytes identify the clustering
    return {
        "seconds": seconds,
        "partitions": grouped.stats["partitions"],
        "reads": dict(reads),
        "verified": grouped.stats.get("verified_pairs"),
        "labels": hash(labels["_row"].to_numpy().tobytes() + labels["_cluster"].to_numpy().tobytes()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--partitions", default="1,3,22", help="verification buckets to force, comma-separated")
    ap.add_argument("--memory-gb", type=float, default=0.5, help="the budget for every other step of the plan")
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    keys = spill_keys(args.docs)
    spill = sum(os.path.getsize(k) for k in keys)
    print(
        f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}; {args.docs:,} documents, "
        f"{len(keys)} keys files, {spill / 2**20:,.0f} MiB of spill"
    )
    counts = [int(p) for p in args.partitions.split(",")]
    results: dict[int, list[dict]] = {p: [] for p in counts}
    for _ in range(args.reps):
        for p in counts:
            r = plan_once(keys, p, args.memory_gb)
            results[p].append(r)
            print(
                f"  verify buckets {p:>3}: plan {r['seconds']:6.1f} s  partitions {r['partitions']}  spill windows read "
                f"{r['reads']}  verified pairs {r['verified']:,}  load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    assert len({r["labels"] for rs in results.values() for r in rs}) == 1, "the partitioning changed the clusters"
    best = {p: min(r["seconds"] for r in rs) for p, rs in results.items()}
    print(
        "plan time (best of reps) against "
        + f"{counts[0]} bucket(s): "
        + ", ".join(f"{p} buckets {best[p] / best[counts[0]]:.2f}x" for p in counts[1:])
    )


if __name__ == "__main__":
    main()
