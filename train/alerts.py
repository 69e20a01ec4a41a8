"""Anomaly detection and alerts: loss spikes, NaN/Inf, gradient norm, throughput drops, data wait.

An alert goes to ``alerts.jsonl`` in the run folder, to the log, and (when configured) is
POSTed as JSON to a webhook. A failing webhook is logged, never fatal: training goes on.

A throughput drop is judged against the run's own recent history (the median tokens/s of the
last ``throughput_window`` log intervals), and only once it lasts ``throughput_patience``
intervals: on a machine shared with other work, one slow interval is a neighbour's burst, not a drop.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from winnow.train.errors import ConfigError, checker
from winnow.train.jsonl import json_line

_check = checker("train.alerts")

log = logging.getLogger(__name__)


class AlertKind(StrEnum):
    """Every ``kind`` an alert record may have: the trainer emits them, the report and diagnosis read them."""

    LOSS_SPIKE = "loss_spike"
    NONFINITE = "nan"  # a non-finite loss or gradient norm
    GRAD_NORM = "grad_norm"
    THROUGHPUT_DROP = "throughput_drop"
    DATA_WAIT = "data_wait"


class SkipReason(StrEnum):
    """Why the trainer skipped an optimizer step (``StepResult.skipped``, ``skipped_steps`` counts)."""

    NONFINITE = "nonfinite"
    SPIKE = "spike"


#: The alert that marks each skipped step, by skip reason.
SKIP_ALERT = {SkipReason.NONFINITE: AlertKind.NONFINITE, SkipReason.SPIKE: AlertKind.LOSS_SPIKE}


@dataclass(kw_only=True, slots=True)
class AlertConfig:
    """Thresholds of the alerts and where they go (``[train.alerts]``)."""

    spike_sigma: float = 6.0  # a step loss this many rolling std above the rolling mean is a spike (0: off)
    spike_window: int = 50  # accepted steps in the rolling window
    spike_min_history: int = 20  # no spike verdicts before this many accepted steps
    skip_spikes: bool = True  # skip the optimizer step of a spike (not only alert)
    max_nonfinite: int = 10  # stop the run after this many non-finite steps in a row, each skipped (0: never)
    grad_norm_max: float | None = None  # alert when the (pre-clip) gradient norm exceeds this
    throughput_drop: float = 0.5  # alert when tokens/s stays below this fraction of the recent median (0: off)
    throughput_window: int = 20  # log intervals whose median tokens/s is the recent rate
    throughput_patience: int = 3  # consecutive log intervals below it before the alert (one slow interval is noise)
    data_wait_pct: float = 50.0  # alert when the trainer waited for data more than this % of a log interval
    webhook_url: str | None = None  # POST each alert as JSON to this http(s) URL too
    webhook_timeout: float = 5.0  # seconds to wait for the webhook

    def __post_init__(self) -> None:
        for key in ("spike_sigma", "throughput_drop", "data_wait_pct", "webhook_timeout"):
            value = getattr(self, key)
            _check(isinstance(value, (int, float)) and value >= 0, key, value, "a number >= 0")
        # a fraction of the recent median: at 1 or above every interval would be "slow"
        _check(self.throughput_drop < 1, "throughput_drop", self.throughput_drop, "a fraction in [0, 1) (0: off)")
        for key in ("throughput_window", "throughput_patience"):
            value = getattr(self, key)
            _check(isinstance(value, int) and value >= 1, key, value, "an integer >= 1")
        n = self.max_nonfinite
        _check(type(n) is int and n >= 0, "max_nonfinite", n, "an integer >= 0 (0: never stop)")  # not a bool
        if self.spike_window < 2 or not 1 < self.spike_min_history <= self.spike_window:
            raise ConfigError(
                f"train.alerts.spike_min_history = {self.spike_min_history!r} is invalid; "
                f"allowed: 2..spike_window ({self.spike_window}), with spike_window >= 2"
            )
        url = self.webhook_url
        _check(url is None or url.startswith(("http://", "https://")), "webhook_url", url, "an http(s) URL")


class SpikeDetector:
    """Rolling mean and std of recently accepted step losses."""

    def __init__(self, *, sigma: float, window: int, min_history: int) -> None:
        self.sigma, self.min_history = sigma, min_history
        self.history: deque[float] = deque(maxlen=window)

    def is_spike(self, loss: float) -> bool:
        if self.sigma <= 0 or len(self.history) < self.min_history:
            return False
        mean = sum(self.history) / len(self.history)
        std = math.sqrt(sum((x - mean) ** 2 for x in self.history) / (len(self.history) - 1))
        return loss > mean + self.sigma * max(std, 1e-6 * abs(mean))

    def accept(self, loss: float) -> None:
        self.history.append(loss)

    def state_dict(self) -> dict:
        return {"history": list(self.history)}

    def load_state_dict(self, state: dict) -> None:
        self.history.clear()
        self.history.extend(state["history"])


class Alerts:
    """Writes alerts to ``alerts.jsonl``, the log and an optional webhook; checks the per-log thresholds."""

    def __init__(self, cfg: AlertConfig, run_dir: str | Path) -> None:
        self.cfg = cfg
        self.path = Path(run_dir) / "alerts.jsonl"
        self.recent_tokens_per_s: deque[float] = deque(maxlen=cfg.throughput_window)
        self.slow_intervals = 0  # consecutive intervals below the tolerance
        self.count = 0

    def emit(self, kind: AlertKind, step: int, message: str, **data: Any) -> None:
        record = {"time": time.time(), "step": step, "kind": AlertKind(kind).value, "message": message, **data}
        self.count += 1
        log.warning("alert %s at step %d: %s", kind, step, message)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json_line(record, default=str))
        if self.cfg.webhook_url:
            self._post(record)

    def _post(self, record: dict) -> None:
        body = json_line(record, default=str).encode()
        request = urllib.request.Request(
            self.cfg.webhook_url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.cfg.webhook_timeout) as response:
                response.read()
        except (urllib.error.URLError, OSError) as err:
            log.warning("alert webhook %s failed: %s", self.cfg.webhook_url, err)

    def check_interval(self, step: int, *, tokens_per_s: float, data_wait_pct: float, grad_norm: float) -> None:
        """Threshold checks made once per log step, on that interval's figures."""
        cfg = self.cfg
        if cfg.grad_norm_max is not None and grad_norm > cfg.grad_norm_max:
            self.emit(
                AlertKind.GRAD_NORM,
                step,
                f"gradient norm {grad_norm:.3g} > {cfg.grad_norm_max:.3g}",
                grad_norm=grad_norm,
            )
        self._check_throughput(step, tokens_per_s)
        if data_wait_pct > cfg.data_wait_pct:
            self.emit(
                AlertKind.DATA_WAIT,
                step,
                f"waited for data {data_wait_pct:.0f}% of the interval (> {cfg.data_wait_pct:.0f}%)",
                data_wait_pct=data_wait_pct,
            )

    def _check_throughput(self, step: int, tokens_per_s: float) -> None:
        """One alert when tokens/s stays below ``throughput_drop`` x the recent median for ``throughput_patience``
        intervals; the slow intervals join the history, so a lasting new rate becomes the run's normal."""
        cfg, recent = self.cfg, self.recent_tokens_per_s
        if cfg.throughput_drop > 0 and len(recent) >= min(3, recent.maxlen):
            median = statistics.median(recent)
            if tokens_per_s < cfg.throughput_drop * median:
                self.slow_intervals += 1
                if self.slow_intervals == cfg.throughput_patience:
                    self.emit(
                        AlertKind.THROUGHPUT_DROP,
                        step,
                        f"{tokens_per_s:.0f} tokens/s for {self.slow_intervals} log intervals, below "
                        f"{cfg.throughput_drop:.0%} of the recent median {median:.0f}",
                        tokens_per_s=tokens_per_s,
                        recent_median_tokens_per_s=median,
                    )
            else:
                self.slow_intervals = 0
        recent.append(tokens_per_s)

    def state_dict(self) -> dict:
        return {
            "recent_tokens_per_s": list(self.recent_tokens_per_s),
            "slow_intervals": self.slow_intervals,
            "count": self.count,
        }

    def load_state_dict(self, state: dict) -> None:
        self.recent_tokens_per_s.clear()
        self.recent_tokens_per_s.extend(state.get("recent_tokens_per_s", []))  # none in checkpoints older than it
        self.slow_intervals, self.count = state.get("slow_intervals", 0), state["count"]
