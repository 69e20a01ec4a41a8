"""The dense building blocks: RMSNorm, rotary embeddings, attention (SDPA) and the SwiGLU MLP.

Shape legend in ``train.model``: B batch, L sequence length, D width, H heads, G kv heads, C head width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from train.model.config import ModelConfig


class _RMSNormFunction(torch.autograd.Function):
    """RMSNorm with a hand-derived backward: 3 + 6 passes over the activations instead of autograd's ~15.

    With n = x·r, r = 1/sqrt(mean(x²) + eps), y = n·w and gn = g·w:
    dL/dw = Σ_rows g·n and dL/dx = r·(gn - n·mean(gn·n)).
    """

    @staticmethod
    def forward(ctx, x, weight, eps):
        dim = x.shape[-1]
        rstd = torch.rsqrt(torch.linalg.vector_norm(x, dim=-1, keepdim=True).square_().div_(dim).add_(eps))
        normed = x * rstd
        ctx.save_for_backward(normed, rstd, weight)
        return normed * weight

    @staticmethod
    def backward(ctx, grad):
        normed, rstd, weight = ctx.saved_tensors
        grad_w = (grad * normed).reshape(-1, normed.shape[-1]).sum(0)
        grad_n = grad * weight
        mean_dot = torch.linalg.vecdot(grad_n, normed, dim=-1).unsqueeze(-1).div_(normed.shape[-1])
        grad_x = torch.addcmul(grad_n, normed, mean_dot, value=-1).mul_(rstd)
        return grad_x, grad_w, None


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in fp32 whatever the autocast dtype (it is cheap and range-sensitive)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x_BLD: torch.Tensor) -> torch.Tensor:
        return _RMSNormFunction.apply(x_BLD.float(), self.weight.float(), self.eps).to(x_BLD.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    # half-split layout (GPT-NeoX / Llama): (x1, x2) -> (x1·cos - x2·sin, x2·cos + x1·sin), with the minus folded into sin
    x1, x2 = x.chunk(2, dim=-1)
    return torch.addcmul(x * cos, torch.cat((x2, x1), dim=-1), sin_signed)


class _Rotation(torch.autograd.Function):
    """The rotary rotation with its inverse as the backward: three kernels each way instead of autograd's dozen.

    A rotation's adjoint is the rotation by the opposite angle, so the gradient is the same
    function with the sine negated (nothing but the tables is saved for backward).
    """

    @staticmethod
    def forward(ctx, x, cos, sin_signed):
        ctx.save_for_backward(cos, sin_signed)
        return _rotate(x, cos, sin_signed)

    @staticmethod
    def backward(ctx, grad):
        cos, sin_signed = ctx.saved_tensors
        return _rotate(grad, cos, -sin_signed), None, None


class Rotary(nn.Module):
    """Rotary position embeddings (https://arxiv.org/abs/2104.09864), cos/sin tables cached as buffers."""

    def __init__(self, head_dim: int, max_seq_len: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv_freq)
        cos, sin = angles.cos(), angles.sin()
        # (L, 1, C): broadcast over the heads of a (B, L, H, C) tensor; non-persistent: derived from the
        # config, so checkpoints stay small and portable
        self.register_buffer("cos_L1C", torch.cat((cos, cos), -1).float()[:, None], persistent=False)
        self.register_buffer("sin_L1C", torch.cat((-sin, sin), -1).float()[:, None], persistent=False)

    def forward(self, x_BLHC: torch.Tensor) -> torch.Tensor:
        """Rotate queries or keys laid out (B, L, H, C), in fp32 whatever the autocast dtype."""
        seq = x_BLHC.shape[1]
        rotated = _Rotation.apply(x_BLHC.float(), self.cos_L1C[:seq], self.sin_L1C[:seq])
        return rotated.to(x_BLHC.dtype)


def document_mask(doc_ids_BL: torch.Tensor) -> torch.Tensor:
    """Boolean (B,1,L,L) mask: causal and within the same packed document (True = may attend)."""
    seq = doc_ids_BL.shape[1]
    causal_LL = torch.ones(seq, seq, dtype=torch.bool, device=doc_ids_BL.device).tril()
    same_doc_BLL = doc_ids_BL[:, :, None] == doc_ids_BL[:, None, :]
    return (same_doc_BLL & causal_LL)[:, None]


class Attention(nn.Module):
    """Causal multi-head (optionally grouped-query) attention through ``scaled_dot_product_attention``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv = cfg.n_heads, cfg.kv_heads
        self.head_dim = cfg.dim // cfg.n_heads
        self.wq = nn.Linear(cfg.dim, self.n_heads * self.head_dim, bias=False)
        self.wkv = nn.Linear(cfg.dim, 2 * self.n_kv * self.head_dim, bias=False)
        self.wo = nn.Linear(self.n_heads * self.head_dim, cfg.dim, bias=False)
        self.rotary = Rotary(self.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.dropout = cfg.dropout

    def forward(self, x_BLD: torch.Tensor, mask_B1LL: torch.Tensor | None) -> torch.Tensor:
        B, L, _ = x_BLD.shape
        # rotate in the (B, L, H, C) layout the projections produce: contiguous elementwise work
        q_BLHC = self.rotary(self.wq(x_BLD).view(B, L, self.n_heads, self.head_dim))
        k_BLGC, v_BLGC = self.wkv(x_BLD).view(B, L, 2, self.n_kv, self.head_dim).unbind(2)
        q_BHLC, k_BGLC, v_BGLC = q_BLHC.transpose(1, 2), self.rotary(k_BLGC).transpose(1, 2), v_BLGC.transpose(1, 2)
        if self.n_kv != self.n_heads:
            repeat = self.n_heads // self.n_kv
            k_BGLC, v_BGLC = k_BGLC.repeat_interleave(repeat, 1), v_BGLC.repeat_interleave(repeat, 1)
        out_BHLC = F.scaled_dot_product_attention(
            q_BHLC, k_BGLC, v_BGLC,
            attn_mask=mask_B1LL, is_causal=mask_B1LL is None,
            dropout_p=self.dropout if self.training else 0.0,
        )
        return self.wo(out_BHLC.transpose(1, 2).reshape(B, L, -1))


class SwiGLU(nn.Module):
    """The gated feed-forward block (https://arxiv.org/abs/2002.05202): w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w13 = nn.Linear(dim, 2 * hidden, bias=False)  # one matmul for gate and up
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x_TD: torch.Tensor) -> torch.Tensor:
        gate_TF, up_TF = self.w13(x_TD).chunk(2, dim=-1)
        return self.w2(F.silu(gate_TF) * up_TF)
