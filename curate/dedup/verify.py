"""Exact Jaccard check of LSH candidate pairs against the spilled shingle sets.

The sets live in the spill's ``_shingles`` column (sorted unique uint32 per document).
Pairs are checked ``chunk_pairs`` at a time and only the documents a chunk needs are read
(a filtered scan of that one column), so memory is bounded by the chunk, not the corpus.
"""

from __future__ import annotations

import logging

import numpy as np
import polars as pl

from curate.dedup.clusters import pair_jaccard
from curate.dedup.lsh import unpack_pairs

log = logging.getLogger(__name__)

SETS_COLUMN = "_shingles"


def _chunk_similarity(keys: pl.LazyFrame, pairs: np.ndarray) -> np.ndarray:
    a, b = unpack_pairs(pairs)
    need = np.unique(np.concatenate([a, b]))
    sets = (
        keys.select(SETS_COLUMN)
        .with_row_index("_doc")
        .filter(pl.col("_doc").is_in(pl.Series(need, dtype=pl.UInt32).implode()))
        .collect()
    )
    if sets.height != len(need):
        raise AssertionError(f"spill returned {sets.height} shingle sets for {len(need)} documents")
    column = sets[SETS_COLUMN].to_arrow()
    if hasattr(column, "combine_chunks"):
        column = column.combine_chunks()
    offsets = np.asarray(column.offsets, dtype=np.int64)
    values = np.asarray(column.values, dtype=np.uint32)
    return pair_jaccard(np.searchsorted(need, a), np.searchsorted(need, b), offsets, values)


def pair_similarities(keys: pl.LazyFrame, pairs: np.ndarray, *, chunk_pairs: int) -> np.ndarray:
    """Exact Jaccard (on 32-bit shingle hashes) of every packed pair, in chunks."""
    out = np.empty(len(pairs), dtype=np.float64)
    for lo in range(0, len(pairs), chunk_pairs):
        out[lo : lo + chunk_pairs] = _chunk_similarity(keys, pairs[lo : lo + chunk_pairs])
    return out


def verify_pairs(keys: pl.LazyFrame, pairs: np.ndarray, *, threshold: float, chunk_pairs: int) -> np.ndarray:
    """The candidate pairs whose exact Jaccard reaches ``threshold``."""
    if len(pairs) == 0:
        return pairs
    similarity = pair_similarities(keys, pairs, chunk_pairs=chunk_pairs)
    kept = pairs[similarity >= threshold]
    log.info("verified %d of %d candidate pairs at Jaccard >= %.2f", len(kept), len(pairs), threshold)
    return kept


def sampled_false_positive_rate(
    keys: pl.LazyFrame, pairs: np.ndarray, *, threshold: float, sample: int, seed: int, chunk_pairs: int
) -> tuple[int, float | None]:
    """``(pairs checked, share of them below threshold)`` over a seeded sample of the candidates."""
    if len(pairs) == 0:
        return 0, None
    rng = np.random.default_rng(seed)
    picked = np.sort(rng.choice(len(pairs), size=min(sample, len(pairs)), replace=False))
    similarity = pair_similarities(keys, pairs[picked], chunk_pairs=chunk_pairs)
    return len(picked), float(np.mean(similarity < threshold))
