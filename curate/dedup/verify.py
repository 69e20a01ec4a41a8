"""Exact Jaccard check of LSH candidate pairs against the spilled shingle sets.

The sets live in the spill's ``_shingles`` column: one binary value per document holding
its shingles' 32-bit hashes (little-endian uint32, in text order, possibly repeated). Binary,
not ``list<uint32>``: Parquet then hashes one value per document for its dictionary instead
of one per shingle, which made writing the spill 20x cheaper. Sets are sorted and made unique
here, for the documents a candidate pair needs only.
Pairs are checked ``chunk_pairs`` at a time and only the documents a chunk needs are read
(a filtered scan of that one column), so memory is bounded by the chunk, not the corpus.
A job's plan does not read per chunk: ``curate.dedup.routing`` hands every verification bucket
its documents' values in one pass over each column (``read_window`` is the one read of the spill).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import polars as pl
import pyarrow as pa

from winnow.curate.dedup.clusters import pair_jaccard
from winnow.curate.dedup.jit import njit
from winnow.curate.dedup.lsh import unpack_pairs
from winnow.curate.dedup.text import large_buffers

log = logging.getLogger(__name__)

SETS_COLUMN = "_shingles"


def pack_sets(offsets: np.ndarray, values: np.ndarray) -> pa.Array:
    """The ``_shingles`` column: document ``i``'s values ``values[offsets[i]:offsets[i+1]]`` as one binary value."""
    data = np.ascontiguousarray(values, dtype="<u4")
    byte_offsets = np.asarray(offsets, dtype=np.int64) * 4
    return pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), len(offsets) - 1, [None, pa.py_buffer(byte_offsets), pa.py_buffer(data)]
    )


def unpack_sets(column: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets int64[n+1], values uint32)`` of a ``_shingles`` column (inverse of ``pack_sets``)."""
    offsets, data_buf = large_buffers(column, pa.large_binary())
    data = (
        np.frombuffer(data_buf, dtype="<u4")
        if data_buf is not None and len(data_buf) >= 4
        else np.zeros(0, dtype=np.uint32)
    )
    return offsets // 4, data


_RADIX_MIN = 64  # sets at least this long are sorted by radix (6x numba's np.sort on long documents)


@njit(cache=True, nogil=True)
def _radix_sort_u32(a, b):
    """Sort ``a`` (uint32) in place by four 8-bit LSD passes, ``b`` scratch of the same length."""
    n = a.shape[0]
    counts = np.zeros(257, dtype=np.int64)
    src, dst = a, b
    for shift in (0, 8, 16, 24):
        counts[:] = 0
        for i in range(n):
            counts[((src[i] >> shift) & 255) + 1] += 1
        for j in range(256):
            counts[j + 1] += counts[j]
        for i in range(n):
            d = (src[i] >> shift) & 255
            dst[counts[d]] = src[i]
            counts[d] += 1
        src, dst = dst, src  # after four passes the sorted values are back in ``a``


@njit(cache=True, nogil=True)
def sort_unique_into(offsets, values, out, out_offsets, cursor):
    """Each document's values sorted and unique (as ``pair_jaccard`` reads them), written to ``out`` from ``cursor``.

    Returns the new cursor; ``out_offsets[i + 1]`` is set to where document ``i`` ends in ``out``,
    which must have room for ``offsets[-1] - offsets[0]`` more values (a set only shrinks).
    """
    n = offsets.shape[0] - 1
    longest = 0
    for i in range(n):
        longest = max(longest, offsets[i + 1] - offsets[i])
    part = np.empty(longest, dtype=np.uint32)
    scratch = np.empty(longest, dtype=np.uint32)
    for i in range(n):
        lo, hi = offsets[i], offsets[i + 1]
        m = hi - lo
        if m == 0:
            out_offsets[i + 1] = cursor
            continue
        if m >= _RADIX_MIN:
            part[:m] = values[lo:hi]
            _radix_sort_u32(part[:m], scratch[:m])
        else:
            part[:m] = np.sort(values[lo:hi])
        out[cursor] = part[0]
        cursor += 1
        for j in range(1, m):
            if part[j] != part[j - 1]:
                out[cursor] = part[j]
                cursor += 1
        out_offsets[i + 1] = cursor
    return cursor


SIG8_COLUMN = "_sig8"


def pack_sig8(sig8: np.ndarray) -> pa.Array:
    """The ``_sig8`` column: each row's ``num_perm`` low signature bytes as one binary value."""
    n, k = sig8.shape
    offsets = np.arange(n + 1, dtype=np.int64) * k
    return pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(sig8))]
    )


def read_window(
    keys: pl.LazyFrame, column: str, lo: int, window_rows: int, positions: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets, bytes)`` of the binary ``column``'s values at rows ``lo + positions`` of the window ``[lo, lo + window_rows)``.

    Every read of the spill goes through here. Only the picked rows are converted to Arrow
    (gathered first, so the rest of the window is never copied); offsets start at 0.
    """
    window = keys.select(column).slice(lo, window_rows).collect()[column]
    part = window.gather(pl.Series(positions, dtype=pl.UInt32)).to_arrow()
    del window
    part_offsets, data_buf = large_buffers(part, pa.large_binary())
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, dtype=np.uint8)
    return part_offsets - part_offsets[0], data[part_offsets[0] : part_offsets[-1]]


def _windows(
    keys: pl.LazyFrame, column: str, need: np.ndarray, window_rows: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(offsets, bytes)`` of the binary ``column``'s values at rows ``need`` (ascending), one read window at a time."""
    if len(need) == 0:
        return
    first = int(need[0]) // window_rows * window_rows
    for lo in range(first, int(need[-1]) + 1, window_rows):
        picked = need[np.searchsorted(need, lo) : np.searchsorted(need, lo + window_rows)]
        if len(picked):
            yield read_window(keys, column, lo, window_rows, picked - lo)


def read_rows(keys: pl.LazyFrame, column: str, need: np.ndarray, window_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets, bytes)`` of the binary ``column``'s values at rows ``need`` (ascending), ``window_rows`` rows at a time.

    Memory holds one window plus the rows taken, never the whole column.
    """
    offsets, values, total = [np.zeros(1, dtype=np.int64)], [], 0
    for part_offsets, data in _windows(keys, column, need, window_rows):
        offsets.append(part_offsets[1:] + total)
        values.append(data)
        total += int(part_offsets[-1])
    return np.concatenate(offsets), np.concatenate(values) if values else np.zeros(0, dtype=np.uint8)


def read_sets(
    keys: pl.LazyFrame, need: np.ndarray, window_rows: int, *, threads: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique shingle sets ``(offsets, values)`` of rows ``need`` (ascending).

    Each window's sets are sorted straight into one output buffer, sized by the rows' shingle
    counts (a set holds at most ``_nsh`` values; pages past the unique values are never
    touched), so the raw sets are never held all at once next to the sorted ones. With
    ``threads``, each window's rows are sorted in that many runs of about equal size at once.
    """
    counts = keys.select("_nsh").collect()["_nsh"].to_numpy()[need] if len(need) else np.zeros(0, dtype=np.uint32)
    out = np.empty(int(counts.sum(dtype=np.int64)), dtype=np.uint32)
    out_offsets = np.zeros(len(need) + 1, dtype=np.int64)
    done = cursor = 0
    with ThreadPoolExecutor(max(1, threads)) as pool:
        for part_offsets, data in _windows(keys, SETS_COLUMN, need, window_rows):
            values = data.view("<u4") if len(data) else np.zeros(0, dtype=np.uint32)
            if (
                len(values) > len(out) - cursor
            ):  # never with this module's spills (_nsh counts every value); grow, not overrun
                grown = np.empty(cursor + len(values), dtype=np.uint32)
                grown[:cursor] = out[:cursor]
                out = grown
            n = len(part_offsets) - 1
            cursor = _sort_unique_runs(
                part_offsets // 4, values, out, out_offsets[done : done + n + 1], cursor, pool, threads
            )
            done += n
    return out_offsets, out[:cursor]


def _sort_unique_runs(offsets, values, out, out_offsets, cursor, pool, runs: int) -> int:
    """``sort_unique_into`` in up to ``runs`` runs of rows at once, each writing where its raw values would start
    (a set only shrinks), then moved together: the same ``out`` and ``out_offsets``; returns the new cursor."""
    n = len(offsets) - 1
    cuts = np.unique(np.searchsorted(offsets, np.linspace(offsets[0], offsets[-1], max(1, runs) + 1)[1:-1]))
    bounds = [0, *(int(c) for c in cuts if 0 < c < n), n]
    if len(bounds) == 2:
        return sort_unique_into(offsets, values, out, out_offsets, cursor)

    starts = [cursor + int(offsets[lo] - offsets[0]) for lo in bounds[:-1]]

    def run(k: int) -> int:
        lo, hi = bounds[k], bounds[k + 1]
        return sort_unique_into(offsets[lo : hi + 1], values, out, out_offsets[lo : hi + 1], starts[k])

    for k, end in enumerate(pool.map(run, range(len(bounds) - 1))):
        lo, hi, start = bounds[k], bounds[k + 1], starts[k]
        shift = start - cursor  # how far right of the previous run's end this run wrote
        if shift:
            out[cursor : end - shift] = out[start:end]
            out_offsets[lo + 1 : hi + 1] -= shift
        cursor = end - shift
    return cursor


@njit(cache=True, nogil=True)
def sig8_similarity(a_pos, b_pos, sigs):
    """Share of equal 8-bit slots of each pair's rows ``sigs[a_pos[t]]``, ``sigs[b_pos[t]]`` (the screening estimate)."""
    out = np.empty(a_pos.shape[0], dtype=np.float64)
    k = sigs.shape[1]
    for t in range(a_pos.shape[0]):
        same = 0
        for p in range(k):
            same += sigs[a_pos[t], p] == sigs[b_pos[t], p]
        out[t] = same / k
    return out


def screen_margin(threshold: float, num_perm: int) -> float:
    """How far below ``threshold`` a pair's 8-bit signature estimate may fall and still be checked exactly.

    Seven standard deviations of the estimate at the threshold (``sqrt(t (1 - t) / k)``): a pair
    at the threshold falls further below with probability ~1e-12, so screening loses no
    duplicate in practice; most LSH candidates of a loose search are far below and go.
    """
    return 7.0 * float(np.sqrt(threshold * (1.0 - threshold) / num_perm))


def screen_pairs(keys: pl.LazyFrame, pairs: np.ndarray, *, threshold: float, window_rows: int) -> np.ndarray:
    """The candidate pairs whose signature estimate (equal low bytes of the slots) is within ``screen_margin``.

    Collisions of 8-bit values add ``(1 - J) / 256`` to the estimate, which only lets more pairs through.
    """
    if len(pairs) == 0 or SIG8_COLUMN not in keys.collect_schema().names():
        return pairs
    a, b = unpack_pairs(pairs)
    need = np.unique(np.concatenate([a, b]))
    offsets, data = read_rows(keys, SIG8_COLUMN, need, window_rows)
    k = int(offsets[1] - offsets[0])
    estimate = sig8_similarity(np.searchsorted(need, a), np.searchsorted(need, b), data.reshape(len(need), k))
    return pairs[estimate >= threshold - screen_margin(threshold, k)]


def _chunk_similarity(keys: pl.LazyFrame, pairs: np.ndarray, window_rows: int) -> np.ndarray:
    a, b = unpack_pairs(pairs)
    need = np.unique(np.concatenate([a, b]))
    offsets, values = read_sets(keys, need, window_rows)
    if len(offsets) != len(need) + 1:
        raise AssertionError(f"spill returned {len(offsets) - 1} shingle sets for {len(need)} documents")
    return pair_jaccard(np.searchsorted(need, a), np.searchsorted(need, b), offsets, values)


def pair_similarities(
    keys: pl.LazyFrame, pairs: np.ndarray, *, chunk_pairs: int, window_rows: int = 1 << 13
) -> np.ndarray:
    """Exact Jaccard (on 32-bit shingle hashes) of every packed pair, in chunks."""
    out = np.empty(len(pairs), dtype=np.float64)
    for lo in range(0, len(pairs), chunk_pairs):
        out[lo : lo + chunk_pairs] = _chunk_similarity(keys, pairs[lo : lo + chunk_pairs], window_rows)
    return out


def verify_pairs(
    keys: pl.LazyFrame, pairs: np.ndarray, *, threshold: float, chunk_pairs: int, window_rows: int = 1 << 13
) -> np.ndarray:
    """The candidate pairs whose exact Jaccard reaches ``threshold`` (screened by the signature estimate first)."""
    if len(pairs) == 0:
        return pairs
    screened = screen_pairs(keys, pairs, threshold=threshold, window_rows=window_rows)
    similarity = pair_similarities(keys, screened, chunk_pairs=chunk_pairs, window_rows=window_rows)
    kept = screened[similarity >= threshold]
    log.info(
        "verified %d of %d candidate pairs (%d screened in) at Jaccard >= %.2f",
        len(kept),
        len(pairs),
        len(screened),
        threshold,
    )
    return kept


def sampled_false_positive_rate(
    keys: pl.LazyFrame, pairs: np.ndarray, *, threshold: float, sample: int, seed: int, chunk_pairs: int
) -> tuple[int, float | None]:
    """``(pairs checked, share of them below threshold)`` over a seeded sample of the candidates."""
    if len(pairs) == 0:
        return 0, None
    rng = np.random.default_rng(seed)
    picked = np.sort(rng.choice(len(pairs), size=min(sample, len(pairs)), replace=False))
    similarity = pair_similarities(keys, pairs[picked], chunk_pairs=chunk_pairs)  # unscreened: the LSH's own rate
    return len(picked), float(np.mean(similarity < threshold))
