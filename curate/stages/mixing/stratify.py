"""Interleaving sources so every window of the reading order keeps the mixture's shares.

Each source arrives already in its own curriculum order. The k-th row of a source with
n rows is given the fractional position (k + 0.5) / n and all rows are merged by that
position, so after any prefix of p rows each source has contributed within one row of
p times its share; a window of W rows is then within 2/W of every share. Each source
thus follows its own easy-to-hard curve at the same pace (difficulty is compared within
a source, where the scorer's scale means the same thing).
"""

from __future__ import annotations

import numpy as np

from curate.stages.mixing.arrays import argsort_by


def interleave(groups: list[np.ndarray]) -> np.ndarray:
    """Merge per-source reading orders (arrays of row indices) keeping shares in every prefix."""
    sizes = [len(g) for g in groups]
    if sum(sizes) == 0:
        return np.zeros(0, dtype=np.int64)
    position = np.concatenate([(np.arange(n, dtype=np.float64) + 0.5) / n for n in sizes if n])
    group = np.concatenate([np.full(n, g, dtype=np.int32) for g, n in enumerate(sizes) if n])
    rows = np.concatenate([g for g in groups if len(g)])
    return rows[argsort_by(position, group)]


def shuffle_windows(sequence: np.ndarray, key: np.ndarray, window: int) -> np.ndarray:
    """Shuffle ``sequence`` inside each window of ``window`` positions by the per-row ``key``."""
    win = np.arange(len(sequence), dtype=np.int64) // window
    return sequence[argsort_by(win, key[sequence])]


def window_counts(codes_in_order: np.ndarray, n_groups: int, window: int) -> np.ndarray:
    """Rows of each group in each window of the reading order, shape (windows, groups)."""
    n = len(codes_in_order)
    n_windows = -(-n // window)
    flat = (np.arange(n, dtype=np.int64) // window) * n_groups + codes_in_order
    return np.bincount(flat, minlength=n_windows * n_groups).reshape(n_windows, n_groups)
