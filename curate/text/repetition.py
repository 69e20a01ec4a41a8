"""Compiled n-gram repetition kernels over flat token hashes (Gopher repetition metrics).

Inputs are CSR-shaped: ``h`` (uint64 token hashes of all documents, concatenated),
``chars`` (each token's length in characters) and ``offsets`` (document ``d`` owns
tokens ``offsets[d]:offsets[d+1]``). Each document gets an open-addressing hash table
carved out of one shared buffer; a generation stamp marks live slots, so nothing is
cleared between documents. The definitions follow datatrove's
``GopherRepetitionFilter`` (Rae et al. 2021, table A1), which the paper describes only
in words:

* top n-gram characters: the most frequent n-gram (ties: the one seen first) times its
  length as ``" ".join(words)``;
* duplicate n-gram characters: scan left to right, and when the n-gram at ``i`` was seen
  before, add its characters (``"".join(words)``) and jump to ``i + n``, else step by one.

N-grams are compared by a 64-bit combination of token hashes rather than by the joined
string, so ``["ab", "c"]`` and ``["a", "bc"]`` are different n-grams here (they collide
in datatrove's ``"".join``).
"""

from __future__ import annotations

import numba as nb
import numpy as np

_MIX = np.uint64(0x9E3779B97F4A7C15)


@nb.njit(cache=True, inline="always")
def _ngram_key(h, start, n):
    key = np.uint64(0xCBF29CE484222325)
    for j in range(start, start + n):
        key = (key ^ h[j]) * np.uint64(0x100000001B3)
        key ^= key >> np.uint64(29)
    return key


@nb.njit(cache=True, inline="always")
def _slot(keys, stamps, gen, key, mask):
    """Index of ``key``'s slot, or of the free slot where it belongs."""
    i = np.int64((key * _MIX) >> np.uint64(40)) & mask
    while stamps[i] == gen and keys[i] != key:
        i = (i + 1) & mask
    return i


@nb.njit(cache=True)
def _table_size(offsets):
    longest = 0
    for d in range(len(offsets) - 1):
        longest = max(longest, offsets[d + 1] - offsets[d])
    size = 16
    while size < 2 * longest + 2:
        size *= 2
    return size


@nb.njit(cache=True)
def top_ngram_chars(h, chars, offsets, n):
    """Per document: characters covered by its most frequent word n-gram; -1 when it has fewer than ``n`` words."""
    n_docs = len(offsets) - 1
    out = np.full(n_docs, -1, dtype=np.int64)
    size = _table_size(offsets)
    keys = np.zeros(size, dtype=np.uint64)
    stamps = np.zeros(size, dtype=np.int64)
    counts = np.zeros(size, dtype=np.int64)
    first = np.zeros(size, dtype=np.int64)
    for d in range(n_docs):
        lo, hi = offsets[d], offsets[d + 1]
        m = hi - lo - n + 1
        if m <= 0:
            continue
        gen = d + 1
        cap = 16
        while cap < 2 * m + 2:
            cap *= 2
        mask = cap - 1
        best_count, best_first = 0, 0
        for i in range(lo, lo + m):
            key = _ngram_key(h, i, n)
            s = _slot(keys, stamps, gen, key, mask)
            if stamps[s] != gen:
                stamps[s], keys[s], counts[s], first[s] = gen, key, 0, i
            counts[s] += 1
            c = counts[s]
            if c > best_count or (c == best_count and first[s] < best_first):
                best_count, best_first = c, first[s]
        length = n - 1  # the spaces of " ".join
        for j in range(best_first, best_first + n):
            length += chars[j]
        out[d] = length * best_count
    return out


@nb.njit(cache=True)
def duplicate_ngram_chars(h, chars, offsets, n):
    """Per document: characters of word n-grams that repeat an earlier one (greedy, non-overlapping)."""
    n_docs = len(offsets) - 1
    out = np.zeros(n_docs, dtype=np.int64)
    size = _table_size(offsets)
    keys = np.zeros(size, dtype=np.uint64)
    stamps = np.zeros(size, dtype=np.int64)
    for d in range(n_docs):
        lo, hi = offsets[d], offsets[d + 1]
        gen = d + 1
        cap = 16
        while cap < 2 * (hi - lo) + 2:
            cap *= 2
        mask = cap - 1
        repeated = 0
        i = lo
        while i < hi - n + 1:
            key = _ngram_key(h, i, n)
            s = _slot(keys, stamps, gen, key, mask)
            if stamps[s] == gen:
                for j in range(i, i + n):
                    repeated += chars[j]
                i += n
            else:
                stamps[s], keys[s] = gen, key
                i += 1
        out[d] = repeated
    return out
