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
import polars as pl
from numba import njit

from winnow.curate.errors import ConfigError

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


PACE_BYTES = 128  # per row of a paced source, held whole: keys, hash, value, the heap and both permutations


class Paced:
    """Paced curricula, source by source: a source's rows are gathered (in difficulty order) until all
    are in, then drawn from the admitted pool; the pool spans the whole source, so one source's rows
    (``PACE_BYTES`` each) must fit in half of ``[job] memory_gb`` (the key ranges get the other half)."""

    def __init__(self, config, sizes: list[int], memory_gb: float) -> None:
        self.c = config
        largest = max(sizes, default=0)
        if largest * PACE_BYTES > memory_gb * 1e9 / 2:  # half the budget: the key ranges read next to it take the rest
            raise ConfigError(
                f"job.memory_gb = {memory_gb} is too small for order.pacing = {config.pacing!r}: its pool spans a whole source "
                f"({largest} rows x {PACE_BYTES} B, in half the budget); set job.memory_gb to at least "
                f"{2 * largest * PACE_BYTES / 1e9:.3g} or use pacing = 'sorted'"
            )
        self.pending: dict[int, list[pl.DataFrame]] = {}
        self.place: dict[int, np.ndarray] = {}

    def add(self, g: int, rows: pl.DataFrame, *, done: bool) -> pl.DataFrame | None:
        """Take the next rows of source ``g`` (in difficulty order); once ``done``, return all of them."""
        self.pending.setdefault(g, []).append(rows)
        if not done:
            return None
        rows = pl.concat(self.pending.pop(g))
        c, n = self.c, rows.height
        place = np.arange(n, dtype=np.int64)
        if n >= 2:
            by_place = _paced(rows["_u"].to_numpy(), _CODE[c.pacing], float(c.start), int(c.steps))
            place[by_place] = np.arange(n, dtype=np.int64)
        self.place[g] = place
        return rows

    def within(self, g: int) -> np.ndarray:
        """Each row's place in its source's reading order, for the rows ``add`` returned."""
        return self.place.pop(g)
