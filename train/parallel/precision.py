"""fp16 loss scaling whose overflow check every rank agrees on.

Each rank checks only the gradients it holds: its FSDP2 shards, its own experts. One rank can
overflow where the others do not; if each then decided alone, one would step while another
skipped and their scales would part. ``AgreedGradScaler`` takes the maximum of ``found_inf``
over the whole world after ``unscale_`` (one all-reduce of one value per device per step), so
every rank skips the same steps and keeps the same scale.

torch's ``ShardedGradScaler`` does a similar all-reduce, but it sums (a flag of 2 when two ranks
overflow) into a (1,)-shaped tensor; the fused AdamW the trainer uses skips its update only when
the flag is exactly 1 and subtracts it from its 0-d step counts (torch 2.13). This subclass keeps
the plain scaler's 0-d flag and keeps it 0 or 1.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from winnow.train.parallel.comm import CommTimer


class AgreedGradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler`` whose ``found_inf`` is the maximum over ``group`` (default: every rank)."""

    def __init__(self, device: str, *, timer: CommTimer, group=None, **kw) -> None:
        super().__init__(device, **kw)
        self.timer, self.group = timer, group

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        super().unscale_(optimizer)
        if not self.is_enabled():
            return
        for found_inf in self._per_optimizer_states[id(optimizer)]["found_inf_per_device"].values():
            self.timer.all_reduce(found_inf, self.group, dist.ReduceOp.MAX)
