"""MinHash signatures, LSH band keys and shingle sets for whole batches, in one compiled pass.

Two signature schemes over the same 64-bit shingle hashes ``h``:

* ``permutations``: slot ``p`` holds ``min(a_p * h + b_p mod 2**64)`` with odd ``a_p``, a
  bijection per slot (the classic k-permutation MinHash; the inner loop over slots is
  SIMD-friendly, so 128 slots cost about as much as hashing the shingle once).
* ``oph``: one-permutation hashing: one mixed hash per shingle picks a bin and competes for
  its minimum; empty bins are filled by optimal densification (Shrivastava, ICML 2017:
  https://proceedings.mlr.press/v70/shrivastava17a.html), probing other bins in an order that
  depends only on the bin, so equal sets still get equal signatures.

Documents are processed in blocks (``block_bytes`` of text at a time) so that the scratch
arrays and signature matrix stay bounded whatever the batch size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from winnow.curate.dedup.jit import njit
from winnow.curate.dedup.kernels import IDENTITY, PLAIN_SEP, doc_shingles, fmix64, rotl64
from winnow.curate.dedup.text import AltRows, no_alt_rows

_U64 = np.uint64
_MAX = np.uint64(0xFFFFFFFFFFFFFFFF)
_PROBE = np.uint64(0xD6E8FEB86659FD93)


def slot_params(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-slot ``(a odd, b)`` uint64 parameters, a pure function of ``seed``."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 2**63, size=num_perm, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    b = rng.integers(0, 2**63, size=num_perm, dtype=np.uint64)
    return a, b


@njit(cache=True, inline="always")
def _bin(v, k):
    # Lemire's multiply-shift range reduction of the top 32 bits: a uniform bin in [0, k)
    # without a 64-bit division (which cost more than the rest of the per-shingle work).
    return ((v >> _U64(32)) * _U64(k)) >> _U64(32)


@njit(cache=True, nogil=True)
def _signature(hashes, count, a, b, oph, sig, filled):
    k = sig.shape[0]
    sig[:] = _MAX
    if not oph:
        for i in range(count):
            h = hashes[i]
            for p in range(k):
                v = a[p] * h + b[p]
                if v < sig[p]:
                    sig[p] = v
        return
    filled[:] = False
    for i in range(count):
        v = fmix64(hashes[i] ^ b[0])
        j = _bin(v, k)
        filled[j] = True
        if v < sig[j]:
            sig[j] = v
    if count == 0:
        return
    for j in range(k):
        if filled[j]:
            continue
        attempt = _U64(0)
        while True:
            attempt += _U64(1)
            r = _bin(fmix64(_U64(j) * _PROBE + attempt), k)
            if filled[r]:
                sig[j] = sig[r]
                break


@njit(cache=True, nogil=True)
def _band_keys(sig, rows, bands, seed, out):
    for bi in range(bands):
        h = fmix64(_U64(seed) + _U64(bi))
        for r in range(bi * rows, (bi + 1) * rows):
            h = rotl64(h ^ sig[r], 29) * _U64(0x9E3779B97F4A7C15)
        out[bi] = fmix64(h)


@njit(cache=True, nogil=True)
def _grown(values, need):
    """``values`` itself if it holds ``need`` items, else a copy at least twice as long."""
    if need <= values.shape[0]:
        return values
    out = np.empty(max(need, 2 * values.shape[0]), dtype=values.dtype)
    out[: values.shape[0]] = values
    return out


@njit(cache=True, nogil=True)
def _spill(buf, count, out, cursor):
    """Append the top 32 bits of ``buf[:count]`` to ``out`` at ``cursor``, runs of one value once; the new cursor."""
    last = _MAX
    for j in range(count):
        top = buf[j] >> _U64(32)
        if top != last:
            out[cursor] = top
            cursor += 1
            last = top
    return cursor


@njit(cache=True, nogil=True)
def sketch_block(
    offsets, data, alt_rows, alt_offsets, alt_data, sep, low, ngram, chars, a, b, oph, rows, bands, want_sigs, want_sets
):
    """Signatures / band keys / 32-bit shingle hashes (unsorted, see below) for every document of a block.

    Document ``i`` is ``data[offsets[i]:offsets[i + 1]]``, or where ``alt_rows[i]``
    ``alt_data[alt_offsets[i]:alt_offsets[i + 1]]`` (``curate.dedup.text.AltRows``).
    Returns ``(sigs [n, k] or [0, k], band_keys [n, bands], n_shingles [n], set_offsets [n+1], set_values,
    sig8 [n, k] uint8 or [0, k])``. Each document's bytes are read once, shingled, sketched and spilled.
    """
    n = offsets.shape[0] - 1
    k = a.shape[0]
    longest = 0
    for i in range(n):
        size = alt_offsets[i + 1] - alt_offsets[i] if alt_rows[i] else offsets[i + 1] - offsets[i]
        longest = max(longest, size)
    # Scratch for the longest document: one slot per unit, at most one code point per byte, or
    # one word per two bytes (a word and the separator after it; see ``word_shingles``).
    units = longest + 1 if chars else (longest + 1) // 2 + 3
    buf = np.empty(units, dtype=np.uint64)
    starts = np.empty(units if chars else 0, dtype=np.int64)
    sig = np.empty(k, dtype=np.uint64)
    filled = np.empty(k, dtype=np.bool_)
    sigs = np.empty((n if want_sigs else 0, k), dtype=np.uint64)
    sig8 = np.empty((n if want_sets else 0, k), dtype=np.uint8)
    keys = np.empty((n, bands), dtype=np.uint64)
    counts = np.zeros(n, dtype=np.int64)
    set_offsets = np.zeros(n + 1, dtype=np.int64)
    # Grown as needed: about one shingle per 6 bytes of text.
    set_values = np.empty((offsets[n] - offsets[0]) // 6 + 1 if want_sets else 0, dtype=np.uint32)
    cursor = 0
    for i in range(n):
        if alt_rows[i]:
            count = doc_shingles(alt_data, alt_offsets[i], alt_offsets[i + 1], ngram, chars, sep, low, buf, starts)
        else:
            count = doc_shingles(data, offsets[i], offsets[i + 1], ngram, chars, sep, low, buf, starts)
        counts[i] = count
        _signature(buf, count, a, b, oph, sig, filled)
        if want_sigs:
            sigs[i, :] = sig
        if want_sets:
            for p in range(k):  # low 8 bits of each slot: the cheap similarity estimate that screens candidates
                sig8[i, p] = np.uint8(sig[p] & _U64(0xFF))
        _band_keys(sig, rows, bands, b[0], keys[i])
        if want_sets and count > 0:
            # The top 32 bits suffice for Jaccard (a false match needs a 2**-32 collision). Sets are
            # sorted only when a candidate pair needs them (curate.dedup.verify): most documents are
            # in no pair, and sorting here doubled this kernel's time. Runs of one value (a repeated
            # word) are collapsed so that such a document spills one value, not one per shingle.
            if cursor + count > set_values.shape[0]:
                set_values = _grown(set_values, cursor + count)
            cursor = _spill(buf, count, set_values, cursor)
        set_offsets[i + 1] = cursor
    return sigs, keys, counts, set_offsets, set_values[:cursor], sig8


@dataclass(slots=True)
class Sketch:
    """What ``sketch_texts`` computes for a batch (arrays aligned with its rows)."""

    signatures: np.ndarray | None  # uint64 [n, num_perm]
    band_keys: np.ndarray  # uint64 [n, bands]
    n_shingles: np.ndarray  # int64 [n]; 0 for documents without a word (never near-duplicates)
    set_offsets: np.ndarray | None  # int64 [n+1] into set_values
    set_values: np.ndarray | None  # uint32, each document's shingle hashes (top 32 bits), in text order
    sig8: np.ndarray | None = None  # uint8 [n, num_perm]: each slot's low 8 bits (with the sets)


def sketch_buffers(
    offsets: np.ndarray,
    data: np.ndarray,
    *,
    ngram: int,
    chars: bool,
    num_perm: int,
    scheme: str,
    seed: int,
    bands: int,
    rows: int,
    want_signatures: bool,
    want_sets: bool,
    block_bytes: int = 64 << 20,
    tables: tuple[np.ndarray, np.ndarray] = (PLAIN_SEP, IDENTITY),
    alt: AltRows | None = None,
) -> Sketch:
    """Sketch the strings described by Arrow ``offsets``/``data``, ``block_bytes`` of text at a time.

    ``tables`` are the word kernels' ``(sep, low)`` byte tables and ``alt`` the rows read from a
    buffer of their own (both from ``curate.dedup.text.word_buffers``).
    """
    sep, low = tables
    a, b = slot_params(num_perm, seed)
    n = len(offsets) - 1
    alt = alt if alt is not None else no_alt_rows(n)
    parts, lo = [], 0
    while True:
        hi = int(np.searchsorted(offsets, offsets[lo] + block_bytes, side="right")) - 1
        hi = min(max(hi, lo + 1), n)
        parts.append(
            sketch_block(
                offsets[lo : hi + 1],
                data,
                alt.rows[lo:hi],
                alt.offsets[lo : hi + 1],
                alt.data,
                sep,
                low,
                ngram,
                chars,
                a,
                b,
                scheme == "oph",
                rows,
                bands,
                want_signatures,
                want_sets,
            )
        )
        lo = hi
        if lo >= n:
            break
    sigs = _joined([p[0] for p in parts]) if want_signatures else None
    set_offsets = set_values = sig8 = None
    if want_sets:
        sig8 = _joined([p[5] for p in parts])
        values = [p[4] for p in parts]
        starts = np.cumsum([0] + [len(v) for v in values[:-1]])
        set_offsets = _joined([parts[0][3]] + [p[3][1:] + s for p, s in zip(parts[1:], starts[1:])])
        set_values = _joined(values)
    return Sketch(sigs, _joined([p[1] for p in parts]), _joined([p[2] for p in parts]), set_offsets, set_values, sig8)


def _joined(arrays: list[np.ndarray]) -> np.ndarray:
    """The arrays end to end; the one array itself when there is one (a batch is usually one block)."""
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
