"""Skipping steps that would damage the run: a non-finite loss or gradient norm, or a loss spike.

A hook (``train.hooks``): every skip is alerted with the batch's sources and shard rows, counted by
reason (``skipped_steps`` in the log records), and the spike detector's window holds the losses of
applied steps only.
"""

from __future__ import annotations

import numpy as np
import torch

from winnow.train.alerts import AlertConfig, AlertKind, Alerts, SkipReason, SpikeDetector
from winnow.train.data import Batch
from winnow.train.errors import Diverged
from winnow.train.hooks import TrainHook


class Stability(TrainHook):
    """Skips (and alerts on) non-finite steps when ``skip_nonfinite``, and loss spikes when ``cfg.skip_spikes``."""

    name = "stability"

    def __init__(self, cfg: AlertConfig, alerts: Alerts, sources: list[str], *, skip_nonfinite: bool = True) -> None:
        self.cfg, self.alerts, self.sources, self.skip_nonfinite = cfg, alerts, sources, skip_nonfinite
        self.spikes = SpikeDetector(sigma=cfg.spike_sigma, window=cfg.spike_window, min_history=cfg.spike_min_history)
        self.skipped = {r.value: 0 for r in SkipReason}  # plain str keys: they go into checkpoints and JSON
        self.nonfinite_run = 0  # non-finite steps in a row, up to this one
        self._step, self._loss = 0, 0.0

    def begin_step(self, step: int) -> None:
        self._step = step + 1

    def check(self, loss: float, grad_norm: float, batches: list[Batch]) -> SkipReason | None:
        self._loss = loss
        if self.skip_nonfinite and not (np.isfinite(loss) and np.isfinite(grad_norm)):
            self.alerts.emit(
                AlertKind.NONFINITE,
                self._step,
                f"non-finite loss {loss} or gradient norm {grad_norm}; step skipped",
                loss=str(loss),
                grad_norm=str(grad_norm),
                **self._provenance(batches),
            )
            reason = SkipReason.NONFINITE
            self.nonfinite_run += 1
            limit = self.cfg.max_nonfinite
            if limit and self.nonfinite_run >= limit:
                raise Diverged(
                    f"steps {self._step - self.nonfinite_run + 1}-{self._step}: {self.nonfinite_run} steps in a row had "
                    "a non-finite loss or gradient norm, each skipped: the model has diverged (its weights may be NaN "
                    "or inf) and skipping trains nothing more. Lower [train.optim] lr (or grad_clip) and train again "
                    "([train] resume = false, or another output); [train.alerts] max_nonfinite = 0 keeps skipping"
                )
        elif self.spikes.is_spike(loss):
            self.alerts.emit(
                AlertKind.LOSS_SPIKE, self._step, f"loss {loss:.4g} is a spike", loss=loss, **self._provenance(batches)
            )
            if not self.cfg.skip_spikes:
                return None
            reason = SkipReason.SPIKE
        else:
            return None
        self.skipped[reason] += 1
        return reason

    def end_step(self, applied: bool, clip_coef: float) -> None:
        if applied:
            self.spikes.accept(self._loss)
            self.nonfinite_run = 0

    def _provenance(self, batches: list[Batch]) -> dict:
        """Which sources and shard rows a batch held: what an alert about it names."""
        ids = torch.cat([b.source_ids[b.loss_mask] for b in batches]).unique().tolist()
        return {
            "sources": [self.sources[i] for i in ids if 0 <= i < len(self.sources)],
            "origins": [list(o) for b in batches for o in b.origins],
        }

    def report(self) -> dict:
        return {"skipped_steps": dict(self.skipped)}

    def state_dict(self) -> dict:
        return {"spikes": self.spikes.state_dict(), "skipped": dict(self.skipped), "nonfinite_run": self.nonfinite_run}

    def load_state_dict(self, state: dict | None) -> None:
        if state is not None:
            self.spikes.load_state_dict(state["spikes"])
            self.skipped = dict(state["skipped"])
            self.nonfinite_run = int(state.get("nonfinite_run", 0))  # a checkpoint written before it was kept: 0
