"""Expert parallelism: each MoE layer's experts sharded over the ``ep`` ranks, rows moved with all-to-all.

Every rank routes its own tokens over all E experts; ``ExpertDispatch``, hooked onto each MoE
block's ``experts`` module (as torchtitan's ``ExpertParallel`` hooks ``distribute_module``'s input
and output functions there), sends each routed row to the rank that holds its expert
(``all_to_all_single`` with variable splits) before the experts run, and sends the results back the
same way after. The all-to-all is its own autograd function (backward is the reverse all-to-all),
so gradients of the local experts gather every rank's tokens, exactly as the unsharded model's would.

Shape legend in ``train.model``, plus R ranks of the ep group and X local experts (E / R).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from winnow.train.model.moe import MoE
from winnow.train.parallel.comm import CommTimer
from winnow.train.parallel.mesh import World

EXPERT_PARAMS = ("experts.w13_ED2F", "experts.w2_EFD")


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
    """One MoE block's row exchange under expert parallelism: a forward pre-hook and a forward hook on its experts.

    ``dispatch`` (before the experts run) sends each row to the rank holding its expert and sorts what
    arrived by local expert; ``combine`` (after) puts the outputs back in the order the rows left and
    returns them. The routing of the call in flight is kept between the two (and for ``route``).
    """

    def __init__(self, *, group, ep_size: int, n_experts: int, timer: CommTimer) -> None:
        self.group, self.ep_size, self.n_local, self.timer = group, ep_size, n_experts // ep_size, timer
        self._splits: tuple[list[int], list[int]] | None = None  # (send, recv) rows per rank of the call in flight
        self._order: torch.Tensor | None = None  # arrivals sorted by local expert

    def dispatch(self, _module: nn.Module, args: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        x_AD, counts_E = args
        R, X = self.ep_size, self.n_local
        send_RX = counts_E.view(R, X)  # assignments for each (destination rank, its local expert)
        recv_RX = torch.empty_like(send_RX)  # rows: source rank
        with self.timer.blocking(send_RX.numel() * send_RX.element_size()):
            dist.all_to_all_single(recv_RX, send_RX.contiguous(), group=self.group)
        self._splits = send_RX.sum(1).tolist(), recv_RX.sum(1).tolist()  # split sizes live on the host
        x_recv_AD = _AllToAll.apply(x_AD, self._splits[1], self._splits[0], self.group, self.timer)
        # arrivals are grouped by source rank, then expert; the local experts want them grouped by expert
        local_expert_A = torch.repeat_interleave(torch.arange(R * X, device=x_AD.device) % X, recv_RX.reshape(-1))
        self._order = local_expert_A.argsort(stable=True)
        return x_recv_AD[self._order], recv_RX.sum(0)

    def combine(self, _module: nn.Module, _args: tuple, y_sorted_AD: torch.Tensor) -> torch.Tensor:
        order_A = self._order
        inverse_A = torch.empty_like(order_A)
        inverse_A[order_A] = torch.arange(len(order_A), device=order_A.device)
        send, recv = self._splits
        return _AllToAll.apply(y_sorted_AD[inverse_A], send, recv, self.group, self.timer)

    def route(self, values_A: torch.Tensor) -> torch.Tensor:
        """Per-row values (e.g. each row's source) sent where the call in flight sent its rows, in the order
        the local experts see them; call between ``dispatch`` and ``combine``."""
        send, recv = self._splits
        out = values_A.new_empty(sum(recv))
        with self.timer.blocking(values_A.numel() * values_A.element_size()):
            dist.all_to_all_single(out, values_A.contiguous(), recv, send, group=self.group)
        return out[self._order]


def apply_expert_parallel(model: nn.Module, world: World, timer: CommTimer) -> dict[int, ExpertDispatch]:
    """Keep this rank's experts of every MoE block in ``model`` and hook the row exchange onto them, in place;
    returns each block's dispatch by ``id`` of its ``experts`` module."""
    dispatches = {}
    for moe in (m for m in model.modules() if isinstance(m, MoE)):
        n_experts, experts = moe.cfg.n_experts, moe.experts  # ep divides n_experts (ParallelConfig.resolve)
        lo, local = world.ep_rank * (n_experts // world.ep_size), n_experts // world.ep_size
        with torch.no_grad():
            for pname in ("w13_ED2F", "w2_EFD"):
                setattr(experts, pname, nn.Parameter(getattr(experts, pname)[lo : lo + local].clone()))
        dispatch = ExpertDispatch(group=world.ep_group, ep_size=world.ep_size, n_experts=n_experts, timer=timer)
        experts.register_forward_pre_hook(dispatch.dispatch)
        experts.register_forward_hook(dispatch.combine)
        dispatches[id(experts)] = dispatch
    return dispatches


def sharded_expert_names(model: nn.Module) -> list[str]:
    """Names of the expert parameters (sharded over ``ep`` once ``apply_expert_parallel`` ran)."""
    return [
        f"{name}.{pname}"
        for name, module in model.named_modules()
        if isinstance(module, MoE)
        for pname in EXPERT_PARAMS
    ]


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
        timer.all_reduce(flat, world.edp_group)
    for g, part in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(part.view_as(g))


def gather_experts(tensor: torch.Tensor, world: World) -> torch.Tensor:
    """The full (E, ...) tensor from every ep rank's (X, ...) slice."""
    parts = [torch.empty_like(tensor) for _ in range(world.ep_size)]
    dist.all_gather(parts, tensor.contiguous(), group=world.ep_group)
    return torch.cat(parts)


def local_slice(tensor: torch.Tensor, world: World) -> torch.Tensor:
    """This rank's rows of a full (E, ...) expert tensor."""
    local = tensor.shape[0] // world.ep_size
    return tensor[world.ep_rank * local : (world.ep_rank + 1) * local]
