"""A concrete model shape for an active-parameter target, through ``ModelConfig`` so counts are exact.

Per block: attention 4·d² and a SwiGLU expert of width f = 8d/(3k) (so the k active experts
together have a dense block's 8·d²): active ≈ 12·L·d². The depth follows the width as in the
usual families (GPT-3, Llama: d/L between ~64 and ~128): L ≈ d/100. Heads are 64 wide below a
width of 1024 and 128 above, and wide models get head counts tensor parallelism can split (a
multiple of 4 from 2048, of 8 from 4096).
"""

from __future__ import annotations

from winnow.train.model import ModelConfig


def model_for(active_params: float, *, n_experts: int, top_k: int, vocab_size: int, seq_len: int) -> ModelConfig:
    """The shape whose active parameters (without embeddings) come closest to ``active_params``."""
    best: tuple[float, ModelConfig] | None = None
    for dim in [*range(64, 1024, 64), *range(1024, 2048, 128), *range(2048, 4096, 512), *range(4096, 32769, 1024)]:
        layers = max(2, round(dim / 100))
        head = 128 if dim >= 1024 else 64
        k = top_k if n_experts > 1 else 1
        ffn = max(16, round(8 * dim / (3 * k) / 16) * 16)
        cfg = ModelConfig(
            vocab_size=vocab_size,
            dim=dim,
            n_layers=layers,
            n_heads=dim // head,
            ffn_hidden=ffn,
            n_experts=n_experts if n_experts > 1 else 0,
            top_k=k,
            max_seq_len=seq_len,
        )
        active = non_embedding(cfg)[1]
        error = abs(active / active_params - 1)
        if best is None or error < best[0]:
            best = (error, cfg)
    assert best is not None
    return best[1]


def non_embedding(cfg: ModelConfig) -> tuple[int, int]:
    """(total, active) parameters without the embedding and output head."""
    total, active = cfg.param_counts()
    embed = cfg.padded_vocab * cfg.dim * (1 if cfg.tie_embeddings else 2)
    return total - embed, active - embed


def expert_params(cfg: ModelConfig) -> int:
    """Parameters in routed experts (the part expert parallelism splits)."""
    return cfg.n_moe_layers * cfg.n_experts * 3 * cfg.dim * cfg.ffn_hidden if cfg.is_moe else 0
