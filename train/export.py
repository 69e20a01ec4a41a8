"""A trained model out of its run: one safetensors file, and a Hugging Face Mixtral folder where the config maps.

``winnow-model.safetensors`` holds the one-process model's state under winnow's own parameter
names, with the model config, step and sources in the file's metadata; ``load_exported`` builds
the ``Transformer`` back from it alone. ``hf/`` holds a ``config.json`` (``MixtralForCausalLM``)
and ``model.safetensors`` in the layout Mixtral checkpoints on the Hub use
(``block_sparse_moe.experts.N.w1``), which ``transformers`` v4 loads as is and v5 converts on load.

The mapping is exact, not approximate: winnow's attention is Llama's (half-split rotary, SDPA's
1/sqrt(C) scale, grouped-query heads), its RMSNorm and SwiGLU experts are Mixtral's, and its
softmax router with renormalized top-k weights is Mixtral's router. A dense model (``n_experts``
0 or 1) becomes a Mixtral with one expert whose router always gives it weight 1. Features
Mixtral lacks are listed by ``hf_blockers`` with the config key that brings them in; the
safetensors file is written either way. The vocabulary stays winnow's padded one (logits over the
padding rows are what winnow computes too). ``doc_mask`` only matters for packed sequences of
several documents; for one document per sequence the logits are the same.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from train.checkpoint import renamed
from train.errors import CheckpointError
from train.model import ModelConfig, Transformer

WINNOW_FILE = "winnow-model.safetensors"
HF_DIR = "hf"


def hf_blockers(cfg: ModelConfig) -> list[str]:
    """Why ``cfg`` has no exact Mixtral equivalent, one line per config key (empty: it maps)."""
    out = []
    if cfg.is_moe and cfg.n_dense_layers:
        out.append(f"train.model.n_dense_layers = {cfg.n_dense_layers}: Mixtral has experts in every layer")
    if cfg.is_moe and cfg.n_shared_experts:
        out.append(f"train.model.n_shared_experts = {cfg.n_shared_experts}: Mixtral has no shared experts")
    if cfg.is_moe and cfg.score_func != "softmax":
        out.append(f"train.model.score_func = {cfg.score_func!r}: Mixtral's router is a softmax")
    if cfg.is_moe and cfg.load_balance == "bias":
        out.append("train.model.load_balance = 'bias': Mixtral's router has no expert-selection bias")
    if cfg.is_moe and cfg.capacity_factor is not None:
        out.append(f"train.model.capacity_factor = {cfg.capacity_factor}: Mixtral is dropless, winnow drops "
                   "tokens over capacity at inference too")
    if cfg.is_moe and cfg.top_k == 1:
        out.append("train.model.top_k = 1: Mixtral renormalizes the top-k weights, so one expert gets weight 1 "
                   "where winnow keeps its softmax probability")
    return out


def mixtral_config(cfg: ModelConfig) -> dict:
    """``config.json`` of the equivalent ``MixtralForCausalLM`` (call only when ``hf_blockers`` is empty)."""
    experts, top_k = (cfg.n_experts, cfg.top_k) if cfg.is_moe else (1, 1)
    hidden = cfg.ffn_hidden if cfg.is_moe else cfg.dense_hidden or cfg.ffn_hidden
    return {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
            "vocab_size": cfg.padded_vocab, "hidden_size": cfg.dim, "intermediate_size": hidden,
            "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
            "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.dim // cfg.n_heads, "hidden_act": "silu",
            "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.norm_eps,
            # both spellings: transformers v4 reads rope_theta, v5 rope_parameters
            "rope_theta": cfg.rope_theta, "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
            "num_local_experts": experts, "num_experts_per_tok": top_k, "router_aux_loss_coef": cfg.aux_loss_coef,
            "router_jitter_noise": 0.0, "output_router_logits": False, "sliding_window": None,
            "attention_dropout": 0.0, "tie_word_embeddings": cfg.tie_embeddings, "torch_dtype": "float32",
            "initializer_range": cfg.init_std, "use_cache": True}


def mixtral_state(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """winnow's one-process state dict renamed and reshaped into Mixtral's Hub layout."""
    kv = cfg.kv_heads * (cfg.dim // cfg.n_heads)  # rows of the key (and of the value) projection
    out = {"model.embed_tokens.weight": state["embed.weight"], "model.norm.weight": state["norm.weight"]}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = state["head.weight"]
    for i in range(cfg.n_layers):
        src, dst = f"blocks.{i}.", f"model.layers.{i}."
        wkv = state[src + "attn.wkv.weight"]  # (2·G·C, D): keys first, then values
        out |= {dst + "input_layernorm.weight": state[src + "attn_norm.weight"],
                dst + "post_attention_layernorm.weight": state[src + "ffn_norm.weight"],
                dst + "self_attn.q_proj.weight": state[src + "attn.wq.weight"],
                dst + "self_attn.k_proj.weight": wkv[:kv], dst + "self_attn.v_proj.weight": wkv[kv:],
                dst + "self_attn.o_proj.weight": state[src + "attn.wo.weight"]}
        moe = dst + "block_sparse_moe."
        if cfg.is_moe:
            out[moe + "gate.weight"] = state[src + "ffn.router.gate.weight"]
            w13_ED2F, w2_EFD = state[src + "ffn.experts.w13_ED2F"], state[src + "ffn.experts.w2_EFD"]
            F_ = cfg.ffn_hidden
            for e in range(cfg.n_experts):  # nn.Linear weights are (out, in): the transposes of x @ W
                out[f"{moe}experts.{e}.w1.weight"] = w13_ED2F[e, :, :F_].T
                out[f"{moe}experts.{e}.w3.weight"] = w13_ED2F[e, :, F_:].T
                out[f"{moe}experts.{e}.w2.weight"] = w2_EFD[e].T
        else:  # one expert, always chosen with weight softmax([0]) = 1
            w13 = state[src + "ffn.w13.weight"]  # (2F, D), gate rows first
            F_ = w13.shape[0] // 2
            out[moe + "gate.weight"] = torch.zeros(1, cfg.dim, dtype=w13.dtype)
            out[moe + "experts.0.w1.weight"], out[moe + "experts.0.w3.weight"] = w13[:F_], w13[F_:]
            out[moe + "experts.0.w2.weight"] = state[src + "ffn.w2.weight"]
    return {k: v.detach().contiguous() for k, v in out.items()}


def _winnow_tensors(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # safetensors holds no shared storage: a tied head is the embedding, re-tied by the model on load
    return {k: v.detach().contiguous() for k, v in state.items() if not (cfg.tie_embeddings and k == "head.weight")}


def export_model(state: dict, out_dir: str | Path, *, step: int | None = None,
                 sources: list[str] | None = None) -> dict:
    """Write ``out_dir/winnow-model.safetensors`` and, when the config maps, ``out_dir/hf/``.

    ``state`` is a checkpoint's (``model`` and ``model_config`` at least). Returns what was
    written: ``{"winnow": path, "hf": path or None, "hf_blockers": [...]}``.
    """
    import safetensors.torch as st  # the train extra's; imported by the commands that write files only

    if "model" not in state or "model_config" not in state:
        raise CheckpointError("the checkpoint holds no model or model_config to export")
    cfg = ModelConfig(**state["model_config"])
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {"format": "winnow", "model_config": json.dumps(dataclasses.asdict(cfg)),
            "step": str(step if step is not None else -1), "sources": json.dumps(list(sources or []))}
    winnow_path = out_dir / WINNOW_FILE
    st.save_file(_winnow_tensors(cfg, state["model"]), str(winnow_path), metadata=meta)
    blockers = hf_blockers(cfg)
    hf_path = None
    if not blockers:
        hf_path = out_dir / HF_DIR
        hf_path.mkdir(exist_ok=True)
        (hf_path / "config.json").write_text(json.dumps(mixtral_config(cfg), indent=2) + "\n")
        st.save_file(mixtral_state(cfg, state["model"]), str(hf_path / "model.safetensors"), metadata={"format": "pt"})
    return {"winnow": str(winnow_path), "hf": str(hf_path) if hf_path else None, "hf_blockers": blockers}


def load_exported(path: str | Path) -> tuple[Transformer, dict]:
    """The model in a ``winnow-model.safetensors`` file (eval mode), and the file's metadata."""
    import safetensors.torch as st
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata() or {})
    if meta.get("format") != "winnow" or "model_config" not in meta:
        raise CheckpointError(f"{path}: not a winnow export (no winnow model_config in its metadata); "
                              "write one with `winnow export RUN`")
    cfg = ModelConfig(**json.loads(meta["model_config"]))
    state = renamed(st.load_file(str(path)))  # an earlier version's export: its expert names as today's
    if cfg.tie_embeddings:
        state["head.weight"] = state["embed.weight"]
    model = Transformer(cfg)
    model.load_state_dict(state)
    return model.eval(), meta
