"""Helpers for the 2-process gloo tests: a rank-aware batch stream and a spawnable trainer worker."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import torch
import torch.multiprocessing as mp

from tests.train.test_trainer_loop import SOURCES, SyntheticBatches, tiny_config
from train.model import Transformer
from train.parallel import Parallel, ParallelConfig, shutdown
from train.trainer import Trainer


class RankBatches(SyntheticBatches):
    """Global batch ``g`` goes to rank ``g % world``: one rank with ``grad_accum = world`` sees the same global batches."""

    def __init__(self, *, rank: int = 0, world: int = 1, **kw) -> None:
        super().__init__(**kw)
        self.rank, self.world = rank, world

    def __next__(self):
        batch = self.make(self.position + self.rank)
        self.position += self.world
        return batch


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def build(run_dir: Path, *, parallel: Parallel, grad_accum: int, steps: int, model: dict | None = None,
          resume: bool = False) -> Trainer:
    """A tiny trainer on ``parallel``; each data-parallel rank reads its own batches (tp/pp ranks share theirs)."""
    cfg = tiny_config(run_dir, steps=steps, grad_accum=grad_accum, metrics={"log_every": 1},
                      checkpoint={"every": 0, "resume": resume}, model=model or {})
    torch.manual_seed(cfg.seed)
    data = RankBatches(rank=parallel.world.dp_rank, world=parallel.world.dp_size)
    model = Transformer(cfg.model, experts=parallel.expert_shard(cfg.model.n_experts),
                        tensor=parallel.tensor_shard(cfg.model))
    return Trainer(cfg, model=model, data=data, sources=SOURCES, run_dir=run_dir,
                   device=torch.device("cpu"), parallel=parallel)


def fit(trainer: Trainer) -> dict:
    """Run ``fit`` recording every step's loss and norm, the first batch's origins and the comm report."""
    losses, norms, origins, step = [], [], [], trainer.train_step

    def recording():
        result = step()
        losses.append(result.loss)
        norms.append(result.grad_norm)
        origins.append(trainer.data.position)
        return result

    trainer.train_step = recording
    summary = trainer.fit()
    # Each logged metrics record carries the communication since the previous one; add them up.
    comm = trainer.parallel.comm_report()
    metrics = trainer.run_dir / "metrics.jsonl"
    for line in metrics.read_text().splitlines() if metrics.exists() else []:
        for key, value in json.loads(line).get("comm", {}).items():
            comm[key] = comm.get(key, 0) + value
    return {"losses": losses, "norms": norms, "positions": origins, "summary": summary, "comm": comm}


def _worker(rank: int, world: int, port: int, job: dict, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    try:
        parallel = Parallel.from_env(ParallelConfig(**job.get("parallel", {})), device="cpu", n_experts=4)
        trainer = build(Path(job["run_dir"]), parallel=parallel, grad_accum=job.get("grad_accum", 1), steps=job["steps"],
                        model=job.get("model"), resume=job.get("resume", False))
        if job.get("stop_after"):  # train part of the schedule, checkpoint, leave (a preempted run)
            losses = [trainer.train_step().loss for _ in range(job["stop_after"])]
            trainer.save_checkpoint()
            result = {"losses": losses, "positions": [trainer.data.position]}
        else:
            result = fit(trainer)
        if rank == 0:
            Path(out).write_text(json.dumps(result, default=str))
    finally:
        shutdown()


def spawn(job: dict, out: Path, *, world: int = 2) -> dict:
    """Run ``job`` on ``world`` gloo processes; returns rank 0's record."""
    os.environ["OMP_NUM_THREADS"] = "1"
    mp.spawn(_worker, args=(world, free_port(), job, str(out)), nprocs=world, join=True)
    return json.loads(Path(out).read_text())
