"""Hashed unigram+bigram features: bucket ids for models, list columns for spills, and model files.

Layout used everywhere (spills, models, scoring): a document with ``n`` kept tokens has
``n`` unigram bucket ids followed by ``n - 1`` bigram bucket ids, so the token-aligned
sequences can be recovered from a spilled list (``split_spilled``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
from numba import njit

from winnow.curate.errors import StageError
from winnow.curate.stages.scores.tokens import HASH_VERSION, TokenHashes


def bucket_features(th: TokenHashes, buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """(doc int64 [F], bucket int64 [F]): every token's unigram bucket, then every bigram bucket."""
    b = np.uint64(buckets)
    mask = th.has_prev()
    doc = th.doc_index()
    ids = np.concatenate([th.uni % b, th.bi[mask] % b]).astype(np.int64)
    return np.concatenate([doc, doc[mask]]), ids


def features_csr(th: TokenHashes, buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """(indptr int64 [D+1], bucket int64 [F]) grouped by document, in the layout of this module."""
    return _features_csr(th.indptr, th.uni, th.bi, np.uint64(buckets))


@njit(cache=True, nogil=True)
def _features_csr(tok_indptr, uni, bi, buckets):
    n_docs = tok_indptr.shape[0] - 1
    indptr = np.zeros(n_docs + 1, dtype=np.int64)
    for d in range(n_docs):
        n = tok_indptr[d + 1] - tok_indptr[d]
        indptr[d + 1] = indptr[d] + n + max(n - 1, 0)
    ids = np.empty(indptr[n_docs], dtype=np.int64)
    for d in range(n_docs):
        lo, n, at = tok_indptr[d], tok_indptr[d + 1] - tok_indptr[d], indptr[d]
        for j in range(n):
            ids[at + j] = np.int64(uni[lo + j] % buckets)
        for j in range(1, n):
            ids[at + n + j - 1] = np.int64(bi[lo + j] % buckets)
    return indptr, ids


def token_buckets(th: TokenHashes, buckets: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Token-aligned (doc [T], unigram bucket [T], bigram bucket or -1 [T]): ``split_spilled`` of
    ``features_csr``, without the spill layout in between."""
    b = np.uint64(buckets)
    bi = (th.bi % b).astype(np.int64)
    bi[~th.has_prev()] = -1
    return th.doc_index(), (th.uni % b).astype(np.int64), bi


def features_column(th: TokenHashes, buckets: int, *, name: str = "feats") -> pl.Series:
    """A ``List(UInt32)`` Series of each document's bucket ids, for a barrier's spill."""
    indptr, ids = features_csr(th, buckets)
    arr = pa.LargeListArray.from_arrays(pa.array(indptr), pa.array(ids.astype(np.uint32)))
    return pl.Series(name, arr)


def list_csr(column: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """(indptr int64 [N+1] starting at 0, values int32) of a ``List(UInt32)`` Series of bucket ids (nulls as empty)."""
    arr = column.fill_null([]).to_arrow()
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    arr = arr.cast(pa.large_list(pa.uint32()))
    offsets = np.asarray(arr.offsets, dtype=np.int64)
    # Bucket ids are < 2**31 (configs check it): int32 halves the memory of training samples.
    values = np.asarray(arr.values, dtype=np.uint32)[offsets[0] : offsets[-1]].view(np.int32)
    return offsets - offsets[0], values


def split_spilled(indptr: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Token-aligned (doc [T], unigram [T], bigram-or--1 [T]) from spilled lists in this module's layout."""
    return _split_spilled(indptr, values)


@njit(cache=True, nogil=True)
def _split_spilled(indptr, values):
    n_docs = indptr.shape[0] - 1
    total = 0
    for d in range(n_docs):
        total += (indptr[d + 1] - indptr[d] + 1) // 2  # n unigrams + (n - 1) bigrams
    doc = np.empty(total, dtype=np.int64)
    uni = np.empty(total, dtype=values.dtype)
    bi = np.full(total, -1, dtype=np.int64)
    t = 0
    for d in range(n_docs):
        lo = indptr[d]
        n = (indptr[d + 1] - lo + 1) // 2
        for j in range(n):
            doc[t + j] = d
            uni[t + j] = values[lo + j]
            if j > 0:
                bi[t + j] = values[lo + n + j - 1]
        t += n
    return doc, uni, bi


def iter_spill(keys: pl.LazyFrame, columns: list[str], *, chunk_size: int = 8192) -> Iterator[pl.DataFrame]:
    """Stream a barrier's spilled keys in bounded chunks (never the whole pool in memory)."""
    yield from keys.select(columns).collect_batches(chunk_size=chunk_size)


def save_model(path: Path, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """Write a model (arrays + JSON metadata, including the hash version) as one ``.npz`` file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    meta = {**meta, "hash_version": HASH_VERSION}
    np.savez(tmp, __meta__=np.array(json.dumps(meta, sort_keys=True)), **arrays)
    tmp.replace(path)  # atomic: a crashed plan leaves no half-written model behind


def load_model(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Read a model written by ``save_model``; refuses one hashed with another tokenizer version.

    Every task of a job reads the same model: a process keeps the last few it read (by path, size and
    modification time), with their arrays read-only.
    """
    try:
        stat = path.stat()
    except FileNotFoundError as err:
        raise StageError(f"model file {path} is missing; the stage's plan step must run before apply") from err
    arrays, meta = _read_model(str(path), stat.st_size, stat.st_mtime_ns)
    if meta.get("hash_version") != HASH_VERSION:
        raise StageError(
            f"model {path} was built with token hash version {meta.get('hash_version')}, this winnow uses "
            f"{HASH_VERSION}; re-run the job's plan for this stage"
        )
    return dict(arrays), dict(meta)


@functools.lru_cache(maxsize=4)
def _read_model(path: str, size: int, mtime_ns: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files if k != "__meta__"}
        meta = json.loads(str(z["__meta__"]))
    for array in arrays.values():
        array.flags.writeable = False
    return arrays, meta


def sample_cdf(sorted_quantiles: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Mid-rank CDF of ``x`` against stored pool quantiles, in [0, 1] (ties land in the middle)."""
    q = sorted_quantiles
    if q.shape[0] == 0:
        return np.full(x.shape, 0.5)
    lo = np.searchsorted(q, x, side="left")
    hi = np.searchsorted(q, x, side="right")
    return (lo + hi) / (2.0 * q.shape[0])


def check_positive_int(name: str, value: int, *, low: int = 1, high: int = 2**31 - 1) -> None:
    """Raise ``ConfigError`` naming ``name`` unless ``low <= value <= high``."""
    from winnow.curate.errors import ConfigError

    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{name} must be an integer in [{low}, {high}], got {value!r}")


def check_column(name: str) -> None:
    """Raise ``ConfigError`` unless ``name`` may hold a Float64 score."""
    from winnow.curate.errors import ConfigError
    from winnow.curate.schema import CORE_COLUMNS, OPTIONAL_COLUMNS

    if not name or name in CORE_COLUMNS:
        raise ConfigError(f"column must be a new, non-empty column name, got {name!r}")
    if name.startswith("_"):  # stages' internal columns (_count, _tokens, ...)
        raise ConfigError(f"column {name!r} starts with '_', which winnow reserves for its internal columns")
    if name in OPTIONAL_COLUMNS and OPTIONAL_COLUMNS[name] != pl.Float64:
        raise ConfigError(f"column {name!r} is reserved for {OPTIONAL_COLUMNS[name]} values; choose another name")
