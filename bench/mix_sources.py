"""Benchmark: the ``mix`` and ``order`` plans at 100,000 sources, next to 10 sources at the same row count.

    python bench/mix_sources.py                                   # 1M rows: 10 vs 100,000 sources
    python bench/mix_sources.py --rows 3000000 --sources 1000 10000 100000 --rounds 2

Sources taken from a field (web domains, repositories) number 10^4-10^5, so a global plan must
cost O(rows + sources + tasks), never rows x sources or sources x tasks. This generates the key
spills the runner hands the ``mix`` and ``order`` barriers (id, source, token estimate, id hash,
ordering value, ``_task``; Parquet under ``bench/_data/``) for the same rows spread over 10 sources
and over each larger count (Zipf-sized: one row each at least, the rest with p ~ 1/rank^1.1), then
runs each plan in a fresh process (so its peak RSS is its own), sizes interleaved A B A B:

* ``Mix.plan`` with temperature 2 and a 2-epoch cap (small sources up-sampled to the cap, large
  ones cut in a partial pass: a cut-off per source), plus every task's decision, as the runner writes it;
* ``Order.plan`` by a random difficulty, stratified windows of 1,000 rows, plus every task's ranks.

Prints seconds and peak RSS per size, and the ratio of each size to 10 sources. There is no peer: no
curation tool we know plans a mixture per source at this count (datatrove and NeMo Curator mix by
sampling streams, which needs no plan); the reference is winnow itself at 10 sources.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402


def generate(rows: int, sources: int, tasks: int, folder: Path) -> None:
    """Key spills of ``rows`` rows over ``sources`` Zipf-sized sources in ``tasks`` files."""
    if (folder / "_SUCCESS").exists():
        return
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    p = 1.0 / np.arange(1, sources + 1) ** 1.1
    codes = np.concatenate([np.arange(sources), rng.choice(sources, size=rows - sources, p=p / p.sum())])
    rng.shuffle(codes)
    width = len(str(sources))
    base = (
        pl.DataFrame({"_c": codes.astype(np.int64), "_i": np.arange(rows, dtype=np.int64)})
        .with_columns(
            source=pl.format("site-{}.example", pl.col("_c").cast(pl.String).str.zfill(width)),
            _task=(pl.col("_i") * tasks // rows).cast(pl.Int32),
            _tokens=pl.Series(rng.integers(50, 2000, rows, dtype=np.int32)),
            _h=pl.Series(rng.integers(0, 2**63, rows, dtype=np.uint64)),
            _value=pl.Series(rng.random(rows)),
        )
        .with_columns(id=pl.format("{}/doc-{}", "source", "_i"), repeat=pl.lit(0, pl.Int32))
    )
    for t in range(tasks):
        part = base.filter(pl.col("_task") == t)
        part.select("id", "source", "_tokens", "_h", "_task").write_parquet(folder / f"mix-{t:04d}.parquet")
        part.select("id", "repeat", "source", "_value", "_h", "_task").write_parquet(folder / f"order-{t:04d}.parquet")
    (folder / "_SUCCESS").touch()


def _peak_mib() -> float:
    """This process's peak memory (VmHWM): ru_maxrss would include the parent bench's peak, which survives exec."""
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM")).split()[1]) / 1024


def child(folder: Path, which: str) -> dict:
    """One plan in this fresh process: its seconds, and the process's peak RSS."""
    from winnow.curate.stages.base import StageContext
    from winnow.curate.stages.mix import Mix, MixConfig
    from winnow.curate.stages.order import Order, OrderConfig

    ctx = StageContext(
        stage_id="bench", job_name="bench", output_dir=folder, plan_dir=folder / f"plan-{which}", sources=()
    )
    stage = (
        Mix(MixConfig(scheme="temperature", temperature=2.0, max_epochs=2.0), ctx)
        if which == "mix"
        else Order(OrderConfig(by="difficulty", window=1000), ctx)
    )
    files = sorted(folder.glob(f"{which}-*.parquet"))
    warm = stage.plan(pl.scan_parquet(files[:1]).head(1000))  # numba's kernels load outside the measurement
    warm.per_task(0, pl.scan_parquet(files[:1]).head(1000))
    idle = _peak_mib()
    t0 = time.perf_counter()
    plan = stage.plan(pl.scan_parquet(files))
    decided = 0
    (folder / f"plan-{which}").mkdir(exist_ok=True)
    for t, f in enumerate(files):  # as the runner does: each task's decision, one task at a time
        part = plan.per_task(t, pl.scan_parquet(f))
        part.write_parquet(folder / f"plan-{which}" / f"decision-{t:04d}.parquet")
        decided += part.height
    return {"seconds": time.perf_counter() - t0, "peak_mib": _peak_mib(), "idle_mib": idle, "decided": decided}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--sources", type=int, nargs="+", default=[100_000], help="source counts to compare with 10")
    ap.add_argument("--tasks", type=int, default=16, help="key spill files (map tasks)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of every size, interleaved")
    ap.add_argument("--plans", nargs="+", default=["mix", "order"], choices=["mix", "order"])
    ap.add_argument("--child", choices=["mix", "order"], help=argparse.SUPPRESS)
    ap.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.data, args.child)))
        return
    sizes = [10, *args.sources]
    folders = {}
    for s in sizes:
        folders[s] = ROOT / "bench" / "_data" / f"mix_sources-{args.rows}-{s}-{args.tasks}"
        t0 = time.perf_counter()
        generate(args.rows, s, args.tasks, folders[s])
        print(f"keys: {args.rows:,} rows over {s:,} sources in {args.tasks} spills ({time.perf_counter() - t0:.1f} s)")
    best: dict[tuple[str, int], dict] = {}
    for r in range(args.rounds):
        for which in args.plans:
            for s in sizes:
                cmd = [sys.executable, __file__, "--child", which, "--data", str(folders[s])]
                done = subprocess.run(
                    cmd, capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
                )
                res = json.loads(done.stdout.strip().splitlines()[-1])
                assert res["decided"] == args.rows, res
                print(
                    f"round {r} {which:5s} {s:>7,} sources: {res['seconds']:7.2f} s, peak RSS {res['peak_mib']:6.0f} MiB "
                    f"(before the plan {res['idle_mib']:.0f})"
                )
                key = (which, s)
                if key not in best or res["seconds"] < best[key]["seconds"]:
                    best[key] = {**res, "peak_mib": min(res["peak_mib"], best.get(key, res)["peak_mib"])}
    print(f"\nbest of {args.rounds}, {args.rows:,} rows, {args.tasks} tasks:")
    for which in args.plans:
        ref = best[(which, 10)]
        for s in sizes:
            b = best[(which, s)]
            print(
                f"  {which:5s} {s:>7,} sources: {b['seconds']:7.2f} s ({b['seconds'] / ref['seconds']:.2f}x 10 sources), "
                f"peak RSS {b['peak_mib']:6.0f} MiB ({b['peak_mib'] / ref['peak_mib']:.2f}x)"
            )


if __name__ == "__main__":
    main()
