"""The Gopher repetition counts of every document in one compiled pass (Rae et al. 2021, table A1).

``repetition_counts`` reads a string column's Arrow buffers and, per document, in one
call that releases the GIL:

* the document's characters (the denominator of every fraction), counted 8 bytes a step;
* lines (split at runs of ``\\n``) and paragraphs (the text stripped of surrounding
  whitespace, split at runs of two or more ``\\n``): how many, how many repeat an earlier
  one, and the characters of those repeats;
* words (the tokens of ``curate.text.words.TOKEN_PATTERN``, scanned by
  ``curate.text.tokens``) and, over them in one pass, the characters covered by the most
  frequent 2-, 3- and 4-gram and by repeated 5- to 10-grams.

The definitions follow datatrove's ``GopherRepetitionFilter``, which the paper describes
only in words:

* top n-gram characters: the most frequent n-gram (ties: the one seen first) times its
  length as ``" ".join(words)``;
* duplicate n-gram characters: scan left to right, and when the n-gram at ``i`` was seen
  before, add its characters (``"".join(words)``) and jump to ``i + n``, else step by one.

N-grams are compared as sequences of words (words by a 64-bit hash of their bytes), so
``["ab", "c"]`` and ``["a", "bc"]`` are different n-grams here (they collide in
datatrove's ``"".join``).

How the n-grams cost one hash probe per word or two: each position ``i`` gets, for each
``n``, the position ``first[n][i]`` where its n-gram occurs first. A word's is found in a
table of word hashes; an n-gram whose (n-1)-gram prefix occurs there for the first time
is new as well (``first[n][i] = i``, no probe); otherwise it is looked up by the pair
(first position of its prefix, its last word), which names it exactly. Counting n-grams
is then counting first positions, and "seen before" in the duplicate scans is a bit per
first position: no table per n-gram size, and in prose most long n-grams cost nothing.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from winnow.curate.text.tokens import document_tokens, hash_bytes, longest_string, stripped

_U64 = np.uint64
TOP_NS = (2, 3, 4)
DUP_NS = (5, 6, 7, 8, 9, 10)
#: Rows of ``repetition_counts``' segment output: paragraphs and lines, and the document's characters.
SEGMENT_COUNTS = ("paras", "para_dups", "para_dup_chars", "lines", "line_dups", "line_dup_chars", "chars")


@nb.njit(cache=True, inline="always")
def _mix(x):
    x ^= x >> _U64(33)
    x *= _U64(0xFF51AFD7ED558CCD)
    x ^= x >> _U64(33)
    return x


_ONES = _U64(0x0101010101010101)
_HIGH_BITS = _U64(0x8080808080808080)
_LOW_BITS = _U64(0x7F7F7F7F7F7F7F7F)
_NEWLINES = _U64(0x0A0A0A0A0A0A0A0A)


@nb.njit(cache=True, inline="always")
def _count_high_bits(x):
    """How many bytes of ``x`` have their high bit set (``x`` has no other bit set)."""
    return np.int64(((x >> _U64(7)) * _ONES) >> _U64(56))


@nb.njit(cache=True)
def _scan(data, words, lo, hi):
    """``(newlines, characters, high)`` of ``data[lo:hi]``; ``high < 128`` when it is ASCII.

    ``words`` is ``data`` viewed as uint64: whole words are read 8 bytes a step. A byte is
    ``\\n`` when ``x ^ _NEWLINES`` has a zero byte (found exactly: adding 0x7F to the low
    bits carries into no other byte), and begins a character unless it is ``10xxxxxx``.
    """
    newlines = chars = 0
    high = np.int64(0)
    body, tail = min(hi, (lo + 7) & ~7), max(lo, hi & ~7)
    if body >= tail:  # no whole word
        body = tail = hi
    for p in range(lo, body):
        newlines += data[p] == 10
        chars += (data[p] & 0xC0) != 0x80
        high |= data[p]
    any_high = _U64(0)
    for k in range(body >> 3, tail >> 3):
        x = words[k]
        any_high |= x
        y = x ^ _NEWLINES
        newlines += _count_high_bits(~(((y & _LOW_BITS) + _LOW_BITS) | y) & _HIGH_BITS)
        chars += 8 - _count_high_bits(x & ~(x << _U64(1)) & _HIGH_BITS)
    for p in range(tail, hi):
        newlines += data[p] == 10
        chars += (data[p] & 0xC0) != 0x80
        high |= data[p]
    if any_high & _HIGH_BITS:
        high |= 128
    return newlines, chars, high


@nb.njit(cache=True)
def _capacity(n):
    cap = 16
    while cap < 2 * n + 2:
        cap *= 2
    return cap


# Hash tables are rows of two uint64 (one cache line holds four): a key, and ``gen << 32 | value``
# where ``gen`` numbers the table's uses, so that a slot of an earlier document reads as empty
# and no table is ever cleared. A table is grown for the largest document so far, but a document
# uses only the first ``mask + 1`` rows, sized for it: small documents stay in cache.


@nb.njit(cache=True, inline="always")
def _find(table, key, gen, mask):
    """The row holding ``key`` in generation ``gen``, or the empty row where it belongs."""
    i = np.int64(_mix(key)) & mask
    while (table[i, 1] >> _U64(32)) == gen and table[i, 0] != key:
        i = (i + 1) & mask
    return i


@nb.njit(cache=True, inline="always")
def _seen_before(table, key, gen, mask):
    """Whether ``key`` is in the set of generation ``gen``; adds it if not."""
    i = _find(table, key, gen, mask)
    if (table[i, 1] >> _U64(32)) == gen:
        return True
    table[i, 0], table[i, 1] = key, gen << _U64(32)
    return False


@nb.njit(cache=True)
def _table(table, n):
    """``(table, mask)`` with room for ``n`` keys at most half full (a larger table when ``table`` is too small)."""
    cap = _capacity(n)
    if table.shape[0] < cap:
        table = np.zeros((cap, 2), dtype=np.uint64)
    return table, cap - 1


@nb.njit(cache=True, inline="always")
def _chars(data, start, end):
    """Characters (code points) of ``data[start:end]``."""
    n = 0
    for p in range(start, end):
        n += (data[p] & 0xC0) != 0x80
    return n


@nb.njit(cache=True)
def _segment_counts(data, lo, hi, props, table, gen, mask, out):
    """Lines and paragraphs of one document: ``out`` gets ``SEGMENT_COUNTS``.

    Lines are the pieces between runs of ``\n`` (an empty first / last piece where the text
    starts / ends with one). Paragraphs are the pieces of the text stripped of surrounding
    whitespace between runs of two or more ``\n``: each is hashed from the hashes of its lines
    (a paragraph holds no ``\n\n``, so its lines name it), so the text is hashed once. Line keys
    have the low bit clear, paragraph keys set, in one table.
    """
    s0, e0 = stripped(data, lo, hi, props)
    lines = line_dups = line_chars = 0
    paras = para_dups = para_chars = 0
    if s0 == e0:
        paras = 1  # one empty paragraph
    para_h, para_start, para_end = _U64(0), -1, -1
    start = p = lo
    while True:
        while p < hi and data[p] != 10:
            p += 1
        h = hash_bytes(data, start, p)
        lines += 1
        if _seen_before(table, h & ~_U64(1), gen, mask):
            line_dups += 1
            line_chars += _chars(data, start, p)
        r = p
        while r < hi and data[r] == 10:
            r += 1
        a, b = max(start, s0), min(p, e0)
        if a < b:  # this line holds a piece of a paragraph
            if a != start or b != p:
                h = hash_bytes(data, a, b)
            para_h = ((para_h << _U64(23)) | (para_h >> _U64(41))) ^ h
            para_h *= _U64(0x9E3779B97F4A7C15)
            if para_start < 0:
                para_start = a
            para_end = b
        if para_start >= 0 and (r - p >= 2 or p >= e0 or r >= hi):  # the paragraph ends here
            paras += 1
            if _seen_before(table, _mix(para_h ^ _U64(para_end - para_start)) | _U64(1), gen, mask):
                para_dups += 1
                para_chars += _chars(data, para_start, para_end)
            para_h, para_start = _U64(0), -1
        if p >= hi:
            break
        start = p = r
    out[0], out[1], out[2], out[3], out[4], out[5] = paras, para_dups, para_chars, lines, line_dups, line_chars


@nb.njit(cache=True)
def _tokens(data, lo, hi, props, fold, starts, ends, hashes, prefix, ascii):
    """The document's word hashes and the running sum of their characters (``prefix[0] = 0``); returns how many.

    Scratch arrays hold at least ``hi - lo`` values (``prefix`` one more): a word has a byte at least.
    """
    m = document_tokens(data, lo, hi, props, fold, starts, ends)
    for t in range(m):
        hashes[t] = hash_bytes(data, starts[t], ends[t])
        prefix[t + 1] = prefix[t] + (ends[t] - starts[t] if ascii else _chars(data, starts[t], ends[t]))
    return m


_LOW32 = np.uint64(0xFFFFFFFF)


_SEEN, _SKIPPED = 1, 2  # a duplicate scan's marks on a position: its n-gram was seen there / the scan jumped over it


@nb.njit(cache=True)
def _ngram_counts(m, hashes, prefix, word, rep, rep_first, state, words, pairs, mask, gen, top, dup):
    """Top 2-4-gram and duplicate 5-10-gram characters of one document's ``m`` words (see the module docstring).

    N-gram sizes are taken in turn, over the positions whose (n-1)-gram occurred before
    (``rep``, ascending, with that (n-1)-gram's first position in ``rep_first``): only there can
    the n-gram have occurred before, so each size costs what repeats, not what the text holds.
    ``words`` and ``pairs`` are hash tables of at least ``mask + 1`` rows; ``gen`` is the
    first of the 10 generations this call uses.
    """
    g = _U64(gen) << _U64(32)
    r = 0
    for i in range(m):  # word[i]: where word i occurs first
        j = _find(words, hashes[i], gen, mask)
        if words[j, 1] & ~_LOW32 != g:
            words[j, 0], words[j, 1] = hashes[i], g | _U64(i)
        word[i] = np.int64(words[j, 1] & _LOW32)
        if word[i] != i:
            rep[r], rep_first[r] = i, word[i]
            r += 1
    for n in range(2, 11):
        size = m - n + 1  # positions of an n-gram
        if size <= 0:
            return
        g = _U64(gen + n - 1) << _U64(32)
        state[:size] = 0  # top n-grams: repeats of the n-gram first seen there; duplicate scans: _SEEN | _SKIPPED
        best, best_first = 1, 0  # an n-gram that occurs once: the first one wins ties
        chars = 0
        kept = 0
        for t in range(r):
            i, c = rep[t], rep_first[t]
            if i >= size:
                break
            last = word[i + n - 1]
            if word[c + n - 1] != last:  # not c's n-gram: another's that begins with the same (n-1)-gram, or a new one
                key = (_U64(c) << _U64(32)) | _U64(last)
                j = _find(pairs, key, gen + n - 1, mask)
                if pairs[j, 1] & ~_LOW32 == g:
                    c = np.int64(pairs[j, 1] & _LOW32)
                else:
                    pairs[j, 0], pairs[j, 1] = key, g | _U64(i)
                    continue  # its first occurrence: counted as once, and a scan sees it new
            rep[kept], rep_first[kept] = i, c
            kept += 1
            if n <= 4:
                state[c] += 1
                v = state[c] + 1
                if v > best or (v == best and c < best_first):
                    best, best_first = v, c
            elif not state[i] & _SKIPPED:  # the greedy scan stops here; a position it did not jump over saw its n-gram
                if state[c] & _SEEN or not state[c] & _SKIPPED:
                    chars += prefix[i + n] - prefix[i]
                    for k in range(i + 1, min(i + n, size)):
                        state[k] |= _SKIPPED
                else:
                    state[c] |= _SEEN
        r = kept
        if n <= 4:
            top[n - 2] = (n - 1 + prefix[best_first + n] - prefix[best_first]) * best
        else:
            dup[n - 5] = chars


#: Documents may have at most this many bytes (word positions are packed into 32 bits of a table key).
MAX_WORDS = 1 << 32


@nb.njit(cache=True, nogil=True)
def repetition_counts(offsets, data, props, fold):
    """Per document of the string column ``offsets``/``data``: ``(segments [7, n], top [3, n], dup [6, n])``.

    ``segments`` rows are ``SEGMENT_COUNTS``; ``top`` row ``k`` holds the characters of the most
    frequent ``(k + 2)``-gram (-1 when the document has fewer words), ``dup`` row ``k`` the
    characters of repeated ``(k + 5)``-grams. ``props``/``fold`` come from ``curate.text.codepoints``
    and must cover every code point of the column; no document may reach ``MAX_WORDS`` bytes.
    """
    n_docs = offsets.shape[0] - 1
    segments = np.zeros((7, n_docs), dtype=np.int64)
    top = np.full((3, n_docs), -1, dtype=np.int64)
    dup = np.zeros((6, n_docs), dtype=np.int64)
    longest = longest_string(offsets)
    # Scratch for the longest document (it has at most one word per byte).
    starts = np.empty(longest + 1, dtype=np.int64)
    ends = np.empty(longest + 1, dtype=np.int64)
    hashes = np.empty(longest + 1, dtype=np.uint64)
    prefix = np.zeros(longest + 2, dtype=np.int64)
    word = np.empty(longest + 1, dtype=np.int64)
    rep = np.empty(longest + 1, dtype=np.int64)
    rep_first = np.empty(longest + 1, dtype=np.int64)
    state = np.empty(longest + 1, dtype=np.int32)
    segs = np.zeros((16, 2), dtype=np.uint64)
    words = np.zeros((16, 2), dtype=np.uint64)
    pairs = np.zeros((16, 2), dtype=np.uint64)
    data64 = data[: data.shape[0] - data.shape[0] % 8].view(np.uint64)
    gen = 0
    for d in range(n_docs):
        lo, hi = offsets[d], offsets[d + 1]
        newlines, segments[6, d], high = _scan(data, data64, lo, hi)
        segs, mask = _table(segs, 2 * (newlines + 1))
        gen += 1
        _segment_counts(data, lo, hi, props, segs, gen, mask, segments[:, d])
        m = _tokens(data, lo, hi, props, fold, starts, ends, hashes, prefix, high < 128)
        words, mask = _table(words, m)
        pairs, mask = _table(pairs, m)
        gen += 1
        _ngram_counts(m, hashes, prefix, word, rep, rep_first, state, words, pairs, mask, gen, top[:, d], dup[:, d])
        gen += 9
    return segments, top, dup
