"""Load-time mixing of several shard sets by token weight, deterministic and resumable.

Every sequence has the same length within a step, so token weights are sequence weights.
Global sequence ``g`` goes to the set with the largest deficit ``w_s * (g + 1) - count_s``
(ties to the lower index): a smooth weighted round-robin with no randomness, so the mix
depends only on the weights and the sequence counter — not on ranks, workers or seeds —
and after any prefix every set is within one sequence of its share. The state is the
per-set counts.
"""

from __future__ import annotations

import numpy as np

from train.errors import CheckpointError, ConfigError


class MixSchedule:
    """Which shard set each global sequence comes from."""

    def __init__(self, weights: list[float]) -> None:
        w = np.asarray(weights, np.float64)
        if w.ndim != 1 or len(w) == 0 or not np.all(np.isfinite(w)) or (w <= 0).any():
            raise ConfigError(f"train.data.mix_weights = {list(weights)!r} is invalid; allowed: one positive number per data set")
        self.weights = w / w.sum()
        self.counts = np.zeros(len(w), np.int64)

    def assign(self, n: int) -> np.ndarray:
        """Set index of each of the next ``n`` global sequences (does not advance)."""
        if len(self.weights) == 1:
            return np.zeros(n, np.int64)
        counts, out = self.counts.copy(), np.empty(n, np.int64)
        total = int(counts.sum())
        for j in range(n):
            s = int(np.argmax(self.weights * (total + j + 1) - counts))
            out[j] = s
            counts[s] += 1
        return out

    def advance(self, assigned: np.ndarray) -> None:
        self.counts += np.bincount(assigned, minlength=len(self.counts))

    def state_dict(self) -> dict:
        return {"counts": self.counts.tolist()}

    def load_state_dict(self, state: dict) -> None:
        counts = np.asarray(state["counts"], np.int64)
        if counts.shape != self.counts.shape:
            raise CheckpointError(f"mixing state has {len(counts)} data sets, this run has {len(self.counts)}")
        self.counts = counts
