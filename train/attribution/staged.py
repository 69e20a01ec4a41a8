"""The held-out probe through the pipeline stages: each stage's part of every source's held-out gradient.

Under pipeline parallelism a rank holds only its stages, so the probe's rows run through the
schedule like a training step (forward and backward, the stages' router losses weighted 0): each
row's source travels as the micro-batch's source ids, every stage splits its weight gradients by
it (``hooks.py``), and the last stage's loss is each source's mean held-out loss, summed
over the sources. The rows are cut into micro-batches of the training's shape (padding masked) and run under the
training's autocast: the stages' buffers have its shape and dtype.
Each stage's gradients are then its part of the held-out gradient; the dot products add up over
``pp`` with the rest (``pieces.py``). Shape legend: S sources, B rows, L sequence length.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import torch

from winnow.train.attribution.hooks import GradSplit, Splitter
from winnow.train.data import Batch
from winnow.train.model import cross_entropy_per_token


def probe_rows(pools: list[list[Batch]], n_sources: int) -> tuple[Batch, torch.Tensor]:
    """Every source's probe rows as one batch whose source ids are the row's probe source (its other
    sources' tokens masked), and the (S,) token count of each source's loss."""
    rows, count_S = [], torch.zeros(n_sources)
    for s, pool in enumerate(pools):
        for b in pool:
            mask_BL = b.loss_mask & (b.source_ids == s)
            rows.append(Batch(b.tokens, b.targets, torch.full_like(b.source_ids, s), mask_BL, b.doc_ids))
            count_S[s] += float(mask_BL.sum())
    keys = ("tokens", "targets", "source_ids", "loss_mask", "doc_ids")
    return Batch(*(torch.cat([getattr(r, k) for r in rows]) for k in keys)), count_S


def evaluate_staged(
    pipeline,
    pools: list[list[Batch]],
    inputs: Sequence[torch.Tensor],
    *,
    n_sources: int,
    shape: tuple[int, int],
    reduce_pp: Callable,
    device: torch.device,
    splitter: Splitter,
    autocast: Callable | None = None,
):
    """(S,) mean held-out loss per source (float64, CPU; every rank) and, per parameter of this rank's stages,
    the (S, ...) gradients of those losses (full size: the tensors the forward uses)."""
    S = n_sources
    buffers = {id(t): torch.zeros(S, *t.shape, dtype=torch.float32, device=t.device) for t in inputs}
    if not any(pools):
        return torch.zeros(S, dtype=torch.float64), list(buffers.values())
    batch, count_S = probe_rows(pools, S)
    count_S = count_S.to(device)
    written: set[int] = set()
    loss_S = torch.zeros(S, device=device)

    def loss(logits_BLV, targets_BL, source_ids_BL, loss_mask_BL):
        token_BL = cross_entropy_per_token(logits_BLV, targets_BL).float() * loss_mask_BL
        label_B = source_ids_BL[:, 0].clamp(0, S - 1)  # a row's probe source (padding rows: masked, any)
        row_B = token_BL.sum(1)  # row sums first, as the one-process probe adds them
        loss_S.index_add_(0, label_B, row_B.detach())
        return (row_B / count_S.clamp(min=1)[label_B]).sum()

    def split(source_ids_BL):
        return splitter.active(GradSplit(source_ids_BL, S, buffers, written=written))

    rows = shape[0]
    micro = [
        Batch(
            *(getattr(batch, k)[lo : lo + rows] for k in ("tokens", "targets", "source_ids", "loss_mask", "doc_ids"))
        ).to(device)
        for lo in range(0, batch.tokens.shape[0], rows)
    ]
    n = pipeline.n_microbatches
    for lo in range(0, len(micro), n):
        pipeline.run(
            pipeline.padded(micro[lo : lo + n], *shape),
            loss=loss,
            record=None,
            loss_scale=0.0,
            split=split,
            autocast=autocast or contextlib.nullcontext,
        )
    for t in inputs:
        if id(t) not in written:
            buffers[id(t)].zero_()
    mean_S = reduce_pp(loss_S) / count_S.clamp(min=1)
    return mean_S.double().cpu(), list(buffers.values())
