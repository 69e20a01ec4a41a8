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

from winnow.train.attribution.hooks import GradSplit, Splitter
from winnow.train.data import Batch
from winnow.train.model import cross_entropy_per_token

log = logging.getLogger(__name__)


class HeldoutProbe:
    """``rows`` held-out sequences per source (the first that hold its tokens), read once from ``val_data``."""

    def __init__(
        self,
        val_data: Callable[[], Iterable],
        n_sources: int,
        rows: int,
        device: torch.device,
        *,
        seq_part: tuple[int, int] | None = None,
    ) -> None:
        self._start(self._read(val_data, n_sources, rows), device, seq_part)

    def _start(self, pools: list[list[Batch]], device: torch.device, seq_part: tuple[int, int] | None) -> None:
        self.n_sources, self.device = len(pools), device
        self.seq_part = seq_part  # sequence parallel: this tp rank's part of each row, where the norms run
        self.pools = pools
        self.missing = [s for s in range(self.n_sources) if not self.pools[s]]
        self._all = None  # every source's rows as one batch, and each row's source (built on first use)
        self._batched: bool | None = None  # whether the one-pass evaluation splits every gradient (None: untried)

    def grouped(self, groups: int) -> HeldoutProbe:
        """The same rows as ``groups`` probes per source: source ``s``'s rows ``g, g + groups, ...`` are probe
        ``s · groups + g`` (their source ids relabelled and the other sources' tokens masked), so one evaluation
        gives each source's loss gradient on every group, and their spread says how much the rows' draw matters."""
        pools = []
        for source, pool in enumerate(self.pools):
            for g in range(groups):
                label = len(pools)
                part = [
                    Batch(
                        b.tokens[g::groups],
                        b.targets[g::groups],
                        torch.full_like(b.source_ids[g::groups], label),
                        b.loss_mask[g::groups] & (b.source_ids[g::groups] == source),
                        b.doc_ids[g::groups],
                    )
                    for b in pool
                    if b.tokens.shape[0] > g
                ]
                pools.append(part)
        probe = object.__new__(HeldoutProbe)
        probe._start(pools, self.device, self.seq_part)
        return probe

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

    def evaluate(
        self, model: torch.nn.Module, params: Sequence[torch.Tensor], splitter: Splitter
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """At the model's current parameters: (S,) mean held-out loss per source (float64, CPU) and, per
        parameter, the (S, ...) gradients of those losses (zeros for a source with no probe).

        All sources' rows go through one forward and one backward, each weight gradient split by the
        source whose probe the row belongs to (``splitter``, ``hooks.py``): rows are separate sequences, so
        each source's part is exactly the gradient of its own loss, at the FLOPs of one pass."""
        was_training = model.training
        model.eval()  # held-out loss is measured in eval mode (no dropout, no router noise)
        try:
            if self._batched is not False:
                found = self._evaluate_batched(model, params, splitter)
                if found is not None:
                    self._batched = True
                    return found
                self._batched = False  # a parameter the model does not split by row: one pass per source
                log.info("attribution probe: the model does not split every gradient by row; one pass per source")
            return self._evaluate_each(model, params)
        finally:
            model.train(was_training)

    def _evaluate_batched(self, model, params, splitter: Splitter):
        S, present = self.n_sources, [s for s, pool in enumerate(self.pools) if pool]
        if not present:
            return torch.zeros(S, dtype=torch.float64), [torch.zeros(S, *p.shape, device=p.device) for p in params]
        if self._all is None:
            batches = [self.pools[s][0] for s in present]
            label_B = torch.cat([torch.full((b.tokens.shape[0],), s) for s, b in zip(present, batches)])
            keys = ("tokens", "targets", "source_ids", "loss_mask", "doc_ids")
            self._all = (
                Batch(*(torch.cat([getattr(b, k) for b in batches]) for k in keys)).to(self.device),
                label_B.to(self.device),
            )
        b, label_B = self._all
        mask_BL = b.loss_mask & (b.source_ids == label_B[:, None])
        count_S = torch.zeros(S, device=self.device).index_add_(0, label_B, mask_BL.sum(1).float())
        buffers = {id(p): torch.empty(S, *p.shape, dtype=torch.float32, device=p.device) for p in params}
        split = GradSplit(label_B[:, None].expand_as(b.tokens), S, buffers, seq_part=self.seq_part)
        with splitter.active(split):
            token_loss_BL = cross_entropy_per_token(model(b.tokens, b.doc_ids).logits_BLV, b.targets)
            loss_S = torch.zeros(S, device=self.device).index_add_(0, label_B, (token_loss_BL.float() * mask_BL).sum(1))
            mean_S = loss_S / count_S.clamp(min=1)
            found = torch.autograd.grad(mean_S.sum(), params, allow_unused=True)
        grads = []
        for p, g in zip(params, found):
            if id(p) not in split.written:
                if g is not None and bool(g.any()):
                    return None  # its gradient was not split
                buffers[id(p)].zero_()
            grads.append(buffers[id(p)])
        return mean_S.detach().double().cpu(), grads

    def _evaluate_each(self, model, params):
        losses_S = torch.zeros(self.n_sources, dtype=torch.float64)
        grads: list[list] = []
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
        return losses_S, [torch.stack(per_source) for per_source in zip(*grads)]


def _stack(rows: list[tuple]) -> Batch:
    """One batch of the picked (batch, row) sequences."""
    keys = ("tokens", "targets", "source_ids", "loss_mask", "doc_ids")
    return Batch(*(torch.stack([getattr(b, k)[r] for b, r in rows]) for k in keys))
