"""The row schema of DESIGN.md contract 1, in one place.

Every row, in memory (a polars DataFrame) and on disk (Parquet, WebDataset ``json``),
has ``id``, ``source``, ``text`` and ``meta`` (a JSON string). Stages may add optional
numeric or string columns (``quality``, ``difficulty``, ``split``, ``order``...).
Rejected rows carry the same columns plus ``reason`` and ``duplicate_of``.
"""

from __future__ import annotations

import polars as pl

from winnow.curate.errors import StageError

CORE_COLUMNS: tuple[str, ...] = ("id", "source", "text", "meta")
REJECT_COLUMNS: tuple[str, ...] = ("reason", "duplicate_of")

#: Columns a stage or the runner adds for itself (``_count``, ``_tokens``, ``_h``, ``_task``...) start with this;
#: no user field may (``keep_fields`` refuses it), so they never collide with a user's column.
INTERNAL_PREFIX = "_"

#: polars dtypes of the core columns.
CORE_SCHEMA: dict[str, pl.DataType] = {c: pl.String() for c in CORE_COLUMNS}

#: The splits winnow writes shards of (``shards/<format>/<split>/``): ``split`` holds one of these or null (train).
SPLITS: tuple[str, ...] = ("train", "val")

#: Columns that stages add, with their dtypes; a stage that writes one must use this dtype.
OPTIONAL_COLUMNS: dict[str, pl.DataType] = {
    "split": pl.String(),
    "quality": pl.Float64(),
    "difficulty": pl.Float64(),
    "dsir_weight": pl.Float64(),
    "lang": pl.String(),
    "lang_score": pl.Float64(),
    "n_tokens": pl.Int64(),
    "order": pl.Int64(),
    "repeat": pl.Int32(),
}


def validate_rows(df: pl.DataFrame, *, where: str) -> pl.DataFrame:
    """Check that ``df`` has the core columns with string types; ``where`` names the producer."""
    missing = [c for c in CORE_COLUMNS if c not in df.columns]
    if missing:
        raise StageError(f"{where}: rows lack the core column(s) {missing}; every batch must keep {list(CORE_COLUMNS)}")
    for c in CORE_COLUMNS:
        if df.schema[c] != pl.String:
            raise StageError(f"{where}: column {c!r} has dtype {df.schema[c]}, expected String")
        if c != "meta" and df[c].null_count():  # meta: null where a record had no other fields
            raise StageError(
                f"{where}: column {c!r} holds {df[c].null_count()} null value(s); every kept row needs one "
                "(a stage that cannot give a row its value rejects the row)"
            )
    for c, dtype in OPTIONAL_COLUMNS.items():
        if c in df.columns and df.schema[c] != dtype and df.schema[c] != pl.Null:
            raise StageError(f"{where}: column {c!r} has dtype {df.schema[c]}, expected {dtype}")
    return df


def make_rejects(df: pl.DataFrame, reason: str | pl.Expr, duplicate_of: pl.Expr | None = None) -> pl.DataFrame:
    """Attach ``reason`` (a constant or an expression) and ``duplicate_of`` to rows being rejected."""
    reason_expr = pl.lit(reason, dtype=pl.String) if isinstance(reason, str) else reason
    dup_expr = duplicate_of if duplicate_of is not None else pl.lit(None, dtype=pl.String)
    return df.with_columns(reason_expr.cast(pl.String).alias("reason"), dup_expr.cast(pl.String).alias("duplicate_of"))


def empty_rejects(df: pl.DataFrame) -> pl.DataFrame:
    """A zero-row reject frame with the columns of ``df``."""
    return make_rejects(df.clear(), "")
