"""Load-time mixing of several shard sets by token weight, deterministic and resumable.

Every sequence has the same length within a step, so token weights are sequence weights.
Global sequence ``g`` goes to the set with the largest deficit ``w_s * (g + 1) - count_s``
(ties to the lower index): a smooth weighted round-robin with no randomness, so the mix
depends only on the weights and the sequence counter — not on ranks, workers or seeds —
and after any prefix every set is within one sequence of its share. The state is the
per-set counts.

``reweight`` changes the weights mid-run (adaptive mixing, ``train/adaptive.py``): deficits then
count from that point on, plus each set's deficit carried over (within one sequence), so the
new shares take over at once without catching up on the old ones. The state then also holds
the weights, the point of the change and the carried deficits; every rank reweights at the
same step with the same weights, so the assignment stays identical across ranks. A resume whose
configured weights differ from those the state records (``configured``) reweights to them the same way.
"""

from __future__ import annotations

import numpy as np

from winnow.train.errors import CheckpointError, ConfigError


class MixSchedule:
    """Which shard set each global sequence comes from."""

    def __init__(self, weights: list[float]) -> None:
        w = np.asarray(weights, np.float64)
        if w.ndim != 1 or len(w) == 0 or not np.all(np.isfinite(w)) or (w <= 0).any():
            raise ConfigError(
                f"train.data.mix_weights = {list(weights)!r} is invalid; allowed: one positive number per data set"
            )
        self.weights = w / w.sum()
        self._configured = self.weights.copy()  # the run's own weights (a resume with others takes them over)
        self.counts = np.zeros(len(w), np.int64)
        self._counts_then = np.zeros(len(w), np.int64)  # per-set counts at the last reweight
        self._carry = np.zeros(len(w), np.float64)  # each set's deficit at the last reweight
        self.reweighted = False

    def reweight(self, weights) -> None:
        """Use ``weights`` (one positive number per set) for the sequences from now on."""
        w = np.asarray(weights, np.float64)
        if w.shape != self.weights.shape or not np.all(np.isfinite(w)) or (w <= 0).any():
            raise ConfigError(
                f"mix weights {list(weights)!r} are invalid; allowed: {len(self.weights)} positive numbers"
            )
        counts = self.counts - self._counts_then
        self._carry = self._carry + self.weights * int(counts.sum()) - counts  # each set's deficit now
        self._counts_then = self.counts.copy()
        self.weights = w / w.sum()
        self.reweighted = True

    def assign(self, n: int) -> np.ndarray:
        """Set index of each of the next ``n`` global sequences (does not advance)."""
        if len(self.weights) == 1:
            return np.zeros(n, np.int64)
        counts, out = self.counts - self._counts_then, np.empty(n, np.int64)
        total = int(counts.sum())
        for j in range(n):  # (carry 0 and nothing before: w * (g + 1) - count, exactly as without reweighting)
            s = int(np.argmax(self._carry + self.weights * (total + j + 1) - counts))
            out[j] = s
            counts[s] += 1
        return out

    def advance(self, assigned: np.ndarray) -> None:
        self.counts += np.bincount(assigned, minlength=len(self.counts))

    def state_dict(self) -> dict:
        state = {"counts": self.counts.tolist(), "configured": self._configured.tolist()}
        if self.reweighted:  # the current weights, and where they took over
            state |= {
                "weights": self.weights.tolist(),
                "counts_then": self._counts_then.tolist(),
                "carry": self._carry.tolist(),
            }
        return state

    def load_state_dict(self, state: dict) -> None:
        counts = np.asarray(state["counts"], np.int64)
        if counts.shape != self.counts.shape:
            raise CheckpointError(f"mixing state has {len(counts)} data sets, this run has {len(self.counts)}")
        self.counts = counts
        mine = self._configured
        if "configured" in state:  # the weights the counts were made with, unless reweighted since
            self.weights = np.asarray(state["configured"], np.float64)
        if "weights" in state:
            self.weights = np.asarray(state["weights"], np.float64)
            self._counts_then = np.asarray(state["counts_then"], np.int64)
            self._carry = np.asarray(state["carry"], np.float64)
            self.reweighted = True
        if "configured" in state and not np.allclose(state["configured"], mine, rtol=0, atol=1e-12):
            # a resume with other weights (a replay share, a set's weight): they take over from here, as a
            # reweight's do; compared with the counts of the old ones, the sets they favour would wait to catch up
            self.reweight(mine)
            self._configured = mine
