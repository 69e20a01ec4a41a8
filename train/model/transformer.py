"""The decoder-only transformer: embeddings, pre-norm blocks (attention + SwiGLU or MoE), output head.

Plain PyTorch: the parallelisms (tensor, sequence, expert, data, pipeline), activation
checkpointing and compilation are applied to a built model from outside
(``train.parallel.parallelize``), and extras such as attribution attach through hooks.
Shape legend in ``train.model``: B batch, L sequence length, D width, V (padded) vocabulary.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from winnow.train.model.config import ModelConfig
from winnow.train.model.layers import Attention, RMSNorm, Rotary, SwiGLU, document_mask
from winnow.train.model.moe import MoE, MoEStats, Router


@dataclass(slots=True)
class ModelOutput:
    """Logits plus the router's losses and per-layer statistics (MoE layers only, in layer order)."""

    logits_BLV: torch.Tensor
    router_loss: torch.Tensor  # weighted aux + z losses, to add to the training loss
    moe: list[MoEStats]


class Block(nn.Module):
    """One pre-norm transformer block; its feed-forward is dense or Mixture-of-Experts."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn = MoE(cfg) if cfg.is_moe_layer(layer) else SwiGLU(cfg.dim, cfg.dense_hidden or cfg.ffn_hidden)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x_BLD: torch.Tensor, mask_B1LL: torch.Tensor | None) -> tuple[torch.Tensor, MoEStats | None]:
        x_BLD = x_BLD + self.dropout(self.attn(self.attn_norm(x_BLD), mask_B1LL))
        if isinstance(self.ffn, MoE):
            out_BLD, stats = self.ffn(self.ffn_norm(x_BLD))
        else:
            out_BLD, stats = self.ffn(self.ffn_norm(x_BLD)), None
        return x_BLD + self.dropout(out_BLD), stats


def _copy_whole(_name: str, param: nn.Parameter, full: torch.Tensor) -> None:
    param.copy_(full)


class Transformer(nn.Module):
    """The language model. ``forward(tokens)`` returns a ``ModelOutput``; the loss is the trainer's business."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.padded_vocab, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.head = nn.Linear(cfg.dim, cfg.padded_vocab, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.embed.weight
        if not self.embed.weight.is_meta:  # built on the meta device, it is initialised once parallelized
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """``init_weights`` with a seed drawn from torch's global generator."""
        self.init_weights(int(torch.randint(2**62, ())))

    @torch.no_grad()
    def init_weights(self, seed: int, write: Callable[[str, nn.Parameter, torch.Tensor], None] | None = None) -> None:
        """GPT-2 style init: N(0, std), residual output projections scaled by 1/sqrt(2·layers), norm scales 1;
        and the buffers (rotary tables, routers' bias).

        Each parameter is drawn whole, on the CPU, from its own generator seeded by (``seed``, its name), so
        a model holding part of a parameter (or some of the layers) can take exactly that part of the
        one-process model's weights: ``write(name, param, full)`` copies the part ``param`` holds (default:
        all of it). One whole parameter at a time is all the memory this needs beyond the model's own.
        """
        if self.cfg.tie_embeddings and self.head.weight is not self.embed.weight:
            self.head.weight = self.embed.weight  # materialised from meta (to_empty), each module got its own tensor
        std, residual_std = self.cfg.init_std, self.cfg.init_std / math.sqrt(2 * self.cfg.n_layers)
        with torch.device("meta"):
            shapes = {name: p.shape for name, p in Transformer(self.cfg).named_parameters()}
        for name, param in self.named_parameters():
            full = torch.empty(shapes[name])
            if full.ndim < 2:
                full.fill_(1.0)
            else:
                digest = hashlib.sha256(f"{seed}/{name}".encode()).digest()
                scale = residual_std if name.endswith(("wo.weight", "w2.weight", "w2_EFD")) else std
                full.normal_(0.0, scale, generator=torch.Generator().manual_seed(int.from_bytes(digest[:8], "little")))
            (write or _copy_whole)(name, param, full)
        for module in self.modules():
            if isinstance(module, Rotary):
                module.reset_tables()
            elif isinstance(module, Router):
                module.expert_bias_E.zero_()

    def forward(self, tokens_BL: torch.Tensor, doc_ids_BL: torch.Tensor | None = None) -> ModelOutput:
        mask_B1LL = self.attention_mask(doc_ids_BL)
        x_BLD = self.embed(tokens_BL)
        moe_stats: list[MoEStats] = []
        for block in self.blocks:
            x_BLD, stats = block(x_BLD, mask_B1LL)
            if stats is not None:
                moe_stats.append(stats)
        return ModelOutput(self.head(self.norm(x_BLD)), self.router_loss(moe_stats, x_BLD), moe_stats)

    def attention_mask(self, doc_ids_BL: torch.Tensor | None) -> torch.Tensor | None:
        return document_mask(doc_ids_BL) if self.cfg.doc_mask and doc_ids_BL is not None else None

    def router_loss(self, moe_stats: list[MoEStats], like: torch.Tensor) -> torch.Tensor:
        """The weighted aux + z losses of ``moe_stats``, to add to the training loss."""
        cfg = self.cfg
        loss = like.new_zeros((), dtype=torch.float32)
        for stats in moe_stats:  # summed over layers, Switch-style
            if cfg.load_balance == "aux_loss":
                loss = loss + cfg.aux_loss_coef * stats.aux_loss
            loss = loss + cfg.z_loss_coef * stats.z_loss
        return loss

    def moe_layers(self) -> list[MoE]:
        """The MoE blocks this model holds (a pipeline stage's model holds some of its layers)."""
        return [block.ffn for block in self.blocks if block is not None and isinstance(block.ffn, MoE)]

    @torch.no_grad()
    def update_expert_bias(self, load_ME: torch.Tensor) -> None:
        """Aux-loss-free balancing: after an optimizer step, move each layer's bias by its step's load."""
        if self.cfg.load_balance != "bias":
            return
        moe_blocks = [block for i, block in enumerate(self.blocks) if self.cfg.is_moe_layer(i)]
        for block, load_E in zip(moe_blocks, load_ME, strict=True):  # rows: every MoE layer, held here or not
            if block is not None:
                block.ffn.router.update_bias(load_E)

    def num_params(self) -> tuple[int, int]:
        """(total, active) parameters this module holds (active: k of the routed experts per token)."""
        total = sum(p.numel() for p in self.parameters())
        routed = sum(m.experts.w13_ED2F.numel() + m.experts.w2_EFD.numel() for m in self.moe_layers())
        active = total - routed + routed * self.cfg.top_k // max(self.cfg.n_experts, 1)
        return total, active
