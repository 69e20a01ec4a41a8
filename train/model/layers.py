"""The dense building blocks: RMSNorm, rotary embeddings, attention (SDPA) and the SwiGLU MLP.

Shape legend in ``train.model``: B batch, L sequence length, D width, H heads, G kv heads, C head width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import wrap_torch_function

from winnow.train.model.config import ModelConfig


def rms_norm_forward(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x·r, r) with r = 1/sqrt(mean(x²) + eps) over the last dimension."""
    rstd = torch.rsqrt(torch.linalg.vector_norm(x, dim=-1, keepdim=True).square_().div_(x.shape[-1]).add_(eps))
    return x * rstd, rstd


def rms_norm_input_grad(
    grad: torch.Tensor, normed: torch.Tensor, rstd: torch.Tensor, weight: torch.Tensor
) -> torch.Tensor:
    """dL/dx = r·(gn - n·mean(gn·n)) with gn = g·w (see ``_RMSNormFunction``)."""
    grad_n = grad * weight
    mean_dot = torch.linalg.vecdot(grad_n, normed, dim=-1).unsqueeze(-1).div_(normed.shape[-1])
    return torch.addcmul(grad_n, normed, mean_dot, value=-1).mul_(rstd)


class _RMSNormFunction(torch.autograd.Function):
    """RMSNorm with a hand-derived backward: 3 + 6 passes over the activations instead of autograd's ~15.

    With n = x·r, r = 1/sqrt(mean(x²) + eps), y = n·w and gn = g·w:
    dL/dw = Σ_rows g·n and dL/dx = r·(gn - n·mean(gn·n)).
    """

    @staticmethod
    def forward(ctx, x, weight, eps):
        normed, rstd = rms_norm_forward(x, eps)
        ctx.save_for_backward(normed, rstd, weight)
        return normed * weight

    @staticmethod
    def backward(ctx, grad):
        normed, rstd, weight = ctx.saved_tensors
        grad_w = (grad * normed).reshape(-1, normed.shape[-1]).sum(0)
        return rms_norm_input_grad(grad, normed, rstd, weight), grad_w, None


# overridable by a torch function mode (the attribution's per-source split, train/attribution/hooks.py)
@wrap_torch_function(lambda x, weight, eps: (x, weight))
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of ``x`` scaled by ``weight``, in fp32 whatever the autocast dtype, returned in ``x``'s dtype."""
    return _RMSNormFunction.apply(x.float(), weight.float(), eps).to(x.dtype)


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in fp32 whatever the autocast dtype (it is cheap and range-sensitive)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x_BLD: torch.Tensor) -> torch.Tensor:
        return rms_norm(x_BLD, self.weight, self.eps)


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
        self.head_dim, self.max_seq_len, self.theta = head_dim, max_seq_len, theta
        # (L, 1, R): broadcast over the heads of a (B, L, H, C) tensor's halves; non-persistent: derived
        # from the config, so checkpoints stay small and portable
        self.register_buffer("cos_L1R", torch.empty(max_seq_len, 1, head_dim // 2), persistent=False)
        self.register_buffer("sin_L1R", torch.empty(max_seq_len, 1, head_dim // 2), persistent=False)
        self.reset_tables()

    @torch.no_grad()
    def reset_tables(self) -> None:
        """Compute the tables (in float64, stored fp32) where the buffers are: at construction, and after
        a model built on the meta device is given memory."""
        if self.cos_L1R.is_meta:
            return
        inv_freq_R = 1.0 / self.theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim)
        angles_LR = torch.outer(torch.arange(self.max_seq_len, dtype=torch.float64), inv_freq_R)
        self.cos_L1R.copy_(angles_LR.cos()[:, None])
        self.sin_L1R.copy_(angles_LR.sin()[:, None])

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

    The head counts come from the projections' shapes, so the module runs whatever heads its
    weights hold (all of them, or a tensor-parallel rank's share: ``train.parallel.tensor_parallel``).
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.head_dim = cfg.dim // cfg.n_heads
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * self.head_dim, bias=False)
        self.wkv = nn.Linear(cfg.dim, 2 * cfg.kv_heads * self.head_dim, bias=False)  # [k heads | v heads]
        self.wo = nn.Linear(cfg.n_heads * self.head_dim, cfg.dim, bias=False)
        self.rotary = Rotary(self.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.dropout = cfg.dropout

    def forward(self, x_BLD: torch.Tensor, mask_B1LL: torch.Tensor | None) -> torch.Tensor:
        B, L, _ = x_BLD.shape
        C = self.head_dim
        # rotate in the (B, L, H, C) layout the projections produce: contiguous elementwise work
        q_BLHC = self.rotary(self.wq(x_BLD).view(B, L, -1, C))
        k_BLGC, v_BLGC = self.wkv(x_BLD).view(B, L, 2, -1, C).unbind(2)
        q_BHLC, k_BGLC, v_BGLC = q_BLHC.transpose(1, 2), self.rotary(k_BLGC).transpose(1, 2), v_BLGC.transpose(1, 2)
        if k_BGLC.shape[1] != q_BHLC.shape[1]:
            repeat = q_BHLC.shape[1] // k_BGLC.shape[1]
            k_BGLC, v_BGLC = k_BGLC.repeat_interleave(repeat, 1), v_BGLC.repeat_interleave(repeat, 1)
        out_BHLC = F.scaled_dot_product_attention(
            q_BHLC,
            k_BGLC,
            v_BGLC,
            attn_mask=mask_B1LL,
            is_causal=mask_B1LL is None,
            dropout_p=self.dropout if self.training else 0.0,
        )
        return self.wo(out_BHLC.transpose(1, 2).reshape(B, L, -1))


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
    """The gated feed-forward block (https://arxiv.org/abs/2002.05202): w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w13 = nn.Linear(dim, 2 * hidden, bias=False)  # one matmul for gate and up: [gate | up]
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x_TD: torch.Tensor) -> torch.Tensor:
        return self.w2(swiglu(self.w13(x_TD)))
