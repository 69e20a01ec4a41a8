"""Distillation (``[train.distill]``): the training loss mixed with a teacher's soft targets, as a trainer hook."""

from __future__ import annotations

import torch

from winnow.train.data import Batch
from winnow.train.hooks import TrainHook
from winnow.train.model import distillation_per_token


class Distillation(TrainHook):
    """``(1 - alpha)·loss + alpha·KL(teacher ‖ student)`` per token, the whole teacher run on the micro-batch's inputs.

    ``teacher`` is None on a pipeline stage that never computes the loss (it is dropped there, before it
    reaches the device).
    """

    name = "distill"
    inputs = True  # a pipeline's last stage scores the micro-batch's tokens

    def __init__(self, teacher: torch.nn.Module | None, *, alpha: float, temperature: float) -> None:
        self.teacher, self.alpha, self.temperature = teacher, alpha, temperature

    def loss(
        self, batch: Batch, logits_BLV: torch.Tensor, loss_BL: torch.Tensor, plain_BL: torch.Tensor, n_tokens: int
    ) -> torch.Tensor:
        with torch.no_grad():
            teacher_BLV = self.teacher(batch.tokens, batch.doc_ids).logits_BLV
        soft_BL = distillation_per_token(logits_BLV, teacher_BLV, temperature=self.temperature)
        return (1 - self.alpha) * loss_BL + self.alpha * soft_BL
