"""The dense building blocks: RMSNorm, rotary embeddings, attention (SDPA) and the SwiGLU MLP.

Shape legend in ``train.model``: B batch, L sequence length, D width, H heads, G kv heads, C head width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from train.model.config import ModelConfig
from train.model.split import norm_weight_parts, project, tracking
from train.model.tensor_shard import ATTENTION_LAYOUT, SWIGLU_LAYOUT, TensorShard, keep_local


class _RMSNormFunction(torch.autograd.Function):
    """RMSNorm with a hand-derived backward: 3 + 6 passes over the activations instead of autograd's ~15.

    With n = x·r, r = 1/sqrt(mean(x²) + eps), y = n·w and gn = g·w:
    dL/dw = Σ_rows g·n and dL/dx = r·(gn - n·mean(gn·n)).
    """

    @staticmethod
    def forward(ctx, x, weight, eps, split=None, key=0):
        ctx.split, ctx.key = split, key  # a GradSplit: the scale's gradient per source (train.model.split)
        dim = x.shape[-1]
        rstd = torch.rsqrt(torch.linalg.vector_norm(x, dim=-1, keepdim=True).square_().div_(dim).add_(eps))
        normed = x * rstd
        ctx.save_for_backward(normed, rstd, weight)
        return normed * weight

    @staticmethod
    def backward(ctx, grad):
        normed, rstd, weight = ctx.saved_tensors
        rows = (grad * normed).reshape(-1, normed.shape[-1])
        grad_w = rows.sum(0) if ctx.split is None else norm_weight_parts(ctx.split, ctx.key, rows)
        grad_n = grad * weight
        mean_dot = torch.linalg.vecdot(grad_n, normed, dim=-1).unsqueeze(-1).div_(normed.shape[-1])
        grad_x = torch.addcmul(grad_n, normed, mean_dot, value=-1).mul_(rstd)
        return grad_x, grad_w, None, None, None


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in fp32 whatever the autocast dtype (it is cheap and range-sensitive)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x_BLD: torch.Tensor) -> torch.Tensor:
        split = tracking(self.weight)
        return _RMSNormFunction.apply(x_BLD.float(), self.weight.float(), self.eps, split, id(self.weight)).to(x_BLD.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, inverse: bool) -> torch.Tensor:
    """Rotate each (x1, x2) pair of the half-split layout (GPT-NeoX / Llama) by +angle, or by -angle if ``inverse``.

    Written into the two halves of one output buffer: each product broadcasts the (L, 1, R)
    tables once, where ``torch.cat((x2, x1))`` plus full-width products cost ~10x the time.
    """
    x1, x2 = x.chunk(2, dim=-1)
    out = torch.empty_like(x)
    out1, out2 = out.chunk(2, dim=-1)
    sign = -1 if inverse else 1
    torch.mul(x1, cos, out=out1).addcmul_(x2, sin, value=-sign)  # x1·cos - x2·sin
    torch.mul(x2, cos, out=out2).addcmul_(x1, sin, value=sign)  # x2·cos + x1·sin
    return out


class _Rotation(torch.autograd.Function):
    """The rotary rotation with its inverse as the backward (nothing but the tables is saved).

    A rotation's adjoint is the rotation by the opposite angle, so the gradient is the same
    function with the sine negated.
    """

    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rotate(x, cos, sin, inverse=False)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return _rotate(grad, cos, sin, inverse=True), None, None


class Rotary(nn.Module):
    """Rotary position embeddings (https://arxiv.org/abs/2104.09864), cos/sin tables cached as buffers.

    R below is the number of rotated pairs per head (C // 2).
    """

    def __init__(self, head_dim: int, max_seq_len: int, theta: float) -> None:
        super().__init__()
        inv_freq_R = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angles_LR = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv_freq_R)
        # (L, 1, R): broadcast over the heads of a (B, L, H, C) tensor's halves; non-persistent: derived
        # from the config, so checkpoints stay small and portable
        self.register_buffer("cos_L1R", angles_LR.cos().float()[:, None], persistent=False)
        self.register_buffer("sin_L1R", angles_LR.sin().float()[:, None], persistent=False)

    def forward(self, x_BLHC: torch.Tensor) -> torch.Tensor:
        """Rotate queries or keys laid out (B, L, H, C), in fp32 whatever the autocast dtype."""
        seq = x_BLHC.shape[1]
        rotated = _Rotation.apply(x_BLHC.float(), self.cos_L1R[:seq], self.sin_L1R[:seq])
        return rotated.to(x_BLHC.dtype)


def document_mask(doc_ids_BL: torch.Tensor) -> torch.Tensor:
    """Boolean (B,1,L,L) mask: causal and within the same packed document (True = may attend)."""
    seq = doc_ids_BL.shape[1]
    causal_LL = torch.ones(seq, seq, dtype=torch.bool, device=doc_ids_BL.device).tril()
    same_doc_BLL = doc_ids_BL[:, :, None] == doc_ids_BL[:, None, :]
    return (same_doc_BLL & causal_LL)[:, None]


class Attention(nn.Module):
    """Causal multi-head (optionally grouped-query) attention through ``scaled_dot_product_attention``.

    Under tensor parallelism (``tensor``) this rank runs H / size query heads and G / size kv heads:
    the weights are built whole (so initialization matches the unsplit model) and cut to this rank's
    heads by ``keep_local_shards``.
    """

    def __init__(self, cfg: ModelConfig, *, tensor: TensorShard | None = None) -> None:
        super().__init__()
        self.tp = tensor if tensor is not None and tensor.size > 1 else None
        split = self.tp.size if self.tp else 1
        self.head_dim = cfg.dim // cfg.n_heads
        self.n_heads, self.n_kv = cfg.n_heads // split, cfg.kv_heads // split  # this rank's heads
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * self.head_dim, bias=False)
        self.wkv = nn.Linear(cfg.dim, 2 * cfg.kv_heads * self.head_dim, bias=False)  # [k heads | v heads]
        self.wo = nn.Linear(cfg.n_heads * self.head_dim, cfg.dim, bias=False)
        self.rotary = Rotary(self.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.dropout = cfg.dropout

    def keep_local_shards(self) -> None:
        keep_local(self, ATTENTION_LAYOUT, self.tp)

    def forward(self, x_BLD: torch.Tensor, mask_B1LL: torch.Tensor | None) -> torch.Tensor:
        if self.tp is not None:  # under sequence parallelism this gathers the whole sequence
            x_BLD = self.tp.open(x_BLD)
        B, L, _ = x_BLD.shape
        # rotate in the (B, L, H, C) layout the projections produce: contiguous elementwise work
        q_BLHC = self.rotary(project(self.wq, x_BLD).view(B, L, self.n_heads, self.head_dim))
        k_BLGC, v_BLGC = project(self.wkv, x_BLD).view(B, L, 2, self.n_kv, self.head_dim).unbind(2)
        q_BHLC, k_BGLC, v_BGLC = q_BLHC.transpose(1, 2), self.rotary(k_BLGC).transpose(1, 2), v_BLGC.transpose(1, 2)
        if self.n_kv != self.n_heads:
            repeat = self.n_heads // self.n_kv
            k_BGLC, v_BGLC = k_BGLC.repeat_interleave(repeat, 1), v_BGLC.repeat_interleave(repeat, 1)
        out_BHLC = F.scaled_dot_product_attention(
            q_BHLC, k_BGLC, v_BGLC,
            attn_mask=mask_B1LL, is_causal=mask_B1LL is None,
            dropout_p=self.dropout if self.training else 0.0,
        )
        out_BLD = project(self.wo, out_BHLC.transpose(1, 2).reshape(B, L, -1))
        return out_BLD if self.tp is None else self.tp.close(out_BLD)


class _SwiGLUActivation(torch.autograd.Function):
    """silu(gate)·up over the two halves of one projection, with both halves' gradients written into one buffer.

    Autograd's version would build the gradient of ``chunk`` with a ``cat`` of the two halves:
    a full extra copy of the widest activation in the block.
    """

    @staticmethod
    def forward(ctx, h):
        ctx.save_for_backward(h)
        gate, up = h.chunk(2, dim=-1)
        return F.silu(gate).mul_(up)

    @staticmethod
    def backward(ctx, grad):
        (h,) = ctx.saved_tensors
        gate, up = h.chunk(2, dim=-1)
        grad_h = torch.empty_like(h)
        grad_gate, grad_up = grad_h.chunk(2, dim=-1)
        torch.ops.aten.silu_backward.grad_input(grad * up, gate, grad_input=grad_gate)
        torch.mul(F.silu(gate), grad, out=grad_up)
        return grad_h


def swiglu(h_2F: torch.Tensor) -> torch.Tensor:
    """The SwiGLU activation of a fused gate-and-up projection (gate first): (..., 2F) -> (..., F)."""
    return _SwiGLUActivation.apply(h_2F)


class SwiGLU(nn.Module):
    """The gated feed-forward block (https://arxiv.org/abs/2002.05202): w2(silu(w1 x) * w3 x).

    Under tensor parallelism each rank keeps hidden / size columns of the gate and the up projection
    and the matching rows of w2 (``keep_local_shards``); the partial outputs are summed on ``leave``.
    """

    def __init__(self, dim: int, hidden: int, *, tensor: TensorShard | None = None) -> None:
        super().__init__()
        self.tp = tensor if tensor is not None and tensor.size > 1 else None
        self.w13 = nn.Linear(dim, 2 * hidden, bias=False)  # one matmul for gate and up: [gate | up]
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def keep_local_shards(self) -> None:
        keep_local(self, SWIGLU_LAYOUT, self.tp)

    def forward(self, x_TD: torch.Tensor) -> torch.Tensor:
        if self.tp is None:
            return self.partial(x_TD)
        return self.tp.close(self.partial(self.tp.open(x_TD)))

    def partial(self, x_TD: torch.Tensor) -> torch.Tensor:
        """This rank's columns of the block on an input already inside the split region: a partial sum under tp."""
        return project(self.w2, swiglu(project(self.w13, x_TD)))
