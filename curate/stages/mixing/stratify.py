"""Interleaving sources so every window of the reading order keeps the mixture's shares.

Each source arrives already in its own curriculum order. The k-th row of a source with
n rows is given the fractional position (k + 0.5) / n and all rows are merged by that
position (ties to the lower source index), so after any prefix of p rows each source has
contributed within one row of p times its share; a window of W rows is then within 2/W
of every share. Each source thus follows its own easy-to-hard curve at the same pace
(difficulty is compared within a source, where the scorer's scale means the same thing).

With few sources the merge needs no sort: a row's global position is its rank in its own
source plus, for every other source, how many of that source's positions precede it, a closed
form in integers (exact, no float ties, ``positions``) that costs O(rows x sources) and places
each piece of a source on its own. Sources taken from a field number 10^4-10^5, so past
``CLOSED_FORM_SOURCES`` the order plan sorts instead: each row gets the integer ``merge_key``
floor((k + 0.5) / n * 2^62), which orders rows exactly as the fractions do (equal fractions, equal
keys; for sources up to 2^30 rows distinct fractions differ by at least one), and a sort by
(key, source) gives the same places in O(rows log rows) whatever the source count.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from winnow.curate.stages.mixing.arrays import ExactSum
from winnow.curate.stages.mixing.hashing import splitmix64


def _preceding(k: np.ndarray, n_self: np.ndarray | int, n_other: int, other_first: np.ndarray | bool) -> np.ndarray:
    """How many positions (j + 0.5) / n_other come before (k + 0.5) / n_self.

    (j + 0.5) / n_other < (k + 0.5) / n_self  <=>  (2j + 1) * n_self < (2k + 1) * n_other =: m,
    so the count is ceil(m / n_self) // 2 (strictly before), or (m // n_self + 1) // 2 when
    the other source wins ties.
    """
    m = (2 * k + 1) * n_other
    count = np.where(other_first, (m // n_self + 1) // 2, (-(-m // n_self)) // 2)
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


CLOSED_FORM_SOURCES = 64  # up to this many sources the closed form beats a sort pass
MAX_MERGE_ROWS = 2**30  # per source: merge keys stay exact up to here


def positions(k: np.ndarray, code: np.ndarray, sizes: np.ndarray, stratify: bool) -> np.ndarray:
    """Places in the whole reading order of the ``k``-th rows of sources ``code`` (``interleave`` row by row:
    a closed form, so each piece is placed without the others; O(rows x sources), for few sources)."""
    if not stratify:  # source by source, in the order of ``sizes``
        return k + (np.cumsum(sizes) - sizes)[code]
    place = k.copy()
    n_self = sizes[code]
    for r, n_other in enumerate(sizes):
        if n_other:
            others = code != r
            place[others] += _preceding(k[others], n_self[others], int(n_other), other_first=r < code[others])
    return place


def merge_key(k: np.ndarray, n: np.ndarray) -> np.ndarray:
    """floor((2k + 1) / (2n) * 2^62) exactly, in int64 (``n`` <= ``MAX_MERGE_ROWS``): the fraction's order as integers."""
    k, n = k.astype(np.int64), n.astype(np.int64)
    a, b = (1 << 61) // n, (1 << 61) % n  # 2^61 = a n + b, so (2k+1) 2^61 / n = (2k+1) a + (2k+1) b / n
    odd = 2 * k + 1
    return odd * a + (odd * b) // n


def within_source(code: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """Each row's rank in its source, for rows sorted by source (one run per source), after ``rank`` earlier rows;
    ``rank`` is advanced past them."""
    starts = np.flatnonzero(np.r_[True, code[1:] != code[:-1]])
    lengths = np.diff(np.r_[starts, len(code)])
    k = rank[code] + np.arange(len(code)) - np.repeat(starts, lengths)
    rank[code[starts]] += lengths
    return k


class Curve:
    """The order's report, built window by window: source shares per window and the curriculum's curve.

    Pieces arrive in place order, each starting on a window boundary; every figure is exact
    integer counting or an ``ExactSum``, so it does not depend on the pieces.
    """

    def __init__(self, names: list[str], sizes: list[int], config) -> None:
        self.names, self.c = names, config
        self.n = sum(sizes)
        self.overall = np.asarray(sizes, dtype=np.int64) / max(self.n, 1)
        self.by_share = np.argsort(-self.overall, kind="stable")  # sources, largest share first
        self.rank_of = np.empty(len(sizes), np.int64)
        self.rank_of[self.by_share] = np.arange(len(sizes))
        self.n_windows = -(-self.n // config.window)
        self.full = self.n // config.window  # the last, partial window is not held to the shares
        keep = config.report_windows
        self.picks = sorted(
            set(range(min(keep, self.n_windows))) | set(range(max(self.n_windows - keep, 0), self.n_windows))
        )
        self.rows: dict[int, dict] = {}
        self.deviation, self.over, self.nulls = 0.0, 0, 0
        m = min(20, self.n)  # the curve: 20 equal slices of the order (np.array_split's sizes)
        self.slice_ends = (
            np.cumsum([self.n // m + (1 if i < self.n % m else 0) for i in range(m)]) if m else np.zeros(0, np.int64)
        )
        self.slices = [ExactSum() for _ in range(m)]

    def add(self, lo: int, codes: np.ndarray, values: np.ndarray) -> None:
        """Places ``lo .. lo + len(codes) - 1``: their sources and ordering values, in order.

        Counts are kept per (window, source) present, never as a windows x sources table: a source
        missing from a window deviates by its whole share, and the largest such share is found from
        the sources ranked by share (O(rows log rows) per piece, whatever the source count).
        """
        window, groups = self.c.window, len(self.names)
        first = lo // window
        codes = codes.astype(np.int64)
        local = np.arange(len(codes), dtype=np.int64) // window
        pair, count = np.unique(local * groups + codes, return_counts=True)
        w_of, c_of = pair // groups, pair % groups
        n_full = max(0, min(int(local[-1]) + 1 if len(local) else 0, self.full - first))
        if n_full:
            full = w_of < n_full
            present = np.zeros(n_full)
            np.maximum.at(present, w_of[full], np.abs(count[full] / window - self.overall[c_of[full]]))
            deviation = np.maximum(present, self._largest_absent(w_of[full], c_of[full], n_full))
            self.deviation = max(self.deviation, float(deviation.max()))
            self.over += int((deviation > self.c.tolerance).sum())
        for w in self.picks:
            if first <= w < first + (int(local[-1]) + 1 if len(local) else 0):
                mine = w_of == w - first
                counts = dict(zip(c_of[mine].tolist(), count[mine].tolist()))
                self.rows[w] = {"window": w, **{s: int(counts.get(i, 0)) for i, s in enumerate(self.names)}}
        self.nulls += int(np.isnan(values).sum())
        bounds = np.searchsorted(self.slice_ends, np.arange(lo, lo + len(values)), side="right")
        finite = np.isfinite(values)
        for s in np.unique(bounds):
            self.slices[s].add(values[(bounds == s) & finite])

    def _largest_absent(self, w: np.ndarray, c: np.ndarray, n_windows: int) -> np.ndarray:
        """Per window, the largest share of a source with no row in it (0 when every source has one)."""
        rank = self.rank_of[c]  # sources ranked by share, largest first
        order = np.lexsort((rank, w))
        w, rank = w[order], rank[order]
        starts = np.flatnonzero(np.r_[True, w[1:] != w[:-1]])
        pos = np.arange(len(w)) - np.repeat(starts, np.diff(np.r_[starts, len(w)]))
        first_gap = np.full(n_windows, -1, np.int64)  # the smallest rank missing from each window
        gaps = np.flatnonzero(rank != pos)
        uniq, at = np.unique(w[gaps], return_index=True)
        first_gap[uniq] = pos[gaps[at]]
        seen = np.bincount(w, minlength=n_windows)
        first_gap = np.where(first_gap >= 0, first_gap, seen)  # no gap: the first rank after those present
        shares = np.r_[self.overall[self.by_share], 0.0]
        return shares[np.minimum(first_gap, len(self.by_share))]

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
