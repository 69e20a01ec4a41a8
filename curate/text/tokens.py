"""``TOKEN_PATTERN`` (``curate.text.words``) as a compiled scanner: the same tokens, no regex.

A regex engine with leftmost-first alternation takes, at each position that is not
whitespace, the first alternative that matches there; since nothing follows the
alternation, each alternative's greedy loops simply run as far as they can, except where
the pattern makes them give back characters. ``token_end`` follows the alternatives in
the pattern's order:

1. URL: ``https://``, ``http://`` or ``www.``, then the longest run of characters other
   than whitespace and ``<>"'`` ending in a character other than ``.,;:!?)]}``;
2. acronym: two or more (letter, ``.``) pairs;
3. contraction suffix: an apostrophe (``'`` or ``’``), then ``s re ve ll d m t`` in any
   case, then a word boundary;
4. word: a run of word characters, extended while inner punctuation (a run of
   characters that are neither whitespace, word characters nor ``'’-=/:<>``) is followed
   by a word character, or an infix (``-=/:<>``) by a number;
5. ``+`` or ``.`` followed by word characters;
6. runs of two or more ``. - = ' * # ~ +``, and ``):``;
7. any other character on its own.

Character classes come from ``curate.text.codepoints`` (asked of the regex engine), so the
tokens are the regex's own; a test compares the two on real and on adversarial text.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from winnow.curate.text.codepoints import LETTER, NUMBER, SPACE, STRIP, WORD

_U64 = np.uint64


@nb.njit(cache=True, inline="always")
def code_point(data, p):
    """``(code point, byte width)`` of the UTF-8 character at ``data[p]`` (valid UTF-8 assumed)."""
    b = np.int64(data[p])
    if b < 0x80:
        return b, 1
    if b < 0xE0:
        return ((b & 0x1F) << 6) | (np.int64(data[p + 1]) & 0x3F), 2
    if b < 0xF0:
        return ((b & 0x0F) << 12) | ((np.int64(data[p + 1]) & 0x3F) << 6) | (np.int64(data[p + 2]) & 0x3F), 3
    return (((b & 0x07) << 18) | ((np.int64(data[p + 1]) & 0x3F) << 12) | ((np.int64(data[p + 2]) & 0x3F) << 6)
            | (np.int64(data[p + 3]) & 0x3F)), 4  # fmt: skip


@nb.njit(cache=True)
def longest_string(offsets):
    """Bytes of the longest string of a column's ``offsets`` (0 for none): the room a per-document scratch needs."""
    longest = 0
    for d in range(offsets.shape[0] - 1):
        longest = max(longest, offsets[d + 1] - offsets[d])
    return longest


@nb.njit(cache=True)
def stripped(data, lo, hi, props):
    """``(start, end)`` of ``data[lo:hi]`` without the characters ``str.strip_chars()`` removes at either end
    (``props`` from ``curate.text.codepoints``, covering the text's code points)."""
    while lo < hi:
        c, w = code_point(data, lo)
        if not props[c] & STRIP:
            break
        lo += w
    while hi > lo:
        q = hi - 1
        while data[q] & 0xC0 == 0x80:
            q -= 1
        c, w = code_point(data, q)
        if not props[c] & STRIP:
            break
        hi = q
    return lo, hi


@nb.njit(cache=True, inline="always")
def _is_infix(c):
    return c == 45 or c == 61 or c == 47 or c == 58 or c == 60 or c == 62  # - = / : < >


@nb.njit(cache=True, inline="always")
def _url_stop(c):
    """Characters a URL cannot hold: whitespace is checked apart; ``< > " ' ```."""
    return c == 60 or c == 62 or c == 34 or c == 39 or c == 96


@nb.njit(cache=True, inline="always")
def _url_trailing(c):
    return (
        c == 46 or c == 44 or c == 59 or c == 58 or c == 33 or c == 63 or c == 41 or c == 93 or c == 125
    )  # . , ; : ! ? ) ] }


@nb.njit(cache=True, inline="always")
def _has(data, p, end, text):
    if p + len(text) > end:
        return False
    for j in range(len(text)):
        if data[p + j] != text[j]:
            return False
    return True


_HTTPS = np.frombuffer(b"https://", dtype=np.uint8).copy()
_HTTP = np.frombuffer(b"http://", dtype=np.uint8).copy()
_WWW = np.frombuffer(b"www.", dtype=np.uint8).copy()


@nb.njit(cache=True, inline="always")
def _word_run(data, p, end, props):
    """End of the run of word characters starting at ``p`` (``p`` itself when there is none)."""
    while True:
        # ASCII in a tight loop of its own: with the decoding in it, the loop ran 2.5x slower on ASCII text.
        while p < end and data[p] < 128 and props[data[p]] & WORD:
            p += 1
        if p >= end or data[p] < 128:
            return p
        c, w = code_point(data, p)
        if not props[c] & WORD:
            return p
        p += w


@nb.njit(cache=True, inline="always")
def _url_end(data, p, end, props):
    """End of a URL token at ``p``, or -1."""
    if _has(data, p, end, _HTTPS):
        q = p + 8
    elif _has(data, p, end, _HTTP):
        q = p + 7
    elif _has(data, p, end, _WWW):
        q = p + 4
    else:
        return -1
    last = -1
    while q < end:
        c, w = code_point(data, q)
        if props[c] & SPACE or _url_stop(c):
            break
        q += w
        if not _url_trailing(c):
            last = q
    return last


@nb.njit(cache=True, inline="always")
def _acronym_end(data, p, end, props):
    """End of two or more (letter, ``.``) pairs at ``p``, or -1."""
    q, reps = p, 0
    while q < end:
        c, w = code_point(data, q)
        if not props[c] & LETTER or q + w >= end or data[q + w] != 46:
            break
        q += w + 1
        reps += 1
    return q if reps >= 2 else -1


@nb.njit(cache=True, inline="always")
def _contraction_end(data, p, end, props, fold):
    """End of ``['’](?i:s|re|ve|ll|d|m|t)\\b`` at ``p``, or -1."""
    c, w = code_point(data, p)
    if c != 39 and c != 0x2019:
        return -1
    q = p + w
    if q >= end:
        return -1
    c, w = code_point(data, q)
    first = fold[c]
    q += w
    if first == 114 or first == 118 or first == 108:  # r -> e, v -> e, l -> l
        if q >= end:
            return -1
        c, w = code_point(data, q)
        if fold[c] != (108 if first == 108 else 101):
            return -1
        q += w
    elif not (first == 115 or first == 100 or first == 109 or first == 116):  # s d m t
        return -1
    if q < end:  # \b: the suffix ends in a word character, so the next one must not be one
        c, w = code_point(data, q)
        if props[c] & WORD:
            return -1
    return q


@nb.njit(cache=True, inline="always")
def _inner_punct(flags, c):
    """Whether ``c`` may join two runs of word characters (``[^\\s\\w'’\\-=/:<>]``)."""
    return not (flags & (SPACE | WORD) or c == 39 or c == 0x2019 or _is_infix(c))


@nb.njit(cache=True, inline="always")
def _word_end(data, p, end, props):
    """End of a word token (alternative 4) at ``p``, which holds a word character."""
    q = _word_run(data, p, end, props)
    while q < end:
        b = data[q]
        if b < 128 and props[b] & SPACE:  # the usual end of a word
            break
        c, w = code_point(data, q)
        flags = props[c]
        if not _inner_punct(flags, c):
            if not _is_infix(c) or q + w >= end:
                break
            c2, w2 = code_point(data, q + w)
            if not props[c2] & NUMBER:
                break
            q = _word_run(data, q + w + w2, end, props)
            continue
        r = q + w  # a run of inner punctuation, which must be followed by a word character
        while r < end:
            c, w = code_point(data, r)
            if not _inner_punct(props[c], c):
                break
            r += w
        after = _word_run(data, r, end, props)
        if after == r:
            break
        q = after
    return q


@nb.njit(cache=True)
def token_end(data, p, end, props, fold):
    """End of the token that starts at ``p`` (a character that is not whitespace) within ``data[:end]``."""
    c, w = code_point(data, p)
    flags = props[c]
    if flags & WORD:
        if (c == 104 or c == 119) and p + 4 <= end:  # h, w: maybe a URL
            q = _url_end(data, p, end, props)
            if q >= 0:
                return q
        if flags & LETTER and p + w < end and data[p + w] == 46:  # a letter and a dot: maybe an acronym
            q = _acronym_end(data, p, end, props)
            if q >= 0:
                return q
        return _word_end(data, p, end, props)
    if c == 39 or c == 0x2019:
        q = _contraction_end(data, p, end, props, fold)
        if q >= 0:
            return q
    if (c == 43 or c == 46) and p + 1 < end:  # [+.]\w+
        q = _word_run(data, p + 1, end, props)
        if q > p + 1:
            return q
    if c == 46 or c == 45 or c == 61 or c == 39 or c == 42 or c == 35 or c == 126 or c == 43:  # . - = ' * # ~ +
        q = p + 1
        while q < end and data[q] == c:
            q += 1
        if q - p >= 2:
            return q
    if c == 41 and p + 1 < end and data[p + 1] == 58:  # ):
        return p + 2
    return p + w


@nb.njit(cache=True, inline="always")
def _load64(data, p):
    """The 8 bytes at ``data[p]`` as a little-endian uint64 (compiled to one load)."""
    return (_U64(data[p]) | (_U64(data[p + 1]) << _U64(8)) | (_U64(data[p + 2]) << _U64(16)) | (_U64(data[p + 3]) << _U64(24))
            | (_U64(data[p + 4]) << _U64(32)) | (_U64(data[p + 5]) << _U64(40)) | (_U64(data[p + 6]) << _U64(48))
            | (_U64(data[p + 7]) << _U64(56)))  # fmt: skip


@nb.njit(cache=True, inline="always")
def hash_bytes(data, start, end):
    """A 64-bit hash of ``data[start:end]``, 8 bytes a step (MurmurHash3's block mixing)."""
    h = _U64(end - start) * _U64(0x9E3779B97F4A7C15)
    p = start
    while p + 8 <= end:
        k = _load64(data, p) * _U64(0x87C37B91114253D5)
        k = ((k << _U64(31)) | (k >> _U64(33))) * _U64(0x4CF5AD432745937F)
        h ^= k
        h = ((h << _U64(27)) | (h >> _U64(37))) * _U64(5) + _U64(0x52DCE729)
        p += 8
    k = _U64(0)
    shift = _U64(0)
    while p < end:
        k |= _U64(data[p]) << shift
        shift += _U64(8)
        p += 1
    k *= _U64(0x87C37B91114253D5)
    k = ((k << _U64(31)) | (k >> _U64(33))) * _U64(0x4CF5AD432745937F)
    return h ^ k  # no finalizer: every table this keys mixes the key before taking its low bits


def _ascii_classes() -> np.ndarray:
    """Classes of the ASCII characters for the scanner's fast paths (a test checks them against the regex engine)."""
    out = np.zeros(128, dtype=np.uint8)
    for b in range(128):
        ch = chr(b)
        if ch.isalnum() or ch == "_":
            out[b] |= A_WORD
        if ch.isdigit():
            out[b] |= A_NUMBER
        if ch in "\t\n\x0b\x0c\r ":
            out[b] |= A_SPACE
        if ch in "-=/:<>":
            out[b] |= A_INFIX
        elif not out[b] & (A_WORD | A_SPACE) and ch != "'":
            out[b] |= A_INNER
        if ch in "'+.-=*#~)":
            out[b] |= A_SPECIAL
    return out


A_WORD, A_SPACE, A_NUMBER, A_INFIX, A_INNER, A_SPECIAL = 1, 2, 8, 16, 32, 64
#: ASCII classes: word, whitespace, digit, infix (``-=/:<>``), inner punctuation (see ``_word_end``),
#: and the symbols that may start a longer token than themselves (``'+.-=*#~)``).
ASCII = _ascii_classes()
_FALLBACK = -1


@nb.njit(cache=True, inline="always")
def _ascii_word_run(data, q, end):
    """End of the run of ASCII word characters from ``q``, or ``_FALLBACK`` when it meets a non-ASCII character."""
    while q < end:
        b = data[q]
        if b >= 128:
            return _FALLBACK
        if not ASCII[b] & A_WORD:
            return q
        q += 1
    return q


@nb.njit(cache=True, inline="always")
def _ascii_word_end(data, p, end):
    """``_word_end`` for a word starting at ``p`` in ASCII text; ``_FALLBACK`` when it meets a non-ASCII character."""
    q = _ascii_word_run(data, p + 1, end)
    while q != _FALLBACK and q < end:
        b = data[q]
        if b >= 128:
            return _FALLBACK
        f = ASCII[b]
        if f & A_INFIX:
            if q + 1 >= end:
                break
            b = data[q + 1]
            if b >= 128:
                return _FALLBACK
            if not ASCII[b] & A_NUMBER:
                break
            q = _ascii_word_run(data, q + 2, end)
        elif f & A_INNER:
            r = q + 1
            while r < end and data[r] < 128 and ASCII[data[r]] & A_INNER:
                r += 1
            if r >= end:
                break
            b = data[r]
            if b >= 128:
                return _FALLBACK
            if not ASCII[b] & A_WORD:
                break
            q = _ascii_word_run(data, r + 1, end)
        else:  # whitespace or an apostrophe
            break
    return q


@nb.njit(cache=True, inline="always")
def _fast_token_end(data, p, end):
    """End of the token at ``p`` when it is found by an ASCII fast path, else ``_FALLBACK``.

    Fast: a word of ASCII word characters (not starting a URL or an acronym), a lone symbol,
    a run of ``.-=*#~+``, ``)`` or ``):``, and ``.``/``+`` followed by ASCII word characters.
    """
    b = data[p]
    if b >= 128:
        return _FALLBACK
    f = ASCII[b]
    if f & A_WORD:
        if (b == 104 and p + 3 < end and data[p + 1] == 116 and data[p + 2] == 116 and data[p + 3] == 112) or (
            b == 119 and p + 3 < end and data[p + 1] == 119 and data[p + 2] == 119 and data[p + 3] == 46
        ):
            return _FALLBACK  # maybe a URL
        if p + 1 < end and data[p + 1] == 46 and not f & A_NUMBER and b != 95:
            return _FALLBACK  # maybe an acronym
        return _ascii_word_end(data, p, end)
    if not f & A_SPECIAL:
        return p + 1
    if b == 46 or b == 43:
        if p + 1 < end and data[p + 1] < 128 and ASCII[data[p + 1]] & A_WORD:
            return _ascii_word_run(data, p + 2, end)  # [+.]\w+
        if p + 1 < end and data[p + 1] >= 128:
            return _FALLBACK
    if b == 41:  # ) or ):
        return p + 2 if p + 1 < end and data[p + 1] == 58 else p + 1
    if b == 39:
        return _FALLBACK  # ' may start a contraction
    q = p + 1  # a run of . - = * # ~ + (one alone is a token too)
    while q < end and data[q] == b:
        q += 1
    return q


@nb.njit(cache=True)
def document_tokens(data, lo, hi, props, fold, starts, ends):
    """Byte spans of the tokens of ``data[lo:hi]`` into ``starts``/``ends`` (room for ``hi - lo``); returns how many.

    Most tokens are found in a loop of their own, plain ASCII words by the loop itself, other ASCII
    tokens by ``_fast_token_end``; the rest by ``token_end``, called from outside that loop (the call
    inside it slowed every token).
    """
    m = 0
    p = lo
    while p < hi:
        while p < hi:
            b = data[p]
            if b < 128 and ASCII[b] & A_SPACE:
                p += 1
                continue
            # The commonest token, ASCII word characters up to whitespace or the end, in this loop itself: no
            # other alternative of the pattern can match there (a URL, an acronym or a word with inner
            # punctuation needs a character that is neither), and the helpers below cost 4x its scan.
            if b < 128 and ASCII[b] & A_WORD:
                q = p + 1
                while q < hi and data[q] < 128 and ASCII[data[q]] & A_WORD:
                    q += 1
                if q >= hi or (data[q] < 128 and ASCII[data[q]] & A_SPACE):
                    starts[m], ends[m] = p, q
                    m += 1
                    p = q
                    continue
            q = _fast_token_end(data, p, hi) if b < 128 else _FALLBACK
            if q == _FALLBACK:
                break
            starts[m], ends[m] = p, q
            m += 1
            p = q
        if p >= hi:
            break
        c, w = code_point(data, p)
        if props[c] & SPACE:
            p += w
            continue
        q = token_end(data, p, hi, props, fold)
        starts[m], ends[m] = p, q
        m += 1
        p = q
    return m


@nb.njit(cache=True, nogil=True)
def token_spans(offsets, data, props, fold):
    """Every token of every string: ``(row int64[t], start int64[t], end int64[t])`` byte spans."""
    n = offsets.shape[0] - 1
    starts = np.empty(offsets[n] - offsets[0], dtype=np.int64)
    ends = np.empty(offsets[n] - offsets[0], dtype=np.int64)
    rows = np.empty(offsets[n] - offsets[0], dtype=np.int64)
    t = 0
    for i in range(n):
        m = document_tokens(data, offsets[i], offsets[i + 1], props, fold, starts[t:], ends[t:])
        rows[t : t + m] = i
        t += m
    return rows[:t], starts[:t], ends[:t]
