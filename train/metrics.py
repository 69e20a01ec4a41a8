"""Run metrics: ``metrics.jsonl`` (one object per logged step), optional TensorBoard, throughput and MFU.

MFU counts active parameters only (6·N_active per token plus causal attention) against a
peak FLOP/s basis that is configurable and printed at the start of the run.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from train.errors import ConfigError, require

log = logging.getLogger(__name__)

# dense (no sparsity) peak FLOP/s per device, by name fragment; first match wins
_GPU_PEAKS = (("H200", 989e12), ("H100", 989e12), ("A100", 312e12), ("L40S", 362e12), ("A10G", 70e12),
              ("L4", 121e12), ("4090", 165e12), ("V100", 125e12), ("T4", 65e12))
_CPU_PEAK = 5.2e11  # measured oneDNN fp32 peak of the 2-core dev machine (PERF_NOTES.md); set peak_flops for yours


@dataclass(kw_only=True, slots=True)
class MetricsConfig:
    """What is logged and how often (``[train.metrics]``)."""

    log_every: int = 10
    tensorboard: bool = False  # needs the optional ``tensorboard`` package
    peak_flops: float | None = None  # per device, for MFU; None: looked up from the device name

    def __post_init__(self) -> None:
        if not (isinstance(self.log_every, int) and self.log_every >= 1):
            raise ConfigError(f"train.metrics.log_every = {self.log_every!r} is invalid; allowed: an integer >= 1")
        if self.peak_flops is not None and self.peak_flops <= 0:
            raise ConfigError(f"train.metrics.peak_flops = {self.peak_flops!r} is invalid; allowed: None or > 0")


def peak_flops_basis(device: torch.device, configured: float | None) -> tuple[float, str]:
    """(peak FLOP/s, where the figure comes from) for MFU."""
    if configured is not None:
        return configured, "configured (train.metrics.peak_flops)"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for fragment, peak in _GPU_PEAKS:
            if fragment in name:
                return peak, f"{name} dense bf16 peak"
        return 100e12, f"unknown GPU {name!r}: assumed 100 TFLOP/s; set train.metrics.peak_flops"
    return _CPU_PEAK, "2-core dev CPU fp32 peak (PERF_NOTES.md); set train.metrics.peak_flops for this machine"


def memory_stats(device: torch.device) -> dict[str, float]:
    if device.type == "cuda":
        return {"allocated_gib": torch.cuda.memory_allocated(device) / 2**30,
                "peak_gib": torch.cuda.max_memory_allocated(device) / 2**30}
    try:
        import resource

        return {"peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
    except ImportError:  # not on POSIX
        return {}


class Throughput:
    """Tokens, wall time and data-wait time since the last log step; eval and checkpoint time excluded."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.start = time.perf_counter()
        self.tokens = 0
        self.wait = 0.0
        self.excluded = 0.0

    def exclude(self, seconds: float) -> None:
        self.excluded += seconds

    def summary(self, flops_per_token: float, peak: float) -> dict[str, float]:
        elapsed = max(time.perf_counter() - self.start - self.excluded, 1e-9)
        tokens_per_s = self.tokens / elapsed
        return {"tokens_per_s": tokens_per_s, "flops_per_s": tokens_per_s * flops_per_token,
                "mfu": tokens_per_s * flops_per_token / peak, "data_wait_pct": 100.0 * self.wait / elapsed}


def _flatten(prefix: str, value: Any, out: dict[str, float]) -> None:
    if isinstance(value, dict):
        for key, sub in value.items():
            _flatten(f"{prefix}/{key}" if prefix else str(key), sub, out)
    elif isinstance(value, (list, tuple)):
        for i, sub in enumerate(value):
            _flatten(f"{prefix}/{i}", sub, out)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        out[prefix] = float(value)


class MetricsWriter:
    """Appends one JSON object per logged step; mirrors scalars to TensorBoard when enabled."""

    def __init__(self, run_dir: str | Path, *, tensorboard: bool) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        self._tb = None
        if tensorboard:
            require("tensorboard", feature="TensorBoard metrics (train.metrics.tensorboard = true)")
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.run_dir / "tensorboard"))

    def write(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self._tb is not None:
            scalars: dict[str, float] = {}
            _flatten("", {k: v for k, v in record.items() if k not in ("step", "routing")}, scalars)
            for name, value in scalars.items():
                self._tb.add_scalar(name, value, record["step"])

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
