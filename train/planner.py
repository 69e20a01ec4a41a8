"""What a ``[train]`` table costs, for ``winnow plan``: its time and per-device memory, first-order, for planning
only (sizing a run from a budget is ``plan/budget.py``)."""

from __future__ import annotations

from winnow.train.config import TrainConfig


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
