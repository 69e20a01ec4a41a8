"""Interleaving sources so every window of the reading order keeps the mixture's shares.

Each source arrives already in its own curriculum order. The k-th row of a source with
n rows is given the fractional position (k + 0.5) / n and all rows are merged by that
position (ties to the lower source index), so after any prefix of p rows each source has
contributed within one row of p times its share; a window of W rows is then within 2/W
of every share. Each source thus follows its own easy-to-hard curve at the same pace
(difficulty is compared within a source, where the scorer's scale means the same thing).

The merge needs no sort: a row's global position is its rank in its own source plus, for
every other source, how many of that source's positions precede it, which is a closed
form in integers (exact, no float ties), so it costs O(rows x sources) and 8 bytes a row.
"""

from __future__ import annotations

import numpy as np
from numba import njit

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


def interleave(sequence: np.ndarray, sizes: list[int]) -> np.ndarray:
    """Merge per-source reading orders, stored back to back in ``sequence`` (source g has
    ``sizes[g]`` rows), so every prefix keeps each source's share."""
    out = np.empty_like(sequence)
    start = 0
    for g, n in enumerate(sizes):
        if n == 0:
            continue
        k = np.arange(n, dtype=np.int64)
        position = k.copy()
        for r, n_other in enumerate(sizes):
            if r != g and n_other:
                position += _preceding(k, n, n_other, other_first=r < g)
        out[position] = sequence[start : start + n]
        start += n
    return out


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


def window_counts(codes_in_order: np.ndarray, n_groups: int, window: int) -> np.ndarray:
    """Rows of each group in each window of the reading order, shape (windows, groups)."""
    n = len(codes_in_order)
    n_windows = -(-n // window)
    flat = (np.arange(n, dtype=np.int64) // window) * n_groups + codes_in_order
    return np.bincount(flat, minlength=n_windows * n_groups).reshape(n_windows, n_groups)
