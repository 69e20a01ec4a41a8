"""The model's shape and MoE options: one validated dataclass, mapped from ``[train.model]``."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

from winnow.train.errors import CheckpointError, ConfigError, checker

MAX_SEQ_LEN = 1 << 20  # positions a model may be built for: its rotary tables hold a row per position

_check = checker("train.model")


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    """Shape of the transformer and of its Mixture-of-Experts feed-forward blocks.

    The defaults are the tiny demo model (~3.5M total / ~1.1M active parameters) that trains
    on the demo shards in minutes on two CPU cores.
    """

    vocab_size: int = 258  # the tokenizer's; the embedding is padded up to a multiple of 64
    dim: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = None  # None: same as n_heads; fewer gives grouped-query attention
    max_seq_len: int = 2048
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    dropout: float = 0.0
    doc_mask: bool = False  # attention stays within a document of a packed sequence
    tie_embeddings: bool = False
    init_std: float = 0.02
    # feed-forward / MoE
    ffn_hidden: int = 256  # hidden width of each expert (and of dense blocks unless dense_hidden)
    dense_hidden: int | None = None
    n_experts: int = 8  # 0 or 1: every block is dense
    top_k: int = 2
    n_dense_layers: int = 0  # the first N blocks use a dense SwiGLU instead of experts
    n_shared_experts: int = 0  # always-on experts added to the routed output (DeepSeek-style)
    score_func: Literal["softmax", "sigmoid"] = "softmax"
    router_noise: float = 0.0  # std of Gaussian noise on router logits while training
    capacity_factor: float | None = None  # None: dropless; else tokens over capacity are dropped
    load_balance: Literal["aux_loss", "bias", "none"] = "aux_loss"  # "bias": aux-loss-free
    aux_loss_coef: float = 0.01
    z_loss_coef: float = 0.001
    bias_update_rate: float = 0.001

    def __post_init__(self) -> None:
        for key in ("vocab_size", "dim", "n_layers", "n_heads", "max_seq_len", "ffn_hidden"):
            value = getattr(self, key)
            _check(isinstance(value, int) and value > 0, key, value, "a positive integer")
        _check(
            self.max_seq_len <= MAX_SEQ_LEN,
            "max_seq_len",
            self.max_seq_len,
            f"at most {MAX_SEQ_LEN:,} (the rotary tables hold a row per position)",
        )
        _check(
            # inf and nan are named as what they are where [train] checks every number for them
            isinstance(self.rope_theta, int | float) and (not math.isfinite(self.rope_theta) or self.rope_theta > 0),
            "rope_theta",
            self.rope_theta,
            "a positive number (the rotary base, 10000 usually; 0 makes every rotation infinite and the loss NaN)",
        )
        _check(
            isinstance(self.norm_eps, int | float) and (not math.isfinite(self.norm_eps) or self.norm_eps > 0),
            "norm_eps",
            self.norm_eps,
            "a positive number (1e-5 usually; at 0 or below a norm divides by zero or by a negative root: every "
            "loss NaN, every step skipped)",
        )
        _check(self.dim % self.n_heads == 0, "dim", self.dim, f"a multiple of n_heads ({self.n_heads})")
        _check((self.dim // self.n_heads) % 2 == 0, "dim", self.dim, "dim // n_heads must be even (rotary)")
        kv = self.kv_heads
        _check(
            self.n_kv_heads != 0 and 0 < kv <= self.n_heads and self.n_heads % kv == 0,
            "n_kv_heads",
            self.n_kv_heads,
            f"a divisor of n_heads ({self.n_heads}) (leave the key out for as many as n_heads)",
        )
        _check(0.0 <= self.dropout < 1.0, "dropout", self.dropout, "0 <= dropout < 1")
        _check(self.n_experts >= 0, "n_experts", self.n_experts, ">= 0")
        if self.is_moe:
            _check(1 <= self.top_k <= self.n_experts, "top_k", self.top_k, f"1..n_experts ({self.n_experts})")
        _check(
            0 <= self.n_dense_layers <= self.n_layers,
            "n_dense_layers",
            self.n_dense_layers,
            f"0..n_layers ({self.n_layers})",
        )
        _check(self.n_shared_experts >= 0, "n_shared_experts", self.n_shared_experts, ">= 0")
        _check(self.score_func in ("softmax", "sigmoid"), "score_func", self.score_func, "'softmax' or 'sigmoid'")
        _check(
            self.load_balance in ("aux_loss", "bias", "none"),
            "load_balance",
            self.load_balance,
            "'aux_loss', 'bias' or 'none'",
        )
        _check(
            self.capacity_factor is None or self.capacity_factor > 0,
            "capacity_factor",
            self.capacity_factor,
            "None (dropless) or > 0",
        )
        for key in ("router_noise", "aux_loss_coef", "z_loss_coef", "bias_update_rate", "init_std"):
            _check(getattr(self, key) >= 0, key, getattr(self, key), ">= 0")
        _check(self.dense_hidden is None or self.dense_hidden > 0, "dense_hidden", self.dense_hidden, "None or > 0")

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 1

    @property
    def padded_vocab(self) -> int:
        return -(-self.vocab_size // 64) * 64

    def is_moe_layer(self, layer: int) -> bool:
        return self.is_moe and layer >= self.n_dense_layers

    @property
    def n_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.n_layers))

    def param_counts(self) -> tuple[int, int]:
        """(total, active) parameters, counted from the shapes; active counts k routed experts per token."""
        head = self.dim // self.n_heads
        attn = self.dim * head * (self.n_heads * 2 + self.kv_heads * 2)
        dense_ffn = 3 * self.dim * (self.dense_hidden or self.ffn_hidden)
        expert = 3 * self.dim * self.ffn_hidden
        embed = self.padded_vocab * self.dim * (1 if self.tie_embeddings else 2)
        total = active = embed + self.dim  # final norm
        for layer in range(self.n_layers):
            block = attn + 2 * self.dim
            if self.is_moe_layer(layer):
                shared = self.n_shared_experts * expert
                router = self.dim * self.n_experts
                total += block + router + shared + self.n_experts * expert
                active += block + router + shared + self.top_k * expert
            else:
                total += block + dense_ffn
                active += block + dense_ffn
        return total, active

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6·N_active (non-embedding matmuls plus the output head) + causal attention."""
        _, active = self.param_counts()
        non_embedding = active - self.padded_vocab * self.dim * (0 if self.tie_embeddings else 1)
        attention = 6 * self.n_layers * self.dim * seq_len  # QK^T and AV, forward+backward, halved by causality
        return 6.0 * non_embedding + attention


def saved_model_config(saved: object, where: str) -> ModelConfig:
    """The ``ModelConfig`` a checkpoint or an export recorded (``where`` names it): a ``CheckpointError`` saying what
    is wrong when the record is missing, is not a table, has keys this version lacks or values no model has."""
    if saved is None:
        raise CheckpointError(f"{where} records no model_config; export or start from another checkpoint of the run")
    if not isinstance(saved, dict):
        raise CheckpointError(
            f"{where}: its model_config is a {type(saved).__name__}, not a table of [train.model] keys; the checkpoint "
            "is damaged or not winnow's: use another checkpoint of the run (checkpoints/step-N)"
        )
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    if unknown := sorted(str(k) for k in saved if k not in known):
        raise CheckpointError(
            f"{where}: its model has keys this version of winnow does not know ({', '.join(unknown)}), so it "
            "cannot be built here; a newer winnow wrote it: use that version of winnow, or a later one"
        )
    try:
        return ModelConfig(**saved)
    except (ConfigError, TypeError, ValueError) as err:  # a value of the wrong type fails a comparison: TypeError
        raise CheckpointError(
            f"{where}: its model_config is not a model this version can build ({err}); the checkpoint is damaged or "
            "not winnow's: use another checkpoint of the run (checkpoints/step-N)"
        ) from None
