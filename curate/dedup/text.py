"""Text normalization before hashing, and zero-copy access to a string column's bytes.

Normalization runs as polars expressions (Rust regex and Unicode case folding over the
whole column); the hashing kernels then read the normalized column's Arrow buffers
(``offsets`` + ``data``) directly, so Python never touches a document.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import polars as pl
import pyarrow as pa

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


def string_buffers(values: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets int64[n+1], data uint8[...])`` of a string Series, without copying the text when possible."""
    arr = values.to_arrow()
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if arr.type != pa.large_string():
        arr = arr.cast(pa.large_string())
    _, off_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(off_buf, dtype=np.int64)[arr.offset : arr.offset + len(arr) + 1]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, dtype=np.uint8)
    return offsets, data


def normalized_buffers(texts: pl.Series, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """Normalize ``texts`` by ``mode`` and return its Arrow buffers (see ``string_buffers``)."""
    normalized = pl.select(normalize_expr(pl.lit(texts), mode)).to_series()
    return string_buffers(normalized)
