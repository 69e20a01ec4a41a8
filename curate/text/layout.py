"""``clean``'s control-character removal and whitespace normalization as one compiled pass.

``curate.stages.clean.normalize_text`` states them as polars regular expressions, applied in turn:

1. remove ``[\\p{Cc}&&[^\\n\\t]]`` and the invisible ``U+200B U+2060 U+FEFF U+00AD``;
2. ``[^\\S\\n]+\\n`` → ``\\n``: whitespace at the end of a line goes;
3. ``(\\S)(?:[^\\S\\n]{2,}|[^\\S \\n])`` → ``$1 ``: after a visible character, a run of two or more
   whitespace characters, or one that is not a space, becomes one space (indentation stays);
4. ``\\n{3,}`` → ``\\n\\n``;
5. ``strip_chars()``.

Together they act on each maximal run of whitespace (after step 1's removals) on its own. Say
the run holds ``k`` newlines and ``tail`` is what follows its last one (the whole run when
``k = 0``). Step 2 deletes everything but the newlines and ``tail``; step 4 keeps at most two
newlines; step 3 touches ``tail`` only when ``k = 0`` and a visible character precedes it, and
then makes it one space. So the run becomes ``"\\n" * min(k, 2) + tail``, or ``" "`` when it
follows a visible character within a line; step 5 then strips the ends of the result. Which
characters are whitespace (``\\s``) and which ``strip_chars`` removes come from
``curate.text.codepoints`` (asked of polars' regex engine); a test compares this pass with the
expressions on adversarial and real text.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from winnow.curate.text.codepoints import SPACE
from winnow.curate.text.tokens import code_point, stripped


@nb.njit(cache=True, inline="always")
def _removed(c):
    """Step 1's characters: controls other than ``\\n`` and ``\\t``, and the four invisible ones."""
    if c < 0x20:
        return c != 9 and c != 10
    return (0x7F <= c <= 0x9F) or c == 0x200B or c == 0x2060 or c == 0xFEFF or c == 0xAD


@nb.njit(cache=True, inline="always")
def _copy_kept(data, lo, hi, out, o):
    """Copy ``data[lo:hi]`` to ``out[o:]`` without step 1's characters; returns the new end."""
    p = lo
    while p < hi:
        b = data[p]
        if b < 0x80:
            if not _removed(b):
                out[o] = b
                o += 1
            p += 1
            continue
        c, w = code_point(data, p)
        if not _removed(c):
            for j in range(w):
                out[o + j] = data[p + j]
            o += w
        p += w
    return o


@nb.njit(cache=True, nogil=True)
def clean_layout(offsets, data, props):
    """Every string of ``offsets``/``data`` with the module's five steps applied: ``(offsets, data)``.

    ``props`` must cover every code point of the strings (``TABLE.cover``). The result is never
    longer than the input.
    """
    n = offsets.shape[0] - 1
    out = np.empty(offsets[n] - offsets[0], dtype=np.uint8)
    out_offsets = np.zeros(n + 1, dtype=np.int64)
    o = 0
    for i in range(n):
        row = o
        p, end = offsets[i], offsets[i + 1]
        while p < end:
            b = data[p]
            if 0x20 < b < 0x7F:  # visible ASCII
                out[o] = b
                o += 1
                p += 1
                continue
            if b == 32 and o > row and p + 1 < end and 0x20 < data[p + 1] < 0x7F:  # one space between words
                out[o] = 32
                o += 1
                p += 1
                continue
            c, w = code_point(data, p)
            if _removed(c):
                p += w
                continue
            if not props[c] & SPACE:
                for j in range(w):
                    out[o + j] = data[p + j]
                o += w
                p += w
                continue
            # a run of whitespace: count its newlines, find where its tail begins and where it ends
            newlines, tail, q = 0, p, p
            while q < end:
                b = data[q]
                if b < 0x80:  # ASCII: \n, whitespace, a visible character or a control to remove
                    if b == 10:
                        newlines += 1
                        tail = q + 1
                    elif 0x20 < b < 0x7F:
                        break
                    q += 1
                    continue
                c, w = code_point(data, q)
                if not (_removed(c) or props[c] & SPACE):
                    break
                q += w
            if newlines == 0 and o > row:  # after a visible character within a line
                out[o] = 32
                o += 1
            else:
                for _ in range(min(newlines, 2)):
                    out[o] = 10
                    o += 1
                o = _copy_kept(data, tail, q, out, o)
            p = q
        s, e = stripped(out, row, o, props)
        if s > row:
            for j in range(e - s):
                out[row + j] = out[s + j]
        o = row + e - s
        out_offsets[i + 1] = o
    return out_offsets, out[:o]
