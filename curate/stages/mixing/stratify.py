"""Interleaving sources so every window of the reading order keeps the mixture's shares.

Each source arrives already in its own curriculum order. The k-th row of a source with
n rows is given the fractional position (k + 0.5) / n and all rows are merged by that
position (ties to the lower source index), so after any prefix of p rows each source has
contributed within one row of p times its share; a window of W rows is then within 2/W
of every share. Each source thus follows its own easy-to-hard curve at the same pace
(difficulty is compared within a source, where the scorer's scale means the same thing).

The merge needs no sort: a row's global position is its rank in its own source plus, for
every other source, how many of that source's positions precede it, which is a closed
form in integers (exact, no float ties, ``positions``), so it costs O(rows x sources) and
each piece of a source is placed on its own, without holding the others.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from curate.stages.mixing.arrays import ExactSum
from curate.stages.mixing.hashing import splitmix64


def _preceding(k: np.ndarray, n_self: int, n_other: int, other_first: bool) -> np.ndarray:
    """How many positions (j + 0.5) / n_other come before (k + 0.5) / n_self.

    (j + 0.5) / n_other < (k + 0.5) / n_self  <=>  (2j + 1) * n_self < (2k + 1) * n_other =: m,
    so the count is ceil(m / n_self) // 2 (strictly before), or (m // n_self + 1) // 2 when
    the other source wins ties.
    """
    m = (2 * k + 1) * n_other
    count = (m // n_self + 1) // 2 if other_first else (-(-m // n_self)) // 2
    return np.minimum(count, n_other)


@njit(cache=True)
def _shuffle_windows(sequence, h, salt, window):
    n = sequence.shape[0]
    for a in range(0, n, window):
        b = min(a + window, n)
        keys = np.empty(b - a, dtype=np.uint64)
        for i in range(a, b):
            keys[i - a] = splitmix64(h[sequence[i]] ^ salt)
        sequence[a:b] = sequence[a:b][np.argsort(keys)]


def shuffle_windows(sequence: np.ndarray, h: np.ndarray, salt: int, window: int) -> None:
    """Shuffle ``sequence`` in place inside each window of ``window`` positions, keyed by the
    row hashes ``h`` remixed with ``salt`` (a stream independent of the one that drew the order)."""
    _shuffle_windows(sequence, np.ascontiguousarray(h, dtype=np.uint64), np.uint64(salt), int(window))


def positions(k: np.ndarray, g: int, sizes: list[int], stratify: bool) -> np.ndarray:
    """Places in the whole reading order of the ``k``-th rows of source ``g`` (``interleave`` row by row:
    a closed form, so each piece of a source is placed without the others)."""
    if not stratify:  # source by source, in the order of ``sizes``
        return k + sum(sizes[:g])
    place = k.copy()
    for r, n_other in enumerate(sizes):
        if r != g and n_other:
            place += _preceding(k, sizes[g], n_other, other_first=r < g)
    return place


class Curve:
    """The order's report, built window by window: source shares per window and the curriculum's curve.

    Pieces arrive in place order, each starting on a window boundary; every figure is exact
    integer counting or an ``ExactSum``, so it does not depend on the pieces.
    """

    def __init__(self, names: list[str], sizes: list[int], config) -> None:
        self.names, self.c = names, config
        self.n = sum(sizes)
        self.overall = np.asarray(sizes, dtype=np.int64) / max(self.n, 1)
        self.n_windows = -(-self.n // config.window)
        self.full = self.n // config.window  # the last, partial window is not held to the shares
        keep = config.report_windows
        self.picks = sorted(set(range(min(keep, self.n_windows))) | set(range(max(self.n_windows - keep, 0), self.n_windows)))
        self.rows: dict[int, dict] = {}
        self.deviation, self.over, self.nulls = 0.0, 0, 0
        m = min(20, self.n)  # the curve: 20 equal slices of the order (np.array_split's sizes)
        self.slice_ends = np.cumsum([self.n // m + (1 if i < self.n % m else 0) for i in range(m)]) if m else np.zeros(0, np.int64)
        self.slices = [ExactSum() for _ in range(m)]

    def add(self, lo: int, codes: np.ndarray, values: np.ndarray) -> None:
        """Places ``lo .. lo + len(codes) - 1``: their sources and ordering values, in order."""
        window, groups = self.c.window, len(self.names)
        first = lo // window
        local = np.arange(len(codes), dtype=np.int64) // window
        counts = np.bincount(local * groups + codes, minlength=(-(-len(codes) // window)) * groups).reshape(-1, groups)
        full = counts[: max(0, min(len(counts), self.full - first))] / window
        if len(full):
            deviation = np.abs(full - self.overall)
            self.deviation = max(self.deviation, float(deviation.max()))
            self.over += int((deviation.max(axis=1) > self.c.tolerance).sum())
        for w in self.picks:
            if first <= w < first + len(counts):
                self.rows[w] = {"window": w, **{s: int(counts[w - first, i]) for i, s in enumerate(self.names)}}
        self.nulls += int(np.isnan(values).sum())
        bounds = np.searchsorted(self.slice_ends, np.arange(lo, lo + len(values)), side="right")
        finite = np.isfinite(values)
        for s in np.unique(bounds):
            self.slices[s].add(values[(bounds == s) & finite])

    def finish(self) -> dict:
        c = self.c
        return {
            "by": c.by,
            "direction": c.direction,
            "pacing": c.pacing,
            "stratify": c.stratify,
            "rows": self.n,
            "window": c.window,
            "windows": self.n_windows,
            "source_shares": {s: float(self.overall[i]) for i, s in enumerate(self.names)},
            "max_share_deviation": self.deviation,
            "windows_over_tolerance": self.over,
            "window_rows": [self.rows[w] for w in self.picks],
            # Mean of the ordering column over 20 equal slices of the order: the curriculum's curve.
            "curve": [s.mean() for s in self.slices],
            "null_values": self.nulls,
        }
