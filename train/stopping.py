"""When to stop training early: patience on held-out loss, or a per-source loss threshold (``[train.stop]``).

A trainer hook (``train.hooks``), fed one evaluation record at a time (``{"step", "eval": {"loss",
"per_source"}}``, what ``Trainer.evaluate`` writes). The watched value is the total held-out loss, or the mean over
``sources`` when named; a run stops after ``patience`` evaluations in a row without an
improvement of more than ``min_delta`` over the best so far (the best moves only with such an
improvement, so a loss a little below it is not a new best), or as soon as a source named in
``thresholds`` is at or below its threshold. A continued run's step-0 evaluation (``init_from``) is the
first: it measures the starting model, so it sets the best the run must improve on. The reason is a
sentence the trainer logs and writes to ``metrics.jsonl``.
"""

from __future__ import annotations

import math

from winnow.train.config import StopConfig  # noqa: F401 (defined there: no torch)
from winnow.train.errors import ConfigError, checker
from winnow.train.hooks import TrainHook

_check = checker("train.stop")


class EarlyStopping(TrainHook):
    """Decides after each evaluation whether the run should stop; ``reason`` says why once it has."""

    name = "stopping"

    def __init__(self, cfg: StopConfig) -> None:
        self.cfg = cfg
        self.best = math.inf
        self.best_step = -1
        self.bad_evals = 0
        self.reason: str | None = None

    def _watched(self, per_source: dict[str, float | None], total: float | None) -> float | None:
        if not self.cfg.sources:
            return total
        missing = [s for s in self.cfg.sources if per_source.get(s) is None]
        if missing:
            raise ConfigError(
                f"train.stop.sources: no held-out loss for {missing} (held-out sources: {sorted(per_source)})"
            )
        return sum(per_source[s] for s in self.cfg.sources) / len(self.cfg.sources)

    def after_eval(self, record: dict) -> str | None:
        """Take one evaluation record; returns the reason to stop, or None to go on."""
        return self.update(record) if self.cfg.active else None

    def update(self, record: dict) -> str | None:
        """Take one evaluation record; returns the reason to stop, or None to go on."""
        step, result = record["step"], record["eval"]
        per_source = result.get("per_source") or {}
        for source, threshold in self.cfg.thresholds.items():
            loss = per_source.get(source)
            if loss is None:
                raise ConfigError(
                    f"train.stop.thresholds.{source}: no held-out loss for {source!r} "
                    f"(held-out sources: {sorted(per_source)})"
                )
            if loss <= threshold:
                self.reason = (
                    f"held-out loss of {source} is {loss:.4f} at step {step}, at or below its threshold {threshold:g}"
                )
                return self.reason
        if not self.cfg.patience:
            return None
        value = self._watched(per_source, result.get("loss"))
        what = "held-out loss" if not self.cfg.sources else f"mean held-out loss of {', '.join(self.cfg.sources)}"
        if value is not None and value < self.best - self.cfg.min_delta:
            self.best, self.best_step, self.bad_evals = value, step, 0
            return None
        self.bad_evals += 1
        if self.bad_evals >= self.cfg.patience:
            now = "none" if value is None else f"{value:.4f}"
            self.reason = (
                f"{what} has not improved by more than min_delta={self.cfg.min_delta:g} over its best "
                f"{self.best:.4f} (step {self.best_step}) for {self.bad_evals} evaluations (now {now} at step {step})"
            )
        return self.reason

    def report(self) -> dict:
        return {"stopped": self.reason} if self.reason else {}

    def state_dict(self) -> dict:
        return {"best": self.best, "best_step": self.best_step, "bad_evals": self.bad_evals, "reason": self.reason}

    def load_state_dict(self, state: dict | None) -> None:
        if state is None:
            return
        self.best, self.best_step = state["best"], state["best_step"]
        self.bad_evals, self.reason = state["bad_evals"], state["reason"]
