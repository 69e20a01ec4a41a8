"""Run metrics: ``metrics.jsonl`` (one object per logged step), optional trackers, throughput and MFU.

MFU counts active parameters only (6·N_active per token plus causal attention) against the
peak FLOP/s of the machine the run is on, found at the start of the run and logged with its
source (``peak_flops_basis``): ``[train.metrics] peak_flops`` when set; for a GPU the dense bf16
peak of its entry in the accelerator table ``winnow plan`` uses (``train.plan.hardware``); for a
GPU not in the table, or a CPU, the best rate of a short matmul measured on it.
"""

from __future__ import annotations

import functools
import logging
import time
from pathlib import Path
from typing import Any

import torch

from winnow.train.config import MetricsConfig  # noqa: F401 (defined there: no torch)
from winnow.train.errors import checker
from winnow.train.jsonl import json_line
from winnow.train.plan.hardware import DEVICES, table_key

_check = checker("train.metrics")

log = logging.getLogger(__name__)

#: The measured basis: square matmuls of this size (fp32 on a CPU, bf16 on a GPU), timed for about this long.
MATMUL_SIZE = {"cpu": 1024, "cuda": 4096}
MATMUL_SECONDS = 0.25


def peak_flops_basis(device: torch.device, configured: float | None) -> tuple[float, str]:
    """(peak FLOP/s per device, where the figure comes from) for MFU; the trainer logs both."""
    if configured is not None:
        return configured, "configured (train.metrics.peak_flops)"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        key = table_key(name)
        if key is not None:
            return DEVICES[key].peak_flops, f"{name}: the accelerator table's dense bf16 peak for {DEVICES[key].name}"
        peak, how = measured_peak(str(device))
        return peak, f"{name} is not in the accelerator table: {how}; set train.metrics.peak_flops to its data sheet's"
    peak, how = measured_peak("cpu", torch.get_num_threads())
    return peak, f"this CPU, {how}"


@functools.cache
def measured_peak(device: str, threads: int = 0) -> tuple[float, str]:
    """The best FLOP/s of repeated square matmuls on ``device`` (and how it was measured), once per process.

    The best of the repeats, not their mean: on a machine shared with other work the fastest
    repeat is the closest to what the hardware can do. ``threads`` keys the cache (a CPU's rate
    depends on torch's thread count). Constant inputs leave the global random state untouched.
    """
    kind = torch.device(device).type
    n, dtype = MATMUL_SIZE.get(kind, 1024), torch.float32 if kind == "cpu" else torch.bfloat16
    a = torch.full((n, n), 0.5, dtype=dtype, device=device)
    b = torch.full((n, n), 0.25, dtype=dtype, device=device)
    sync = torch.cuda.synchronize if kind == "cuda" else (lambda: None)
    torch.mm(a, b)  # warm-up: kernel selection, thread pool start
    sync()
    best, repeats, start = float("inf"), 0, time.perf_counter()
    while repeats < 5 or time.perf_counter() - start < MATMUL_SECONDS:
        t0 = time.perf_counter()
        torch.mm(a, b)
        sync()
        best = min(best, time.perf_counter() - t0)
        repeats += 1
    peak = 2 * n**3 / best
    name = str(dtype).removeprefix("torch.")
    where = f" on {threads} thread(s)" if kind == "cpu" else ""
    return peak, f"measured: the best of {repeats} {name} {n}x{n} matmuls{where}, {peak / 1e9:,.0f} GFLOP/s"


def memory_stats(device: torch.device) -> dict[str, float]:
    """Memory in use and at peak; on a GPU also the device's own limit (``limit_gib``, what the diagnosis compares to)."""
    if device.type == "cuda":
        _free, total = torch.cuda.mem_get_info(device)  # the driver's figure: what this process can have at most
        return {
            "allocated_gib": torch.cuda.memory_allocated(device) / 2**30,
            "peak_gib": torch.cuda.max_memory_allocated(device) / 2**30,
            "limit_gib": total / 2**30,
        }
    try:
        import resource

        return {"peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
    except ImportError:  # not on POSIX
        return {}


class Throughput:
    """Tokens, wall time, data-wait and communication time since the last log step; eval and checkpoint time excluded.

    ``comm`` is the run's ``CommTimer`` (anything with a never-reset ``total_seconds``); its
    share of the wall time is ``comm_pct``, 0 for one process.
    """

    def __init__(self, comm=None) -> None:
        self.comm = comm
        self.reset()

    def _comm_total(self) -> float:
        return self.comm.total_seconds if self.comm is not None else 0.0

    def reset(self) -> None:
        self.start = time.perf_counter()
        self.tokens = 0
        self.wait = 0.0
        self.excluded = 0.0
        self.comm_start = self._comm_total()
        self.comm_excluded = 0.0

    def mark(self) -> tuple[float, float]:
        """Start of a stretch to leave out (evaluation, checkpoint): hand it back to ``exclude_since``."""
        return time.perf_counter(), self._comm_total()

    def exclude_since(self, mark: tuple[float, float]) -> None:
        """Leave out the wall time since ``mark`` and the communication in it (e.g. FSDP2's all-gathers in eval)."""
        self.excluded += time.perf_counter() - mark[0]
        self.comm_excluded += self._comm_total() - mark[1]

    def summary(self, flops_per_token: float, peak: float) -> dict[str, float]:
        elapsed = max(time.perf_counter() - self.start - self.excluded, 1e-9)
        tokens_per_s = self.tokens / elapsed
        comm = max(self._comm_total() - self.comm_start - self.comm_excluded, 0.0)
        return {
            "tokens_per_s": tokens_per_s,
            "flops_per_s": tokens_per_s * flops_per_token,
            "mfu": tokens_per_s * flops_per_token / peak,
            "data_wait_pct": 100.0 * self.wait / elapsed,
            "comm_pct": min(100.0 * comm / elapsed, 100.0),
        }


class MetricsWriter:
    """Appends one JSON object per logged step to ``metrics.jsonl`` and hands it to each tracker."""

    def __init__(self, run_dir: str | Path, config: MetricsConfig | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        self.trackers: list = []
        if config is not None and config.trackers:
            from winnow.train.trackers import open_trackers

            self.trackers = open_trackers(
                config.trackers,
                self.run_dir,
                project=config.project,
                mlflow_uri=config.mlflow_tracking_uri,
                wandb_mode=config.wandb_mode,
            )

    def write(self, record: dict[str, Any]) -> None:
        try:
            with open(self.path, "a") as f:
                f.write(json_line(record))
        except OSError as err:  # a full disk: said with the file (a resume trims a torn last line)
            if err.filename is None:
                raise OSError(err.errno, err.strerror, str(self.path)) from err
            raise
        for tracker in self.trackers:
            tracker.log(record)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()
        self.trackers = []
