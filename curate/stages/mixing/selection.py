"""Which rows of one source make up its share of the mixture, and how many times each.

A source asked for ``target`` tokens out of ``available`` takes ``floor(target / available)``
whole passes over its rows, then a partial pass over its most preferred rows until the
target is met (to the nearest document). Preference is a seeded random order, the score
order (``top``), or importance resampling without replacement (``importance``: Gumbel-top-k
over log-weights, which draws rows with probability proportional to ``exp(dsir_weight)``
without replacement, as in DSIR, https://arxiv.org/abs/2302.03169). No row gets more than
``max_copies`` copies.
"""

from __future__ import annotations

import numpy as np

from curate.stages.mixing.arrays import argsort_by

SELECTIONS = ("random", "top", "importance")


def preference_order(u: np.ndarray, score: np.ndarray | None, select: str) -> np.ndarray:
    """Row indices, most preferred first; ``u`` are per-row uniforms in [0, 1) from stable hashes."""
    if select == "random":
        return np.argsort(u, kind="stable")
    assert score is not None, "top/importance selection needs a score"
    score = np.where(np.isnan(score), -np.inf, score)
    if select == "top":
        return argsort_by(-score, u)  # ties in score fall back to the seeded random order
    # Gumbel-top-k: key = log w + G with G = -log(-log u) draws without replacement ∝ w.
    gumbel = -np.log(-np.log(np.clip(u, 1e-300, 1.0 - 1e-16)))
    return np.argsort(-(score + gumbel), kind="stable")


def repeat_counts(tokens: np.ndarray, order: np.ndarray, target: float, max_copies: int) -> np.ndarray:
    """Copies of each row (0 = dropped) so the source contributes about ``target`` tokens."""
    n = len(tokens)
    counts = np.zeros(n, dtype=np.int32)
    available = float(tokens.sum())
    if n == 0 or available <= 0 or target <= 0:
        return counts
    passes = min(int(target // available), max_copies)
    counts[:] = passes
    rest = target - passes * available
    if passes >= max_copies or rest <= 0:
        return counts
    cum = np.cumsum(tokens[order], dtype=np.int64)
    k = int(np.searchsorted(cum, rest, side="right"))  # rows whose running total stays <= rest
    below = float(cum[k - 1]) if k else 0.0
    if k < n and cum[k] - rest < rest - below:  # the next document lands closer to the target
        k += 1
    counts[order[:k]] += 1
    return counts
