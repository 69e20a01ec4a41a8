"""A fastText-style linear classifier over hashed features: logistic regression trained with Adagrad.

A document is the mean of its feature one-hots (fastText averages its input vectors), so
``logit = b + mean(w[f] for f in doc)``. Training is sparse Adagrad over shuffled documents
with per-class weights that give both classes equal total weight (the reference source is
usually much smaller than the pool), compiled with numba because each step touches only the
document's own buckets. Prediction is vectorized numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit


@njit(cache=True)
def _adagrad(indptr, feats, y, sample_w, w, b, g2, epochs, lr, l2, seed):
    np.random.seed(seed)
    n = indptr.shape[0] - 1
    gb2 = 1e-8
    for _ in range(epochs):
        for i in np.random.permutation(n):
            s, e = indptr[i], indptr[i + 1]
            n_f = e - s
            z = b[0]
            if n_f > 0:
                acc = 0.0
                for j in range(s, e):
                    acc += w[feats[j]]
                z += acc / n_f
            p = 1.0 / (1.0 + np.exp(-z)) if z > -30.0 else 0.0
            g = (p - y[i]) * sample_w[i]
            gb2 += g * g
            b[0] -= lr * g / np.sqrt(gb2)
            if n_f > 0:
                gf = g / n_f
                for j in range(s, e):
                    f = feats[j]
                    grad = gf + l2 * w[f]
                    g2[f] += grad * grad
                    w[f] -= lr * grad / np.sqrt(g2[f])


@dataclass(slots=True)
class LinearModel:
    """Weights over hashed buckets plus a bias; ``predict`` gives P(positive)."""

    weights: np.ndarray  # float64 [B]
    bias: float

    @classmethod
    def fit(
        cls,
        indptr: np.ndarray,
        feats: np.ndarray,
        y: np.ndarray,
        *,
        buckets: int,
        epochs: int,
        lr: float,
        l2: float,
        seed: int,
    ) -> LinearModel:
        """Train on documents in CSR layout (``indptr`` [N+1], ``feats`` bucket ids) with 0/1 labels ``y``."""
        y = y.astype(np.float64)
        n_pos = max(y.sum(), 1.0)
        n_neg = max(y.shape[0] - y.sum(), 1.0)
        sample_w = np.where(y > 0, y.shape[0] / (2 * n_pos), y.shape[0] / (2 * n_neg))
        w = np.zeros(buckets, dtype=np.float64)
        g2 = np.full(buckets, 1e-8, dtype=np.float64)
        b = np.zeros(1, dtype=np.float64)
        _adagrad(indptr, feats, y, sample_w, w, b, g2, epochs, lr, l2, seed)
        return cls(w, float(b[0]))

    def logits(self, indptr: np.ndarray, feats: np.ndarray) -> np.ndarray:
        """float64 [N]: the logit of each document in CSR layout."""
        n = indptr.shape[0] - 1
        counts = np.diff(indptr)
        doc = np.repeat(np.arange(n, dtype=np.int64), counts)
        sums = np.bincount(doc, weights=self.weights[feats], minlength=n)
        return self.bias + sums / np.maximum(counts, 1)

    def predict(self, indptr: np.ndarray, feats: np.ndarray) -> np.ndarray:
        """float64 [N]: P(positive) of each document."""
        return 1.0 / (1.0 + np.exp(-np.clip(self.logits(indptr, feats), -500, 500)))


def take_rows(indptr: np.ndarray, feats: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The CSR sub-matrix of ``rows`` (in that order)."""
    counts = np.diff(indptr)[rows]
    out_ptr = np.zeros(rows.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=out_ptr[1:])
    starts = np.repeat(indptr[rows], counts)
    within = np.arange(out_ptr[-1], dtype=np.int64) - np.repeat(out_ptr[:-1], counts)
    return out_ptr, feats[starts + within]


def roc_auc(y: np.ndarray, score: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U with mid-ranks for ties); NaN if a class is missing."""
    y = y.astype(bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(score, kind="stable")
    sorted_s = score[order]
    _, inv, counts = np.unique(sorted_s, return_inverse=True, return_counts=True)
    first = np.cumsum(counts) - counts  # 0-based rank of each tie group's first member
    ranks = np.empty(score.shape[0], dtype=np.float64)
    ranks[order] = first[inv] + (counts[inv] + 1) / 2.0
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))
