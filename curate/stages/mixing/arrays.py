"""Array helpers shared by the plans: multi-key sorts and grouping rows by source."""

from __future__ import annotations

import numpy as np
import polars as pl


def argsort_by(*keys: np.ndarray) -> np.ndarray:
    """Indices sorting by ``keys[0]``, ties by ``keys[1]``, ...; stable.

    polars' multi-column arg-sort is multithreaded and measured several times faster here
    than ``np.lexsort`` on float keys of a few million rows.
    """
    frame = pl.DataFrame({f"k{i}": k for i, k in enumerate(keys)})
    return frame.select(pl.arg_sort_by(frame.columns, maintain_order=True)).to_series().to_numpy()


def group_indices(codes: np.ndarray, n_groups: int) -> list[np.ndarray]:
    """Row indices of each group ``0..n_groups-1``, each in row order."""
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(n_groups + 1))
    return [order[bounds[g] : bounds[g + 1]] for g in range(n_groups)]
