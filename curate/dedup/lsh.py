"""LSH banding: choosing bands x rows, and turning band keys into candidate pairs by sorting.

Candidate pairs come from one band at a time: the band's keys (one uint64 per document) are
sorted with polars together with the document index, and every document in a run of equal
keys is paired with the run's first document and with its predecessor. That is linear in
the run length (an all-identical corpus gives 2 pairs per document per band, not n**2), and
the star plus chain keeps each run connected even when the exact check rejects some pairs.
Pairs are packed as ``a << 32 | b`` (``a < b``) and kept sorted and unique across bands.
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import polars as pl

from winnow.curate.dedup.jit import njit
from winnow.curate.errors import ConfigError


@functools.lru_cache(maxsize=64)
def choose_bands(threshold: float, num_perm: int, *, fp_weight: float = 0.5, fn_weight: float = 0.5) -> tuple[int, int]:
    """``(bands, rows)`` minimizing the weighted false-positive and false-negative areas at ``threshold``.

    The search of datasketch's ``_optimal_param`` (every split with ``bands * rows <= num_perm``,
    the first strict minimum in ``bands``-then-``rows`` order), with the areas integrated by
    Gauss-Legendre quadrature: the integrands are polynomials of degree ``bands * rows <=
    num_perm``, which ``num_perm // 2 + 1`` nodes integrate exactly. Vectorized over all splits,
    it costs milliseconds and no scipy import (which cost each worker 2.5 s and 40 MB).
    """
    if not 0.0 < threshold < 1.0:
        raise ConfigError(f"LSH threshold must be in (0, 1), got {threshold}")
    splits = np.array([(b, r) for b in range(1, num_perm + 1) for r in range(1, num_perm // b + 1)], dtype=np.float64)
    x, w = np.polynomial.legendre.leggauss(num_perm // 2 + 1)
    b, r = splits[:, :1], splits[:, 1:]

    def area(lo: float, hi: float, false_negative: bool) -> np.ndarray:
        s = (hi - lo) / 2 * x + (hi + lo) / 2
        miss = (1.0 - s**r) ** b  # probability of no shared band
        return ((miss if false_negative else 1.0 - miss) @ w) * (hi - lo) / 2

    error = area(0.0, threshold, False) * fp_weight + area(threshold, 1.0, True) * fn_weight
    bands, rows = splits[int(np.argmin(error))]
    return int(bands), int(rows)


def candidate_probability(similarity: float | np.ndarray, bands: int, rows: int):
    """Probability that two documents of Jaccard ``similarity`` share at least one band."""
    return 1.0 - (1.0 - np.asarray(similarity, dtype=np.float64) ** rows) ** bands


@njit(cache=True, nogil=True)
def _run_pairs(keys, docs):
    n = keys.shape[0]
    out = np.empty(2 * n, dtype=np.uint64)
    m = 0
    first = 0
    for i in range(1, n):
        if keys[i] != keys[i - 1]:
            first = i
            continue
        out[m] = (np.uint64(docs[first]) << np.uint64(32)) | np.uint64(docs[i])
        m += 1
        if i - 1 != first:
            out[m] = (np.uint64(docs[i - 1]) << np.uint64(32)) | np.uint64(docs[i])
            m += 1
    return out[:m]


def band_pairs(keys: np.ndarray, docs: np.ndarray) -> np.ndarray:
    """Sorted unique packed pairs of documents sharing a key (``keys`` uint64, ``docs`` uint32, aligned)."""
    frame = pl.DataFrame({"k": keys, "d": docs}).sort("k", "d")
    pairs = _run_pairs(frame["k"].to_numpy(), frame["d"].to_numpy())
    return np.unique(pairs)


def lsh_pairs(
    keys: pl.LazyFrame, band_columns: list[str], docs: np.ndarray, usable: np.ndarray, *, threads: int = 1
) -> np.ndarray:
    """Candidate pairs over every band column of ``keys`` (read in one pass: 8 bytes per document and band).

    ``docs`` are the document indices of ``keys``' rows, ``usable`` masks out rows that must
    never pair (documents without shingles). With ``threads``, each thread takes every
    ``threads``-th band (the sorts and kernels release the GIL); the pairs are the same.
    """
    frame = keys.select(band_columns).collect()
    bands = [frame[column].to_numpy()[usable] for column in band_columns]  # here: threads never share a Series
    del frame
    docs = docs[usable]

    def pairs_of(chosen: list[np.ndarray]) -> np.ndarray:
        pairs = np.zeros(0, dtype=np.uint64)
        for band in chosen:
            found = band_pairs(band, docs)
            pairs = merge_unique(pairs, found) if len(pairs) else found
        return pairs

    ways = max(1, min(threads, len(bands)))
    if ways == 1:
        return pairs_of(bands)
    with ThreadPoolExecutor(ways) as pool:
        return functools.reduce(merge_unique, pool.map(pairs_of, [bands[i::ways] for i in range(ways)]))


@njit(cache=True, nogil=True)
def merge_unique(a, b):
    """The sorted union of two sorted unique uint64 arrays, by one merge (``np.union1d`` sorts them again)."""
    out = np.empty(a.shape[0] + b.shape[0], dtype=np.uint64)
    i = j = m = 0
    while i < a.shape[0] and j < b.shape[0]:
        x, y = a[i], b[j]
        out[m] = min(x, y)
        i += x <= y
        j += y <= x
        m += 1
    rest_a, rest_b = a.shape[0] - i, b.shape[0] - j  # one of them is 0
    out[m : m + rest_a] = a[i:]
    out[m + rest_a : m + rest_a + rest_b] = b[j:]
    return out[: m + rest_a + rest_b]


def unpack_pairs(pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(a, b)`` uint32 document indices of packed pairs."""
    return (pairs >> np.uint64(32)).astype(np.uint32), (pairs & np.uint64(0xFFFFFFFF)).astype(np.uint32)
