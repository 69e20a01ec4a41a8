"""Tensor and sequence parallelism over the mesh's ``tp`` group, applied to a built model from outside.

Megatron-LM's split (https://arxiv.org/abs/1909.08053): attention by heads (q/k/v column-wise, the
output row-wise), the SwiGLU blocks and every expert by hidden width (gate/up column-wise, down
row-wise), so attention and the activations run on local heads and columns with no collective inside.
``apply_tensor_parallel`` cuts each split weight to this rank's part and hooks the crossings onto the
modules: ``enter`` (identity forward, all-reduce of the input gradient backward) opens a split region,
``leave`` (all-reduce of the partial outputs forward, identity backward) closes it. The router, norms,
embedding and head stay replicated. Inside an MoE block (as torchtitan's expert ``TensorParallel``) the
routed rows and the shared experts' input enter their regions, the routing weights (they scale a partial
output) enter too, and the block's output, both partial sums added, leaves once.

Sequence parallelism (https://arxiv.org/abs/2205.05198) cuts the activations between the regions along
the sequence: each rank holds (B, L/size, D) of the residual stream, so norms, residual adds and dropout
run on 1/size of the tokens. Opening a region is then an all-gather along the sequence (backward:
reduce-scatter), closing it a reduce-scatter (backward: all-gather); the embedding's output is cut, and
the head and each MoE block gather theirs for replicated consumers (backward: this rank's part of a
gradient every rank holds whole). The norm scales see only their rank's tokens: their gradients are
summed over the group (``Parallel.clip_grad_norm``).

A layout ``(dim, parts)`` maps a full weight onto the ranks: cut along ``dim`` into ``parts`` blocks (2
for the fused [k | v] and [gate | up] projections) and each block into ``size`` slices; rank r keeps
slice r of every block. In DTensor terms that is ``Shard(dim)``, or ``_StridedShard(dim, split_factor=2)``
for the fused projections. DTensor's ``parallelize_module`` styles are not used: their parameters are
DTensors, which DDP does not take (DDP x TP is a layout winnow offers), the fused projections and the
grouped (E, D, 2F) experts have no built-in style, and the per-source gradient split
(``train.attribution.hooks``) and the comm timer work on plain tensors. So split weights stay ordinary
parameters of this rank's shape, and the crossings are autograd functions hooked on as those styles
hook theirs.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from winnow.train.errors import ConfigError
from winnow.train.model import ModelConfig
from winnow.train.model.layers import Attention, RMSNorm, SwiGLU
from winnow.train.model.moe import MoE
from winnow.train.parallel.comm import CommTimer
from winnow.train.parallel.mesh import World

# per module class: parameter name -> (dim, parts) of its tensor-parallel layout
ATTENTION_LAYOUT = {"wq.weight": (0, 1), "wkv.weight": (0, 2), "wo.weight": (1, 1)}
SWIGLU_LAYOUT = {"w13.weight": (0, 2), "w2.weight": (1, 1)}
EXPERTS_LAYOUT = {"experts.w13_ED2F": (2, 2), "experts.w2_EFD": (1, 1)}


def _all_reduce(x: torch.Tensor, group, timer: CommTimer) -> torch.Tensor:
    return timer.all_reduce(x.contiguous().clone(), group)


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
        raise ConfigError(
            f"train.parallel.sequence_parallel: a batch of sequence length {length} does not split "
            f"over tp = {size} ranks; make train.data.seq_len (and any sequence-length warm-up "
            "lengths) a multiple of tp"
        )
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


class Crossings:
    """The autograd crossings of this rank's ``tp`` group (see above), as functions of one activation."""

    def __init__(self, world: World, timer: CommTimer, *, sequence_parallel: bool) -> None:
        self.group, self.rank, self.size, self.timer = world.tp_group, world.tp_rank, world.tp_size, timer
        self.sequence_parallel = sequence_parallel

    def _seq(self, fn, x: torch.Tensor) -> torch.Tensor:
        return fn.apply(x, self.group, self.rank, self.size, self.timer)

    def enter(self, x: torch.Tensor) -> torch.Tensor:
        return _Enter.apply(x, self.group, self.timer)

    def open(self, x_BLD: torch.Tensor) -> torch.Tensor:
        """Into a split region: the whole sequence, its input gradient summed over the ranks."""
        return self._seq(_Gather, x_BLD) if self.sequence_parallel else self.enter(x_BLD)

    def close(self, x_BLD: torch.Tensor) -> torch.Tensor:
        """Out of a split region: the ranks' partial outputs summed (and cut to this rank's part of the sequence)."""
        return self._seq(_Scatter, x_BLD) if self.sequence_parallel else _Leave.apply(x_BLD, self.group, self.timer)

    def replicate(self, x_BLD: torch.Tensor) -> torch.Tensor:
        """For a replicated consumer: the whole sequence under sequence parallelism (its gradient the same on
        every rank, this rank keeps its part), ``x`` itself otherwise."""
        return self._seq(_GatherReplicated, x_BLD) if self.sequence_parallel else x_BLD

    def cut(self, x_BLD: torch.Tensor) -> torch.Tensor:
        """A replicated activation cut to this rank's part of the sequence (sequence parallel only)."""
        return self._seq(_Split, x_BLD) if self.sequence_parallel else x_BLD


def check_divides(cfg: ModelConfig, tp: int) -> None:
    """ConfigError naming the model key tensor parallelism cannot split evenly over ``tp`` ranks."""
    hidden = {
        "train.model.n_heads": cfg.n_heads,
        "train.model.n_kv_heads": cfg.kv_heads,
        "train.model.ffn_hidden": cfg.ffn_hidden,
    }
    if cfg.dense_hidden:
        hidden["train.model.dense_hidden"] = cfg.dense_hidden
    for key, value in hidden.items():
        if value % tp:
            raise ConfigError(
                f"train.parallel.tp = {tp} does not divide {key} = {value}: tensor parallelism splits "
                "heads and hidden widths evenly over the tp ranks; pick a tp that divides it"
            )


@torch.no_grad()
def keep_local(module: nn.Module, layout: dict[str, tuple[int, int]], rank: int, size: int) -> None:
    """Replace each parameter named in ``layout`` by this rank's part (on the meta device: its shape)."""
    for name, spec in layout.items():
        owner_name, _, pname = name.rpartition(".")
        owner = module.get_submodule(owner_name) if owner_name else module
        setattr(owner, pname, nn.Parameter(local_part(getattr(owner, pname), spec, rank, size)))


def _in(fn):
    """A forward pre-hook applying ``fn`` to the module's first input."""
    return lambda _module, args: (fn(args[0]), *args[1:])


def _out(fn):
    """A forward hook applying ``fn`` to the module's output (the first element of a tuple output)."""
    return lambda _module, _args, out: (fn(out[0]), *out[1:]) if isinstance(out, tuple) else fn(out)


def apply_tensor_parallel(
    model: nn.Module, world: World, timer: CommTimer, *, sequence_parallel: bool = False
) -> dict[str, tuple[int, int]]:
    """Split ``model`` over the ``tp`` ranks in place; returns parameter name -> ``(dim, parts)`` of every split weight.

    ``model`` is the whole transformer or a pipeline stage's pruned one (blocks it does not hold are None).
    """
    check_divides(model.cfg, world.tp_size)
    tp = Crossings(world, timer, sequence_parallel=sequence_parallel)
    rank, size = world.tp_rank, world.tp_size
    layouts: dict[str, tuple[int, int]] = {}

    def split(name: str, module: nn.Module, layout: dict) -> None:
        keep_local(module, layout, rank, size)
        layouts.update({f"{name}.{p}": spec for p, spec in layout.items()})

    for name, module in model.named_modules():
        if isinstance(module, Attention) or (isinstance(module, SwiGLU) and not name.endswith(".shared")):
            split(name, module, ATTENTION_LAYOUT if isinstance(module, Attention) else SWIGLU_LAYOUT)
            module.register_forward_pre_hook(_in(tp.open))
            module.register_forward_hook(_out(tp.close))
        elif isinstance(module, MoE):
            split(name, module, EXPERTS_LAYOUT)
            module.register_forward_pre_hook(_in(tp.replicate))  # the router routes every token
            module.register_forward_hook(_out(tp.close))  # experts' and shared experts' partial sums, once
            module.experts.register_forward_pre_hook(_in(tp.enter))
            module.router.register_forward_hook(_out(tp.enter))  # the routing weights scale a partial output
            if module.shared is not None:  # its partial output joins the experts' before the block's close
                split(f"{name}.shared", module.shared, SWIGLU_LAYOUT)
                module.shared.register_forward_pre_hook(_in(tp.enter))
    if sequence_parallel:
        if model.embed is not None:  # the blocks run on this rank's part of the sequence
            model.embed.register_forward_hook(_out(tp.cut))
        if model.head is not None:  # the replicated head sees every position
            model.head.register_forward_pre_hook(_in(tp.replicate))
    return layouts


def sequence_parallel_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The replicated weights that see only this rank's part of the sequence: every RMSNorm's scale."""
    return [m.weight for m in model.modules() if isinstance(m, RMSNorm)]


def sync_sequence_parallel_grads(params: list[nn.Parameter], world: World, timer: CommTimer) -> None:
    """Sum the norms' partial gradients over the tp group (one flat all-reduce), so every rank holds the whole one."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    timer.all_reduce(flat, world.tp_group)
    for g, part in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
        g.copy_(part.view_as(g))


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


def gather(tensor: torch.Tensor, layout: tuple[int, int], world: World) -> torch.Tensor:
    """The full tensor from every tp rank's part (all ranks get it)."""
    parts = [torch.empty_like(tensor) for _ in range(world.tp_size)]
    dist.all_gather(parts, tensor.contiguous(), group=world.tp_group)
    return join_parts(parts, layout)


def local(tensor: torch.Tensor, layout: tuple[int, int], world: World) -> torch.Tensor:
    """This tp rank's part of a full tensor."""
    return local_part(tensor, layout, world.tp_rank, world.tp_size)
