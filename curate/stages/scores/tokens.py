"""Word tokens as stable 64-bit hashes: the featurizer shared by the classifier, DSIR and difficulty scores.

A token is a run of word characters (letters, digits, ``_``, combining marks), lowercased;
each Han, kana or CJK-compatibility character is a token on its own, so text without spaces
(Chinese, Japanese) still yields n-grams instead of one giant word. Non-ASCII scripts are
classified by code-point block rather than full Unicode tables (see ``_char_class``).

The hash is FNV-1a over the lowercased code points, finalized with splitmix64 so that the
low bits are uniform for ``% buckets``. It is defined here, not by the polars version, so a
model saved with a job scores the same text the same way later (``HASH_VERSION`` is stored
with every model). The tokenizer is one compiled pass over the Arrow UTF-8 buffer: polars'
``str.extract_all(r"\\w+")`` plus moving the resulting lists to Arrow measured ~10x slower here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa
from numba import njit

HASH_VERSION = 1

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_BIGRAM_SALT = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True, inline="always")
def _mix(h):
    # splitmix64 finalizer: spreads FNV's weak low bits before ``% buckets``.
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


@njit(cache=True, inline="always")
def _char_class(cp):
    """0 = separator, 1 = word character, 2 = a token on its own (Han, kana)."""
    if cp < 0x80:
        if (48 <= cp <= 57) or (65 <= cp <= 90) or (97 <= cp <= 122) or cp == 95:
            return 1
        return 0
    if cp < 0xC0:
        return 1 if (cp == 0xAA or cp == 0xB5 or cp == 0xBA) else 0
    if cp == 0xD7 or cp == 0xF7:
        return 0
    if (0x3040 <= cp <= 0x30FF) or (0x31F0 <= cp <= 0x31FF) or (0x3400 <= cp <= 0x4DBF) or (0x4E00 <= cp <= 0x9FFF):
        return 2
    if (0xF900 <= cp <= 0xFAFF) or (0xFF66 <= cp <= 0xFF9F) or (0x20000 <= cp <= 0x3134F):
        return 2
    # Punctuation, symbols, spaces, emoji and private-use blocks separate words.
    if (0x2000 <= cp <= 0x2BFF) or (0x2E00 <= cp <= 0x2E7F) or (0x3000 <= cp <= 0x303F):
        return 0
    if (0xFE00 <= cp <= 0xFE6F) or (0xFF00 <= cp <= 0xFF0F) or (0xFF1A <= cp <= 0xFF20):
        return 0
    if (0xFF3B <= cp <= 0xFF40) or (0xFF5B <= cp <= 0xFF65) or (0xE000 <= cp <= 0xF8FF) or cp >= 0x1F000:
        return 0
    if cp == 0x60C or cp == 0x61B or cp == 0x61F or cp == 0x964 or cp == 0x965 or cp == 0xFFFD:
        return 0
    return 1


@njit(cache=True, inline="always")
def _lower(cp):
    if 65 <= cp <= 90:
        return cp + 32
    if cp < 0xC0:
        return cp
    if (0xC0 <= cp <= 0xDE) or (0x391 <= cp <= 0x3A9) or (0x410 <= cp <= 0x42F):
        return cp + 32  # Latin-1, Greek, Cyrillic capitals (0xD7 is never a word char)
    if 0x400 <= cp <= 0x40F:
        return cp + 80
    if ((0x100 <= cp <= 0x137) or (0x14A <= cp <= 0x177)) and cp % 2 == 0:
        return cp + 1
    return cp


@njit(cache=True)
def _decode(data, i, end, b0):
    """``(code point, bytes)`` of the character whose lead byte ``b0 >= 0x80`` is at ``data[i]``; a sequence cut
    short by ``end`` reads its last byte again rather than past it."""
    if b0 < 0xE0:
        return ((b0 & 0x1F) << 6) | (np.int64(data[min(i + 1, end - 1)]) & 0x3F), 2
    if b0 < 0xF0:
        cp = ((b0 & 0x0F) << 12) | ((np.int64(data[min(i + 1, end - 1)]) & 0x3F) << 6)
        return cp | (np.int64(data[min(i + 2, end - 1)]) & 0x3F), 3
    cp = ((b0 & 0x07) << 18) | ((np.int64(data[min(i + 1, end - 1)]) & 0x3F) << 12)
    cp = cp | ((np.int64(data[min(i + 2, end - 1)]) & 0x3F) << 6)
    return cp | (np.int64(data[min(i + 3, end - 1)]) & 0x3F), 4


_ASCII_WORD = np.array([chr(b).isascii() and (chr(b).isalnum() or b == 95) for b in range(128)], dtype=np.int64)


@njit(cache=True)
def _count_tokens(data, i, end):
    """How many tokens ``_scan_doc`` would find in ``data[i:end]`` (starting outside a word), without hashing them:
    the words' first characters and the characters that are tokens on their own, counted without a branch per
    ASCII byte."""
    count, prev = 0, 0  # prev: 1 inside a word
    while i < end:
        b0 = np.int64(data[i])
        if b0 < 0x80:
            w = _ASCII_WORD[b0]
            count += w & (prev ^ 1)
            prev = w
            i += 1
            continue
        cp, step = _decode(data, i, end, b0)
        cls = _char_class(cp)
        count += (cls == 1 and prev == 0) + (cls == 2)
        prev = 1 if cls == 1 else 0
        i += step
    return count


@njit(cache=True)
def _scan_doc(data, i, end, max_tokens, start_h, uni, bi, k):
    """Append one document's tokens at ``uni[k:]``; returns (new k, tokens seen) or (-1, 0) when out of room."""
    h, in_word, count, prev = start_h, False, 0, np.uint64(0)
    while i <= end:
        if 0 < max_tokens <= count and not in_word:  # the rest is only counted
            return k, count + _count_tokens(data, i, end)
        cp, step, cls = 0, 1, 0  # past the end: a virtual separator closes the last word
        if i < end:
            b0 = np.int64(data[i])
            if b0 < 0x80:  # ASCII fast path: most bytes of most text
                cp = b0
                if (97 <= b0 <= 122) or (48 <= b0 <= 57):
                    cls = 1
                elif 65 <= b0 <= 90:
                    cls, cp = 1, b0 + 32
                else:
                    cls = 1 if b0 == 95 else 0
            else:
                cp, step = _decode(data, i, end, b0)
            if step > 1:
                cls = _char_class(cp)
                cp = _lower(cp)
        i += step
        if cls == 1:
            h = (h ^ np.uint64(cp)) * _FNV_PRIME
            in_word = True
            continue
        if cls == 0 and not in_word:
            continue
        for e in range(2):  # a word and a Han character can end at the same position
            if e == 0 and not in_word or e == 1 and cls != 2:
                continue
            tok = _mix(h) if e == 0 else _mix((start_h ^ np.uint64(cp)) * _FNV_PRIME)
            if max_tokens <= 0 or count < max_tokens:
                if k == uni.shape[0]:
                    return -1, 0
                uni[k] = tok
                bi[k] = _mix(prev * _BIGRAM_SALT + tok) if count > 0 else np.uint64(0)
                k += 1
            count += 1
            prev = tok
        h, in_word = start_h, False
    return k, count


@njit(cache=True)
def _tokenize(str_offsets, data, max_tokens, seed):
    n_docs = str_offsets.shape[0] - 1
    indptr = np.zeros(n_docs + 1, dtype=np.int64)
    n_total = np.zeros(n_docs, dtype=np.int64)
    uni = np.empty(max(16, (str_offsets[n_docs] - str_offsets[0]) // 6), dtype=np.uint64)
    bi = np.empty_like(uni)
    start_h = _FNV_OFFSET ^ np.uint64(seed)
    k = 0
    for d in range(n_docs):
        new_k, count = _scan_doc(data, str_offsets[d], str_offsets[d + 1], max_tokens, start_h, uni, bi, k)
        while new_k < 0:  # out of room: double and scan this document again
            uni = np.concatenate((uni, np.empty(uni.shape[0], dtype=np.uint64)))
            bi = np.concatenate((bi, np.empty(bi.shape[0], dtype=np.uint64)))
            new_k, count = _scan_doc(data, str_offsets[d], str_offsets[d + 1], max_tokens, start_h, uni, bi, k)
        k = new_k
        n_total[d] = count
        indptr[d + 1] = k
    return indptr, uni[:k].copy(), bi[:k].copy(), n_total


@dataclass(slots=True)
class TokenHashes:
    """Per-token hashes of a batch, in CSR layout: document ``d`` owns tokens ``indptr[d]:indptr[d+1]``."""

    indptr: np.ndarray  # int64 [D+1]
    uni: np.ndarray  # uint64 [T]: the word
    bi: np.ndarray  # uint64 [T]: (previous word, word); 0 at a document's first token
    n_words: np.ndarray  # int64 [D]: words in the whole document, before the ``max_tokens`` cap

    @property
    def n_docs(self) -> int:
        return self.indptr.shape[0] - 1

    def doc_index(self) -> np.ndarray:
        """int64 [T]: the document of each token."""
        return np.repeat(np.arange(self.n_docs, dtype=np.int64), np.diff(self.indptr))

    def has_prev(self) -> np.ndarray:
        """bool [T]: tokens that have a bigram (all but each document's first)."""
        mask = np.ones(self.uni.shape[0], dtype=bool)
        firsts = self.indptr[:-1][np.diff(self.indptr) > 0]
        mask[firsts] = False
        return mask


def _string_buffers(values: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """(offsets int64 [N+1], utf8 bytes) of a string Series, nulls read as empty strings."""
    arr = values.fill_null("").to_arrow()
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    arr = arr.cast(pa.large_string())
    _, off_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(off_buf, dtype=np.int64)[arr.offset : arr.offset + len(arr) + 1]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(1, dtype=np.uint8)
    return offsets, data


def hash_tokens(text: pl.Series, *, max_tokens: int | None = None, seed: int = 0) -> TokenHashes:
    """Tokenize and hash every document of ``text``; keep at most ``max_tokens`` tokens per document."""
    offsets, data = _string_buffers(text)
    indptr, uni, bi, n_words = _tokenize(offsets, data, max_tokens or 0, seed)
    return TokenHashes(indptr, uni, bi, n_words)


@njit(cache=True)
def _hash_strings(offsets, data, seed):
    out = np.empty(offsets.shape[0] - 1, dtype=np.uint64)
    for d in range(out.shape[0]):
        h = _FNV_OFFSET ^ np.uint64(seed)
        for b in range(offsets[d], offsets[d + 1]):
            h = (h ^ np.uint64(data[b])) * _FNV_PRIME
        out[d] = _mix(h)
    return out


def hash_strings(values: pl.Series, *, seed: int = 0) -> np.ndarray:
    """uint64 [N]: a stable seeded hash of each string (e.g. ids, for seeded sampling and folds)."""
    offsets, data = _string_buffers(values)
    return _hash_strings(offsets, data, seed)
