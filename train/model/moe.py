"""The Mixture-of-Experts feed-forward block: an fp32 router, batched experts, balancing losses.

Shape legend in ``train.model``: T tokens, D width, F expert hidden width, E experts,
K experts per token, A routed assignments (T·K, in expert-sorted order).

Tokens are sorted by expert so each expert's tokens are one contiguous slice, and all
experts run in one grouped matmul (``torch._grouped_mm``) or one padded ``bmm`` (see
``expert_ffn``) — no Python loop over experts.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from train.model.config import ModelConfig
from train.model.layers import SwiGLU, swiglu
from train.model.split import active, expert_mm, linear, tracking
from train.model.tensor_shard import EXPERTS_LAYOUT, TensorShard, keep_local


class MoEStats(NamedTuple):
    """What one MoE block reports per forward (returned, not stored, so activation checkpointing recomputes safely)."""

    aux_loss: torch.Tensor  # Switch load-balancing loss, unweighted (1.0 = perfectly balanced)
    z_loss: torch.Tensor  # mean squared log-partition of the router logits, unweighted
    load_E: torch.Tensor  # assignments routed to each expert (before capacity dropping), detached
    dropped: torch.Tensor  # assignments dropped for capacity (0 when dropless)
    experts_TK: torch.Tensor  # chosen experts per token, detached (per-source routing histograms)


@dataclass(frozen=True, slots=True)
class ExpertShard:
    """Expert parallelism, given to the model at construction (``train.parallel.Parallel.expert_shard``).

    This rank holds experts ``[rank·X, (rank+1)·X)`` of every MoE layer (X = E / size), and
    ``dispatch(x_AD, counts_E, compute, source_A) -> y_AD`` runs each routed assignment on the rank holding
    its expert (``source_A``: each assignment's source while gradients are split by source, else None) (``train.parallel.expert_parallel.ExpertDispatch``).
    """

    rank: int
    size: int
    dispatch: Callable[[torch.Tensor, torch.Tensor, Callable, torch.Tensor | None], torch.Tensor]


def _autocast_dtype(x: torch.Tensor) -> torch.dtype:
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def _grouped_mm_ok(x: torch.Tensor, w: torch.Tensor) -> bool:
    # The kernel needs 16-byte aligned row strides; on CUDA also Hopper+ and bf16.
    if not hasattr(torch, "_grouped_mm") or (x.shape[-1] * x.element_size()) % 16 or (w.shape[-1] * w.element_size()) % 16:
        return False
    if x.device.type == "cpu":
        return True
    return x.device.type == "cuda" and x.dtype == torch.bfloat16 and torch.cuda.get_device_capability(x.device)[0] >= 9


_PAD_ROWS = 32  # padded expert slices grow in steps of this, so step after step sees the same few shapes


def _padded_capacity(counts_E: torch.Tensor) -> int:
    return -(-int(counts_E.max()) // _PAD_ROWS) * _PAD_ROWS if counts_E.numel() else 0


def _padded_rows(counts_E: torch.Tensor, capacity: int, n_rows: int) -> torch.Tensor:
    """Row of each expert-sorted assignment in an (E·capacity) buffer whose expert e starts at row e·capacity."""
    starts_E = counts_E.cumsum(0) - counts_E
    shift_E = torch.arange(counts_E.shape[0], device=counts_E.device) * capacity - starts_E
    return torch.arange(n_rows, device=counts_E.device) + shift_E.repeat_interleave(counts_E, output_size=n_rows)


def _expert_mm(x_AI: torch.Tensor, w_EIO: torch.Tensor, counts_E: torch.Tensor) -> torch.Tensor:
    """One matmul per expert on its slice of the expert-sorted rows: (A, I) -> (A, O), the kernel as below."""
    w_EIO = w_EIO.to(x_AI.dtype)
    if _grouped_mm_ok(x_AI, w_EIO):
        return torch._grouped_mm(x_AI, w_EIO, offs=counts_E.cumsum(0).to(torch.int32))
    capacity = _padded_capacity(counts_E)
    rows_A = _padded_rows(counts_E, capacity, x_AI.shape[0])
    x_ECI = x_AI.new_zeros(w_EIO.shape[0] * capacity, x_AI.shape[1]).index_copy(0, rows_A, x_AI)
    y_ECO = torch.bmm(x_ECI.view(w_EIO.shape[0], capacity, -1), w_EIO)
    return y_ECO.view(-1, w_EIO.shape[2]).index_select(0, rows_A)


def expert_ffn(x_AD: torch.Tensor, w13_ED2F: torch.Tensor, w2_EFD: torch.Tensor, counts_E: torch.Tensor,
               source_A: torch.Tensor | None = None) -> torch.Tensor:
    """Each expert's SwiGLU on its contiguous slice of the expert-sorted rows: (A, D) -> (A, D).

    The one place that chooses the kernel. ``torch._grouped_mm`` runs all experts in one call
    on the compact rows wherever this torch offers it for the device and dtype (CPU; CUDA:
    Hopper, bf16). Elsewhere the slices are padded to one length and run as one ``bmm``.
    On CPU the two kernels cost the same CPU time per row (1 thread, 8 experts x 512 rows,
    256 -> 1024, forward and backward), so the compact kernel wins by the padding it avoids —
    up to ~1.9x the rows with a fresh router's uneven load.
    While a ``GradSplit`` tracks the weights (``source_A``: each row's source), each matmul runs on
    its own so its weight gradient is split by source (``train.model.split``).
    """
    if source_A is not None and tracking(w13_ED2F) is not None:
        h_A2F = expert_mm(_expert_mm, x_AD, w13_ED2F, counts_E, source_A)
        return expert_mm(_expert_mm, swiglu(h_A2F), w2_EFD, counts_E, source_A)
    w13_ED2F, w2_EFD = w13_ED2F.to(x_AD.dtype), w2_EFD.to(x_AD.dtype)
    # the second matmul's input rows are F wide, as the rows of w2's transpose are
    if _grouped_mm_ok(x_AD, w13_ED2F) and _grouped_mm_ok(w2_EFD.transpose(1, 2), w2_EFD):
        offsets_E = counts_E.cumsum(0).to(torch.int32)
        return torch._grouped_mm(swiglu(torch._grouped_mm(x_AD, w13_ED2F, offs=offsets_E)), w2_EFD, offs=offsets_E)
    n_rows, n_experts, dim = x_AD.shape[0], w13_ED2F.shape[0], x_AD.shape[1]
    capacity = _padded_capacity(counts_E)
    rows_A = _padded_rows(counts_E, capacity, n_rows)
    # out-of-place index_copy / index_select: autograd's backward of each is the other, no scatter-add of the padding
    x_ECD = x_AD.new_zeros(n_experts * capacity, dim).index_copy(0, rows_A, x_AD).view(n_experts, capacity, dim)
    y_ECD = torch.bmm(swiglu(torch.bmm(x_ECD, w13_ED2F)), w2_EFD)
    return y_ECD.view(n_experts * capacity, dim).index_select(0, rows_A)


class Router(nn.Module):
    """Scores experts for each token in fp32 and picks the top k, with renormalized weights."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.gate = nn.Linear(cfg.dim, cfg.n_experts, bias=False)
        # aux-loss-free balancing (https://arxiv.org/abs/2408.15664): a bias that only steers selection
        self.register_buffer("expert_bias_E", torch.zeros(cfg.n_experts))

    def forward(self, x_TD: torch.Tensor):
        cfg = self.cfg
        with torch.autocast(x_TD.device.type, enabled=False):
            logits_TE = linear(x_TD.float(), self.gate.weight.float())
            if self.training and cfg.router_noise > 0:
                logits_TE = logits_TE + torch.randn_like(logits_TE) * cfg.router_noise
            if cfg.score_func == "softmax":
                scores_TE = logits_TE.softmax(-1)
                probs_TE = scores_TE
            else:
                scores_TE = logits_TE.sigmoid()
                probs_TE = scores_TE / scores_TE.sum(-1, keepdim=True)
            select_TE = scores_TE + self.expert_bias_E if cfg.load_balance == "bias" else scores_TE
            experts_TK = select_TE.topk(cfg.top_k, dim=-1).indices
            weights_TK = scores_TE.gather(1, experts_TK)
            if cfg.top_k > 1:  # with k = 1 renormalizing would make every weight 1 and starve the router of gradient
                weights_TK = weights_TK / weights_TK.sum(-1, keepdim=True)
        return weights_TK, experts_TK, probs_TE, logits_TE

    @torch.no_grad()
    def update_bias(self, load_E: torch.Tensor) -> None:
        """Nudge under-loaded experts up and over-loaded ones down (the aux-loss-free update)."""
        load_E = load_E.float()
        self.expert_bias_E += self.cfg.bias_update_rate * torch.sign(load_E.mean() - load_E)


class MoE(nn.Module):
    """Routed SwiGLU experts (plus optional shared experts), dropless unless a capacity factor is set."""

    def __init__(self, cfg: ModelConfig, *, experts: ExpertShard | None = None,
                 tensor: TensorShard | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.shard = experts
        # tensor parallel: every expert's hidden width F split over the ranks (each runs its columns of
        # every expert; the partial outputs are summed on ``leave``); the router sees the full hidden state
        self.tp = tensor if tensor is not None and tensor.size > 1 else None
        self.router = Router(cfg)
        E, D, F_ = cfg.n_experts, cfg.dim, cfg.ffn_hidden
        self.w13_ED2F = nn.Parameter(torch.empty(E, D, 2 * F_))  # gate and up, side by side
        self.w2_EFD = nn.Parameter(torch.empty(E, F_, D))
        self.shared = SwiGLU(D, F_ * cfg.n_shared_experts, tensor=tensor) if cfg.n_shared_experts else None
        # under expert parallelism (x_AD, counts_E, compute, source_A) -> y_AD runs the experts on the ranks
        # holding them; None: every expert is local
        self.dispatch = experts.dispatch if experts is not None else None

    @torch.no_grad()
    def keep_local_experts(self) -> None:
        """Drop the experts other ranks hold. The owning model calls it once, after initializing every
        expert, so a sharded model starts from the same weights as the unsharded one."""
        if self.shard is None or self.w13_ED2F.shape[0] != self.cfg.n_experts:
            return
        local = self.cfg.n_experts // self.shard.size
        lo = self.shard.rank * local
        self.w13_ED2F = nn.Parameter(self.w13_ED2F[lo:lo + local].clone())
        self.w2_EFD = nn.Parameter(self.w2_EFD[lo:lo + local].clone())

    def keep_local_shards(self) -> None:
        """Keep this rank's columns of every expert under tensor parallelism (after ``keep_local_experts``)."""
        keep_local(self, EXPERTS_LAYOUT, self.tp)

    def compute_experts(self, x_AD: torch.Tensor, counts_E: torch.Tensor,
                        source_A: torch.Tensor | None = None) -> torch.Tensor:
        """This module's experts on their expert-sorted assignments: (A, D) -> (A, D)."""
        return expert_ffn(x_AD, self.w13_ED2F, self.w2_EFD, counts_E, source_A)

    def forward(self, x_BLD: torch.Tensor) -> tuple[torch.Tensor, MoEStats]:
        cfg = self.cfg
        x_in_TD = None  # the experts' input inside the tensor-parallel region
        if self.tp is not None and self.tp.sequence_parallel:
            # x_BLD is this rank's part of the sequence: gather it once, the router routes every token
            # (as in one process) on a replicated copy, the experts run this rank's columns on the other
            x_in_BLD, x_BLD = self.tp.gather_both(x_BLD)
            x_in_TD = x_in_BLD.reshape(-1, x_BLD.shape[-1])
        x_TD = x_BLD.reshape(-1, x_BLD.shape[-1])
        T, K, E = x_TD.shape[0], cfg.top_k, cfg.n_experts
        weights_TK, experts_TK, probs_TE, logits_TE = self.router(x_TD)

        expert_flat_A = experts_TK.reshape(-1)
        split = active()  # splitting gradients by source: each assignment's source (sent along under ep)
        if split is not None and cfg.capacity_factor is None:
            # each expert's rows grouped by source, so the backward's per-(source, expert) weight gradients are
            # contiguous slices of them (no gather); capacity dropping keeps the token order below
            src_A = split.src_T.repeat_interleave(K, output_size=T * K)
            order_A = (expert_flat_A * (split.S + 1) + src_A).argsort(stable=True)
        else:
            order_A = expert_flat_A.argsort(stable=True)  # stable: earlier tokens win capacity slots
        # index_add, not bincount: bincount reads the max back to the host on CUDA
        load_E = torch.zeros(E, dtype=torch.long, device=x_TD.device).index_add_(0, expert_flat_A, torch.ones_like(expert_flat_A))
        counts_E, dropped = load_E, load_E.new_zeros(())
        if cfg.capacity_factor is not None:
            capacity = math.ceil(cfg.capacity_factor * T * K / E)
            starts_E = load_E.cumsum(0) - load_E
            rank_A = torch.arange(T * K, device=x_TD.device) - starts_E[expert_flat_A[order_A]]
            order_A = order_A[rank_A < capacity]
            counts_E = load_E.clamp(max=capacity)
            dropped = (load_E - counts_E).sum()
        token_A = order_A // K

        dtype = _autocast_dtype(x_TD)
        # the experts' input crosses into the tensor-parallel region; the router's does not (it is replicated)
        if x_in_TD is None:
            x_in_TD = x_TD if self.tp is None else self.tp.enter(x_TD)
        x_AD = x_in_TD.index_select(0, token_A).to(dtype)  # backward: index_add, cheaper than index_put
        source_A = None if split is None else split.src_T.index_select(0, token_A)
        if self.dispatch is None:
            y_AD = self.compute_experts(x_AD, counts_E, source_A)
        else:
            y_AD = self.dispatch(x_AD, counts_E, self.compute_experts, source_A)
        if self.tp is not None:  # y_AD is this rank's partial sum: the weights' gradient is summed over the ranks
            weights_TK = self.tp.enter(weights_TK)
        y_AD = y_AD * weights_TK.reshape(-1)[order_A, None].to(y_AD.dtype)
        out_TD = y_AD.new_zeros(T, x_TD.shape[1]).index_add_(0, token_A, y_AD)
        if self.shared is not None:  # under tp its columns' partial sum joins the experts' before the one sum
            out_TD = out_TD + (self.shared(x_TD) if self.tp is None else self.shared.partial(x_in_TD))
        out_BLD = out_TD.view_as(x_BLD)
        if self.tp is not None:  # sum the ranks' partial outputs: (T, D), cheaper than (A, D)
            out_BLD = self.tp.close(out_BLD)  # sequence parallel: summed and cut to this rank's part of the sequence

        # Switch load balancing (https://arxiv.org/abs/2101.03961): E · Σ_e fraction_e · mean_prob_e
        fraction_E = load_E.float() / (T * K)
        aux_loss = E * (fraction_E * probs_TE.mean(0)).sum()
        # router z-loss (https://arxiv.org/abs/2202.08906) keeps the logits small
        z_loss = torch.logsumexp(logits_TE, dim=-1).pow(2).mean()
        stats = MoEStats(aux_loss, z_loss, load_E.detach().float(), dropped, experts_TK.detach())
        return out_BLD.to(x_BLD.dtype), stats
