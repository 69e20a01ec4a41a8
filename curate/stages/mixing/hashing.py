"""Stable hashes of row ids: the randomness of ``split``, ``mix`` and ``order``.

Every random choice these stages make is a function of a row's id (and a seed), never
of the row's position, the task it came from, or the other sources in the job. That is
what keeps a held-out set, a mixture and a curriculum stable when files or sources are
added. polars' own ``hash`` is documented as unstable across polars versions, so ids are
hashed here: FNV-1a over the UTF-8 bytes, finished with the splitmix64 mixer for
uniform high bits, compiled with numba over the Arrow buffers (no per-row Python).
"""

from __future__ import annotations

import hashlib

import numpy as np
import polars as pl
import pyarrow as pa
from numba import njit

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_TWO_POW_53 = float(2**53)


@njit(cache=True)
def splitmix64(x):
    """The splitmix64 finalizer (Steele et al. 2014): every input bit moves every output bit."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@njit(cache=True)
def _hash_utf8(offsets, data, salts, out):
    for i in range(out.shape[0]):
        h = _FNV_OFFSET
        for j in range(offsets[i], offsets[i + 1]):
            h = (h ^ np.uint64(data[j])) * _FNV_PRIME
        out[i] = splitmix64(h ^ salts[i])


def seed_key(*parts: object) -> int:
    """A 64-bit key for a tuple of seeds and names (e.g. ``(seed, source)``), stable across runs and platforms."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def hash_strings(values: pl.Series, salt: int | np.ndarray = 0) -> np.ndarray:
    """uint64 hash of every string in ``values``, mixed with ``salt`` (one int, or one per row)."""
    n = len(values)
    salts = (
        np.broadcast_to(np.asarray(salt, dtype=np.uint64), (n,))
        if np.ndim(salt) == 0
        else np.asarray(salt, dtype=np.uint64)
    )
    out = np.empty(n, dtype=np.uint64)
    arrow = values.to_arrow(compat_level=pl.CompatLevel.oldest())
    chunks = arrow.chunks if isinstance(arrow, pa.ChunkedArray) else [arrow]
    start = 0
    for chunk in chunks:
        m = len(chunk)
        if m == 0:
            continue
        chunk = chunk.cast(pa.large_string())
        _, off_buf, data_buf = chunk.buffers()
        offsets = np.frombuffer(off_buf, dtype=np.int64)[chunk.offset : chunk.offset + m + 1]
        data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
        _hash_utf8(offsets, data, np.ascontiguousarray(salts[start : start + m]), out[start : start + m])
        start += m
    return out


def to_unit(h: np.ndarray) -> np.ndarray:
    """Map uint64 hashes to floats uniform in [0, 1) (top 53 bits)."""
    return (h >> np.uint64(11)).astype(np.float64) / _TWO_POW_53


def source_salts(sources: pl.Series, *parts: object) -> np.ndarray:
    """Per-row salt ``seed_key(*parts, source)``: each source gets its own random stream."""
    names = sources.unique().to_list()
    keys = [seed_key(*parts, name) for name in names]
    return sources.replace_strict(names, keys, return_dtype=pl.UInt64).to_numpy()


def unit(column: str) -> pl.Expr:
    """``to_unit`` as a polars expression over a uint64 column (the same floats, exactly)."""
    return (pl.col(column) // 2048).cast(pl.Float64) / _TWO_POW_53
