"""Learning-rate schedules as a multiplier of ``[train.optim] lr`` per optimizer step.

* ``cosine`` / ``linear``: warm-up, then one decay over the rest of the run to ``min_lr_ratio``.
* ``constant``: warm-up, then flat.
* ``wsd`` (warm-up, stable, decay; MiniCPM, https://arxiv.org/abs/2404.06395, and Hägele et al. 2024,
  https://arxiv.org/abs/2405.18392): warm-up, flat at the peak, and a decay over the last
  ``decay_fraction`` of the steps shaped ``linear``, ``cosine`` or ``sqrt`` (1 - √p, the shape
  Hägele et al. found best). The stable phase is what makes continuing cheap: a checkpoint taken
  there can be trained further with more ``steps`` (the decay moves later) or decayed on its own.

Re-warming (Gupta et al. 2023, https://arxiv.org/abs/2308.04014): when a run continues another,
its warm-up can start from the learning rate that run ended with (``start_factor`` = that LR over
this run's peak) instead of from zero.
"""

from __future__ import annotations

import math


def decay_shape(progress: float, shape: str) -> float:
    """Fraction of the way from the floor to the peak after ``progress`` (0..1) of a decay."""
    p = min(1.0, max(0.0, progress))
    if shape == "cosine":
        return 0.5 * (1 + math.cos(math.pi * p))
    if shape == "sqrt":
        return 1 - math.sqrt(p)
    return 1 - p


def decay_start(total_steps: int, warmup_steps: int, decay_fraction: float) -> int:
    """First step of a WSD run's decay: the last ``decay_fraction`` of ``total_steps``, never inside the warm-up."""
    return max(warmup_steps, total_steps - round(decay_fraction * total_steps))


def lr_factor(step: int, cfg, total_steps: int, *, start_factor: float = 0.0) -> float:
    """Multiplier of ``cfg.lr`` at 0-based ``step`` under ``cfg`` (an ``OptimConfig``).

    Warm-up is linear from ``start_factor`` (exclusive) to 1 over ``warmup_steps``. A WSD decay of
    ``D`` steps starting at step ``s`` has progress ``(step - s + 1) / D``, so its last step is at
    the floor ``min_lr_ratio``; cosine/linear decays span ``warmup_steps..total_steps`` as before.
    """
    if step < cfg.warmup_steps:
        return start_factor + (1 - start_factor) * (step + 1) / cfg.warmup_steps
    floor = cfg.min_lr_ratio
    if cfg.schedule == "constant":
        return 1.0
    if cfg.schedule == "wsd":
        start = decay_start(total_steps, cfg.warmup_steps, cfg.decay_fraction)
        if step < start:
            return 1.0
        progress = (step - start + 1) / max(1, total_steps - start)
        return floor + (1 - floor) * decay_shape(progress, cfg.decay_shape)
    progress = (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps)
    return floor + (1 - floor) * decay_shape(progress, cfg.schedule)
