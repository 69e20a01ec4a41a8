"""The compute planner behind ``winnow plan``: size a run from a budget, or cost a ``[train]`` table.

Compute-optimal sizing follows Chinchilla (https://arxiv.org/abs/2203.15556): C = 6·N·D with
D ≈ 20·N tokens, applied to *active* parameters for a MoE; total parameters follow from the
expert count and top-k. Time and memory estimates are first-order, for planning only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from winnow.train.config import TrainConfig
from winnow.train.errors import ConfigError

TOKENS_PER_PARAM = 20.0
FFN_SHARE = 2 / 3  # share of a dense transformer's non-embedding parameters in its feed-forward blocks


@dataclass(kw_only=True, slots=True)
class Budget:
    """Accelerator time and speed available for one run."""

    device_hours: float
    peak_flops: float  # per device, dense, in the training dtype
    utilization: float = 0.35  # expected MFU
    n_experts: int = 8
    top_k: int = 2

    def __post_init__(self) -> None:
        for key in ("device_hours", "peak_flops"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"plan.{key} = {getattr(self, key)!r} is invalid; allowed: > 0")
        if not 0 < self.utilization <= 1:
            raise ConfigError(f"plan.utilization = {self.utilization!r} is invalid; allowed: 0 < value <= 1")
        if not 1 <= self.top_k <= max(self.n_experts, 1):
            raise ConfigError(f"plan.top_k = {self.top_k!r} is invalid; allowed: 1..n_experts ({self.n_experts})")


def plan_budget(budget: Budget) -> dict[str, float]:
    """Compute-optimal active/total parameters and tokens for the budget."""
    compute = budget.device_hours * 3600 * budget.peak_flops * budget.utilization
    active = math.sqrt(compute / (6 * TOKENS_PER_PARAM))
    tokens = TOKENS_PER_PARAM * active
    expansion = budget.n_experts / budget.top_k if budget.n_experts > 1 else 1.0
    total = active * (1 - FFN_SHARE + FFN_SHARE * expansion)
    return {"compute_flops": compute, "active_params": active, "total_params": total, "tokens": tokens}


def estimate_run(cfg: TrainConfig, *, peak_flops: float, utilization: float, devices: int = 1) -> dict[str, float]:
    """Time and per-device memory of the run a ``[train]`` table describes."""
    total, active = cfg.model.param_counts()
    tokens_per_step = cfg.data.batch_size * cfg.data.seq_len * cfg.grad_accum * devices
    tokens = tokens_per_step * cfg.steps
    flops = cfg.model.flops_per_token(cfg.data.seq_len) * tokens
    seconds = flops / (peak_flops * utilization * devices)
    # fp32 master weights + grads + two Adam moments; activations ~ 34·B·L·D bytes per layer in 16-bit
    # (Korthikanti et al. 2022), fp32 doubles it; checkpointing keeps ~ one block's worth plus inputs
    state_bytes = total * (4 + 4 + 8)
    act_bytes_per_layer = (
        34 * cfg.data.batch_size * cfg.data.seq_len * cfg.model.dim * (2 if cfg.precision == "fp32" else 1)
    )
    layers_held = 1 + cfg.model.n_layers * 0.1 if cfg.activation_checkpointing else cfg.model.n_layers
    logits_bytes = cfg.data.batch_size * cfg.data.seq_len * cfg.model.padded_vocab * 4 * 2
    memory = state_bytes + act_bytes_per_layer * layers_held + logits_bytes
    return {
        "total_params": total,
        "active_params": active,
        "tokens": tokens,
        "flops": flops,
        "hours": seconds / 3600,
        "memory_gib_per_device": memory / 2**30,
        "tokens_per_param": tokens / active,
    }
