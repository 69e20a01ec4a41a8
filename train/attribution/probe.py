"""The held-out probe: fixed batches per source, and each source's mean loss and its gradient on them.

The same batches are evaluated at both ends of every attributed stretch, so the measured
change of a source's held-out loss is a difference of two numbers on identical tokens: no
sampling noise between the ends, and the quadrature below is checked against it exactly.
Shape legend: S sources, B batch, L sequence length.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

import torch

from train.data import Batch
from train.model import cross_entropy_per_token

log = logging.getLogger(__name__)


class HeldoutProbe:
    """``rows`` held-out sequences per source (the first that hold its tokens), read once from ``val_data``."""

    def __init__(self, val_data: Callable[[], Iterable], n_sources: int, rows: int, device: torch.device) -> None:
        self.n_sources, self.device = n_sources, device
        self.pools = self._read(val_data, n_sources, rows)
        self.missing = [s for s in range(n_sources) if not self.pools[s]]

    @staticmethod
    def _read(val_data: Callable[[], Iterable], n_sources: int, cap: int) -> list[list]:
        picked: list[list[tuple]] = [[] for _ in range(n_sources)]  # per source: (batch, row)
        loader = val_data()
        try:
            for batch in loader:
                for row in range(batch.tokens.shape[0]):
                    for s in batch.source_ids[row][batch.loss_mask[row]].unique().tolist():
                        if 0 <= s < n_sources and len(picked[s]) < cap:
                            picked[s].append((batch, row))
                if all(len(p) >= cap for p in picked):
                    break
        finally:
            if hasattr(loader, "close"):
                loader.close()
        return [[_stack(rows)] if rows else [] for rows in picked]

    def evaluate(self, model: torch.nn.Module, params: Sequence[torch.Tensor]) -> tuple[torch.Tensor, list[list]]:
        """At the model's current parameters: (S,) mean held-out loss per source (float64, CPU) and,
        per source, the gradient of that loss for every parameter (zeros for a source with no probe)."""
        losses_S = torch.zeros(self.n_sources, dtype=torch.float64)
        grads: list[list] = []
        was_training = model.training
        model.eval()  # held-out loss is measured in eval mode (no dropout, no router noise)
        try:
            for s, pool in enumerate(self.pools):
                if not pool:
                    grads.append([torch.zeros_like(p) for p in params])
                    continue
                loss_sum, count = 0.0, 0
                for batch in pool:
                    b = batch.to(self.device)
                    mask_BL = b.loss_mask & (b.source_ids == s)
                    token_loss_BL = cross_entropy_per_token(model(b.tokens, b.doc_ids).logits_BLV, b.targets)
                    loss_sum = loss_sum + (token_loss_BL.float() * mask_BL).sum()
                    count += int(mask_BL.sum())
                loss = loss_sum / max(count, 1)
                found = torch.autograd.grad(loss, params, allow_unused=True)
                grads.append([g if g is not None else torch.zeros_like(p) for g, p in zip(found, params)])
                losses_S[s] = float(loss.detach())
        finally:
            model.train(was_training)
        return losses_S, grads


def _stack(rows: list[tuple]) -> Batch:
    """One batch of the picked (batch, row) sequences."""
    keys = ("tokens", "targets", "source_ids", "loss_mask", "doc_ids")
    return Batch(*(torch.stack([getattr(b, k)[r] for b, r in rows]) for k in keys))
