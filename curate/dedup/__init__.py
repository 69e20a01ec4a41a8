"""Deduplication: the ``dedup.exact`` and ``dedup.minhash`` stages, and a small API without a job file.

Example::

    from winnow.curate.dedup import duplicate_clusters, minhash_signatures
    sigs = minhash_signatures(["a b c d e f", "a b c d e g"])   # uint64 [2, 128]
    duplicate_clusters(texts, threshold=0.8)                    # [[0, 7, 9], [3, 4], ...]
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import polars as pl

from winnow.curate.dedup.clusters import connected_components
from winnow.curate.dedup.lsh import unpack_pairs
from winnow.curate.dedup.minhash import MinHashConfig, minhash_keys, near_duplicate_pairs, text_buffers
from winnow.curate.dedup.signatures import sketch_buffers


def _as_series(texts: Iterable[str] | pl.Series) -> pl.Series:
    return texts.cast(pl.String) if isinstance(texts, pl.Series) else pl.Series("text", list(texts), dtype=pl.String)


def minhash_signatures(
    texts: Iterable[str] | pl.Series,
    *,
    ngram: int = 5,
    num_perm: int = 128,
    scheme: str = "oph",
    shingle: str = "words",
    normalize: str = "words",
    seed: int = 1,
) -> np.ndarray:
    """MinHash signatures (uint64 ``[len(texts), num_perm]``) of ``texts``, computed batch-wide.

    The share of equal slots between two rows estimates the Jaccard similarity of their
    shingle sets. Documents without a word get all slots at the uint64 maximum.
    """
    # Validated like the stage's options (bands/rows given so that no LSH search runs).
    config = MinHashConfig(
        ngram=ngram, num_perm=num_perm, scheme=scheme, shingle=shingle, normalize=normalize, seed=seed, bands=1, rows=1
    )
    offsets, data, tables, alt = text_buffers(_as_series(texts), config)
    sketch = sketch_buffers(
        offsets, data, ngram=ngram, chars=shingle == "chars", num_perm=num_perm, scheme=scheme, seed=seed,
        bands=1, rows=1, want_signatures=True, want_sets=False, tables=tables, alt=alt,
    )  # fmt: skip
    return sketch.signatures


def duplicate_clusters(texts: Iterable[str] | pl.Series, *, threshold: float = 0.8, **options) -> list[list[int]]:
    """Clusters of near-duplicate ``texts`` (positions, each cluster ascending, clusters by first member).

    ``options`` are ``dedup.minhash``'s (``ngram``, ``num_perm``, ``scheme``, ``verify``...);
    the pipeline stage would keep the first position of each cluster and drop the rest.
    """
    config = MinHashConfig(threshold=threshold, **options)
    series = _as_series(texts)
    keys = minhash_keys(series, config, with_sets=config.verify != "none")
    usable = keys["_nsh"].to_numpy() > 0
    pairs, _ = near_duplicate_pairs(keys.lazy(), len(series), usable, config)
    labels = connected_components(len(series), *unpack_pairs(pairs))
    order = np.argsort(labels, kind="stable")
    groups = np.split(order, np.flatnonzero(np.diff(labels[order])) + 1) if len(order) else []
    return [g.tolist() for g in groups if len(g) > 1]


__all__ = ["duplicate_clusters", "minhash_signatures", "MinHashConfig"]
