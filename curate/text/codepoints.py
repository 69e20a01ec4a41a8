"""Per-code-point classes as polars' regex engine sees them, for compiled kernels that must agree with it.

The word tokenizer (``curate.text.words.TOKEN_PATTERN``) and the segment rules of the
filters are regular expressions run by polars (Rust ``regex``, Unicode mode). The compiled
kernels that replace them read two tables indexed by code point: ``props`` (bit flags:
``\\w``, ``\\s``, ``\\p{L}``, ``\\p{N}``, ``\\p{M}``, stripped by ``str.strip_chars()``) and ``fold``
(the ASCII letter of ``srevldmt`` a code point matches case-insensitively, for the
contraction suffixes ``'s 're 've 'll 'd 'm 't``; 0 for none). Each entry is computed by
asking the engine itself about that one code point, so a kernel agrees with the regex
whatever Unicode version polars was built with. Only code points that occur in the text
are classified (``CodePointTable.cover``), a few hundred in a batch of real text.
"""

from __future__ import annotations

import threading

import numba as nb
import numpy as np
import polars as pl

WORD, SPACE, LETTER, NUMBER, STRIP, MARK = 1, 2, 4, 8, 16, 32
KNOWN = 128
CODE_POINTS = 0x110000
FOLD_LETTERS = "srevldmt"  # the first letters of the contraction suffixes (and "e", "l" of re, ve, ll)


def classify(code_points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(props, fold)`` of ``code_points`` (no surrogates), asked of polars' regex engine one code point each."""
    chars = pl.Series([chr(int(c)) for c in code_points], dtype=pl.String)
    frame = pl.DataFrame({"c": chars})
    c = pl.col("c")
    flags = frame.select(
        c.str.contains(r"^\w$").alias("w"),
        c.str.contains(r"^\s$").alias("s"),
        c.str.contains(r"^\p{L}$").alias("l"),
        c.str.contains(r"^\p{N}$").alias("n"),
        c.str.contains(r"^\p{M}$").alias("m"),
        (c.str.strip_chars() == "").alias("strip"),
        *[c.str.contains(rf"^(?i:{x})$").alias(f"fold_{x}") for x in FOLD_LETTERS],
    )
    props = np.full(len(code_points), KNOWN, dtype=np.uint8)
    for name, bit in (("w", WORD), ("s", SPACE), ("l", LETTER), ("n", NUMBER), ("strip", STRIP), ("m", MARK)):
        props |= flags[name].to_numpy().astype(np.uint8) * np.uint8(bit)
    fold = np.zeros(len(code_points), dtype=np.uint8)
    for x in reversed(FOLD_LETTERS):  # a code point folds to at most one of them
        fold = np.where(flags[f"fold_{x}"].to_numpy(), np.uint8(ord(x)), fold)
    return props, fold


_HIGH_BITS = np.uint64(0x8080808080808080)


@nb.njit(cache=True)
def _past_ascii_words(words, p, end):
    """From a position ``p`` that starts an 8-byte word, past the whole words of ASCII before ``end`` (``words``:
    the data as uint64); ``p`` itself when it does not start one."""
    if p & 7:
        return p
    k, whole = p >> 3, end >> 3
    while k < whole and not words[k] & _HIGH_BITS:
        k += 1
    return max(p, k << 3)


@nb.njit(cache=True, nogil=True)
def _unknown_code_points(offsets, data, props):
    """Code points of the strings whose ``props`` entry is not filled yet (each once).

    Runs of ASCII are skipped 8 bytes a step (a word with no high bit holds only ASCII).
    """
    seen = np.zeros(CODE_POINTS, dtype=np.bool_)
    out = np.empty(64, dtype=np.int64)
    n = 0
    words = data[: data.shape[0] - data.shape[0] % 8].view(np.uint64)
    p, end = offsets[0], offsets[-1]
    while p < end:
        p = _past_ascii_words(words, p, end)
        if p >= end:
            break
        b = np.int64(data[p])
        p += 1
        if b < 0x80 or (b & 0xC0) == 0x80:  # ASCII (always known) or a continuation byte
            continue
        q = p - 1
        if b >= 0xF0:
            cp = (
                ((b & 0x07) << 18)
                | ((np.int64(data[q + 1]) & 0x3F) << 12)
                | ((np.int64(data[q + 2]) & 0x3F) << 6)
                | (np.int64(data[q + 3]) & 0x3F)
            )
        elif b >= 0xE0:
            cp = ((b & 0x0F) << 12) | ((np.int64(data[q + 1]) & 0x3F) << 6) | (np.int64(data[q + 2]) & 0x3F)
        else:
            cp = ((b & 0x1F) << 6) | (np.int64(data[q + 1]) & 0x3F)
        if props[cp] & KNOWN or seen[cp]:
            continue
        seen[cp] = True
        if n == out.shape[0]:
            grown = np.empty(2 * n, dtype=np.int64)
            grown[:n] = out
            out = grown
        out[n] = cp
        n += 1
    return out[:n]


@nb.njit(cache=True, nogil=True)
def rows_with_byte_at_least(offsets, data, lowest):
    """bool per string of ``offsets``/``data``: does it hold a byte ``>= lowest`` (``lowest >= 0x80``)?

    With a UTF-8 lead byte as ``lowest``: does it hold a character at or above the first one that
    lead byte begins (0xCC: U+0300). Runs of ASCII are skipped 8 bytes a step.
    """
    n = offsets.shape[0] - 1
    out = np.zeros(n, dtype=np.bool_)
    words = data[: data.shape[0] - data.shape[0] % 8].view(np.uint64)
    for i in range(n):
        p, end = offsets[i], offsets[i + 1]
        while p < end:
            p = _past_ascii_words(words, p, end)
            if p >= end:
                break
            if data[p] >= lowest:
                out[i] = True
                break
            p += 1
    return out


class CodePointTable:
    """``props`` and ``fold`` for every code point, filled where text has been seen (thread-safe)."""

    def __init__(self) -> None:
        self.props = np.zeros(CODE_POINTS, dtype=np.uint8)
        self.fold = np.zeros(CODE_POINTS, dtype=np.uint8)
        self.lock = threading.Lock()
        self._fill(np.arange(128))

    def _fill(self, code_points: np.ndarray) -> None:
        props, fold = classify(code_points)
        self.fold[code_points] = fold
        self.props[code_points] = props  # last: KNOWN marks a complete entry

    def cover(self, offsets: np.ndarray, data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The tables, with every code point of the strings in ``offsets``/``data`` filled."""
        missing = _unknown_code_points(offsets, data, self.props)
        if len(missing):
            with self.lock:
                missing = missing[(self.props[missing] & KNOWN) == 0]
                if len(missing):
                    self._fill(missing)
        return self.props, self.fold


#: The one table of a process: every kernel reads the same classes.
TABLE = CodePointTable()
