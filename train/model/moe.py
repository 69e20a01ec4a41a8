"""The Mixture-of-Experts feed-forward block: an fp32 router, batched experts, balancing losses.

Shape legend in ``train.model``: T tokens, D width, F expert hidden width, E experts,
K experts per token, A routed assignments (T·K, in expert-sorted order).

Tokens are sorted by expert so each expert's tokens are one contiguous slice, and all
experts run in one grouped matmul (``torch._grouped_mm``) or one padded ``bmm`` (see
``expert_ffn``) — no Python loop over experts. The experts are a module of their own
(``GroupedExperts``: rows in, rows out), the seam where expert parallelism moves the rows
to the ranks holding their experts (``train.parallel.expert_parallel``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn
from torch.overrides import wrap_torch_function

from winnow.train.model.config import ModelConfig
from winnow.train.model.layers import SwiGLU, swiglu


class MoEStats(NamedTuple):
    """What one MoE block reports per forward (returned, not stored, so activation checkpointing recomputes safely)."""

    aux_loss: torch.Tensor  # Switch load-balancing loss, unweighted (1.0 = perfectly balanced)
    z_loss: torch.Tensor  # mean squared log-partition of the router logits, unweighted
    load_E: torch.Tensor  # assignments routed to each expert (before capacity dropping), detached
    dropped: torch.Tensor  # assignments dropped for capacity (0 when dropless)
    experts_TK: torch.Tensor  # chosen experts per token, detached (per-source routing histograms)


class Assignment(NamedTuple):
    """Which token each expert-sorted row is (``MoE.assign``)."""

    order_A: torch.Tensor  # index into the flat (T·K) choices of each row
    token_A: torch.Tensor  # the token of each row (order_A // K)
    counts_E: torch.Tensor  # rows per expert, after capacity dropping
    load_E: torch.Tensor  # choices per expert, before it
    dropped: torch.Tensor  # choices dropped for capacity


def _autocast_dtype(x: torch.Tensor) -> torch.dtype:
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def _grouped_mm_ok(x: torch.Tensor, w: torch.Tensor) -> bool:
    # The kernel needs 16-byte aligned row strides; on CUDA also Hopper+ and bf16.
    if (
        not hasattr(torch, "_grouped_mm")
        or (x.shape[-1] * x.element_size()) % 16
        or (w.shape[-1] * w.element_size()) % 16
    ):
        return False
    if torch.compiler.is_compiling() and x.dtype != torch.bfloat16:  # traced, the kernel takes bf16 only
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


def expert_mm(x_AI: torch.Tensor, w_EIO: torch.Tensor, counts_E: torch.Tensor) -> torch.Tensor:
    """One matmul per expert on its slice of the expert-sorted rows: (A, I) -> (A, O), the kernel as below."""
    w_EIO = w_EIO.to(x_AI.dtype)
    if _grouped_mm_ok(x_AI, w_EIO):
        return torch._grouped_mm(x_AI, w_EIO, offs=counts_E.cumsum(0).to(torch.int32))
    capacity = _padded_capacity(counts_E)
    rows_A = _padded_rows(counts_E, capacity, x_AI.shape[0])
    x_ECI = x_AI.new_zeros(w_EIO.shape[0] * capacity, x_AI.shape[1]).index_copy(0, rows_A, x_AI)
    y_ECO = torch.bmm(x_ECI.view(w_EIO.shape[0], capacity, -1), w_EIO)
    return y_ECO.view(-1, w_EIO.shape[2]).index_select(0, rows_A)


# overridable by a torch function mode (the attribution's per-source split, train/attribution/hooks.py)
@wrap_torch_function(lambda x_AD, w13_ED2F, w2_EFD, counts_E: (x_AD, w13_ED2F, w2_EFD))
def expert_ffn(
    x_AD: torch.Tensor, w13_ED2F: torch.Tensor, w2_EFD: torch.Tensor, counts_E: torch.Tensor
) -> torch.Tensor:
    """Each expert's SwiGLU on its contiguous slice of the expert-sorted rows: (A, D) -> (A, D).

    The one place that chooses the kernel. ``torch._grouped_mm`` runs all experts in one call
    on the compact rows wherever this torch offers it for the device and dtype (CPU; CUDA:
    Hopper, bf16). Elsewhere the slices are padded to one length and run as one ``bmm``.
    On CPU the two kernels cost the same CPU time per row (1 thread, 8 experts x 512 rows,
    256 -> 1024, forward and backward), so the compact kernel wins by the padding it avoids —
    up to ~1.9x the rows with a fresh router's uneven load.
    """
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


class GroupedExperts(nn.Module):
    """E SwiGLU experts as two stacked weights: rows grouped by expert in, their outputs out."""

    def __init__(self, dim: int, hidden: int, n_experts: int) -> None:
        super().__init__()
        self.w13_ED2F = nn.Parameter(torch.empty(n_experts, dim, 2 * hidden))  # gate and up, side by side
        self.w2_EFD = nn.Parameter(torch.empty(n_experts, hidden, dim))

    def forward(self, x_AD: torch.Tensor, counts_E: torch.Tensor) -> torch.Tensor:
        """``counts_E[e]`` consecutive rows of ``x_AD`` for each expert e this module holds: (A, D) -> (A, D)."""
        return expert_ffn(x_AD, self.w13_ED2F, self.w2_EFD, counts_E)


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
            logits_TE = self.gate(x_TD.float())
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

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        # registered first: the parameters keep their order (experts, router, shared) in optimizers and checkpoints
        self.experts = GroupedExperts(cfg.dim, cfg.ffn_hidden, cfg.n_experts)
        self.router = Router(cfg)
        self.shared = SwiGLU(cfg.dim, cfg.ffn_hidden * cfg.n_shared_experts) if cfg.n_shared_experts else None

    def assign(self, experts_TK: torch.Tensor) -> Assignment:
        """The expert-sorted rows of a step's choices: stable, so earlier tokens win capacity slots."""
        cfg = self.cfg
        T, K, E = experts_TK.shape[0], cfg.top_k, cfg.n_experts
        expert_flat_A = experts_TK.reshape(-1)
        order_A = expert_flat_A.argsort(stable=True)
        # index_add, not bincount: bincount reads the max back to the host on CUDA
        load_E = torch.zeros(E, dtype=torch.long, device=experts_TK.device).index_add_(
            0, expert_flat_A, torch.ones_like(expert_flat_A)
        )
        counts_E, dropped = load_E, load_E.new_zeros(())
        if cfg.capacity_factor is not None:
            capacity = math.ceil(cfg.capacity_factor * T * K / E)
            starts_E = load_E.cumsum(0) - load_E
            rank_A = torch.arange(T * K, device=experts_TK.device) - starts_E[expert_flat_A[order_A]]
            order_A = order_A[rank_A < capacity]
            counts_E = load_E.clamp(max=capacity)
            dropped = (load_E - counts_E).sum()
        return Assignment(order_A, order_A // K, counts_E, load_E, dropped)

    def forward(self, x_BLD: torch.Tensor) -> tuple[torch.Tensor, MoEStats]:
        cfg = self.cfg
        x_TD = x_BLD.reshape(-1, x_BLD.shape[-1])
        T, K, E = x_TD.shape[0], cfg.top_k, cfg.n_experts
        weights_TK, experts_TK, probs_TE, logits_TE = self.router(x_TD)
        order_A, token_A, counts_E, load_E, dropped = self.assign(experts_TK)
        x_AD = x_TD.index_select(0, token_A).to(_autocast_dtype(x_TD))  # backward: index_add, cheaper than index_put
        y_AD = self.experts(x_AD, counts_E)
        y_AD = y_AD * weights_TK.reshape(-1)[order_A, None].to(y_AD.dtype)
        out_TD = y_AD.new_zeros(T, x_TD.shape[1]).index_add_(0, token_A, y_AD)
        if self.shared is not None:
            out_TD = out_TD + self.shared(x_TD)

        # Switch load balancing (https://arxiv.org/abs/2101.03961): E · Σ_e fraction_e · mean_prob_e
        fraction_E = load_E.float() / (T * K)
        aux_loss = E * (fraction_E * probs_TE.mean(0)).sum()
        # router z-loss (https://arxiv.org/abs/2202.08906) keeps the logits small
        z_loss = torch.logsumexp(logits_TE, dim=-1).pow(2).mean()
        stats = MoEStats(aux_loss, z_loss, load_E.detach().float(), dropped, experts_TK.detach())
        return out_TD.view_as(x_BLD).to(x_BLD.dtype), stats
