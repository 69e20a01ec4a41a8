"""Tensor parallelism as the model sees it: which slice of each weight this rank keeps, and where the
activations cross the tensor-parallel group (Megatron-LM's f and g, https://arxiv.org/abs/1909.08053).

Attention is split by heads (q/k/v column-wise, the output row-wise), the SwiGLU blocks and every
expert by hidden width (gate/up column-wise, down row-wise), so attention and the activations run on
local heads and columns with no collective inside; ``enter`` (identity forward, all-reduce of the
input gradient backward) opens each split region and ``leave`` (all-reduce of the partial outputs
forward, identity backward) closes it. The router, norms, embedding and head stay replicated.

With sequence parallelism (Megatron-LM's, https://arxiv.org/abs/2205.05198) the activations between
the split regions are cut along the sequence instead of being replicated: each rank holds (B, L/size,
D) of the residual stream, so the norms, residual adds and dropout run on 1/size of the tokens.
``open`` is then an all-gather along the sequence (backward: reduce-scatter) and ``close`` a
reduce-scatter (backward: all-gather). The embedding's output is cut (``split``), the final norm's
output gathered for the replicated head (``gather_replicated``: its backward keeps this rank's part
of a gradient that is the same on every rank). The MoE router routes after the gather, so it sees
every token as in one process (``gather_both``: one all-gather, one copy for the experts' split region
and one for the replicated router). The norm weights then see only their rank's tokens: their
gradients are summed over the group (``train.parallel.Parallel.clip_grad_norm``).

A layout ``(dim, parts)`` says how a full weight maps onto the ranks: the full tensor is cut along
``dim`` into ``parts`` blocks (2 for the fused [k | v] and [gate | up] projections, 1 otherwise)
and each block into ``size`` slices; rank r keeps slice r of every block, side by side. The same
layout turns a full checkpoint tensor into this rank's part and the ranks' parts back into it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# per module class: parameter name -> (dim, parts) of its tensor-parallel layout
ATTENTION_LAYOUT = {"wq.weight": (0, 1), "wkv.weight": (0, 2), "wo.weight": (1, 1)}
SWIGLU_LAYOUT = {"w13.weight": (0, 2), "w2.weight": (1, 1)}
EXPERTS_LAYOUT = {"w13_ED2F": (2, 2), "w2_EFD": (1, 1)}


@dataclass(frozen=True, slots=True)
class TensorShard:
    """Tensor parallelism, given to the model at construction (``train.parallel.Parallel.tensor_shard``).

    ``enter(x)`` and ``leave(x)`` are the two crossings of the tensor-parallel group (see above);
    ``open``/``close`` are the crossings of the activations, which sequence parallelism (the four
    optional sequence ops, all along dim 1 of a (B, L, D) tensor) turns into gathers and scatters.
    """

    rank: int
    size: int
    enter: Callable[[torch.Tensor], torch.Tensor]
    leave: Callable[[torch.Tensor], torch.Tensor]
    gather: Callable[[torch.Tensor], torch.Tensor] | None = None  # (B, L/size, D) -> (B, L, D); bwd reduce-scatter
    scatter: Callable[[torch.Tensor], torch.Tensor] | None = None  # partial (B, L, D) -> summed (B, L/size, D)
    split: Callable[[torch.Tensor], torch.Tensor] | None = None  # replicated (B, L, D) -> this rank's (B, L/size, D)
    gather_replicated: Callable[[torch.Tensor], torch.Tensor] | None = None  # for replicated consumers
    gather_both: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None  # (split region, replicated)

    @property
    def sequence_parallel(self) -> bool:
        return self.gather is not None

    def open(self, x_BLD: torch.Tensor) -> torch.Tensor:
        """Into a split region: the whole sequence, its input gradient summed over the ranks."""
        return self.gather(x_BLD) if self.gather is not None else self.enter(x_BLD)

    def close(self, x_BLD: torch.Tensor) -> torch.Tensor:
        """Out of a split region: the ranks' partial outputs summed (and cut to this rank's part of the sequence)."""
        return self.scatter(x_BLD) if self.scatter is not None else self.leave(x_BLD)


def local_part(full: torch.Tensor, layout: tuple[int, int], rank: int, size: int) -> torch.Tensor:
    """This rank's part of a full tensor (a copy), laid out as ``layout`` says."""
    dim, parts = layout
    blocks = full.chunk(parts, dim)
    return torch.cat([block.chunk(size, dim)[rank] for block in blocks], dim).clone()


def join_parts(locals_: list[torch.Tensor], layout: tuple[int, int]) -> torch.Tensor:
    """The full tensor from every rank's part (in rank order): the inverse of ``local_part``."""
    dim, parts = layout
    pieces = [local.chunk(parts, dim) for local in locals_]
    return torch.cat([torch.cat([p[b] for p in pieces], dim) for b in range(parts)], dim)


@torch.no_grad()
def keep_local(module: torch.nn.Module, layout: dict[str, tuple[int, int]], shard: TensorShard | None) -> None:
    """Replace each parameter named in ``layout`` by this rank's part; the owning model calls it once,
    after initializing the full weights, so a tensor-parallel model starts from the unsplit one's weights."""
    if shard is None or shard.size == 1:
        return
    for name, spec in layout.items():
        owner_name, _, pname = name.rpartition(".")
        owner = module.get_submodule(owner_name) if owner_name else module
        setattr(owner, pname, torch.nn.Parameter(local_part(getattr(owner, pname), spec, shard.rank, shard.size)))
