"""Handing each verification bucket the spilled values it needs, in one pass over the spill.

A bucket of candidate pairs (``curate.dedup.grouping``) needs the values of the documents on
its pairs (their 8-bit signatures to screen them, then their shingle sets to verify them), and
those documents lie anywhere in the spill. Read bucket by bucket, each bucket scanned the whole
column: at 10M documents and ``memory_gb = 0.5``, 22 scans of the shingle sets, and the plan
took 40x its 1M time. Here each bucket first states the documents it needs (``need``); then
``route`` reads the column once, in row order and in windows, and appends every needed value
to the file of each bucket that needs it; a bucket then reads only its own file (``read``).

While routing, the needs of all buckets are held as sorted ``doc << 32 | bucket`` keys
(``budget.NEED_BYTES`` each). Should they outgrow ``memory_gb``, consecutive buckets are routed
in rounds, one pass each: the column is read once until there are ~30M needs per GB of budget.
The files hold each value once per bucket that needs it, i.e. what the buckets hold anyway.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from winnow.curate.dedup.budget import GB, NEED_BYTES
from winnow.curate.dedup.jit import njit
from winnow.curate.dedup.verify import read_window

# (offsets int64[n+1], data uint8) -> the same for the values as a bucket should see them
Transform = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


@dataclass(slots=True)
class Routed:
    """One bucket's values: its documents (ascending) and their values ``data[offsets[i]:offsets[i+1]]``."""

    docs: np.ndarray  # uint32
    offsets: np.ndarray  # int64, bytes
    data: np.ndarray  # uint8

    def positions(self, docs: np.ndarray) -> np.ndarray:
        """Where each of ``docs`` (all routed to this bucket) is in ``self.docs``."""
        return np.searchsorted(self.docs, docs)


class Router:
    """Per-bucket files under ``folder``: ``need-Q`` (documents, uint32), and after ``route`` the values."""

    def __init__(self, folder: Path, buckets: int) -> None:
        folder.mkdir(parents=True)
        self.folder, self.buckets = folder, buckets
        self.counts = np.zeros(buckets, dtype=np.int64)

    def _path(self, kind: str, bucket: int) -> Path:
        return self.folder / f"{kind}-{bucket:05d}"

    def need(self, bucket: int, docs: np.ndarray) -> None:
        """Bucket ``bucket`` needs the values of ``docs`` (sorted, unique)."""
        if len(docs):
            np.asarray(docs, dtype=np.uint32).tofile(self._path("need", bucket))
            self.counts[bucket] = len(docs)

    def route(
        self, keys: pl.LazyFrame, column: str, *, window_rows: int, memory_gb: float, transform: Transform | None = None
    ) -> int:
        """Copy every needed value of ``column`` to its buckets' files; returns the passes made over the column."""
        if not self.counts.any():
            return 0
        rounds = _rounds(self.counts, max(1, int(memory_gb * GB / NEED_BYTES)))
        for buckets in rounds:
            self._route_round(keys, column, buckets, window_rows, transform)
        return len(rounds)

    def _route_round(
        self, keys: pl.LazyFrame, column: str, buckets: range, window_rows: int, transform: Transform | None
    ) -> None:
        parts = [(np.fromfile(self._path("need", q), dtype=np.uint32).astype(np.uint64) << np.uint64(32)) | np.uint64(q)
                 for q in buckets if self.counts[q]]  # fmt: skip
        if not parts:
            return
        packed = np.sort(np.concatenate(parts))
        del parts
        docs, owners = (packed >> np.uint64(32)).astype(np.int64), (packed & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        del packed
        for q in buckets:
            self._path("need", q).unlink(missing_ok=True)
        first = int(docs[0]) // window_rows * window_rows
        for lo in range(first, int(docs[-1]) + 1, window_rows):
            i, j = np.searchsorted(docs, [lo, lo + window_rows])
            if i < j:
                self._route_window(keys, column, lo, window_rows, docs[i:j], owners[i:j], transform)

    def _route_window(
        self,
        keys: pl.LazyFrame,
        column: str,
        lo: int,
        window_rows: int,
        docs: np.ndarray,
        owners: np.ndarray,
        transform: Transform | None,
    ) -> None:
        # docs ascending (owners ascending within a doc): each distinct doc is read once, then copied per owner.
        picked = docs[np.r_[True, docs[1:] != docs[:-1]]]
        offsets, data = read_window(keys, column, lo, window_rows, picked - lo)
        if transform is not None:
            offsets, data = transform(offsets, data)
        order = np.argsort(owners, kind="stable")  # by bucket, documents still ascending within one
        owners, docs = owners[order], docs[order]
        offsets, data = _gather(offsets, data, np.searchsorted(picked, docs))
        cuts = np.flatnonzero(np.r_[True, owners[1:] != owners[:-1], True])
        for s, e in zip(cuts[:-1], cuts[1:]):
            q = int(owners[s])
            _append(self._path("docs", q), docs[s:e].astype(np.uint32))
            _append(self._path("lengths", q), np.diff(offsets[s : e + 1]))
            _append(self._path("values", q), data[offsets[s] : offsets[e]])

    def read(self, bucket: int) -> Routed:
        """Bucket ``bucket``'s routed values (its files are removed: each bucket is read once)."""
        docs = _take_file(self._path("docs", bucket), np.uint32)
        lengths = _take_file(self._path("lengths", bucket), np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return Routed(docs, offsets, _take_file(self._path("values", bucket), np.uint8))


def _rounds(counts: np.ndarray, cap: int) -> list[range]:
    """Consecutive buckets whose needs together stay within ``cap`` (a round takes at least one bucket)."""
    rounds, start, total = [], 0, 0
    for q, count in enumerate(counts.tolist()):
        if q > start and total + count > cap:
            rounds.append(range(start, q))
            start, total = q, 0
        total += count
    rounds.append(range(start, len(counts)))
    return rounds


@njit(cache=True, nogil=True)
def _gather(offsets, data, rows):
    """Values ``rows`` (repeats allowed) of ``data[offsets[i]:offsets[i+1]]``, concatenated: ``(offsets, data)``.

    Compiled, not Arrow's ``take``: that imports ``pyarrow.compute``, ~20 MB of Python objects
    that the long-document bench's peak would then carry to the end.
    """
    out_offsets = np.empty(rows.shape[0] + 1, dtype=np.int64)
    out_offsets[0] = 0
    for t in range(rows.shape[0]):
        out_offsets[t + 1] = out_offsets[t] + offsets[rows[t] + 1] - offsets[rows[t]]
    out = np.empty(out_offsets[-1], dtype=np.uint8)
    for t in range(rows.shape[0]):
        out[out_offsets[t] : out_offsets[t + 1]] = data[offsets[rows[t]] : offsets[rows[t] + 1]]
    return out_offsets, out


def _append(path: Path, array: np.ndarray) -> None:
    with open(path, "ab") as fh:
        np.ascontiguousarray(array).tofile(fh)


def _take_file(path: Path, dtype) -> np.ndarray:
    if not path.exists():
        return np.zeros(0, dtype=dtype)
    array = np.fromfile(path, dtype=dtype)
    path.unlink()
    return array
