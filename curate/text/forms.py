"""Unicode normalization forms (NFC, NFKC) of long texts, normalizing only the pieces around non-ASCII characters.

Normalization acts within segments that start at a character which never combines with what
precedes it. An ASCII character followed by another ASCII character (or by the end of the text)
starts such a segment: ASCII characters have no decomposition, are starters (combining class 0),
and are never the second character of a composition, and a following ASCII character cannot be
a combining mark that the first would absorb. So the form of a text is the concatenation of the
forms of its segments, and a segment of ASCII alone is its own form. ``islands`` finds the byte
spans that hold non-ASCII characters, each from such a boundary to the next; only those go through
polars' ``str.normalize``, and ``splice`` puts them back. A test compares the result with
normalizing whole texts.
"""

from __future__ import annotations

import numba as nb
import numpy as np
import polars as pl

from winnow.curate.dedup.text import string_array, string_buffers


@nb.njit(cache=True)
def _boundary(data, q, hi):
    """Whether a segment may start at ``q``: an ASCII byte followed by another or by the end."""
    return data[q] < 0x80 and (q + 1 == hi or data[q + 1] < 0x80)


@nb.njit(cache=True, nogil=True)
def _islands(offsets, data, rows, out_row, out_start, out_end):
    """Write the spans of ``islands`` into the outputs when they are given room (else only count them); returns
    how many."""
    room = out_row.shape[0]
    k = 0
    for r in rows:
        lo, hi = offsets[r], offsets[r + 1]
        last, p = lo, lo
        while p < hi:
            if data[p] < 0x80:
                if _boundary(data, p, hi):
                    last = p
                p += 1
                continue
            q = p + 1
            while q < hi and not _boundary(data, q, hi):
                q += 1
            if k < room:
                out_row[k], out_start[k], out_end[k] = r, last, q
            k += 1
            p = q
    return k


def islands(offsets: np.ndarray, data: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(row, start, end)`` byte spans of the ``rows`` (indices, ascending) that hold non-ASCII characters,
    each between two segment boundaries (or the text's ends)."""
    none = np.zeros(0, dtype=np.int64)
    n = _islands(offsets, data, rows, none, none, none)
    out = tuple(np.empty(n, dtype=np.int64) for _ in range(3))
    _islands(offsets, data, rows, *out)
    return out


@nb.njit(cache=True, nogil=True)
def gather(data, starts, ends):
    """The spans ``data[starts[i]:ends[i]]`` as string buffers ``(offsets, data)``."""
    n = starts.shape[0]
    offsets = np.zeros(n + 1, dtype=np.int64)
    for i in range(n):
        offsets[i + 1] = offsets[i] + ends[i] - starts[i]
    out = np.empty(offsets[n], dtype=np.uint8)
    for i in range(n):
        out[offsets[i] : offsets[i + 1]] = data[starts[i] : ends[i]]
    return offsets, out


@nb.njit(cache=True, nogil=True)
def splice(offsets, data, rows, isl_row, isl_start, isl_end, new_offsets, new_data):
    """The ``rows`` (ascending) with island ``i`` replaced by ``new_data[new_offsets[i]:new_offsets[i + 1]]``."""
    size = 0
    for r in rows:
        size += offsets[r + 1] - offsets[r]
    for i in range(isl_row.shape[0]):
        size += (new_offsets[i + 1] - new_offsets[i]) - (isl_end[i] - isl_start[i])
    out_offsets = np.zeros(rows.shape[0] + 1, dtype=np.int64)
    out = np.empty(size, dtype=np.uint8)
    o, i = 0, 0
    for j in range(rows.shape[0]):
        r = rows[j]
        p, hi = offsets[r], offsets[r + 1]
        while i < isl_row.shape[0] and isl_row[i] == r:
            n = isl_start[i] - p
            out[o : o + n] = data[p : isl_start[i]]
            o += n
            m = new_offsets[i + 1] - new_offsets[i]
            out[o : o + m] = new_data[new_offsets[i] : new_offsets[i + 1]]
            o += m
            p = isl_end[i]
            i += 1
        out[o : o + hi - p] = data[p:hi]
        o += hi - p
        out_offsets[j + 1] = o
    return out_offsets, out


def normalized_rows(text: pl.Series, offsets: np.ndarray, data: np.ndarray, rows: np.ndarray, form: str) -> pl.Series:
    """``text[rows].str.normalize(form)`` (``offsets``/``data``: ``text``'s buffers), island by island."""
    isl_row, isl_start, isl_end = islands(offsets, data, rows)
    fixed = pl.Series(string_array(*gather(data, isl_start, isl_end))).str.normalize(form)
    spliced = splice(offsets, data, rows, isl_row, isl_start, isl_end, *string_buffers(fixed))
    return pl.Series(text.name, string_array(*spliced))
