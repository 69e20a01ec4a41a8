"""Attribution as a trainer hook (``train.hooks``): the estimator's calls at the points of the training step."""

from __future__ import annotations

import contextlib
import logging

import torch

from winnow.train.attribution.estimator import SourceAttribution
from winnow.train.data import Batch
from winnow.train.hooks import TrainHook

log = logging.getLogger(__name__)


class AttributionHook(TrainHook):
    """Splits each attributed step's gradients by source, the optimizer's update after them, and closes a
    stretch when it is due (``attribution``: the estimator)."""

    name = "attribution"

    def __init__(self, attribution: SourceAttribution) -> None:
        self.attribution = attribution
        self._on = False  # whether this step is attributed

    def begin_step(self, step: int) -> None:
        self._on = self.attribution.begin_step(step)

    def split(self, source_ids_BL: torch.Tensor, loss_scale: float):
        if not self._on:
            return contextlib.nullcontext()
        return self.attribution.micro_batch(source_ids_BL, loss_scale=loss_scale)

    def loss(
        self, batch: Batch, logits_BLV: torch.Tensor, loss_BL: torch.Tensor, plain_BL: torch.Tensor, n_tokens: int
    ) -> torch.Tensor:
        if self._on:  # split = "losses": each source's part of this micro-batch's data loss, before its backward
            self.attribution.add_micro_batch(loss_BL * batch.loss_mask / max(n_tokens, 1), batch.source_ids)
        return loss_BL

    def before_update(self) -> None:
        if self._on:
            self.attribution.before_optimizer_step()

    def end_step(self, applied: bool, clip_coef: float) -> None:
        if not self._on:
            return
        if applied:
            self.attribution.after_optimizer_step(clip_coef)
        else:  # the step moved nothing
            self.attribution.skip_step()

    def after_step(self, step: int, *, last: bool = False) -> dict | None:
        open_at = self.attribution.open_at
        if self.attribution.due(step) or (last and open_at not in (None, step)):
            return self.attribution.close(step=step)
        return None

    def state_dict(self) -> dict:
        return self.attribution.state_dict()

    def load_state_dict(self, state: dict | None) -> None:
        if state:
            self.attribution.load_state_dict(state)


class CounterfactualHook(TrainHook):
    """At the end of the run, the counterfactual record (``SourceAttribution.counterfactual``): what scaling
    each source's share would do to each held-out loss. Its state lives in the attribution's."""

    def __init__(self, attribution: SourceAttribution) -> None:
        self.attribution = attribution

    def after_step(self, step: int, *, last: bool = False) -> dict | None:
        if not last:
            return None
        record = self.attribution.counterfactual(step)
        if record is None:
            cfg = self.attribution.cfg
            log.warning(
                "attribution: the run ended at step %d before its first attributed stretch closed "
                "(train.attribution start = %d, every = %d): no attribution and no counterfactual",
                step,
                cfg.start,
                cfg.every,
            )
        return record
