"""The trainer's hook interface: what an extra (attribution, adaptive mixing, distillation, step skipping,
early stopping) may do at fixed points of the training step, and nothing else.

``Trainer.train_step`` is one linear function: draw the batches, forward and loss per micro-batch,
backward, clip, decide, step, log. A hook is called, in the order the trainer holds them, at:

=============================================  ===========================================================
``begin_step(step)``                           before step ``step + 1`` draws its batches
``split(source_ids_BL, loss_scale)``           a context around each micro-batch's forward (and, outside a
                                               pipeline, its backward); ``loss_scale``: the factor the
                                               backward's loss carries beyond the global-batch mean
``loss(batch, logits_BLV, loss_BL, plain_BL,   the per-token loss (B, L) to differentiate, given the
n_tokens) -> loss_BL``                         previous hook's; ``plain_BL`` is the cross-entropy without
                                               label smoothing, ``n_tokens`` the step's loss tokens over
                                               every rank (runs under autocast, on the last pipeline stage)
``check(loss, grad_norm, batches)``            ``SkipReason`` to skip the step (the first hook's wins)
``before_update()``                            the step is about to be applied
``end_step(applied, clip_coef)``               after the optimizer step, or the decision to skip it
``after_step(step, last=False) -> dict``       a metrics record to write, or None (``last``: the run ends)
``after_eval(record) -> str``                  a reason to stop the run after an evaluation, or None
``report() -> dict``                           figures for every log record and the run's summary
``state_dict()`` / ``load_state_dict(state)``  saved under ``name`` in checkpoints (``None``: the
                                               checkpoint has none)
=============================================  ===========================================================

``inputs = True`` asks a pipeline-parallel run to bring each micro-batch's tokens and document ids
to the last stage for ``loss``. A new extra (another mixing rule, say) is one more subclass; the
trainer does not change.
"""

from __future__ import annotations

import contextlib
import logging
import time

import torch

from winnow.train.alerts import SkipReason
from winnow.train.data import Batch

log = logging.getLogger(__name__)


class TrainHook:
    """Does nothing at every point; subclasses override the ones they need (see the module docstring)."""

    name = ""  # its key in a checkpoint's state
    inputs = False

    def begin_step(self, step: int) -> None:
        return None

    def split(self, source_ids_BL: torch.Tensor, loss_scale: float):
        del source_ids_BL, loss_scale
        return contextlib.nullcontext()

    def loss(
        self, batch: Batch, logits_BLV: torch.Tensor, loss_BL: torch.Tensor, plain_BL: torch.Tensor, n_tokens: int
    ) -> torch.Tensor:
        return loss_BL

    def check(self, loss: float, grad_norm: float, batches: list[Batch]) -> SkipReason | None:
        return None

    def before_update(self) -> None:
        return None

    def end_step(self, applied: bool, clip_coef: float) -> None:
        return None

    def after_step(self, step: int, *, last: bool = False) -> dict | None:
        return None

    def after_eval(self, record: dict) -> str | None:
        return None

    def report(self) -> dict:
        return {}

    def state_dict(self) -> dict | None:
        return None

    def load_state_dict(self, state: dict | None) -> None:
        return None


class CompileTime(TrainHook):
    """Logs once how long ``[train] compile`` took: a run's first step compiles, its second runs compiled."""

    name = "compile"

    def __init__(self) -> None:
        self._steps: list[float] = []

    def begin_step(self, step: int) -> None:
        self._start = time.perf_counter()

    def end_step(self, applied: bool, clip_coef: float) -> None:
        if len(self._steps) < 2:
            self._steps.append(time.perf_counter() - self._start)
            if len(self._steps) == 2:
                first, second = self._steps
                log.info(
                    "torch.compile: %.1f s compiling (the first step took %.1f s, the second %.1f s)",
                    first - second,
                    first,
                    second,
                )
