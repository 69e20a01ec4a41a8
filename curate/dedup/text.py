"""Text normalization before hashing, and zero-copy access to a string column's bytes.

Normalization is defined by polars expressions (``normalize_expr``: Rust regex and Unicode
case folding); a compiled pass over the bytes gives the same result (its per-code-point
tables are built by running the expression over every code point), and the hashing kernels
read the Arrow buffers (``offsets`` + ``data``) directly, so Python never touches a document.
Word shingles need no normalized copy of ASCII rows at all (``word_buffers``): byte tables
split and lowercase them while they are hashed.
"""

from __future__ import annotations

import threading
from typing import Literal, NamedTuple

import numpy as np
import polars as pl
import pyarrow as pa

from winnow.curate.dedup.jit import njit
from winnow.curate.errors import ConfigError

Normalization = Literal["none", "whitespace", "lower", "words"]
NORMALIZATIONS: tuple[str, ...] = ("none", "whitespace", "lower", "words")


def check_normalization(key: str, value: str) -> None:
    """Raise ``ConfigError`` naming ``key`` unless ``value`` is a known normalization."""
    if value not in NORMALIZATIONS:
        raise ConfigError(f"{key} = {value!r} is not a normalization; allowed: {', '.join(NORMALIZATIONS)}")


def normalize_expr(expr: pl.Expr, mode: str) -> pl.Expr:
    """``expr`` normalized by ``mode``.

    * ``none``: bytes as they are;
    * ``whitespace``: runs of Unicode whitespace become one space, ends stripped;
    * ``lower``: ``whitespace`` plus Unicode lowercase;
    * ``words``: ``lower`` plus punctuation and symbols turned into spaces, so that
      "Hello, world!" and "hello world" are the same words.
    """
    expr = expr.fill_null("")
    if mode == "none":
        return expr
    if mode in ("lower", "words"):
        expr = expr.str.to_lowercase()
    pattern = r"[\s\p{P}\p{S}]+" if mode == "words" else r"\s+"
    return expr.str.replace_all(pattern, " ").str.strip_chars(" ")


def large_buffers(arr: pa.Array | pa.ChunkedArray, large_type: pa.DataType) -> tuple[np.ndarray, pa.Buffer | None]:
    """``(byte offsets int64[n+1], data buffer)`` of a variable-length Arrow array, as ``large_type``.

    Copies only when the array is chunked or has 32-bit offsets.
    """
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if arr.type != large_type:
        arr = arr.cast(large_type)
    _, off_buf, data_buf = arr.buffers()
    return np.frombuffer(off_buf, dtype=np.int64)[arr.offset : arr.offset + len(arr) + 1], data_buf


def string_buffers(values: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets int64[n+1], data uint8[...])`` of a string Series, without copying the text when possible."""
    offsets, data_buf = large_buffers(values.to_arrow(), pa.large_string())
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, dtype=np.uint8)
    return offsets, data


def string_array(offsets: np.ndarray, data: np.ndarray) -> pa.Array:
    """A large string Arrow array of ``(offsets, data)`` buffers (no nulls): ``string_buffers`` the other way."""
    return pa.LargeStringArray.from_buffers(len(offsets) - 1, pa.py_buffer(offsets), pa.py_buffer(data))


def _byte_tables(mode: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-byte ``(kind, lowered)`` tables of the ASCII fast path: kind 0 keep, 1 space, 2 non-ASCII."""
    kind = np.zeros(256, dtype=np.uint8)
    kind[128:] = 2
    kind[[9, 10, 11, 12, 13, 32]] = 1
    if mode == "words":
        punct = [b for b in range(33, 127) if not chr(b).isalnum()]
        kind[punct] = 1
    lowered = np.arange(256, dtype=np.uint8)
    if mode in ("lower", "words"):
        lowered[65:91] += 32
    return kind, lowered


_TABLES = {mode: _byte_tables(mode) for mode in ("whitespace", "lower", "words")}


_TABLE_CODE_POINTS = 0x20000  # planes 0 and 1: every script in use, and the emoji


# Unicode's White_Space property: what the regex engine's \s matches (str.isspace differs on 0x1C-0x1F).
_WHITE_SPACE = frozenset(
    [*range(9, 14), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000]
)


def _classify(code_points, mode: str, cls: np.ndarray, lowered: np.ndarray) -> None:
    """Fill ``cls`` / ``lowered`` (see ``_code_point_tables``) at ``code_points``; others are left as they are."""
    import unicodedata

    words, lower = mode == "words", mode in ("lower", "words")
    for cp in code_points:
        cp = int(cp)
        if 0xD800 <= cp < 0xE000 or cp == 0x03A3:
            continue
        char = chr(cp)
        category = unicodedata.category(char)
        if category == "Cn":
            continue
        if cp in _WHITE_SPACE or (words and category[0] in "PS"):
            cls[cp] = 1
            continue
        low = char.lower() if lower else char
        if len(low) != 1:
            continue
        if words and unicodedata.category(low)[0] in "PS":
            continue  # lowercased into a separator: leave it to the expression
        cls[cp], lowered[cp] = 0, ord(low)


def _code_point_tables(mode: str) -> tuple[np.ndarray, np.ndarray]:
    """Per code point of planes 0 and 1: ``(class, lowered)`` as ``normalize_expr`` treats it.

    Class 0: kept as ``lowered``; 1: a separator (becomes part of one space); 2: not handled
    here (the row goes through the expression): code points this Python's Unicode database
    does not assign (the regex engine's may be newer), lowercases of several code points,
    surrogates, and the capital sigma, whose lowercase depends on its neighbours. Built from
    ``unicodedata`` (running the expression over every code point held ~90 MB of regex state
    in each worker); a test checks it against the expression itself. The kernels use
    ``_tables_for``, which fills only the code points a batch holds.
    """
    cls = np.full(_TABLE_CODE_POINTS, 2, dtype=np.uint8)
    lowered = np.zeros(_TABLE_CODE_POINTS, dtype=np.int32)
    _classify(range(_TABLE_CODE_POINTS), mode, cls, lowered)
    return cls, lowered


class _LazyTables:
    """``_code_point_tables(mode)``, filled only at the code points seen so far.

    Classifying all 128k code points in Python cost each process ~0.15 s; a batch of real text
    holds a few hundred distinct ones. Entries not filled yet read as class 2, which sends a
    row through the expression (the same result, slower), so a reader never sees a wrong entry;
    a lock keeps two threads from classifying the same code points twice.
    """

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.cls = np.full(_TABLE_CODE_POINTS, 2, dtype=np.uint8)
        self.lowered = np.zeros(_TABLE_CODE_POINTS, dtype=np.int32)
        self.known = np.zeros(_TABLE_CODE_POINTS, dtype=np.bool_)
        self.lock = threading.Lock()

    def cover(self, seen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The tables, with every code point where ``seen`` (bool per code point) is true filled."""
        missing = np.flatnonzero(seen & ~self.known)
        if len(missing):
            with self.lock:
                missing = missing[~self.known[missing]]
                _classify(missing, self.mode, self.cls, self.lowered)
                self.known[missing] = True
        return self.cls, self.lowered


_LAZY_TABLES = {mode: _LazyTables(mode) for mode in ("whitespace", "lower", "words")}


@njit(cache=True, nogil=True)
def _seen_code_points(offsets, data, rows, limit):
    """Which code points below ``limit`` occur in the ``rows`` (mask) of a valid UTF-8 string column."""
    seen = np.zeros(limit, dtype=np.bool_)
    for i in range(offsets.shape[0] - 1):
        if not rows[i]:
            continue
        p, end = offsets[i], offsets[i + 1]
        while p < end:
            b = np.int32(data[p])
            if b < 0x80:
                p += 1
                continue
            width = 4 if b >= 0xF0 else 3 if b >= 0xE0 else 2
            if p + width > end:  # cannot happen in valid UTF-8; the normalizer flags such a row
                break
            if width == 4:
                cp = (
                    ((b & 0x07) << 18)
                    | ((np.int32(data[p + 1]) & 0x3F) << 12)
                    | ((np.int32(data[p + 2]) & 0x3F) << 6)
                    | (np.int32(data[p + 3]) & 0x3F)
                )
            elif width == 3:
                cp = ((b & 0x0F) << 12) | ((np.int32(data[p + 1]) & 0x3F) << 6) | (np.int32(data[p + 2]) & 0x3F)
            else:
                cp = ((b & 0x1F) << 6) | (np.int32(data[p + 1]) & 0x3F)
            p += width
            if cp < limit:
                seen[cp] = True
    return seen


def _tables_for(offsets: np.ndarray, data: np.ndarray, rows: np.ndarray, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """Code point tables covering every code point of the ``rows`` (``_code_point_tables`` where it matters)."""
    return _LAZY_TABLES[mode].cover(_seen_code_points(offsets, data, rows, _TABLE_CODE_POINTS))


def _expression_tables(mode: str) -> tuple[np.ndarray, np.ndarray]:
    """``_code_point_tables`` as the expression itself computes them (for tests: slow, and heavy on memory)."""
    cps = np.arange(_TABLE_CODE_POINTS)
    surrogate = (cps >= 0xD800) & (cps < 0xE000)
    text = "".join(map(chr, np.where(surrogate, 0x20, cps).tolist())).encode()
    widths = np.where(surrogate, 1, 1 + (cps >= 0x80) + (cps >= 0x800) + (cps >= 0x10000))
    offsets = np.concatenate([[0], np.cumsum(widths)]).astype(np.int32)
    chars = pl.Series(pa.StringArray.from_buffers(len(cps), pa.py_buffer(offsets), pa.py_buffer(text)))
    out = pl.select(normalize_expr(pl.lit(chars), mode)).to_series()
    lengths = out.str.len_chars().to_numpy()
    lowered = _first_code_points(*string_buffers(out))
    cls = np.where(lengths == 0, 1, np.where(lengths == 1, 0, 2)).astype(np.uint8)
    cls[surrogate | (cps == 0x03A3)] = 2
    return cls, np.where(cls == 0, lowered, 0).astype(np.int32)


@njit(cache=True, nogil=True)
def _first_code_points(offsets, data):
    n = offsets.shape[0] - 1
    out = np.zeros(n, dtype=np.int32)
    for i in range(n):
        p = offsets[i]
        if p == offsets[i + 1]:
            continue
        b = np.int32(data[p])
        if b < 0x80:
            out[i] = b
        elif b < 0xE0:
            out[i] = ((b & 0x1F) << 6) | (np.int32(data[p + 1]) & 0x3F)
        elif b < 0xF0:
            out[i] = ((b & 0x0F) << 12) | ((np.int32(data[p + 1]) & 0x3F) << 6) | (np.int32(data[p + 2]) & 0x3F)
        else:
            out[i] = (
                ((b & 0x07) << 18)
                | ((np.int32(data[p + 1]) & 0x3F) << 12)
                | ((np.int32(data[p + 2]) & 0x3F) << 6)
                | (np.int32(data[p + 3]) & 0x3F)
            )
    return out


_NO_CODE_POINTS = (np.full(1, 2, dtype=np.uint8), np.zeros(1, dtype=np.int32))


@njit(cache=True, nogil=True)
def _normalize_rows(offsets, data, rows, kind, lowered, cp_class, cp_lowered):
    """``normalize_expr`` of the ``rows`` (mask) of a string column, compiled; other rows come out empty.

    ASCII bytes go by the byte tables, other code points by the per-code-point tables
    (``_code_point_tables``); a row with a code point they do not handle comes out empty and
    flagged, for the expression to do. The output is at most 1.5x the input (a lowercase
    may take 3 UTF-8 bytes where its capital took 2).
    """
    n = offsets.shape[0] - 1
    out = np.empty((offsets[n] - offsets[0]) * 3 // 2 + 4, dtype=np.uint8)
    out_offsets = np.zeros(n + 1, dtype=np.int64)
    flagged = np.zeros(n, dtype=np.bool_)
    limit = cp_class.shape[0]
    cursor = 0
    for i in range(n):
        start = cursor
        if rows[i]:
            pending = False
            p, end = offsets[i], offsets[i + 1]
            while p < end:
                b = data[p]
                if b < 128:
                    # ASCII without a branch (a mispredicted jump at every word end cost more than
                    # the rest): a space is written at the cursor and kept only before a kept byte
                    # that follows a separator; the byte is written and kept only if it is kept.
                    keep = kind[b] == 0
                    out[cursor] = 32
                    cursor += pending & keep
                    out[cursor] = lowered[b]
                    cursor += keep
                    pending = (not keep) & (cursor > start)
                    p += 1
                    continue
                else:
                    if p + 1 >= end:
                        flagged[i] = True
                        break
                    if b >= 0xF0:
                        if p + 3 >= end:
                            flagged[i] = True
                            break
                        cp = (
                            ((np.int32(b) & 0x07) << 18)
                            | ((np.int32(data[p + 1]) & 0x3F) << 12)
                            | ((np.int32(data[p + 2]) & 0x3F) << 6)
                            | (np.int32(data[p + 3]) & 0x3F)
                        )
                        p += 4
                    elif b >= 0xE0:
                        if p + 2 >= end:
                            flagged[i] = True
                            break
                        cp = (
                            ((np.int32(b) & 0x0F) << 12)
                            | ((np.int32(data[p + 1]) & 0x3F) << 6)
                            | (np.int32(data[p + 2]) & 0x3F)
                        )
                        p += 3
                    else:
                        cp = ((np.int32(b) & 0x1F) << 6) | (np.int32(data[p + 1]) & 0x3F)
                        p += 2
                    if cp >= limit or cp_class[cp] == 2:
                        flagged[i] = True
                        break
                    k = cp_class[cp]
                    c = cp_lowered[cp]
                if k == 0:
                    if pending:
                        out[cursor] = 32
                        cursor += 1
                        pending = False
                    if c < 0x80:
                        out[cursor] = c
                        cursor += 1
                    elif c < 0x800:
                        out[cursor] = 0xC0 | (c >> 6)
                        out[cursor + 1] = 0x80 | (c & 0x3F)
                        cursor += 2
                    elif c < 0x10000:
                        out[cursor] = 0xE0 | (c >> 12)
                        out[cursor + 1] = 0x80 | ((c >> 6) & 0x3F)
                        out[cursor + 2] = 0x80 | (c & 0x3F)
                        cursor += 3
                    else:
                        out[cursor] = 0xF0 | (c >> 18)
                        out[cursor + 1] = 0x80 | ((c >> 12) & 0x3F)
                        out[cursor + 2] = 0x80 | ((c >> 6) & 0x3F)
                        out[cursor + 3] = 0x80 | (c & 0x3F)
                        cursor += 4
                else:
                    pending = cursor > start
        if flagged[i]:
            cursor = start
        out_offsets[i + 1] = cursor
    return out_offsets, out[:cursor], flagged


@njit(cache=True, nogil=True)
def _assemble(source, offsets0, data0, offsets1, data1, offsets2, data2):
    """Row ``i`` from buffers 0 or 1 (row-indexed) or the next row of buffers 2, as ``source[i]`` says."""
    n = source.shape[0]
    out_offsets = np.zeros(n + 1, dtype=np.int64)
    total = 0
    k = 0
    for i in range(n):
        if source[i] == 0:
            total += offsets0[i + 1] - offsets0[i]
        elif source[i] == 1:
            total += offsets1[i + 1] - offsets1[i]
        else:
            total += offsets2[k + 1] - offsets2[k]
            k += 1
    out = np.empty(total, dtype=np.uint8)
    cursor = 0
    k = 0
    for i in range(n):
        if source[i] == 0:
            lo, hi = offsets0[i], offsets0[i + 1]
            out[cursor : cursor + hi - lo] = data0[lo:hi]
        elif source[i] == 1:
            lo, hi = offsets1[i], offsets1[i + 1]
            out[cursor : cursor + hi - lo] = data1[lo:hi]
        else:
            lo, hi = offsets2[k], offsets2[k + 1]
            out[cursor : cursor + hi - lo] = data2[lo:hi]
            k += 1
        cursor += hi - lo
        out_offsets[i + 1] = cursor
    return out_offsets, out


def _normalized(
    texts: pl.Series, offsets: np.ndarray, data: np.ndarray, rows: np.ndarray, non_ascii: np.ndarray, mode: str
) -> tuple[np.ndarray, np.ndarray]:
    """Buffers (indexed by row) with the ``rows`` normalized (compiled, or by the expression where it must), the rest empty."""
    todo = non_ascii & rows
    cp_tables = _tables_for(offsets, data, todo, mode) if todo.any() else _NO_CODE_POINTS
    norm_offsets, norm, flagged = _normalize_rows(offsets, data, rows, *_TABLES[mode], *cp_tables)
    if not flagged.any():
        return norm_offsets, norm
    source = np.where(flagged, 2, 1).astype(np.uint8)
    sub_offsets, sub = string_buffers(
        pl.select(normalize_expr(pl.lit(texts.filter(pl.Series(flagged))), mode)).to_series()
    )
    return _assemble(source, norm_offsets, norm, norm_offsets, norm, sub_offsets, sub)


def normalized_buffers(texts: pl.Series, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """Normalize ``texts`` by ``mode`` and return its Arrow buffers (see ``string_buffers``).

    A compiled pass over the bytes (10x faster than the regex, ASCII or not) gives the same
    result as ``normalize_expr``; the few rows it cannot do (see ``_code_point_tables``) go
    through the expression.
    """
    texts = texts.fill_null("")
    offsets, data = string_buffers(texts)
    if mode == "none":
        return offsets, data
    every = np.ones(len(offsets) - 1, dtype=np.bool_)
    return _normalized(texts, offsets, data, every, _non_ascii_rows(texts), mode)


def _non_ascii_rows(texts: pl.Series) -> np.ndarray:
    """bool per row of a string Series without nulls: does it hold a byte outside ASCII?

    In valid UTF-8 exactly the rows with fewer code points than bytes; polars counts both
    with SIMD, several times faster than a compiled byte loop.
    """
    return (texts.str.len_bytes() != texts.str.len_chars()).to_numpy()


def _word_tables(mode: str) -> tuple[np.ndarray, np.ndarray]:
    """``(sep, low)`` tables under which raw ASCII text has the words of its normalized form.

    Normalized text keeps control bytes other than whitespace, which the word kernels then
    split on like any byte up to ASCII space; ``words`` also splits on ASCII punctuation and
    symbols and ``lower``/``words`` hash ASCII letters lowercased. On text that is already
    normalized the tables change nothing, so normalized non-ASCII rows can share a buffer
    with raw ASCII ones.
    """
    kind, lowered = (
        _byte_tables(mode) if mode != "none" else (np.zeros(256, dtype=np.uint8), np.arange(256, dtype=np.uint8))
    )
    sep = ((np.arange(256) <= 32) | (kind == 1)).astype(np.uint8)
    return sep, lowered


_WORD_TABLES = {mode: _word_tables(mode) for mode in NORMALIZATIONS}


class AltRows(NamedTuple):
    """Rows that the word kernels read from a buffer of their own: row ``i`` is
    ``data[offsets[i]:offsets[i + 1]]`` where ``rows[i]`` (``offsets`` is indexed by row)."""

    rows: np.ndarray  # bool [n]
    offsets: np.ndarray  # int64 [n + 1]
    data: np.ndarray  # uint8


def no_alt_rows(n: int) -> AltRows:
    """``AltRows`` for a column whose rows are all read from its own buffer."""
    return AltRows(np.zeros(n, dtype=np.bool_), np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.uint8))


def word_buffers(texts: pl.Series, mode: str) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray], AltRows]:
    """``(offsets, data, (sep, low), alt)`` from which the word kernels read the words of ``normalized_buffers``.

    ASCII-only rows are read from the column's own buffer as they are (no normalized copy:
    the tables normalize them while they are hashed); rows with other bytes are normalized
    (compiled, or by ``normalize_expr`` where it must) into ``alt``'s buffer, so the column's
    text is never copied. The words, and so every shingle hash, equal those of the normalized text.
    """
    texts = texts.fill_null("")
    offsets, data = string_buffers(texts)
    alt = no_alt_rows(len(offsets) - 1)
    if mode != "none":
        non_ascii = _non_ascii_rows(texts)
        if non_ascii.any():
            alt = AltRows(non_ascii, *_normalized(texts, offsets, data, non_ascii, non_ascii, mode))
    return offsets, data, _WORD_TABLES[mode], alt
