"""Sums across ranks for the figures every rank must agree on: token counts, step loss, per-source sums, loads.

Each call is one all-reduce of one small tensor; the trainer calls them once per step (token
count, loss and norm together) and once per log step (the per-source accounting tensors).
"""

from __future__ import annotations

import torch

from winnow.train.parallel.comm import CommTimer
from winnow.train.parallel.mesh import World


class Reducer:
    """All-reduce (sum) over the data-parallel ranks of ``world``; the identity when the world is one process.

    Tensor-parallel ranks of one data-parallel rank hold the same figures, so only ``dp`` is summed.
    """

    def __init__(self, world: World, timer: CommTimer) -> None:
        self.world, self.timer = world, timer

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """A new tensor holding the sum of ``tensor`` over the dp ranks (``tensor`` is left unchanged)."""
        if self.world.dp_size == 1:
            return tensor
        return self.timer.all_reduce(tensor.detach().clone(), self.world.dp_group)

    def sum_int(self, value: int) -> int:
        """An integer summed over the ranks (e.g. a step's loss tokens)."""
        if self.world.dp_size == 1:
            return value
        return int(self.sum(torch.tensor([value], dtype=torch.int64, device=self.world.device)).item())

    def step_values(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> tuple[float, float]:
        """(global loss, gradient norm) on the host: the step's one sync, and every rank decides the same skip.

        Each rank's loss is its share of the global mean (normalized by the global token count),
        so the sum is the global loss; the norm is already global and identical on every rank.
        """
        pair = torch.stack([loss.detach().float(), grad_norm.detach().float()])
        if self.world.dp_size > 1:
            pair = self.sum(pair.double()) * torch.tensor(
                [1.0, 1.0 / self.world.dp_size], dtype=torch.float64, device=pair.device
            )
        loss_value, norm_value = pair.tolist()
        return loss_value, norm_value
