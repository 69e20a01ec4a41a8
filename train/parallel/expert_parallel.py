"""Expert parallelism: each MoE layer's experts sharded over the ``ep`` ranks, tokens moved with all-to-all.

Every rank routes its own tokens over all E experts; ``ExpertDispatch`` sends each routed
assignment to the rank that holds its expert (``all_to_all_single`` with variable splits),
runs the local experts on what arrived, and sends the results back the same way. The
all-to-all is its own autograd function (backward is the reverse all-to-all), so gradients
of the local experts gather every rank's tokens, exactly as the unsharded model's would.

Shape legend in ``train.model``, plus R ranks of the ep group and X local experts (E / R).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from train.errors import ConfigError
from train.model.moe import ExpertShard, MoE
from train.parallel.comm import CommTimer
from train.parallel.mesh import World

EXPERT_PARAMS = ("w13_ED2F", "w2_EFD")


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` along dim 0 with variable splits; backward sends the gradients back."""

    @staticmethod
    def forward(ctx, x, out_splits: list[int], in_splits: list[int], group, timer: CommTimer):
        ctx.splits, ctx.group, ctx.timer = (out_splits, in_splits), group, timer
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        with timer.blocking(x.numel() * x.element_size()):
            dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        with ctx.timer.blocking(grad.numel() * grad.element_size()):
            dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None, None


class ExpertDispatch:
    """The MoE block's dispatch under expert parallelism (``ExpertShard.dispatch``)."""

    def __init__(self, *, group, ep_size: int, n_experts: int, timer: CommTimer) -> None:
        self.group, self.ep_size, self.n_local, self.timer = group, ep_size, n_experts // ep_size, timer

    def __call__(self, x_AD: torch.Tensor, counts_E: torch.Tensor, compute,
                 source_A: torch.Tensor | None = None) -> torch.Tensor:
        R, X = self.ep_size, self.n_local
        send_RX = counts_E.view(R, X)  # assignments for each (destination rank, its local expert)
        recv_RX = torch.empty_like(send_RX)  # rows: source rank
        with self.timer.blocking(send_RX.numel() * send_RX.element_size()):
            dist.all_to_all_single(recv_RX, send_RX.contiguous(), group=self.group)
        send_splits, recv_splits = send_RX.sum(1).tolist(), recv_RX.sum(1).tolist()  # split sizes live on the host
        x_recv_AD = _AllToAll.apply(x_AD, recv_splits, send_splits, self.group, self.timer)
        # arrivals are grouped by source rank, then expert; the local experts want them grouped by expert
        local_expert_A = torch.repeat_interleave(torch.arange(R * X, device=x_AD.device) % X, recv_RX.reshape(-1))
        order_A = local_expert_A.argsort(stable=True)
        if source_A is None:
            y_sorted_AD = compute(x_recv_AD[order_A], recv_RX.sum(0))
        else:  # splitting gradients by source: each arriving assignment's source travels with it
            source_recv_A = source_A.new_empty(sum(recv_splits))
            with self.timer.blocking(source_A.numel() * source_A.element_size()):
                dist.all_to_all_single(source_recv_A, source_A.contiguous(), recv_splits, send_splits, group=self.group)
            y_sorted_AD = compute(x_recv_AD[order_A], recv_RX.sum(0), source_recv_A[order_A])
        inverse_A = torch.empty_like(order_A)
        inverse_A[order_A] = torch.arange(len(order_A), device=order_A.device)
        return _AllToAll.apply(y_sorted_AD[inverse_A], send_splits, recv_splits, self.group, self.timer)


def expert_shard(world: World, timer: CommTimer, n_experts: int) -> ExpertShard | None:
    """What a model built on this rank passes to ``Transformer(..., experts=)``; None without expert parallelism."""
    if world.ep_size <= 1:
        return None
    dispatch = ExpertDispatch(group=world.ep_group, ep_size=world.ep_size, n_experts=n_experts, timer=timer)
    return ExpertShard(rank=world.ep_rank, size=world.ep_size, dispatch=dispatch)


def sharded_expert_names(model: nn.Module, world: World) -> list[str]:
    """Names of the sharded expert parameters; refuses a model built without this rank's ``ExpertShard``."""
    names = []
    for name, module in model.named_modules():
        if not isinstance(module, MoE):
            continue
        if module.shard is None or module.shard.size != world.ep_size or module.shard.rank != world.ep_rank:
            raise ConfigError(f"train.parallel.ep = {world.ep_size}: the model's MoE layer {name!r} was "
                              f"not built for it; build the model with Transformer(cfg, "
                              f"experts=parallel.expert_shard(cfg.n_experts))")
        names += [f"{name}.{pname}" if name else pname for pname in EXPERT_PARAMS]
    return names


def expert_parameters(model: nn.Module, names: list[str]) -> list[nn.Parameter]:
    named = dict(model.named_parameters())
    return [named[n] for n in names]


@torch.no_grad()
def sync_expert_grads(params: list[nn.Parameter], world: World, timer: CommTimer) -> None:
    """Expert gradients to the global-batch mean: DDP's 1/dp, and a sum over the ranks holding the same experts.

    The all-to-all backward already added every ep rank's contribution; the ``edp`` ranks
    hold the same experts and saw different tokens.
    """
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    for p, g in zip(params, grads):
        p.grad = g
    flat = torch.cat([g.reshape(-1) for g in grads])
    flat.div_(world.dp_size)
    if world.edp_size > 1:
        with timer.blocking(flat.numel() * flat.element_size()):
            dist.all_reduce(flat, group=world.edp_group)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def gather_experts(tensor: torch.Tensor, world: World) -> torch.Tensor:
    """The full (E, ...) tensor from every ep rank's (X, ...) slice."""
    parts = [torch.empty_like(tensor) for _ in range(world.ep_size)]
    dist.all_gather(parts, tensor.contiguous(), group=world.ep_group)
    return torch.cat(parts)


def local_slice(tensor: torch.Tensor, world: World) -> torch.Tensor:
    """This rank's rows of a full (E, ...) expert tensor."""
    local = tensor.shape[0] // world.ep_size
    return tensor[world.ep_rank * local:(world.ep_rank + 1) * local]
