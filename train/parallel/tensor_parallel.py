"""Tensor parallelism over the mesh's ``tp`` group: the two crossings (f and g) and the weights' layouts.

Each rank holds its part of the split weights as ordinary parameters (``train.model.tensor_shard``),
so DDP over the ``dp`` group, the optimizer and the accounting see plain tensors of this rank's
shape; the ranks of one ``tp`` group read the same batches. In DTensor terms a split weight's
placement on the ``tp`` mesh is ``Shard(dim)`` for the plain column/row splits and
``_StridedShard(dim, split_factor=2)`` for the fused [k | v] and [gate | up] projections (each half
split on its own); ``gather``/``local`` convert to and from the one-process checkpoint format.

The collectives are hand-written autograd functions on the ``tp`` group rather than DTensor's
``parallelize_module`` styles: the fused projections and the grouped ``(E, D, F)`` expert weights
have no ``ColwiseParallel`` equivalent, DDP does not take DTensor parameters, and going through
``CommTimer`` counts the all-reduces in ``comm_pct``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from train.errors import ConfigError
from train.model import ModelConfig
from train.model.layers import Attention, SwiGLU
from train.model.moe import MoE
from train.model.tensor_shard import (ATTENTION_LAYOUT, EXPERTS_LAYOUT, SWIGLU_LAYOUT, TensorShard, join_parts,
                                      local_part)
from train.parallel.comm import CommTimer
from train.parallel.mesh import World


def _all_reduce(x: torch.Tensor, group, timer: CommTimer) -> torch.Tensor:
    out = x.contiguous().clone()
    with timer.blocking(out.numel() * out.element_size()):
        dist.all_reduce(out, group=group)
    return out


class _Enter(torch.autograd.Function):
    """f: the identity forward; backward sums the ranks' partial input gradients."""

    @staticmethod
    def forward(ctx, x, group, timer):
        ctx.group, ctx.timer = group, timer
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group, ctx.timer), None, None


class _Leave(torch.autograd.Function):
    """g: forward sums the ranks' partial outputs; the gradient of the sum is the same on every rank."""

    @staticmethod
    def forward(ctx, x, group, timer):
        return _all_reduce(x, group, timer)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


def tensor_shard(world: World, timer: CommTimer, cfg: ModelConfig) -> TensorShard | None:
    """What a model built on this rank passes to ``Transformer(..., tensor=)``; None without tensor parallelism."""
    tp = world.tp_size
    if tp <= 1:
        return None
    hidden = {"train.model.n_heads": cfg.n_heads, "train.model.n_kv_heads": cfg.kv_heads,
              "train.model.ffn_hidden": cfg.ffn_hidden}
    if cfg.dense_hidden:
        hidden["train.model.dense_hidden"] = cfg.dense_hidden
    for key, value in hidden.items():
        if value % tp:
            raise ConfigError(f"train.parallel.tp = {tp} does not divide {key} = {value}: tensor parallelism splits "
                              "heads and hidden widths evenly over the tp ranks; pick a tp that divides it")
    group = world.tp_group
    return TensorShard(rank=world.tp_rank, size=tp, enter=lambda x: _Enter.apply(x, group, timer),
                       leave=lambda x: _Leave.apply(x, group, timer))


_LAYOUTS = ((Attention, ATTENTION_LAYOUT), (SwiGLU, SWIGLU_LAYOUT), (MoE, EXPERTS_LAYOUT))


def split_layouts(model: nn.Module, world: World) -> dict[str, tuple[int, int]]:
    """Parameter name -> ``(dim, parts)`` of every tensor-parallel weight; refuses a model not built for this rank."""
    layouts = {}
    for name, module in model.named_modules():
        for cls, layout in _LAYOUTS:
            if not isinstance(module, cls):
                continue
            tp = module.tp
            if tp is None or tp.size != world.tp_size or tp.rank != world.tp_rank:
                raise ConfigError(f"train.parallel.tp = {world.tp_size}: the model's {cls.__name__} {name!r} was not "
                                  "built for it; build the model with Transformer(cfg, "
                                  "tensor=parallel.tensor_shard(cfg))")
            layouts.update({f"{name}.{p}" if name else p: spec for p, spec in layout.items()})
    return layouts


def gather(tensor: torch.Tensor, layout: tuple[int, int], world: World) -> torch.Tensor:
    """The full tensor from every tp rank's part (all ranks get it)."""
    parts = [torch.empty_like(tensor) for _ in range(world.tp_size)]
    dist.all_gather(parts, tensor.contiguous(), group=world.tp_group)
    return join_parts(parts, layout)


def local(tensor: torch.Tensor, layout: tuple[int, int], world: World) -> torch.Tensor:
    """This tp rank's part of a full tensor."""
    return local_part(tensor, layout, world.tp_rank, world.tp_size)
