"""Per-document token counts of the Gopher quality rules in one compiled pass over the Arrow buffers.

``quality_counts`` scans each document's tokens (``curate.text.tokens``: the tokens of
``curate.text.words.TOKEN_PATTERN``) and counts, per document: the tokens; the words (tokens
holding a letter, number or mark, ``WORD_CHAR``) and their characters; the alphabetic tokens
(holding a letter); and how many distinct stop words occur (tokens equal to one of them, byte
for byte). Character classes come from ``curate.text.codepoints``, so the counts are those of
the regular expressions; a test compares them with the expressions.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from winnow.curate.text.codepoints import LETTER, MARK, NUMBER
from winnow.curate.text.tokens import code_point, document_tokens, longest_string

#: Rows of ``quality_counts``' output.
COUNTS = ("tokens", "words", "word_chars", "alpha", "stop_words")


def stop_word_buffers(stop_words) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets, data)`` of the distinct stop words' UTF-8 bytes, for ``quality_counts``."""
    encoded = [w.encode() for w in dict.fromkeys(stop_words)]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(w) for w in encoded])
    return offsets, np.frombuffer(b"".join(encoded), dtype=np.uint8).copy()


@nb.njit(cache=True, inline="always")
def _stop_index(data, lo, hi, stop_offsets, stop_data):
    """Index of the stop word equal to ``data[lo:hi]``, or -1."""
    for s in range(stop_offsets.shape[0] - 1):
        a, b = stop_offsets[s], stop_offsets[s + 1]
        if b - a != hi - lo:
            continue
        same = True
        for j in range(b - a):
            if stop_data[a + j] != data[lo + j]:
                same = False
                break
        if same:
            return s
    return -1


@nb.njit(cache=True, nogil=True)
def quality_counts(offsets, data, props, fold, stop_offsets, stop_data):
    """``int64 [5, n]``: ``COUNTS`` of each string of ``offsets``/``data`` (``props``/``fold`` cover its code points)."""
    n = offsets.shape[0] - 1
    out = np.zeros((5, n), dtype=np.int64)
    longest = longest_string(offsets)
    starts = np.empty(longest + 1, dtype=np.int64)
    ends = np.empty(longest + 1, dtype=np.int64)
    n_stop = stop_offsets.shape[0] - 1
    shortest, longest_stop = longest + 1, 0
    for s in range(n_stop):
        shortest = min(shortest, stop_offsets[s + 1] - stop_offsets[s])
        longest_stop = max(longest_stop, stop_offsets[s + 1] - stop_offsets[s])
    seen = np.zeros(max(n_stop, 1), dtype=np.int64)  # the document (plus one) a stop word was last counted in
    for d in range(n):
        m = document_tokens(data, offsets[d], offsets[d + 1], props, fold, starts, ends)
        words = word_chars = alpha = stops = 0
        for t in range(m):
            lo, hi = starts[t], ends[t]
            chars, word, letter = 0, False, False
            p = lo
            while p < hi:
                c, w = code_point(data, p)
                f = props[c]
                word = word or (f & (LETTER | NUMBER | MARK)) != 0
                letter = letter or (f & LETTER) != 0
                p += w
                chars += 1
            if word:
                words += 1
                word_chars += chars
            alpha += letter
            if shortest <= hi - lo <= longest_stop:
                s = _stop_index(data, lo, hi, stop_offsets, stop_data)
                if s >= 0 and seen[s] != d + 1:
                    seen[s] = d + 1
                    stops += 1
        out[0, d], out[1, d], out[2, d], out[3, d], out[4, d] = m, words, word_chars, alpha, stops
    return out
