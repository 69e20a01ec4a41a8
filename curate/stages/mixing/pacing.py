"""Curriculum pacing: in which order the rows of one group (a source) are read.

A pacing function is a *competence* c(t): at training progress t in [0, 1], the easiest
c(t) fraction of the rows may be read (Platanios et al. 2019, https://arxiv.org/abs/1903.09848).
Rows are placed one position at a time, each drawn uniformly (by its stable hash) from the
admitted rows not yet placed, so the result is a permutation: nothing is repeated or left
out, harder rows never appear before the pacing admits them, and within the admitted pool
the order is random. ``sorted`` is c(t) = t: the pool holds one row, so the order is the
plain easy-to-hard sort. Every c here satisfies c(t) >= t, so the pool is never empty.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from curate.stages.mixing.arrays import argsort_by

PACINGS = ("sorted", "linear", "sqrt", "step")
_CODE = {name: i for i, name in enumerate(PACINGS)}


@njit(cache=True)
def _competence(code, t, start, steps):
    if code == 1:  # linear: from `start` to everything at the end
        return start + (1.0 - start) * t
    if code == 2:  # square root: harder rows enter fast early, then slow down
        return math.sqrt(start * start + (1.0 - start * start) * t)
    if code == 3:  # step: stage k of `steps` admits the easiest (k + 1) / steps
        return min(1.0, (math.floor(t * steps) + 1.0) / steps)
    return t


@njit(cache=True)
def _paced(u_by_rank, code, start, steps):
    """Positions -> difficulty ranks: a min-heap on ``u`` over the admitted, unplaced ranks."""
    n = u_by_rank.shape[0]
    heap = np.empty(n, dtype=np.int64)
    size = 0
    admitted = 0
    out = np.empty(n, dtype=np.int64)
    for p in range(n):
        allowed = int(math.ceil(_competence(code, p / n, start, steps) * n - 1e-9))  # progress before this row
        allowed = min(n, max(allowed, p + 1))
        while admitted < allowed:  # push, sift up
            i = size
            heap[i] = admitted
            size += 1
            while i > 0:
                parent = (i - 1) >> 1
                if u_by_rank[heap[parent]] <= u_by_rank[heap[i]]:
                    break
                heap[parent], heap[i] = heap[i], heap[parent]
                i = parent
            admitted += 1
        out[p] = heap[0]  # pop the smallest u, sift down
        size -= 1
        heap[0] = heap[size]
        i = 0
        while True:
            left = 2 * i + 1
            if left >= size:
                break
            child = left
            if left + 1 < size and u_by_rank[heap[left + 1]] < u_by_rank[heap[left]]:
                child = left + 1
            if u_by_rank[heap[i]] <= u_by_rank[heap[child]]:
                break
            heap[i], heap[child] = heap[child], heap[i]
            i = child
    return out


def paced_order(value: np.ndarray, u: np.ndarray, *, pacing: str, start: float = 0.1, steps: int = 4) -> np.ndarray:
    """Row indices in reading order: easy (small ``value``) to hard under ``pacing``.

    ``u`` (uniform per row, from stable hashes) breaks ties in ``value`` and draws rows
    from the admitted pool; NaN values count as the hardest.
    """
    value = np.where(np.isnan(value), np.inf, value)
    by_rank = argsort_by(value, u)  # easiest first; ties by the seeded hash
    if pacing == "sorted" or len(by_rank) < 2:
        return by_rank
    return by_rank[_paced(u[by_rank], _CODE[pacing], float(start), int(steps))]
