"""Helpers for the 2-process gloo tests: a rank-aware batch stream and a spawnable trainer worker."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import socket
from pathlib import Path

import torch
import torch.multiprocessing as mp

from tests.train.test_trainer_loop import SOURCES, SyntheticBatches, tiny_config
from winnow.train.build import build_trainer
from winnow.train.model import Transformer
from winnow.train.parallel import Parallel, ParallelConfig, exit_process, shutdown
from winnow.train.trainer import Trainer


class RankBatches(SyntheticBatches):
    """Global batch ``g`` goes to rank ``g % world``: one rank with ``grad_accum = world`` sees the same global batches."""

    def __init__(self, *, rank: int = 0, world: int = 1, lengths: list[int] | None = None, **kw) -> None:
        super().__init__(**kw)
        self.rank, self.world, self.lengths = rank, world, lengths

    def __next__(self):
        g = self.position + self.rank
        if self.lengths:  # global batch g's sequence length (the last one from there on): a warm-up's growth
            self.seq_len = self.lengths[min(g, len(self.lengths) - 1)]
        batch = self.make(g)
        self.position += self.world
        return batch


def start(fn, nprocs: int, *args, attempts: int = 3) -> None:
    """Run ``fn(rank, nprocs, port, *args)`` on ``nprocs`` processes forked from a server that imported torch.

    A spawned process imports torch and the trainer afresh (seconds of CPU each, two to four
    processes per test); the forkserver does it once per test process and forks each rank from
    there (still a separate process, on gloo, with its own environment set by ``fn``).

    The rendezvous port is free when chosen but another process (a parallel test worker, a gloo
    connection) can take it before rank 0 listens on it: a start that fails with EADDRINUSE is
    tried again on a new port.
    """
    multiprocessing.get_context("forkserver").set_forkserver_preload([__name__])
    for attempt in range(attempts):
        try:
            mp.start_processes(
                fn, args=(nprocs, free_port(), *args), nprocs=nprocs, join=True, start_method="forkserver"
            )
            return
        except mp.ProcessRaisedException as exc:
            if "EADDRINUSE" not in str(exc) or attempt == attempts - 1:
                raise


def free_port() -> int:
    """A port no socket holds now, below Linux's ephemeral range (32768-60999) that outgoing connections draw from."""
    for port in random.sample(range(20000, 32000), 64):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def build(
    run_dir: Path,
    *,
    parallel: Parallel,
    grad_accum: int,
    steps: int,
    model: dict | None = None,
    resume: bool = False,
    config: dict | None = None,
    val_batches: int = 0,
    lengths: list[int] | None = None,
) -> Trainer:
    """A tiny trainer on ``parallel``; each data-parallel rank reads its own batches (tp/pp ranks share theirs)."""
    cfg = tiny_config(
        run_dir,
        steps=steps,
        grad_accum=grad_accum,
        metrics={"log_every": 1},
        checkpoint={"every": 0, "resume": resume},
        model=model or {},
        **(config or {}),
    )
    teacher = None
    if cfg.distill is not None:  # a fixed random teacher of the student's shape, the same on every rank
        torch.manual_seed(cfg.seed + 1)
        teacher = Transformer(cfg.model)
    data = RankBatches(rank=parallel.world.dp_rank, world=parallel.world.dp_size, lengths=lengths)
    held_out = SyntheticBatches(seed=7)  # the same held-out batches on every rank
    val_data = (lambda: (held_out.make(i) for i in range(val_batches))) if val_batches else None
    return build_trainer(cfg, data=data, sources=SOURCES, parallel=parallel, val_data=val_data, teacher=teacher)


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


def records(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def per_source(run_dir: Path) -> list[dict]:
    """Each logged record's per-source loss sums."""
    return [{k: v["loss_sum"] for k, v in r["per_source"].items()} for r in records(run_dir) if "per_source" in r]


def reference_run(tmp_path: Path, *, steps: int, grad_accum: int, **kw) -> dict:
    """The one-process run (in ``tmp_path / "ref"``) a parallel layout is compared with."""
    torch.set_num_threads(1)
    return fit(
        build(tmp_path / "ref", parallel=Parallel.local(torch.device("cpu")), grad_accum=grad_accum, steps=steps, **kw)
    )


def assert_same_run(got: dict, ref: dict, got_dir: Path, ref_dir: Path) -> None:
    """A layout's run equals the one-process run: losses within 1e-5, norms 1e-4, every record's per-source sums."""
    import pytest

    assert got["losses"] == pytest.approx(ref["losses"], abs=1e-5)
    assert got["norms"] == pytest.approx(ref["norms"], rel=1e-4)
    mine, theirs = per_source(got_dir), per_source(ref_dir)
    assert len(mine) == len(theirs) == len(ref["losses"])
    for a, b in zip(mine, theirs, strict=True):
        assert a == pytest.approx(b, rel=1e-5)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def layouts(model: torch.nn.Module) -> dict:
    """Per parameter: its class, DTensor mesh dims and placements (empty when plain), local and dtype."""
    out = {}
    for name, p in model.named_parameters():
        mesh = getattr(p, "device_mesh", None)
        out[name] = {
            "dtensor": mesh is not None,
            "mesh": list(mesh.mesh_dim_names or ()) if mesh is not None else [],
            "mesh_size": mesh.size() if mesh is not None else 1,
            "placements": [str(x) for x in getattr(p, "placements", ())],
            "local_shape": list(_local(p).shape),
            "dtype": str(p.dtype),
        }
    return out


def full_state(trainer: Trainer) -> dict:
    """``trainer.state_dict()``'s model tensors (as sums) and the parameters its optimizer state covers."""
    state = trainer.state_dict()
    return {
        "model": {k: v.double().sum().item() for k, v in state["model"].items()},
        "optimizer": sorted(state["optimizer"]["state"]),
    }


def overflow_steps(trainer: Trainer, *, rank: int, steps: list[int], param: str) -> list[dict]:
    """Run ``trainer``'s schedule, making ``rank``'s part of ``param``'s gradient overflow on ``steps`` (1-based).

    The inf goes into this rank's local part of a gradient after backward, before the scaler
    checks it: an fp16 overflow that only this rank sees. Returns this rank's view of every step.
    """
    scaler, unscale = trainer.scaler, trainer.scaler.unscale_
    # under pipeline parallelism only the ranks of ``param``'s stage hold it
    target = dict(trainer.model.named_parameters()).get(param)
    if trainer.parallel.world.rank == rank and target is None:
        raise KeyError(f"rank {rank} does not hold {param!r}")

    def inject(optimizer):
        if trainer.parallel.world.rank == rank and trainer.step + 1 in steps:
            _local(target.grad).view(-1)[0] = float("inf")
        return unscale(optimizer)

    scaler.unscale_ = inject
    seen = []
    for _ in range(trainer.cfg.steps):
        before = [_local(p).detach().clone() for p in trainer.model.parameters()]
        result = trainer.train_step()
        moved = any(not torch.equal(b, _local(p)) for b, p in zip(before, trainer.model.parameters()))
        seen.append(
            {
                "step": result.step,
                "loss": result.loss,
                "skipped": result.skipped,
                "stepped": moved,
                "scale": float(scaler.get_scale()),
            }
        )
    return seen


def _worker(rank: int, world: int, port: int, job: dict, out: str) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)
    try:
        parallel = Parallel.from_env(ParallelConfig(**job.get("parallel", {})), device="cpu", n_experts=4)
        trainer = build(
            Path(job["run_dir"]),
            parallel=parallel,
            grad_accum=job.get("grad_accum", 1),
            steps=job["steps"],
            model=job.get("model"),
            resume=job.get("resume", False),
            config=job.get("config"),
            val_batches=job.get("val_batches", 0),
            lengths=job.get("lengths"),
        )
        if job.get("overflow"):  # every rank reports: what each one decided is the point
            result = {"steps": overflow_steps(trainer, **job["overflow"]), "layouts": layouts(trainer.model)}
            Path(f"{out}.{rank}").write_text(json.dumps(result, default=str))
        elif job.get("compare_compile"):  # the same run eager, then with [train] compile
            result = {"eager": fit(trainer)["losses"]}
            compiled = build(
                Path(job["run_dir"]) / "compiled",
                parallel=parallel,
                grad_accum=job.get("grad_accum", 1),
                steps=job["steps"],
                model=job.get("model"),
                config={**job.get("config", {}), "compile": True},
            )
            result["compiled"] = fit(compiled)["losses"]
        elif job.get("stop_after"):  # train part of the schedule, checkpoint, leave (a preempted run)
            losses = [trainer.train_step().loss for _ in range(job["stop_after"])]
            trainer.save_checkpoint()
            result = {"losses": losses, "positions": [trainer.data.position]}
        else:
            result = fit(trainer)
            result["layouts"] = layouts(trainer.model)
            result["holds_teacher"] = (
                trainer.hook("distill") is not None and trainer.hook("distill").teacher is not None
            )
            if job.get("full_state"):  # the one-process state, gathered from every rank (a collective)
                result["full_state"] = full_state(trainer)
            result["optim_dtypes"] = sorted(
                {
                    str(v.dtype)
                    for state in trainer.optimizer.state.values()
                    for v in state.values()
                    if isinstance(v, torch.Tensor) and v.ndim
                }
            )
        if rank == 0:
            Path(out).write_text(json.dumps(result, default=str))
    finally:
        shutdown()
    exit_process(0)  # a spawned rank that finished: no finalization for gloo's threads to race


def spawn(job: dict, out: Path, *, world: int = 2) -> dict:
    """Run ``job`` on ``world`` gloo processes; returns rank 0's record (every rank's, ``ranks``, for ``overflow``)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    start(_worker, world, job, str(out))
    if job.get("overflow"):
        return {"ranks": [json.loads(Path(f"{out}.{r}").read_text()) for r in range(world)]}
    return json.loads(Path(out).read_text())
