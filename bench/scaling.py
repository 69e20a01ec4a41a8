"""Scaling report per parallel layout: the same training job on 1 process and on 2 (gloo on CPU / NCCL on GPU).

For each layout it prints tokens/s, the scaling efficiency (tokens/s on N processes / (N x
tokens/s on 1)) and the communication share — the ``comm_pct`` the trainer itself logs (its
``CommTimer`` around every collective: DDP buckets, FSDP2 all-gathers and reduce-scatters, expert
all-to-alls, pipeline sends and receives, winnow's own all-reduces), read from the run's
``metrics.jsonl``, not measured again here. Every run trains ``--warmup`` untimed steps, then
``--steps`` steps through ``Trainer.fit``, whose one log record covers exactly the timed steps.

    python bench/scaling.py                                  # every layout this checkout offers, 2 processes
    python bench/scaling.py --layouts ddp fsdp --steps 20 --dim 128

Layouts whose config this checkout refuses (or that fail to start) are listed with the reason
instead of a row. Data-parallel layouts keep the per-rank batch (weak scaling: the global batch
grows with N); model-parallel ones (tp, pp) split one batch's work (dp = 1), so their tokens/s is
of the same global batch. Runs are interleaved (base, layouts, base, ... with --repeat 2) because
the machine may be shared; treat the ratios as indicative when other work runs at the same time.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import traceback
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gpu import RandomBatches  # noqa: E402
from winnow.train.build import build_trainer  # noqa: E402
from winnow.train.checkpoint import CheckpointConfig  # noqa: E402
from winnow.train.config import TrainConfig  # noqa: E402
from winnow.train.data import LoaderConfig  # noqa: E402
from winnow.train.errors import ConfigError  # noqa: E402
from winnow.train.metrics import MetricsConfig  # noqa: E402
from winnow.train.model import ModelConfig  # noqa: E402
from winnow.train.parallel import Parallel, ParallelConfig, exit_process, shutdown  # noqa: E402

# [train.parallel] keys of each layout on 2 processes (the base run is one process, no table)
LAYOUTS = {
    "ddp": {},
    "fsdp": {"dp_shard": -1},
    "ddp+ep": {"ep": 2},
    "fsdp+ep": {"dp_shard": -1, "ep": 2},
    "tp": {"tp": 2},
    "tp+sp": {"tp": 2, "sequence_parallel": True},
    "pp": {"pp": 2},
}


def _model(args) -> ModelConfig:
    return ModelConfig(
        vocab_size=512,
        dim=args.dim,
        n_layers=args.layers,
        n_heads=4,
        ffn_hidden=2 * args.dim,
        n_experts=args.experts,
        top_k=2,
        max_seq_len=args.seq,
    )


def _worker(rank: int, world: int, port: int, layout: dict, args: argparse.Namespace, run_dir: str) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(args.threads)
    try:
        pcfg = ParallelConfig(**layout)
        parallel = Parallel.from_env(pcfg, device=args.device, n_experts=args.experts)
        model = _model(args)
        cfg = TrainConfig(
            output=run_dir,
            steps=args.steps + args.warmup,
            model=model,
            eval_every=0,
            data=LoaderConfig(batch_size=args.batch, seq_len=args.seq, num_workers=0),
            metrics=MetricsConfig(log_every=args.steps + args.warmup),
            parallel=pcfg,
            checkpoint=CheckpointConfig(every=0, resume=False),
        )
        torch.manual_seed(0)
        data = RandomBatches(
            batch=args.batch,
            seq=args.seq,
            vocab=512,
            device=parallel.world.device,
            rank=parallel.world.dp_rank,
            world=parallel.world.dp_size,
        )
        trainer = build_trainer(cfg, data=data, sources=["a", "b"], parallel=parallel)
        for _ in range(args.warmup):
            trainer.train_step()
        trainer.fit()  # restarts the throughput clock: its one record covers the timed steps
    except Exception:
        Path(run_dir, f"error-{rank}.txt").write_text(traceback.format_exc())
        raise
    finally:
        shutdown()
    exit_process(0)  # a spawned rank that finished: no finalization for gloo's threads to race


def run(layout: dict, world: int, args: argparse.Namespace) -> dict:
    """The trainer's last metrics record of ``layout`` on ``world`` processes (``error``: why it did not run)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="winnow-scaling-") as run_dir:
        try:
            mp.spawn(_worker, args=(world, port, layout, args, run_dir), nprocs=world, join=True)
        except Exception as err:  # noqa: BLE001  (a layout that fails to start is reported, not fatal)
            errors = sorted(Path(run_dir).glob("error-*.txt"))
            text = errors[0].read_text().strip().splitlines()[-1] if errors else str(err)
            return {"error": text}
        records = [json.loads(line) for line in Path(run_dir, "metrics.jsonl").read_text().splitlines()]
    last = [r for r in records if "tokens_per_s" in r][-1]
    return {"tokens_per_s": last["tokens_per_s"], "comm_pct": last["comm_pct"]}


def offered(names: list[str], world: int, n_experts: int) -> tuple[list[str], dict[str, str]]:
    """The layouts this checkout's config accepts for ``world`` processes, and why the others are refused."""
    ok, refused = [], {}
    for name in names:
        try:
            ParallelConfig(**LAYOUTS[name]).resolve(world, n_experts=n_experts)
            ok.append(name)
        except ConfigError as err:
            refused[name] = str(err)
    return ok, refused


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layouts", nargs="+", choices=sorted(LAYOUTS), default=list(LAYOUTS))
    p.add_argument("--procs", type=int, default=2, help="processes of each layout's run (the base run has 1)")
    p.add_argument("--steps", type=int, default=12, help="timed steps per run (size flag)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeat", type=int, default=2, help="interleaved repetitions")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--experts", type=int, default=4)
    p.add_argument("--batch", type=int, default=4, help="sequences per data-parallel rank")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per process")
    p.add_argument("--device", choices=["cpu", "cuda", "auto"], default="cpu")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    names, refused = offered(args.layouts, args.procs, args.experts)
    base: list[float] = []
    results: dict[str, list[dict]] = {n: [] for n in names}
    for rep in range(args.repeat):
        one = run({}, 1, args)
        if "error" in one:
            raise SystemExit(f"the one-process base run failed: {one['error']}")
        base.append(one["tokens_per_s"])
        print(f"rep {rep} 1 process: {one['tokens_per_s']:.0f} tok/s", flush=True)
        for name in names:
            r = run(LAYOUTS[name], args.procs, args)
            results[name].append(r)
            print(
                f"rep {rep} {name} on {args.procs}: "
                + (
                    f"failed: {r['error']}"
                    if "error" in r
                    else f"{r['tokens_per_s']:.0f} tok/s, comm {r['comm_pct']:.1f}%"
                ),
                flush=True,
            )
    rate1 = max(base)
    print(
        f"\n{'layout':>8} {'procs':>5} {'tokens/s':>10} {'speed-up':>9} {'efficiency':>10} {'comm_pct':>9}"
        f"  (best of {args.repeat}; base: 1 process, {rate1:.0f} tok/s)"
    )
    for name in names:
        ran = [r for r in results[name] if "error" not in r]
        if not ran:
            print(f"{name:>8} {args.procs:>5}  failed to run: {results[name][-1]['error']}")
            continue
        best = max(ran, key=lambda r: r["tokens_per_s"])
        print(
            f"{name:>8} {args.procs:>5} {best['tokens_per_s']:>10.0f} {best['tokens_per_s'] / rate1:>8.2f}x "
            f"{best['tokens_per_s'] / (args.procs * rate1):>9.0%} {best['comm_pct']:>8.1f}%"
        )
    for name, why in refused.items():
        print(f"{name:>8}  not offered by this checkout: {why}")
    print(
        f"({os.cpu_count()} CPUs visible, {args.threads} thread(s) per process; comm_pct is the trainer's own "
        "metric; shared machines make these ratios indicative only)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
