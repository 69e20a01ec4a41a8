"""Compiled hashing kernels over Arrow string buffers: 128-bit document hashes and shingles.

Every kernel takes the column's ``offsets`` (int64[n+1]) and ``data`` (uint8) buffers,
so a batch is hashed in one call with no per-document Python. All arithmetic is on
uint64 and wraps modulo 2**64, as the hash definitions expect.
"""

from __future__ import annotations

import numpy as np

from winnow.curate.dedup.jit import njit

_U64 = np.uint64
_C1 = np.uint64(0x87C37B91114253D5)
_C2 = np.uint64(0x4CF5AD432745937F)
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_SHINGLE_MUL = np.uint64(0x9E3779B97F4A7C15)  # golden ratio: spreads each word before the next is mixed in


@njit(cache=True, inline="always")
def rotl64(x, r):
    return (x << _U64(r)) | (x >> _U64(64 - r))


@njit(cache=True, inline="always")
def fmix64(k):
    """MurmurHash3's finalizer: a bijection on uint64 whose output bits each depend on every input bit."""
    k ^= k >> _U64(33)
    k *= _U64(0xFF51AFD7ED558CCD)
    k ^= k >> _U64(33)
    k *= _U64(0xC4CEB9FE1A85EC53)
    k ^= k >> _U64(33)
    return k


@njit(cache=True, inline="always")
def _load64(data, p):
    v = _U64(0)
    for j in range(8):
        v |= _U64(data[p + j]) << _U64(8 * j)
    return v


@njit(cache=True, nogil=True)
def murmur3_128(data, start, end, seed):
    """MurmurHash3 x64_128 of ``data[start:end]`` as two uint64 halves."""
    n = end - start
    h1 = _U64(seed)
    h2 = _U64(seed)
    nblocks = n // 16
    for i in range(nblocks):
        p = start + 16 * i
        k1 = _load64(data, p) * _C1
        k1 = rotl64(k1, 31) * _C2
        h1 ^= k1
        h1 = (rotl64(h1, 27) + h2) * _U64(5) + _U64(0x52DCE729)
        k2 = _load64(data, p + 8) * _C2
        k2 = rotl64(k2, 33) * _C1
        h2 ^= k2
        h2 = (rotl64(h2, 31) + h1) * _U64(5) + _U64(0x38495AB5)
    p = start + 16 * nblocks
    rem = n & 15
    k1 = _U64(0)
    k2 = _U64(0)
    for j in range(8, rem):
        k2 ^= _U64(data[p + j]) << _U64(8 * (j - 8))
    if rem > 8:
        k2 = rotl64(k2 * _C2, 33) * _C1
        h2 ^= k2
    for j in range(min(rem, 8)):
        k1 ^= _U64(data[p + j]) << _U64(8 * j)
    if rem > 0:
        k1 = rotl64(k1 * _C1, 31) * _C2
        h1 ^= k1
    h1 ^= _U64(n)
    h2 ^= _U64(n)
    h1 += h2
    h2 += h1
    h1 = fmix64(h1)
    h2 = fmix64(h2)
    h1 += h2
    h2 += h1
    return h1, h2


@njit(cache=True, nogil=True)
def hash128_column(offsets, data, seed):
    """MurmurHash3 x64_128 of every string: ``(hi uint64[n], lo uint64[n])``."""
    n = offsets.shape[0] - 1
    hi = np.empty(n, dtype=np.uint64)
    lo = np.empty(n, dtype=np.uint64)
    for i in range(n):
        hi[i], lo[i] = murmur3_128(data, offsets[i], offsets[i + 1], seed)
    return hi, lo


# Byte tables of the word kernels: ``sep[b]`` is 1 where byte ``b`` ends a word, ``low[b]`` the
# byte hashed in its place. These two read plain bytes (words are runs of bytes above ASCII
# space); curate.dedup.text builds the tables that normalize ASCII text on the fly.
PLAIN_SEP = (np.arange(256) <= 32).astype(np.uint8)
IDENTITY = np.arange(256, dtype=np.uint8)


@njit(cache=True, inline="always")
def _hash_bytes(data, start, end, low):
    # FNV-1a over the (mapped) bytes, then fmix64 so that short words still fill all 64 bits.
    h = _FNV_OFFSET
    for p in range(start, end):
        h ^= _U64(low[data[p]])
        h *= _FNV_PRIME
    return fmix64(h)


@njit(cache=True, nogil=True)
def count_shingles(offsets, data, ngram, chars, sep):
    """How many shingles each document has: ``max(units - ngram + 1, 1)``, or 0 for no units.

    Units are words (runs of bytes ``b`` with ``sep[b] == 0``) or, with ``chars``, code points.
    """
    n = offsets.shape[0] - 1
    out = np.zeros(n, dtype=np.int64)
    for i in range(n):
        units = 0
        in_word = False
        for p in range(offsets[i], offsets[i + 1]):
            b = data[p]
            if chars:
                units += (b & 0xC0) != 0x80
            elif sep[b] == 0:
                units += not in_word
                in_word = True
            else:
                in_word = False
        if units > 0:
            out[i] = max(units - ngram + 1, 1)
    return out


@njit(cache=True, inline="always")
def _word_step(byte, sep, low, h, in_word, units, buf, base):
    """One byte of the word scanner, without a branch: returns the new ``(h, in_word, units)``.

    ``h`` is the running FNV-1a of the current word (``_hash_bytes`` before its ``fmix64``),
    stored at ``buf[base + units]`` after every byte, so the slot holds the word's hash when a
    separator ends it. Branch-free because a mispredicted jump at every word end cost more
    than the hashing; the multiply comes before the select so that it compiles to a
    conditional move.
    """
    s = sep[byte]
    units += in_word & s
    nxt = (h ^ _U64(low[byte])) * _FNV_PRIME
    h = _FNV_OFFSET if s else nxt
    buf[base + units] = h
    return h, 1 - s, units


@njit(cache=True, nogil=True)
def word_shingles(data, start, end, ngram, sep, low, buf):
    """Write the 64-bit word ``ngram``-shingle hashes of ``data[start:end]`` into ``buf``; return how many.

    Each word is hashed while it is scanned, so the bytes are read once. The text is cut in
    two halves at a separator and both are scanned in one loop: FNV-1a is a chain of
    dependent multiplies, and two independent chains keep the multiplier busy. ``buf`` must
    hold ``(end - start + 1) // 2 + 3`` values.
    """
    mid = start + (end - start) // 2
    while mid < end and sep[data[mid]] == 0:  # no word crosses the cut
        mid += 1
    second = (mid - start + 1) // 2 + 1  # where the second half's words go, past the first half's most
    h1 = h2 = _FNV_OFFSET
    in1 = in2 = units1 = units2 = 0
    both = min(mid - start, end - mid)
    for q in range(both):
        h1, in1, units1 = _word_step(data[start + q], sep, low, h1, in1, units1, buf, 0)
        h2, in2, units2 = _word_step(data[mid + q], sep, low, h2, in2, units2, buf, second)
    for p in range(start + both, mid):
        h1, in1, units1 = _word_step(data[p], sep, low, h1, in1, units1, buf, 0)
    for p in range(mid + both, end):
        h2, in2, units2 = _word_step(data[p], sep, low, h2, in2, units2, buf, second)
    units1 += in1
    units2 += in2
    for j in range(units2):
        buf[units1 + j] = buf[second + j]
    units = units1 + units2
    if units == 0:
        return 0
    for i in range(units):
        buf[i] = fmix64(buf[i])
    count = max(units - ngram + 1, 1)
    width = min(ngram, units)
    # In place: shingle i only needs words i..i+width-1, all still unwritten.
    for i in range(count):
        h = _U64(ngram)
        for j in range(width):
            h = rotl64(h, 23) ^ buf[i + j]
            h *= _SHINGLE_MUL
        buf[i] = fmix64(h)
    return count


@njit(cache=True, nogil=True)
def doc_shingles(data, start, end, ngram, chars, sep, low, buf, starts):
    """Write the 64-bit shingle hashes of ``data[start:end]`` into ``buf``; return how many.

    Words are runs of bytes with ``sep[b] == 0``, hashed as ``low[b]`` (see ``PLAIN_SEP``);
    ``chars`` shingles hash the bytes of ``ngram`` code points as they are. ``buf`` and
    ``starts`` are scratch: for words ``buf`` holds ``(end - start + 1) // 2 + 3`` values
    (``starts`` is not used), for characters both hold one more than the code points.
    Documents with fewer than ``ngram`` units give one shingle of all of them.
    """
    if not chars:
        return word_shingles(data, start, end, ngram, sep, low, buf)
    units = 0
    for p in range(start, end):
        if (data[p] & 0xC0) != 0x80:
            starts[units] = p
            units += 1
    if units == 0:
        return 0
    starts[units] = end
    count = max(units - ngram + 1, 1)
    for i in range(count):
        buf[i] = _hash_bytes(data, starts[i], starts[min(i + ngram, units)], IDENTITY)
    return count
