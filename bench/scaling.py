"""Scaling report: the same training job on 1, 2, ... processes (torchrun-style, gloo on CPU / NCCL on GPU).

Prints tokens/s, scaling efficiency (tokens/s on N processes / (N x tokens/s on 1)) and the share
of step time spent in communication (timers around the collectives; DDP's overlapped bucket
all-reduces count as the wall time some all-reduce was in flight). Weak scaling: every process
keeps the per-rank batch, so the global batch grows with N — the "knee" is where efficiency drops.

    python bench/scaling.py --procs 1 2 --steps 12 --dim 64       # a couple of minutes on 2 cores
    python bench/scaling.py --procs 1 2 4 --mode fsdp --experts 8 --expert-parallel 2

Runs are interleaved (1, 2, 1, 2 with --repeat 2) because the machine may be shared; treat the
ratios as indicative when other work runs at the same time.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from train.checkpoint import CheckpointConfig  # noqa: E402
from train.config import TrainConfig  # noqa: E402
from train.data import Batch, LoaderConfig  # noqa: E402
from train.metrics import MetricsConfig  # noqa: E402
from train.model import ModelConfig, Transformer  # noqa: E402
from train.parallel import Parallel, ParallelConfig, shutdown  # noqa: E402
from train.trainer import Trainer  # noqa: E402


class RandomBatches:
    """Synthetic token batches (the loader is benchmarked in bench/loader.py); global batch g to rank g % world."""

    def __init__(self, *, rank: int, world: int, batch: int, seq: int, vocab: int) -> None:
        self.rank, self.world, self.batch, self.seq, self.vocab, self.position = rank, world, batch, seq, vocab, 0

    def __iter__(self):
        return self

    def __next__(self) -> Batch:
        g = torch.Generator().manual_seed(self.position + self.rank)
        self.position += self.world
        seq = torch.randint(0, self.vocab, (self.batch, self.seq + 1), generator=g)
        shape = (self.batch, self.seq)
        return Batch(seq[:, :-1].contiguous(), seq[:, 1:].contiguous(), torch.zeros(shape, dtype=torch.long),
                     torch.ones(shape, dtype=torch.bool), torch.zeros(shape, dtype=torch.int32), [])

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(args.threads)
    try:
        pcfg = ParallelConfig(dp_shard=-1 if args.mode == "fsdp" and world > 1 else 1,
                              ep=args.expert_parallel if world > 1 else 1, powersgd_rank=args.powersgd_rank if world > 1 else 0)
        parallel = Parallel.from_env(pcfg, device=args.device, n_experts=args.experts)
        model = ModelConfig(vocab_size=512, dim=args.dim, n_layers=args.layers, n_heads=4, ffn_hidden=2 * args.dim,
                            n_experts=args.experts, top_k=2, max_seq_len=args.seq)
        with tempfile.TemporaryDirectory() as run_dir:
            cfg = TrainConfig(output=run_dir, steps=args.steps + args.warmup, model=model, eval_every=0,
                              data=LoaderConfig(batch_size=args.batch, seq_len=args.seq, num_workers=0),
                              metrics=MetricsConfig(log_every=10**9), parallel=pcfg,
                              checkpoint=CheckpointConfig(every=0, resume=False))
            torch.manual_seed(0)
            data = RandomBatches(rank=rank, world=world, batch=args.batch, seq=args.seq, vocab=512)
            trainer = Trainer(cfg, model=Transformer(model), data=data, sources=["synthetic"], run_dir=run_dir,
                              device=parallel.world.device, parallel=parallel)
            for _ in range(args.warmup):
                trainer.train_step()
            parallel.comm_report()
            start = time.perf_counter()
            for _ in range(args.steps):
                trainer.train_step()
            elapsed = time.perf_counter() - start
            comm = parallel.comm_report()
        if rank == 0:
            tokens = args.steps * args.batch * args.seq * world
            Path(out).write_text(json.dumps({"tokens_per_s": tokens / elapsed, "step_s": elapsed / args.steps,
                                             "comm_share": comm["seconds"] / elapsed, "bytes_saved": comm["bytes_saved"]}))
    finally:
        shutdown()


def run(world: int, args: argparse.Namespace) -> dict:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    mp.spawn(_worker, args=(world, port, args, out), nprocs=world, join=True)
    result = json.loads(Path(out).read_text())
    os.unlink(out)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--procs", type=int, nargs="+", default=[1, 2], help="process counts to compare (first is the base)")
    p.add_argument("--mode", choices=["ddp", "fsdp"], default="ddp")
    p.add_argument("--expert-parallel", type=int, default=1)
    p.add_argument("--powersgd-rank", type=int, default=0)
    p.add_argument("--steps", type=int, default=12, help="timed steps per run (size flag)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeat", type=int, default=2, help="interleaved repetitions (A B A B)")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--experts", type=int, default=4)
    p.add_argument("--batch", type=int, default=4, help="sequences per rank")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per process")
    p.add_argument("--device", choices=["cpu", "cuda", "auto"], default="cpu")
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    results: dict[int, list[dict]] = {n: [] for n in args.procs}
    for rep in range(args.repeat):
        for n in args.procs:
            r = run(n, args)
            results[n].append(r)
            print(f"rep {rep} procs {n}: {r['tokens_per_s']:.0f} tok/s, step {1000 * r['step_s']:.0f} ms, "
                  f"comm {100 * r['comm_share']:.1f}%", flush=True)
    base_n = args.procs[0]
    base = max(r["tokens_per_s"] for r in results[base_n]) / base_n  # per-process rate of the base run
    print(f"\n{'procs':>5} {'tokens/s':>10} {'speed-up':>9} {'efficiency':>10} {'comm share':>10}  (best of {args.repeat})")
    for n in args.procs:
        best = max(results[n], key=lambda r: r["tokens_per_s"])
        print(f"{n:>5} {best['tokens_per_s']:>10.0f} {best['tokens_per_s'] / (base * base_n):>8.2f}x "
              f"{best['tokens_per_s'] / (base * n):>9.0%} {best['comm_share']:>9.1%}")
    print(f"(mode {args.mode}, ep {args.expert_parallel}, powersgd rank {args.powersgd_rank}, "
          f"{os.cpu_count()} CPUs visible; shared machines make these ratios indicative only)")


if __name__ == "__main__":
    main()
