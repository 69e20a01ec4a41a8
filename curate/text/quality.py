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

``prose_counts`` counts, in one pass, the metrics of ``score.heuristic`` as its regular expressions
define them: runs of non-whitespace (``\\S+``), non-whitespace and letter (``\\p{L}``) characters, ``#``
plus ``...`` and ``…``, Gopher's stop words (``(?i)\\b(?:the|be|...)\\b``), and of the lines split at
``\\n`` and stripped: the non-empty ones, those ending in terminal punctuation, and the distinct ones (told
apart by a 64-bit hash of their bytes).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from winnow.curate.dedup.kernels import fmix64
from winnow.curate.text.codepoints import LETTER, MARK, NUMBER, SPACE, WORD
from winnow.curate.text.tokens import code_point, document_tokens, hash_bytes, longest_string, stripped

#: Rows of ``quality_counts``' output.
COUNTS = ("tokens", "words", "word_chars", "alpha", "stop_words")
#: Rows of ``layout_counts``' output.
LAYOUT_COUNTS = ("hashes", "ellipses", "lines", "bullet_lines", "ellipsis_lines")
#: Rows of ``prose_counts``' output.
PROSE_COUNTS = ("words", "non_space", "letters", "symbols", "stop_words", "lines", "punct_lines", "unique_lines")
#: ``score.heuristic``'s stop words (Gopher's), matched case-insensitively as whole words; ASCII letters only
#: (no other character folds to one of theirs: a test asks the regex engine).
PROSE_STOP_WORDS = ("the", "be", "to", "of", "and", "that", "have", "with")
#: Characters a line may end in to count as ending in terminal punctuation.
LINE_END_PUNCTUATION = ".!?\"'\u201d\u2019)"


def stop_word_buffers(stop_words) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets, data)`` of the distinct stop words' UTF-8 bytes, for ``quality_counts``."""
    encoded = [w.encode() for w in dict.fromkeys(stop_words)]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(w) for w in encoded])
    return offsets, np.frombuffer(b"".join(encoded), dtype=np.uint8).copy()


@nb.njit(cache=True, inline="always")
def _stop_index(data, lo, hi, stop_offsets, stop_data, fold=0):
    """Index of the stop word equal to ``data[lo:hi]`` (each byte or-ed with ``fold``: 0x20 lowercases ASCII
    letters), or -1."""
    for s in range(stop_offsets.shape[0] - 1):
        a, b = stop_offsets[s], stop_offsets[s + 1]
        if b - a != hi - lo:
            continue
        same = True
        for j in range(b - a):
            if stop_data[a + j] != data[lo + j] | fold:
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


_PROSE_STOPS = stop_word_buffers(PROSE_STOP_WORDS)
_LINE_ENDS = np.array([ord(c) for c in LINE_END_PUNCTUATION], dtype=np.int64)


def prose_counts(offsets: np.ndarray, data: np.ndarray, props: np.ndarray) -> np.ndarray:
    """``int64 [8, n]``: ``PROSE_COUNTS`` of each string of ``offsets``/``data`` (``props`` covering its code
    points)."""
    return _prose_counts(offsets, data, props, *_PROSE_STOPS, _LINE_ENDS)


@nb.njit(cache=True, inline="always")
def _is_stop_word(data, p, end, props, stop_offsets, stop_data):
    """Whether a stop word, in any case, starts at ``p`` (a word's start) and ends before a non-word character."""
    q = p
    while q < end and q - p <= 4 and 0x61 <= (data[q] | 0x20) <= 0x7A:  # ASCII letters; no stop word has 5
        q += 1
    if q < end:
        c, _ = code_point(data, q)
        if props[c] & WORD:
            return False
    return _stop_index(data, p, q, stop_offsets, stop_data, 0x20) >= 0


@nb.njit(cache=True, nogil=True)
def _prose_counts(offsets, data, props, stop_offsets, stop_data, line_ends):
    n = offsets.shape[0] - 1
    out = np.zeros((8, n), dtype=np.int64)
    size = 16
    keys = np.zeros(size, dtype=np.uint64)
    used = np.zeros(size, dtype=np.int64)  # the document (plus one) a slot was filled for
    for d in range(n):
        lo, end = offsets[d], offsets[d + 1]
        newlines = 0
        for p in range(lo, end):
            newlines += data[p] == 10
        while size < 2 * (newlines + 1):
            size *= 2
            keys = np.zeros(size, dtype=np.uint64)
            used = np.zeros(size, dtype=np.int64)
        words = non_space = letters = symbols = stops = lines = punct = unique = 0
        dots = 0
        space, in_word = True, False  # the previous character: whitespace (or none); a word character
        line = lo
        p = lo
        while p <= end:
            if p == end or data[p] == 10:  # a line ends: strip it, count it, look up its hash
                s, e = stripped(data, line, p, props)
                if e > s:
                    lines += 1
                    q = e - 1
                    while data[q] & 0xC0 == 0x80:
                        q -= 1
                    last, _ = code_point(data, q)
                    for x in line_ends:
                        if last == x:
                            punct += 1
                            break
                    k = fmix64(hash_bytes(data, s, e))
                    j = np.int64(k & np.uint64(size - 1))
                    while used[j] == d + 1 and keys[j] != k:
                        j = (j + 1) & (size - 1)
                    if used[j] != d + 1:
                        used[j], keys[j] = d + 1, k
                        unique += 1
                line = p + 1
                if p == end:
                    break
            c, w = code_point(data, p)
            f = props[c]
            if f & SPACE:
                space = True
            else:
                non_space += 1
                words += space
                space = False
            letters += (f & LETTER) != 0
            if c == 0x2E:
                dots += 1
            else:
                symbols += dots // 3 + (c == 0x23) + (c == 0x2026)
                dots = 0
            word = (f & WORD) != 0
            if word and not in_word and c < 0x80 and _is_stop_word(data, p, end, props, stop_offsets, stop_data):
                stops += 1
            in_word = word
            p += w
        symbols += dots // 3
        out[0, d], out[1, d], out[2, d], out[3, d] = words, non_space, letters, symbols
        out[4, d], out[5, d], out[6, d], out[7, d] = stops, lines, punct, unique
    return out
