"""A parallel layout (dp × tp × pp, with ep inside dp) from memory per device and link speeds.

Memory per device, bytes (mixed precision, AdamW, FSDP/ZeRO-3 sharding over dp as in torchtitan):

* states: 16 bytes per parameter (bf16 weight and gradient, fp32 master weight and two moments),
  sharded over every device: 16·P / G;
* gathered weights: FSDP holds one block unsharded plus the next one prefetched, bf16:
  2 · 2 · (block's dense params + its experts / ep) / tp;
* activations: 34·s·d bytes per layer and sequence (Korthikanti et al. 2022, bf16, flash attention
  so no s² term), split by tp (sequence parallel); a 1F1B pipeline keeps pp micro-batches in flight
  on its first stage, so pp does not divide them: L · 34·s·d / tp. With activation checkpointing:
  2·s·d per layer (its input) plus one layer's 34·s·d / tp, for 4/3 of the compute;
* logits: s·V·6 bytes (bf16 logits and fp32 softmax), split by tp;
* a layout fits when the sum is at most 90% of the device memory (allocator, NCCL buffers).

Communication per step and device (time = bytes / link GB/s; a group is inside a node when it and
the groups inside it — tp innermost, then ep/dp — fit in one):

* tp: 4 all-reduces of s·d bf16 activations per layer and sequence, 2(tp-1)/tp of each moved;
* ep: all-to-all dispatch and combine, forward and backward, of k copies of d bf16 per token and
  MoE layer, the (ep-1)/ep that leave the device;
* dp (FSDP): all-gather twice and reduce-scatter once of the device's 1/(tp·pp) of the weights in
  bf16; it overlaps with compute, so only what exceeds the compute time is exposed;
* pp: the pipeline bubble (pp-1)/(m+pp-1) of m micro-batches per step (the activations sent
  between stages are small next to these).

Step time = compute / (1 - bubble) + tp + ep + exposed dp, compute = FLOPs / (G · peak · MFU).
The layout with the shortest step time wins; a first-order model to start from, not a promise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from winnow.train.model import ModelConfig
from winnow.train.plan.hardware import Device
from winnow.train.plan.shape import expert_params

FIT = 0.9


@dataclass(frozen=True, slots=True)
class Layout:
    dp: int
    tp: int
    pp: int
    ep: int
    checkpointing: bool
    micro_batches: int  # per pipeline and step (micro-batch = 1 sequence)
    memory: dict[str, float]  # bytes per device by part
    comm: dict[str, float]  # seconds per step by group
    compute_s: float
    bubble: float
    step_s: float

    @property
    def memory_bytes(self) -> float:
        return sum(self.memory.values())

    @property
    def comm_share(self) -> float:
        return sum(self.comm.values()) / self.step_s


def memory_per_device(
    cfg: ModelConfig, *, gpus: int, tp: int, pp: int, ep: int, seq_len: int, checkpointing: bool
) -> dict[str, float]:
    """Bytes per device by part (see the module docstring)."""
    total, _ = cfg.param_counts()
    s, d, L = seq_len, cfg.dim, cfg.n_layers
    experts = expert_params(cfg)
    block_dense = (total - experts - cfg.padded_vocab * d * 2) / L
    block_experts = experts / max(cfg.n_moe_layers, 1)
    activations = (2 * s * d * L + 34 * s * d / tp) if checkpointing else L * 34 * s * d / tp
    return {
        "states": 16 * total / gpus,
        "gathered": 2 * 2 * (block_dense + block_experts / ep) / tp,
        "activations": activations,
        "logits": s * cfg.padded_vocab * 6 / tp,
    }


def evaluate(
    cfg: ModelConfig,
    dev: Device,
    *,
    gpus: int,
    tp: int,
    pp: int,
    ep: int,
    seq_len: int,
    global_seqs: int,
    mfu: float,
    checkpointing: bool,
) -> Layout:
    """Memory, communication and step time of one layout."""
    dp = gpus // (tp * pp)
    m = max(1, global_seqs // dp)
    tokens_replica = m * seq_len
    d = cfg.dim
    flops = cfg.flops_per_token(seq_len) * global_seqs * seq_len * (4 / 3 if checkpointing else 1)
    compute = flops / (gpus * dev.peak_flops * mfu)
    gb = 1e9

    def link(inner: int) -> float:
        return (dev.intra_gbps if inner <= dev.per_node else dev.inter_gbps) * gb

    total, _ = cfg.param_counts()
    comm = {
        "tp": 4 * 2 * (tp - 1) / tp * 2 * d * tokens_replica * (cfg.n_layers / pp) / link(tp) if tp > 1 else 0.0,
        "ep": 4 * cfg.top_k * 2 * d * (tokens_replica / tp) * (ep - 1) / ep * (cfg.n_moe_layers / pp) / link(tp * ep)
        if ep > 1
        else 0.0,
    }
    dp_time = 3 * 2 * total / (tp * pp) * (dp - 1) / dp / link(tp * dp) if dp > 1 else 0.0
    comm["dp"] = max(0.0, dp_time - compute)
    bubble = (pp - 1) / (m + pp - 1)
    step = compute / (1 - bubble) + sum(comm.values())
    return Layout(
        dp=dp,
        tp=tp,
        pp=pp,
        ep=ep,
        checkpointing=checkpointing,
        micro_batches=m,
        memory=memory_per_device(cfg, gpus=gpus, tp=tp, pp=pp, ep=ep, seq_len=seq_len, checkpointing=checkpointing),
        comm=comm,
        compute_s=compute,
        bubble=bubble,
        step_s=step,
    )


def candidates(cfg: ModelConfig, dev: Device, gpus: int) -> list[tuple[int, int, int]]:
    """(tp, pp, ep) with tp inside a node dividing the heads, pp dividing the layers, ep dividing dp and the experts."""
    out = []
    for tp in (1, 2, 4, 8):
        if tp > min(dev.per_node, gpus) or cfg.n_heads % tp or gpus % tp:
            continue
        for pp in (1, 2, 4, 8, 16):
            if gpus % (tp * pp) or pp > cfg.n_layers:
                continue
            dp = gpus // (tp * pp)
            experts = range(1, cfg.n_experts + 1) if cfg.is_moe else (1,)  # not range(dp): dp may be millions
            out.extend((tp, pp, ep) for ep in experts if dp % ep == 0 and cfg.n_experts % ep == 0 or ep == 1)
    return out


def best_layout(
    cfg: ModelConfig, dev: Device, *, gpus: int, seq_len: int, global_seqs: int, mfu: float
) -> Layout | None:
    """The fitting layout with the shortest step time (None when nothing fits)."""
    fitting = []
    for tp, pp, ep in candidates(cfg, dev, gpus):
        for ckpt in (False, True):
            layout = evaluate(
                cfg,
                dev,
                gpus=gpus,
                tp=tp,
                pp=pp,
                ep=ep,
                seq_len=seq_len,
                global_seqs=global_seqs,
                mfu=mfu,
                checkpointing=ckpt,
            )
            if layout.memory_bytes <= FIT * dev.memory_gib * 2**30:
                fitting.append(layout)
    return min(fitting, key=lambda l: (l.step_s, l.tp * l.pp, l.checkpointing), default=None)


def global_batch_tokens(compute_flops: float) -> float:
    """DeepSeek LLM's fitted compute-optimal batch size, B = 0.292 · C^0.3271 tokens (arXiv 2401.02954)."""
    return 0.292 * compute_flops**0.3271


def sequences_per_step(compute_flops: float, seq_len: int) -> int:
    """The batch as a power of two of sequences."""
    return 2 ** max(0, round(math.log2(max(global_batch_tokens(compute_flops) / seq_len, 1))))
