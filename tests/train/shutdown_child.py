"""A tiny training run with one failure or signal injected, run as a child process by test_shutdown.py.

``python -m tests.train.shutdown_child SCENARIO FOLDER``: writes tiny shards under FOLDER,
trains 6 steps with one loader worker, evaluation and a checkpoint every 2 steps, and
injects SCENARIO. Every loader worker's pid is appended to ``FOLDER/pids`` so the parent
can check that none outlives the run; the summary goes to ``FOLDER/summary.json``.

``kill-at:K`` / ``kill-in-save:K`` / ``clean`` run the kill-and-resume harness's longer run
(``HARNESS``, logging every step) and SIGKILL it at the start of step K, or halfway through
writing step K's checkpoint; re-running in the same FOLDER resumes.
"""

from __future__ import annotations

import errno
import io
import json
import multiprocessing as mp
import os
import signal
import sys
import time
from pathlib import Path

import torch

import winnow.train.data.workers as workers
from tests.train.shards_util import make_docs, write_job
from winnow import train
from winnow.pipelines.train import build_trainer
from winnow.train.checkpoint import CheckpointConfig
from winnow.train.config import TrainConfig
from winnow.train.data import LoaderConfig
from winnow.train.metrics import MetricsConfig
from winnow.train.model import ModelConfig
from winnow.train.shutdown import WORKER_PREFIX
from winnow.train.trainer import Trainer

SCENARIOS = (
    "worker-error",
    "main-error",
    "eval-error",
    "save-error",
    "sigterm-step",
    "sigterm-eval",
    "sigterm-save",
    "sigterm-wait",
    "sigkill-main",
)


HARNESS = {"steps": 12, "eval_every": 4, "checkpoint": {"every": 3}, "metrics": {"log_every": 1}}


def harness_config(folder: Path) -> TrainConfig:
    return tiny_config(
        folder,
        steps=HARNESS["steps"],
        eval_every=HARNESS["eval_every"],
        checkpoint=CheckpointConfig(**HARNESS["checkpoint"]),
        metrics=MetricsConfig(**HARNESS["metrics"]),
    )


def tiny_config(folder: Path, **kw) -> TrainConfig:
    model = ModelConfig(dim=32, n_layers=2, n_heads=2, ffn_hidden=32, n_experts=4, top_k=2, max_seq_len=64)
    data = LoaderConfig(batch_size=2, seq_len=32, num_workers=1, piece_rows=8, prefetch=2)
    kw = {"steps": 6, "eval_every": 2, "checkpoint": CheckpointConfig(every=2), **kw}
    return TrainConfig(output=str(folder / "run"), shards=str(folder / "job"), model=model, data=data, **kw)


def write_shards(folder: Path) -> None:
    if (folder / "job" / "manifest.json").exists():
        return
    docs = make_docs(96)
    write_job(folder / "job", [docs[:48], docs[48:]], val=[docs[:12]])


def _record_worker_pids(folder: Path) -> None:
    start = workers.PieceStream.__init__

    def recording(self, *args, **kwargs):
        start(self, *args, **kwargs)
        with open(folder / "pids", "a") as f:
            f.writelines(f"{p.pid}\n" for p in self._procs)

    workers.PieceStream.__init__ = recording


def _at_step(step: int, action) -> None:
    train_step = Trainer.train_step

    def wrapped(self):
        if self.step + 1 == step:
            action()
        return train_step(self)

    Trainer.train_step = wrapped


def _in_eval(action) -> None:
    evaluate = Trainer.evaluate

    def wrapped(self):
        val_data = self.val_data

        def acting():
            for i, batch in enumerate(val_data()):
                if i == 1:
                    action()
                yield batch

        self.val_data = acting
        try:
            return evaluate(self)
        finally:
            self.val_data = val_data

    Trainer.evaluate = wrapped


def _in_save(action) -> None:
    """``action`` once, at the first ``torch.save`` of a checkpoint (a shard's tensor or state.pt)."""
    save, done = torch.save, []

    def wrapped(obj, f, *args, **kwargs):
        if not done:
            done.append(True)
            action()
        return save(obj, f, *args, **kwargs)

    train.checkpoint.torch.save = wrapped  # the module's own reference: torch.save itself


def _in_worker(action) -> None:
    pieces = workers.shard_pieces

    def wrapped(shards, index, epoch, **kwargs):
        if mp.current_process().name.startswith(WORKER_PREFIX):  # not the held-out loader, which runs inline
            action()
        yield from pieces(shards, index, epoch, **kwargs)

    workers.shard_pieces = wrapped


def _kill_in_save(step: int) -> None:
    save = torch.save

    def wrapped(obj, f, *args, **kwargs):
        # state.pt (the shards' tensors go through torch.save too, before it): half on disk, synced, then gone
        if isinstance(obj, dict) and obj.get("counters", {}).get("step") == step:
            buf = io.BytesIO()
            save(obj, buf, *args, **kwargs)
            data = buf.getvalue()
            f.write(data[: len(data) // 2])
            f.flush()
            os.fsync(f.fileno())
            os.kill(os.getpid(), signal.SIGKILL)
        return save(obj, f, *args, **kwargs)

    train.checkpoint.torch.save = wrapped


def _raise(exc: BaseException):
    def action():
        raise exc

    return action


def _signal(signum: int):
    return lambda: os.kill(os.getpid(), signum)


def _stall(folder: Path):
    def action():
        (folder / "stalled").write_text(str(os.getpid()))
        time.sleep(3600)

    return action


def inject(scenario: str, folder: Path) -> None:
    if scenario == "worker-error":
        _in_worker(_raise(RuntimeError("injected failure in a loader worker")))
    elif scenario == "main-error":
        _at_step(3, _raise(RuntimeError("injected failure in the training loop")))
    elif scenario == "eval-error":
        _in_eval(_raise(RuntimeError("injected failure during evaluation")))
    elif scenario == "save-error":
        _in_save(_raise(OSError(errno.ENOSPC, "No space left on device (injected)")))
    elif scenario == "sigterm-step":
        _at_step(3, _signal(signal.SIGTERM))
    elif scenario == "sigterm-eval":
        _in_eval(_signal(signal.SIGTERM))
    elif scenario == "sigterm-save":
        _in_save(_signal(signal.SIGTERM))
    elif scenario == "sigterm-wait":  # the worker stalls; the parent test sends SIGTERM once it has
        _in_worker(_stall(folder))
    elif scenario == "sigkill-main":
        _at_step(3, _signal(signal.SIGKILL))
    elif scenario.startswith("kill-at:"):
        _at_step(int(scenario.split(":")[1]), _signal(signal.SIGKILL))
    elif scenario.startswith("kill-in-save:"):
        _kill_in_save(int(scenario.split(":")[1]))
    elif scenario == "clean":
        pass
    else:
        raise SystemExit(f"unknown scenario {scenario!r}; known: {SCENARIOS}")


def main(scenario: str, folder: str) -> int:
    root = Path(folder)
    write_shards(root)
    _record_worker_pids(root)
    inject(scenario, root)
    harness = scenario == "clean" or scenario.startswith("kill")
    trainer = build_trainer(harness_config(root) if harness else tiny_config(root))
    summary = trainer.fit()
    trainer.data.close()
    (root / "summary.json").write_text(json.dumps({k: v for k, v in summary.items() if k != "eval"}))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
