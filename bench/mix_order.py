"""Benchmark: the ``mix`` and ``order`` plans on generated keys, against Hugging Face datasets.

    python bench/mix_order.py --rows 10000000          # 10M rows (a few minutes)
    python bench/mix_order.py --rows 1000000 --rounds 2

Generates the per-task key spills the runner would hand these barriers (id, source, token
estimate, id hash, score / ordering value, ``_task``; Parquet under ``bench/_data/``), then
runs, each in a fresh process so peak memory is its own:

* winnow: ``Mix.plan`` (explicit weights, 2-epoch cap, up- and down-sampling) over the mix
  keys, and ``Order.plan`` (by difficulty, sqrt pacing, stratified windows, window shuffle)
  over order keys of the same size;
* the peer, ``datasets`` (no curriculum exists in any peer, so the closest pipeline):
  ``interleave_datasets`` with the same shares (probabilistic mixing) then ``sort`` by
  difficulty (a global sort, no pacing or stratification).

The winnow side includes writing every task's decision file, one task at a time, as the
runner does. Prints rows/s and plan memory (peak RSS during the plan minus RSS before it, per row; the
target is under 100 bytes/row), interleaved A B A B. The machine may be shared:
read ratios as paired comparisons within one run. ``datasets`` is a winnow test
dependency already; nothing else is needed.
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

WEIGHTS = {"web": 0.4, "code": 0.25, "books": 0.15, "wiki": 0.1, "papers": 0.05, "legal": 0.05}
SIZES = {"web": 0.55, "code": 0.2, "books": 0.1, "wiki": 0.08, "papers": 0.05, "legal": 0.02}  # of the rows


def generate(rows: int, tasks: int, folder: Path) -> None:
    """Key spills of ``rows`` rows in ``tasks`` files, in the layout the runner writes."""
    if (folder / "_SUCCESS").exists():
        return
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    names = list(SIZES)
    codes = rng.choice(len(names), size=rows, p=list(SIZES.values())).astype(np.int32)
    base = (
        pl.DataFrame({"_c": codes, "_i": np.arange(rows, dtype=np.int64)})
        .with_columns(
            source=pl.col("_c").replace_strict(range(len(names)), names, return_dtype=pl.String),
            _task=(pl.col("_i") * tasks // rows).cast(pl.Int32),
            _tokens=pl.Series(rng.integers(50, 2000, rows, dtype=np.int32)),
            _h=pl.Series(rng.integers(0, 2**63, rows, dtype=np.uint64)),
        )
        .with_columns(id=pl.format("{}/doc-{}", "source", "_i"))
    )
    difficulty = pl.Series(rng.random(rows))
    for t in range(tasks):
        part = base.filter(pl.col("_task") == t)
        part.select("id", "source", "_tokens", "_h", "_task").write_parquet(folder / f"mix-{t:04d}.parquet")
        order = part.with_columns(repeat=pl.lit(0, pl.Int32), _value=difficulty.filter(base["_task"] == t))
        order.select("id", "repeat", "source", "_value", "_h", "_task").write_parquet(folder / f"order-{t:04d}.parquet")
    (folder / "_SUCCESS").touch()


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak() -> int:
    """This process's peak memory in bytes (VmHWM): ru_maxrss would include the parent bench's peak (it survives exec)."""
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM")).split()[1]) * 1024


def child_winnow(folder: Path, rows: int, which: str) -> dict:
    """One winnow plan (``mix`` or ``order``); a process each, so ru_maxrss is that plan's peak."""
    from winnow.curate.stages.base import StageContext
    from winnow.curate.stages.mix import Mix, MixConfig
    from winnow.curate.stages.order import Order, OrderConfig

    ctx = StageContext(
        stage_id="bench", job_name="bench", output_dir=folder, plan_dir=folder / "plan", sources=tuple(SIZES)
    )
    if which == "mix":
        stage = Mix(MixConfig(weights=WEIGHTS, max_epochs=2.0), ctx)
    else:
        stage = Order(OrderConfig(by="difficulty", pacing="sqrt", window=1000, shuffle_within_window=True), ctx)
    files = sorted(folder.glob(f"{which}-*.parquet"))
    warm = stage.plan(pl.scan_parquet(files[:1]).head(1000))  # load the numba kernels outside the measurement
    warm.per_task(0, pl.scan_parquet(files[:1]).head(1000))
    before, t0 = _rss(), time.perf_counter()
    plan = stage.plan(pl.scan_parquet(files))
    decision_rows = 0
    (folder / "plan").mkdir(exist_ok=True)
    for t, f in enumerate(files):  # what the runner then does: each task's decision, one task at a time
        part = plan.per_task(t, pl.scan_parquet(f))
        part.write_parquet(folder / "plan" / f"decision-{t:04d}.parquet")
        decision_rows += part.height
    seconds = time.perf_counter() - t0
    return {
        which: {
            "seconds": seconds,
            "rows_per_s": rows / seconds,
            "bytes_per_row": (_peak() - before) / rows,
            "decision_rows": decision_rows,
        }
    }


def child_peer(folder: Path, rows: int) -> dict:
    import datasets

    datasets.disable_progress_bars()
    table = (
        pl.scan_parquet(sorted(folder.glob("order-*.parquet"))).select("id", "source", "_value").collect().to_arrow()
    )
    before, t0 = _rss(), time.perf_counter()
    full = datasets.Dataset(table)
    parts = [
        full.filter(lambda s, n=n: [x == n for x in s], input_columns="source", batched=True, batch_size=100_000)
        for n in SIZES
    ]
    mixed = datasets.interleave_datasets(parts, probabilities=[WEIGHTS[n] for n in SIZES], seed=0)
    t1 = time.perf_counter()
    ordered = mixed.sort("_value")
    t2 = time.perf_counter()
    return {
        "mix": {"seconds": t1 - t0, "rows_per_s": rows / (t1 - t0), "bytes_per_row": None, "decision_rows": len(mixed)},
        "order": {
            "seconds": t2 - t1,
            "rows_per_s": len(mixed) / (t2 - t1),
            "bytes_per_row": (_peak() - before) / rows,
            "decision_rows": len(ordered),
        },
    }


def run_child(kind: str, folder: Path, rows: int) -> dict:
    out: dict = {}
    for child in ("mix", "order") if kind == "winnow" else ("peer",):
        cmd = [sys.executable, __file__, "--child", child, "--data", str(folder), "--rows", str(rows)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        out |= json.loads(done.stdout.strip().splitlines()[-1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--tasks", type=int, default=16, help="key spill files (map tasks)")
    ap.add_argument("--rounds", type=int, default=2, help="A B rounds, interleaved")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--child", choices=["mix", "order", "peer"], help=argparse.SUPPRESS)
    ap.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        res = (
            child_peer(args.data, args.rows) if args.child == "peer" else child_winnow(args.data, args.rows, args.child)
        )
        print(json.dumps(res))
        return
    folder = ROOT / "bench" / "_data" / f"mix_order-{args.rows}-{args.tasks}"
    t0 = time.perf_counter()
    generate(args.rows, args.tasks, folder)
    print(f"keys: {args.rows:,} rows in {args.tasks} spills ({time.perf_counter() - t0:.1f}s) at {folder}")
    results: dict[str, list[dict]] = {"winnow": [], "peer": []}
    for r in range(args.rounds):
        for kind in ("winnow",) if args.no_peer else ("winnow", "peer"):
            res = run_child(kind, folder, args.rows)
            results[kind].append(res)
            parts = ", ".join(
                f"{k} {v['rows_per_s'] / 1e6:.2f} M rows/s"
                + (f" {v['bytes_per_row']:.0f} B/row" if v["bytes_per_row"] is not None else "")
                for k, v in res.items()
            )
            print(f"round {r} {kind:7s} {parts}")
    best = {k: {p: min(x[p]["seconds"] for x in v) for p in ("mix", "order")} for k, v in results.items() if v}
    w = best["winnow"]
    mem = max(max(x["mix"]["bytes_per_row"], x["order"]["bytes_per_row"]) for x in results["winnow"])
    print(
        f"winnow mix+order: {2 * args.rows / (w['mix'] + w['order']) / 1e6:.2f} M rows/s (best round); plan memory {mem:.0f} B/row (target < 100)"
    )
    if results["peer"]:
        p = best["peer"]
        print(
            f"ratio (peer seconds / winnow seconds): mix {p['mix'] / w['mix']:.2f}x, order {p['order'] / w['order']:.2f}x, "
            f"total {(p['mix'] + p['order']) / (w['mix'] + w['order']):.2f}x"
        )
        print(
            "note: the peer mixes by sampling shares and sorts globally; winnow also meets token shares exactly, "
            "caps epochs, paces and stratifies. The machine is shared: ratios are paired, not absolute."
        )


if __name__ == "__main__":
    main()
