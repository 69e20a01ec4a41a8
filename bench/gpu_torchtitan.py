"""The GPU check's peer: torchtitan's MoE (its Qwen3-MoE model code) at winnow's size, trained on the same batches.

``bench/gpu.py`` calls ``measure`` after winnow's run when ``import torchtitan`` works, and prints
"winnow N x torchtitan" ratios. What is torchtitan's and what is not:

* the model is torchtitan's: its ``Qwen3Model`` with the MoE blocks its own config builder makes
  (``TokenChoiceTopKRouter``, softmax scores, ``GroupedExperts`` on ``torch._grouped_mm``), at winnow's
  vocab, width, layers, heads, kv heads, expert width, experts and top-k; the Qwen3-only q/k norms are
  left out so the shapes are winnow's. Attention is torchtitan's ``ScaledDotProductAttention``, causal,
  the kernel winnow's attention calls too (``--tt-attn flex`` uses its FlexAttention instead; that one
  has no backward on a CPU);
* the step is the one torchtitan's ``Trainer`` runs on one GPU without FSDP (bf16 autocast over fp32
  weights, fp32 cross-entropy, global-norm clipping at 1.0, fused AdamW with winnow's defaults), written
  out here because its ``Trainer`` needs its own dataset/tokenizer setup. torchtitan's aux-loss-free
  expert-bias update (an optimizer hook) is not registered; winnow's aux and z losses do run.

FLOPs per token use winnow's formula (6·non-embedding active parameters + causal attention) on the
peer's own parameter counts, so both MFU figures share one convention.
"""

from __future__ import annotations

import gc
import math
import time

import torch
import torch.nn.functional as F

from winnow.train.metrics import memory_stats


def available() -> str | None:
    """None when torchtitan's MoE model imports here; else why not (printed instead of the peer's figures)."""
    try:
        import torchtitan.models.qwen3  # noqa: F401  (on 0.3.0 this also imports triton)
    except Exception as e:  # ImportError, or an incompatible torch raising at import
        return f"{type(e).__name__}: {e}"
    return None


def build(shape: dict, seq: int, *, attn: str = "sdpa"):
    """torchtitan's ``Qwen3Model.Config`` for winnow's ``ModelConfig`` keys ``shape`` (unbuilt)."""
    import torchtitan.models.qwen3 as q3
    from torchtitan.models.common import CosSinRoPE, Embedding, Linear
    from torchtitan.models.common.attention import ScaledDotProductAttention

    from winnow.train.model import ModelConfig

    w = ModelConfig(**shape, max_seq_len=seq)
    head = w.dim // w.n_heads
    layers = q3._build_qwen3_moe_layers(  # torchtitan's own builder of its Qwen3-MoE blocks
        n_layers=w.n_layers,
        dim=w.dim,
        n_heads=w.n_heads,
        n_kv_heads=w.kv_heads,
        head_dim=head,
        moe_hidden_dim=w.ffn_hidden,
        num_experts=w.n_experts,
        top_k=w.top_k,
        attn_backend="flex",
        moe_comm_backend="standard",
        rope=CosSinRoPE.Config(dim=head, max_seq_len=seq, theta=w.rope_theta),
    )
    for layer in layers:
        layer.attention.qk_norm = None  # winnow's attention has none
        if attn == "sdpa":
            layer.attention.inner_attention = ScaledDotProductAttention.Config()
    vocab = w.padded_vocab
    return q3.Qwen3Model.Config(
        vocab_size=vocab,
        dim=w.dim,
        norm=q3._qwen3_norm(w.dim),
        enable_weight_tying=w.tie_embeddings,
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=w.dim, param_init=q3._EMBEDDING_INIT),
        lm_head=Linear.Config(in_features=w.dim, out_features=vocab, param_init=q3._LINEAR_INIT),
        layers=layers,
    )


def param_counts(model, cfg) -> tuple[int, int, int]:
    """(total, active, embedding) parameters of the built model; active counts top_k of the routed experts."""
    total = experts = embedding = 0
    for name, p in model.named_parameters():
        total += p.numel()
        if "moe.routed_experts" in name:
            experts += p.numel()
        elif "tok_embeddings" in name:
            embedding += p.numel()
    moe = next(layer.moe for layer in cfg.layers if layer.moe is not None)
    active = total - experts + experts * moe.router.top_k // moe.num_experts
    return total, active, embedding


def flops_per_token(cfg, active: int, embedding: int, seq: int) -> float:
    """winnow's convention (``ModelConfig.flops_per_token``) on the peer's counts."""
    return 6.0 * (active - embedding) + 6 * len(cfg.layers) * cfg.dim * seq


def measure(
    *,
    shape: dict,
    batch: int,
    seq: int,
    device: str,
    steps: int,
    warmup: int,
    precision: str,
    peak_flops: float | None,
    batches,
    attn: str = "sdpa",
    lr: float = 3e-3,
) -> dict:
    """Train torchtitan's model ``warmup + steps`` steps on ``batches``; the timed steps' figures."""
    dev = torch.device(device)
    cfg = build(shape, seq, attn=attn)
    if dev.type == "cuda":  # the peak covers this run only, as winnow's covers its own (reset before its build)
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    torch.manual_seed(0)
    with torch.device(dev):
        model = cfg.build()
    model.init_states(buffer_device=dev)
    model.train()
    total, active, embedding = param_counts(model, cfg)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[precision]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20))  # winnow's 20-step warmup
    positions = None if attn == "sdpa" else torch.arange(seq, device=dev)[None].expand(batch, seq)

    def step() -> float:
        b = next(batches)
        tokens, targets = b.tokens.to(dev, non_blocking=True), b.targets.to(dev, non_blocking=True)
        masks = None if positions is None else model.get_attention_masks(positions)
        with torch.autocast(dev.type, dtype=dtype, enabled=dtype is not None):
            logits = model(tokens, positions, masks)
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    for _ in range(warmup):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        loss = step()
    sync()
    elapsed = time.perf_counter() - start
    tokens_per_s = steps * batch * seq / elapsed
    fpt = flops_per_token(cfg, active, embedding, seq)
    result = {
        "total_params": total,
        "active_params": active,
        "batch": batch,
        "seq": seq,
        "timed_steps": steps,
        "attention": attn,
        "tokens_per_s": tokens_per_s,
        "flops_per_token": fpt,
        "mfu": tokens_per_s * fpt / peak_flops if peak_flops else math.nan,
        "memory": memory_stats(dev),
        "loss": float(loss),
        "wall_s": elapsed,
    }
    model = opt = None  # free them before the next contender builds its own (the step closure holds the names)
    return result
