"""The dense building blocks: RMSNorm, rotary embeddings, attention (SDPA) and the SwiGLU MLP.

Shape legend in ``train.model``: B batch, L sequence length, D width, H heads, G kv heads, C head width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from train.model.config import ModelConfig


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in fp32 whatever the autocast dtype (it is cheap and range-sensitive)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x_BLD: torch.Tensor) -> torch.Tensor:
        x32 = x_BLD.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight.float()).to(x_BLD.dtype)


class Rotary(nn.Module):
    """Rotary position embeddings (https://arxiv.org/abs/2104.09864), cos/sin tables cached as buffers."""

    def __init__(self, head_dim: int, max_seq_len: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angles_LC = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv_freq)
        # non-persistent: derived from the config, so checkpoints stay small and portable
        self.register_buffer("cos_LC", angles_LC.cos().float(), persistent=False)
        self.register_buffer("sin_LC", angles_LC.sin().float(), persistent=False)

    def forward(self, x_BHLC: torch.Tensor) -> torch.Tensor:
        seq = x_BHLC.shape[-2]
        cos, sin = self.cos_LC[:seq], self.sin_LC[:seq]
        x1, x2 = x_BHLC.float().chunk(2, dim=-1)  # half-split layout (GPT-NeoX / Llama)
        rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        return rotated.to(x_BHLC.dtype)


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
        q_BHLC = self.wq(x_BLD).view(B, L, self.n_heads, self.head_dim).transpose(1, 2)
        k_BLGC, v_BLGC = self.wkv(x_BLD).view(B, L, 2, self.n_kv, self.head_dim).unbind(2)
        q_BHLC, k_BGLC = self.rotary(q_BHLC), self.rotary(k_BLGC.transpose(1, 2))
        v_BGLC = v_BLGC.transpose(1, 2)
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
