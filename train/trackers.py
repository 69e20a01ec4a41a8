"""Experiment trackers: TensorBoard, MLflow and Weights & Biases, each optional.

``[train.metrics] trackers = ["tensorboard", "mlflow", "wandb"]``. Every record written to
``metrics.jsonl`` goes to each tracker with the same scalars under the same names
(nested keys joined by ``/``: ``per_source/web/mean_loss``, ``eval/loss``), at its step. The
expert load (MoE layers × experts) is one image per log step, a heatmap with a row per layer,
not a scalar per expert; the per-source routing counts stay in ``metrics.jsonl`` only.

Each tracker imports its package when the run starts and fails then with the install
command. MLflow logs to ``<run>/mlruns`` (a local file store) unless ``mlflow_tracking_uri`` or
``MLFLOW_TRACKING_URI`` says otherwise; W&B follows ``wandb_mode`` or its own ``WANDB_MODE``
(``offline`` writes under ``<run>/wandb`` for a later ``wandb sync``).
"""

from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from winnow.train.errors import require

log = logging.getLogger(__name__)

TRACKERS = ("tensorboard", "mlflow", "wandb")
_NOT_SCALARS = ("step", "routing", "expert_load")


class Tracker(Protocol):
    def log(self, record: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


def flatten(prefix: str, value: Any, out: dict[str, float]) -> None:
    """Numbers of a nested record as ``a/b/c`` names."""
    if isinstance(value, dict):
        for key, sub in value.items():
            flatten(f"{prefix}/{key}" if prefix else str(key), sub, out)
    elif isinstance(value, (list, tuple)):
        for i, sub in enumerate(value):
            flatten(f"{prefix}/{i}", sub, out)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        out[prefix] = float(value)


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The scalars a tracker logs for one ``metrics.jsonl`` record."""
    out: dict[str, float] = {}
    flatten("", {k: v for k, v in record.items() if k not in _NOT_SCALARS}, out)
    return out


def load_image(expert_load: Any, *, cell: int = 12) -> np.ndarray | None:
    """Expert load (layers × experts, shares) as a grayscale heatmap, ``cell`` pixels a cell; None without MoE."""
    load = np.asarray(expert_load, dtype=np.float64)
    if load.ndim != 2 or load.size == 0:
        return None
    peak = load.max()
    scaled = (255 * load / peak if peak > 0 else np.zeros_like(load)).astype(np.uint8)
    return np.kron(scaled, np.ones((cell, cell), np.uint8))


class TensorBoardTracker:
    def __init__(self, run_dir: Path) -> None:
        require("tensorboard", feature='TensorBoard logging ([train.metrics] trackers = ["tensorboard"])')
        from torch.utils.tensorboard import SummaryWriter

        self._folder, self._writer_class = str(run_dir / "tensorboard"), SummaryWriter
        self.writer = None

    def log(self, record: dict[str, Any]) -> None:
        step = record["step"]
        if self.writer is None:  # opened at the first step logged: TensorBoard drops what an earlier attempt
            # logged from there on (a resumed run redoes those steps), as metrics.jsonl is cut back
            self.writer = self._writer_class(self._folder, purge_step=step)
        for name, value in scalars(record).items():
            self.writer.add_scalar(name, value, step)
        image = load_image(record.get("expert_load"))
        if image is not None:
            self.writer.add_image("expert_load", image[None], step, dataformats="CHW")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class MlflowTracker:
    _BAD = re.compile(r"[^\w\-. /]")  # MLflow metric names: alphanumerics, _ - . space /

    def __init__(self, run_dir: Path, *, project: str, uri: str | None) -> None:
        mlflow = require(
            "mlflow", package="mlflow-skinny", feature='MLflow logging ([train.metrics] trackers = ["mlflow"])'
        )
        from mlflow.entities import Metric

        self._metric = Metric
        uri = uri or os.environ.get("MLFLOW_TRACKING_URI")
        if uri is None:
            # the run folder's own file store: no server, no database package; MLflow 3 asks for the opt-in
            uri = (run_dir / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = mlflow.MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(project)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(project)
        self.run_id = self.client.create_run(experiment_id, run_name=run_dir.name).info.run_id
        log.info("MLflow run %s in %s (experiment %s)", self.run_id, uri, project)

    def log(self, record: dict[str, Any]) -> None:
        step, now = int(record["step"]), int(time.time() * 1000)
        metrics = [self._metric(self._BAD.sub("_", k), v, now, step) for k, v in scalars(record).items()]
        for lo in range(0, len(metrics), 1000):  # log_batch takes at most 1000 metrics
            self.client.log_batch(self.run_id, metrics=metrics[lo : lo + 1000])
        image = load_image(record.get("expert_load"))
        if image is not None:
            self.client.log_image(self.run_id, image, key="expert_load", step=step)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class WandbTracker:
    def __init__(self, run_dir: Path, *, project: str, mode: str | None) -> None:
        self.wandb = require("wandb", feature='Weights & Biases logging ([train.metrics] trackers = ["wandb"])')
        self.run = self.wandb.init(
            project=project, name=run_dir.name, dir=str(run_dir), mode=mode, config={"run_dir": str(run_dir)}
        )
        self._step = -1

    def log(self, record: dict[str, Any]) -> None:
        data: dict[str, Any] = dict(scalars(record))
        image = load_image(record.get("expert_load"))
        if image is not None:
            data["expert_load"] = self.wandb.Image(
                image, caption="expert load: a row per MoE layer, a column per expert"
            )
        step = max(int(record["step"]), self._step)  # W&B refuses steps that go back (an eval at step 0 after...)
        self.run.log(data, step=step)
        self._step = step

    def close(self) -> None:
        self.run.finish()


def open_trackers(
    names: list[str], run_dir: Path, *, project: str, mlflow_uri: str | None, wandb_mode: str | None
) -> list[Tracker]:
    """Start the named trackers for ``run_dir``, in order."""
    run_dir = Path(run_dir)
    out: list[Tracker] = []
    for name in names:
        if name == "tensorboard":
            out.append(TensorBoardTracker(run_dir))
        elif name == "mlflow":
            out.append(MlflowTracker(run_dir, project=project, uri=mlflow_uri))
        elif name == "wandb":
            out.append(WandbTracker(run_dir, project=project, mode=wandb_mode))
    return out
