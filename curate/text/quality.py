"""Per-document token counts of the Gopher quality rules in one compiled pass over the Arrow buffers.

``quality_counts`` scans each document's tokens (``curate.text.tokens``: the tokens of
``curate.text.words.TOKEN_PATTERN``) and counts, per document: the tokens; the words (tokens
holding a letter, number or mark, ``WORD_CHAR``) and their characters; the alphabetic tokens
(holding a letter); and how many distinct stop words occur (tokens equal to one of them, byte
for byte). Character classes come from ``curate.text.codepoints``, so the counts are those of
the regular expressions; a test compares them with the expressions.

``layout_counts`` counts, in one pass over each document's bytes, what the Gopher rules read from
characters and lines rather than tokens: ``#`` characters, ``...`` and ``…``, lines, lines that start
with a bullet and lines that end in an ellipsis, as the regular expressions over text with unified
line breaks count them (``(?m)^[^\\S\\n]*[•\\-]`` and ``(?m)(?:\\.\\.\\.|…)[^\\S\\n]*$``); a test compares
the two on every line break and blank character.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from winnow.curate.text.codepoints import LETTER, MARK, NUMBER, SPACE
from winnow.curate.text.tokens import code_point, document_tokens, longest_string

#: Rows of ``quality_counts``' output.
COUNTS = ("tokens", "words", "word_chars", "alpha", "stop_words")
#: Rows of ``layout_counts``' output.
LAYOUT_COUNTS = ("hashes", "ellipses", "lines", "bullet_lines", "ellipsis_lines")


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


# Byte classes of ``layout_counts``: the bytes it must look at; every other ASCII byte is an ordinary character.
_ORDINARY, _DOT, _BREAK, _CR, _BLANK, _HASH, _DASH, _HIGH = range(8)
_BYTE_CLASS = np.full(256, _ORDINARY, dtype=np.uint8)
_BYTE_CLASS[0x80:] = _HIGH
_BYTE_CLASS[[0x0A, 0x0B, 0x0C, 0x1C, 0x1D, 0x1E]] = _BREAK
_BYTE_CLASS[[0x0D, 0x20, 0x09, 0x23, 0x2D, 0x2E]] = [_CR, _BLANK, _BLANK, _HASH, _DASH, _DOT]


@nb.njit(cache=True, nogil=True)
def layout_counts(offsets, data, props):
    """``int64 [5, n]``: ``LAYOUT_COUNTS`` of each string of ``offsets``/``data``.

    ``hashes``: ``#`` characters; ``ellipses``: non-overlapping ``...`` plus ``…``; ``lines``: as
    ``str.splitlines`` counts them (0 for empty text); ``bullet_lines``: lines whose first character
    other than blanks is ``•`` or ``-``; ``ellipsis_lines``: lines that end in ``...`` or ``…`` before
    trailing blanks. Line breaks are those of ``curate.text.words.LINE_BREAKS`` (``\\r\\n`` is one);
    blanks are the regex's ``\\s`` (``props``' ``SPACE``, covering the column's code points) other than line
    breaks."""
    n = offsets.shape[0] - 1
    out = np.zeros((5, n), dtype=np.int64)
    classes = _BYTE_CLASS
    for d in range(n):
        lo, end = offsets[d], offsets[d + 1]
        hashes = ellipses = breaks = bullets = ellipsis_lines = 0
        run = 0  # consecutive dots just before p
        line_start = True  # only blanks so far on this line
        tail_dots, tail_hellip = 0, False  # the line's last non-blank characters: a dot run's length, or "…"
        last_break = False  # whether the last character was a line break
        p = lo
        while p < end:
            k = classes[data[p]]
            if k == _ORDINARY:  # a run of ordinary ASCII characters: one state change after it
                p += 1
                while p < end and classes[data[p]] == _ORDINARY:
                    p += 1
                ellipses += run // 3
                run = tail_dots = 0
                line_start = tail_hellip = last_break = False
                continue
            if k == _DOT:
                run += 1
                tail_dots = run
                line_start = tail_hellip = last_break = False
                p += 1
                continue
            ellipses += run // 3
            run = 0
            width, w = 0, 1
            c = np.int64(data[p])
            if k == _BREAK:
                width = 1
            elif k == _CR:
                width = 2 if p + 1 < end and data[p + 1] == 0x0A else 1
            elif k == _HIGH:
                c, w = code_point(data, p)
                if c == 0x85 or c == 0x2028 or c == 0x2029:
                    width = w
            if width:
                breaks += 1
                ellipsis_lines += tail_dots >= 3 or tail_hellip
                line_start, tail_dots, tail_hellip, last_break = True, 0, False, True
                p += width
                continue
            last_break = False
            if k == _BLANK:
                p += 1
                continue
            if k == _HIGH:
                p += w
                if props[c] & SPACE:
                    continue
            else:
                p += 1
            bullets += line_start and (k == _DASH or c == 0x2022)
            hashes += k == _HASH
            ellipses += c == 0x2026
            line_start = False
            tail_dots = 0
            tail_hellip = c == 0x2026
        ellipses += run // 3
        ellipsis_lines += tail_dots >= 3 or tail_hellip
        lines = 0 if end == lo else breaks + 1 - last_break
        out[0, d], out[1, d], out[2, d], out[3, d], out[4, d] = hashes, ellipses, lines, bullets, ellipsis_lines
    return out
