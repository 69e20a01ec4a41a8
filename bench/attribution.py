"""Benchmark: what attribution costs on the demo's training run, and how well its estimates add up.

    winnow curate pipelines/demo.toml            # once: the demo's shards in out/demo
    python bench/attribution.py --rounds 4            # the demo's settings: 150 steps, 26-150 attributed, every 25
    python bench/attribution.py --study out/demo/ablate    # also a finished study's check of the counterfactual
    python bench/attribution.py --rounds 0 --breakdown     # where an attributed step's time goes
    python bench/attribution.py --batch 8 --steps 300 --start 50   # a smaller batch: 1,024 tokens a step

Contenders train the demo's model (``pipelines/demo.toml``: dim 128, 4 layers, 8 experts, batch
64 x 128) on the demo's shards for the same steps from the same seed:

- ``off``: no attribution (the peer every ratio is against);
- ``tokens``: attribution every ``--every`` steps (the demo's 25), per-source gradients split by
  token inside the trainer's one backward (``[train.attribution] split = "tokens"``);
- ``losses``: the same with one extra backward per source (``split = "losses"``; `--contenders off,tokens,losses`).

Every round runs each contender once, the order alternating between rounds (A B C, C B A), and
the overhead printed is the median over rounds of each contender's time over the ``off`` time of
the same round, in wall seconds and in CPU seconds of the process (the figure a shared machine's
descheduling distorts least). The defaults are the demo job's ``[train]`` settings (150 steps of
64 x 128 tokens, steps 26-150 attributed in stretches of 25); ``--batch``, ``--steps``, ``--start``,
``--every`` and ``--rows`` change them. Each attributed run then prints the
efficiency of its last record: per held-out source the measured change, the sources' column sum,
their ratio and the quadrature residual as a share of the measured change.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from winnow.pipelines.train import build_trainer, load_train_config  # noqa: E402
from winnow.train.attribution import AttributionConfig  # noqa: E402
from winnow.train.checkpoint import CheckpointConfig  # noqa: E402


def _config(
    shards: Path,
    out: Path,
    *,
    steps: int,
    every: int,
    start: int,
    split: str | None,
    batch: int | None = None,
    rows: int = 4,
):
    cfg = load_train_config(ROOT / "pipelines" / "demo.toml", steps=steps, output=str(out), shards=str(shards))
    attribution = (
        AttributionConfig(every=every, start=start, split=split, heldout_rows=rows) if split else AttributionConfig()
    )
    data = dataclasses.replace(
        cfg.data,
        num_workers=0,  # tokenizing inline: the same work in every contender
        batch_size=batch or cfg.data.batch_size,
    )
    return dataclasses.replace(
        cfg, eval_every=0, attribution=attribution, data=data, checkpoint=CheckpointConfig(every=0, resume=False)
    )


def _run(cfg) -> tuple[float, float, dict | None]:
    """(wall s, process CPU s, last attribution record) of the training loop: the trainer's steps and
    the attribution's work (its probe read and evaluated included), not the loader's start or evaluation."""
    torch.manual_seed(0)
    trainer = build_trainer(cfg)
    next(trainer._batches)  # the loader's start-up (reading shards, first tokenizing) is no one's cost
    record = None
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(cfg.steps):
        trainer.train_step()
        records = trainer.after_step()  # a stretch closes when it is due (the hooks: train/hooks.py)
        if trainer.step == cfg.steps:
            records += trainer.after_step(last=True)  # the last stretch and the counterfactual's probe
        record = next((r["attribution"] for r in records if "attribution" in r), record)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    trainer.metrics.close()
    trainer.data.close()
    return wall, cpu, record


def _efficiency(name: str, record: dict) -> None:
    measured, columns = np.asarray(record["measured"]), np.asarray(record["matrix"]).sum(0)
    residual = np.asarray(record["residual"])
    print(
        f"{name}: steps {record['steps'][0]}-{record['steps'][1]}, per held-out source "
        "(measured change, sources' column sum, sum / measured, |residual| / |measured|):"
    )
    for s, m, c, r in zip(record["sources"], measured, columns, residual):
        print(f"  {s:<12} {m:+.4f} {c:+.4f}  {c / m:5.2f}x  {abs(r) / abs(m):6.1%}", flush=True)


def _study(folder: Path) -> None:
    path = folder / "ablation" / "correlation.json"
    if not path.is_file():
        print(f"no {path}: run `winnow ablate` on a study first")
        return
    c = json.loads(path.read_text())
    print(
        f"study {folder}: the counterfactual against the measured deltas: signs agree on {c.get('sign_agree')} of "
        f"{c.get('above_noise')} cells above the seed noise, sizes within 2x on {c.get('within_2x')}; Spearman "
        f"{c.get('spearman')} over {c.get('n_cells')} cells"
    )


def _breakdown(args) -> None:
    """Median times of one off step and one attributed step in alternating blocks of 10 (the second's extra
    split into the moment step, ``MomentSplit.after_step``, and the rest: the backward's per-source parts),
    and of one probe evaluation and one stretch's close; then the overhead per attributed step they imply."""
    from winnow.train.attribution import split as moment_split

    def trainer(split):
        cfg = _config(
            args.shards,
            Path(tmp) / f"breakdown-{split}",
            steps=10**6,
            every=args.every,
            start=0,
            split=split,
            batch=args.batch,
            rows=args.rows,
        )
        torch.manual_seed(0)
        t = build_trainer(cfg)
        for _ in range(3):  # the loader's start, the first steps' allocations
            t.train_step()
        return t

    moments: list[float] = []
    after_step = moment_split.MomentSplit.after_step

    def timed(self, clip):
        start = time.perf_counter()
        after_step(self, clip)
        moments.append(time.perf_counter() - start)

    with tempfile.TemporaryDirectory() as tmp:
        off, on = trainer(None), trainer("tokens")
        moment_split.MomentSplit.after_step = timed
        try:
            steps = {"off": [], "on": []}
            for r in range(8):
                for name in ("off", "on") if r % 2 == 0 else ("on", "off"):
                    t = off if name == "off" else on
                    for _ in range(10):
                        start = time.perf_counter()
                        t.train_step()
                        steps[name].append(time.perf_counter() - start)
            attribution = on.hook("attribution").attribution
            probes = []
            for _ in range(4):
                start = time.perf_counter()
                attribution._evaluate()
                probes.append(time.perf_counter() - start)
            closes = []
            for _ in range(3):
                on.train_step()
                start = time.perf_counter()
                attribution.close(step=on.step)
                closes.append(time.perf_counter() - start)
        finally:
            moment_split.MomentSplit.after_step = after_step
        for t in (off, on):
            t.metrics.close()
            t.data.close()
    ms = {
        k: 1e3 * statistics.median(v)
        for k, v in (
            ("off", steps["off"]),
            ("on", steps["on"]),
            ("moments", moments),
            ("probe", probes),
            ("close", closes),
        )
    }
    extra = ms["on"] - ms["off"]
    per_step = extra + ms["close"] / args.every
    print(
        f"breakdown (batch {args.batch or 'as the demo'}, {args.rows} probe rows per source, every {args.every}): "
        f"step {ms['off']:.1f} ms off, {ms['on']:.1f} ms attributed (+{extra:.1f}: moment step {ms['moments']:.1f}, "
        f"backward's per-source parts {extra - ms['moments']:.1f}); probe evaluation {ms['probe']:.0f} ms, stretch "
        f"close {ms['close']:.0f} ms; per attributed step {per_step:.1f} ms = {per_step / ms['off']:.1%} of an off step"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=Path, default=ROOT / "out" / "demo", help="the demo's curated job folder")
    parser.add_argument("--steps", type=int, help="[train] steps (default: the demo's)")
    parser.add_argument("--every", type=int, help="[train.attribution] every (default: the demo's)")
    parser.add_argument("--start", type=int, help="[train.attribution] start (default: the demo's)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--contenders", default="off,tokens")
    parser.add_argument("--batch", type=int, help="[train.data] batch_size (default: the demo's)")
    parser.add_argument("--rows", type=int, default=4, help="[train.attribution] heldout_rows (default 4)")
    parser.add_argument("--breakdown", action="store_true", help="also time the parts of an attributed step")
    parser.add_argument("--study", type=Path, help="a finished ablation study folder: print how its counterfactual did")
    args = parser.parse_args()
    demo = load_train_config(ROOT / "pipelines" / "demo.toml")
    args.steps = args.steps or demo.steps
    args.every = args.every or demo.attribution.every
    args.start = demo.attribution.start if args.start is None else args.start
    if not (args.shards / "manifest.json").is_file():
        print(f"{args.shards} holds no curated job: run `winnow curate pipelines/demo.toml` first")
        return 1
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    names = args.contenders.split(",")
    times: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    last: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                cfg = _config(
                    args.shards,
                    Path(tmp) / f"{name}-{r}",
                    steps=args.steps,
                    every=args.every,
                    start=args.start,
                    split=None if name == "off" else name,
                    batch=args.batch,
                    rows=args.rows,
                )
                wall, cpu, record = _run(cfg)
                times[name].append((wall, cpu))
                print(f"round {r + 1} {name:<7} {wall:7.1f} s wall {cpu:7.1f} s CPU", flush=True)
                if record is not None and name not in last:
                    _efficiency(name, record)  # the same every round: same seed, same steps
                    last[name] = record
    if args.rounds and "off" in times:
        for name in names:
            if name == "off":
                continue
            wall = statistics.median(b[0] / a[0] for a, b in zip(times["off"], times[name]))
            cpu = statistics.median(b[1] / a[1] for a, b in zip(times["off"], times[name]))
            print(
                f"{name}: {wall:.3f} x off in wall time ({wall - 1:+.1%}), {cpu:.3f} x off in CPU time "
                f"({cpu - 1:+.1%}), steps {args.start + 1}-{args.steps} of {args.steps} attributed, every {args.every}"
            )
    if args.breakdown:
        _breakdown(args)
    if args.study is not None:
        _study(args.study)
    return 0


if __name__ == "__main__":
    sys.exit(main())
