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
``CommTimer`` counts the all-reduces in ``comm_pct``. Sequence parallelism
(``[train.parallel] sequence_parallel``) swaps the activations' crossings for all-gathers and
reduce-scatters along the sequence (``train.model.tensor_shard``), timed the same way.
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


# ---- sequence parallelism: the activations' crossings along the sequence (dim 1 of (B, L, D)) -------------
def _seq_all_gather(x: torch.Tensor, group, size: int, timer: CommTimer) -> torch.Tensor:
    """(B, L/size, D) from every rank -> (B, L, D), rank order along the sequence."""
    x = x.contiguous()
    out = x.new_empty((size * x.shape[0], *x.shape[1:]))  # the ranks' parts one after another along dim 0
    with timer.blocking(x.numel() * x.element_size() * (size - 1)):
        dist.all_gather_into_tensor(out, x, group=group)
    return out.view(size, *x.shape).movedim(0, 1).reshape(x.shape[0], size * x.shape[1], *x.shape[2:])


def _seq_reduce_scatter(x: torch.Tensor, group, size: int, timer: CommTimer) -> torch.Tensor:
    """Partial (B, L, D) on every rank -> this rank's part of the sum, (B, L/size, D)."""
    B, L = x.shape[:2]
    parts = x.reshape(B, size, L // size, *x.shape[2:]).movedim(1, 0).contiguous()  # rank r's part at parts[r]
    out = parts.new_empty(parts.shape[1:])
    with timer.blocking(out.numel() * out.element_size() * (size - 1)):
        dist.reduce_scatter_tensor(out, parts.view(size * B, *parts.shape[2:]), group=group)
    return out


def _seq_part(x: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    length = x.shape[1]
    if length % size:
        raise ConfigError(f"train.parallel.sequence_parallel: a batch of sequence length {length} does not split "
                          f"over tp = {size} ranks; make train.data.seq_len (and any sequence-length warm-up "
                          "lengths) a multiple of tp")
    return x.narrow(1, rank * (length // size), length // size).contiguous()


class _Gather(torch.autograd.Function):
    """f under sequence parallelism: all-gather the sequence; backward reduce-scatters the partial input gradients."""

    @staticmethod
    def forward(ctx, x, group, rank, size, timer):
        ctx.args = group, size, timer
        return _seq_all_gather(x, group, size, timer)

    @staticmethod
    def backward(ctx, grad):
        return _seq_reduce_scatter(grad, *ctx.args), None, None, None, None


class _GatherReplicated(torch.autograd.Function):
    """All-gather for a replicated consumer (the head): its gradient is the same on every rank, keep this rank's part."""

    @staticmethod
    def forward(ctx, x, group, rank, size, timer):
        ctx.rank, ctx.size = rank, size
        return _seq_all_gather(x, group, size, timer)

    @staticmethod
    def backward(ctx, grad):
        return _seq_part(grad, ctx.rank, ctx.size), None, None, None, None


class _GatherBoth(torch.autograd.Function):
    """One all-gather, two copies: one into the split region (partial gradients, reduce-scattered) and one for
    the replicated router (its gradient the same on every rank: this rank's part is kept)."""

    @staticmethod
    def forward(ctx, x, group, rank, size, timer):
        ctx.args, ctx.rank = (group, size, timer), rank
        full = _seq_all_gather(x, group, size, timer)
        return full, full.clone()

    @staticmethod
    def backward(ctx, grad_split, grad_replicated):
        group, size, timer = ctx.args
        grad = _seq_part(grad_replicated, ctx.rank, size) if grad_replicated is not None else None
        if grad_split is not None:
            scattered = _seq_reduce_scatter(grad_split, group, size, timer)
            grad = scattered if grad is None else grad + scattered
        return grad, None, None, None, None


class _Scatter(torch.autograd.Function):
    """g under sequence parallelism: reduce-scatter the partial outputs; backward all-gathers the gradient."""

    @staticmethod
    def forward(ctx, x, group, rank, size, timer):
        if x.shape[1] % size:
            _seq_part(x, rank, size)  # raises the error naming the key
        ctx.args = group, size, timer
        return _seq_reduce_scatter(x, group, size, timer)

    @staticmethod
    def backward(ctx, grad):
        return _seq_all_gather(grad, *ctx.args), None, None, None, None


class _Split(torch.autograd.Function):
    """A replicated activation (the embedding's output) cut to this rank's part; backward all-gathers the gradient."""

    @staticmethod
    def forward(ctx, x, group, rank, size, timer):
        ctx.args = group, size, timer
        return _seq_part(x, rank, size)

    @staticmethod
    def backward(ctx, grad):
        return _seq_all_gather(grad, *ctx.args), None, None, None, None


def tensor_shard(world: World, timer: CommTimer, cfg: ModelConfig, *,
                 sequence_parallel: bool = False) -> TensorShard | None:
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
    group, rank = world.tp_group, world.tp_rank
    seq = {}
    if sequence_parallel:
        seq = {name: (lambda x, fn=fn: fn.apply(x, group, rank, tp, timer)) for name, fn in (
            ("gather", _Gather), ("scatter", _Scatter), ("split", _Split), ("gather_replicated", _GatherReplicated),
            ("gather_both", _GatherBoth))}
    return TensorShard(rank=rank, size=tp, enter=lambda x: _Enter.apply(x, group, timer),
                       leave=lambda x: _Leave.apply(x, group, timer), **seq)


def sequence_parallel_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The replicated weights that see only this rank's part of the sequence: every RMSNorm's scale."""
    from train.model.layers import RMSNorm

    return [m.weight for m in model.modules() if isinstance(m, RMSNorm)]


def sync_sequence_parallel_grads(params: list[nn.Parameter], world: World, timer: CommTimer) -> None:
    """Sum the norms' partial gradients over the tp group (one flat all-reduce), so every rank holds the whole one."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    with timer.blocking(flat.numel() * flat.element_size()):
        dist.all_reduce(flat, group=world.tp_group)
    for g, part in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
        g.copy_(part.view_as(g))


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
