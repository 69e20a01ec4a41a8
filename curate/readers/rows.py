"""Turning what a reader parsed into row-schema batches, and unreadable records into rejects."""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson
import polars as pl
import pyarrow as pa

from curate.schema import CORE_COLUMNS, CORE_SCHEMA, OPTIONAL_COLUMNS

#: Read-error reasons (``read:<error>``), a closed set.
READ_REASONS: tuple[str, ...] = (
    "read:bad_json",
    "read:bad_utf8",
    "read:not_an_object",
    "read:missing_text",
    "read:text_not_string",
    "read:missing_source",
    "read:bad_schema",
    "read:truncated",
    "read:bad_record",
)


@dataclass(slots=True)
class ReadBatch:
    """One batch from a reader: good rows and unreadable records (with ``reason``)."""

    rows: pl.DataFrame
    rejects: pl.DataFrame


@dataclass(slots=True)
class RowBuffer:
    """Accumulates parsed records column by column and flushes them as polars frames."""

    ids: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    metas: list[str | None] = field(default_factory=list)
    bad: dict[str, list] = field(default_factory=lambda: {c: [] for c in (*CORE_COLUMNS, "reason")})

    def __len__(self) -> int:
        return len(self.ids) + len(self.bad["id"])

    def add(self, id_: str, source: str, text: str, meta: str | None) -> None:
        self.ids.append(id_)
        self.sources.append(source)
        self.texts.append(text)
        self.metas.append(meta)

    def reject(self, reason: str, *, id_: str, source: str, raw: bytes | str, where: dict) -> None:
        """Keep an unreadable record: its raw content as text, where it was and why in meta."""
        text = raw if isinstance(raw, str) else raw.decode("utf-8", errors="replace")
        for col, value in zip((*CORE_COLUMNS, "reason"), (id_, source, text, orjson.dumps(where).decode(), reason)):
            self.bad[col].append(value)

    def flush(self) -> ReadBatch:
        rows = pl.DataFrame(
            {"id": self.ids, "source": self.sources, "text": self.texts, "meta": self.metas}, schema=CORE_SCHEMA
        )
        rejects = pl.DataFrame(self.bad, schema={**CORE_SCHEMA, "reason": pl.String}).with_columns(
            pl.lit(None, dtype=pl.String).alias("duplicate_of")
        )
        self.ids, self.sources, self.texts, self.metas = [], [], [], []
        self.bad = {c: [] for c in (*CORE_COLUMNS, "reason")}
        return ReadBatch(rows, rejects)


def decode_meta(meta: dict) -> str | None:
    """A record's remaining fields as a JSON string (null when there are none)."""
    return orjson.dumps(meta, option=orjson.OPT_NON_STR_KEYS).decode() if meta else None


def rows_from_arrow(
    table: pa.Table | pa.RecordBatch,
    *,
    source: str | None,
    source_field: str | None,
    text_field: str,
    id_field: str,
    file_label: str,
    row_offset: int,
) -> ReadBatch:
    """Columnar conversion of an Arrow batch (Parquet, HF datasets) to rows and rejects.

    A batch that already has winnow's core columns keeps them verbatim (so shards read back
    unchanged); otherwise every column besides text, id and the source field goes into ``meta``.
    """
    df = pl.from_arrow(table)
    if isinstance(df, pl.Series):
        df = df.to_frame()
    n = df.height
    index = pl.int_range(row_offset, row_offset + n, dtype=pl.Int64, eager=False).alias("__row")
    df = df.with_columns(index)

    def reject_all(reason: str, error: str) -> ReadBatch:
        payload = df.drop("__row").select(pl.struct(pl.all()).struct.json_encode().alias("_raw")) if df.width > 1 else None
        bad = pl.DataFrame(
            {
                "id": [f"{file_label}#{i}" for i in range(row_offset, row_offset + n)],
                "source": [source or ""] * n,
                "text": payload["_raw"] if payload is not None else [""] * n,
                "meta": df.select(pl.struct(pl.lit(file_label).alias("file"), pl.col("__row").alias("row"),
                                            pl.lit(error).alias("error")).struct.json_encode())
                .to_series()
                .to_list(),
                "reason": [reason] * n,
                "duplicate_of": [None] * n,
            },
            schema={**CORE_SCHEMA, "reason": pl.String, "duplicate_of": pl.String},
        )
        return ReadBatch(_empty_rows(), bad)

    if text_field not in df.columns:
        return reject_all("read:bad_schema", f"no column {text_field!r}; columns are {df.columns[:-1]}")
    if df.schema[text_field] not in (pl.String, pl.Null):
        return reject_all("read:bad_schema", f"column {text_field!r} has type {df.schema[text_field]}, expected string")
    if source_field is not None and source_field not in df.columns:
        return reject_all("read:bad_schema", f"no column {source_field!r} (source_field)")

    native = all(c in df.columns and df.schema[c] == pl.String for c in CORE_COLUMNS) and text_field == "text"
    src_expr = pl.col(source_field).cast(pl.String) if source_field else pl.lit(source, dtype=pl.String)
    if id_field in df.columns:
        id_expr = pl.col(id_field).cast(pl.String)
    else:
        id_expr = pl.format("{}/{}/{}", src_expr, pl.lit(file_label), pl.col("__row"))
    if native:
        extra = [c for c in df.columns if c not in CORE_COLUMNS and c != "__row" and c != source_field]
        out = df.select(
            id_expr.alias("id"), src_expr.alias("source"), pl.col("text"), pl.col("meta"),
            *[pl.col(c).cast(OPTIONAL_COLUMNS[c]) if c in OPTIONAL_COLUMNS else pl.col(c) for c in extra],
            pl.col("__row"),
        )
    else:
        rest = [c for c in df.columns if c not in (text_field, id_field, source_field, "__row")]
        meta = pl.struct(rest).struct.json_encode() if rest else pl.lit(None, dtype=pl.String)
        out = df.select(id_expr.alias("id"), src_expr.alias("source"), pl.col(text_field).cast(pl.String).alias("text"),
                        meta.alias("meta"), pl.col("__row"))
    problem = (
        pl.when(pl.col("text").is_null()).then(pl.lit("read:missing_text"))
        .when(pl.col("source").is_null() | (pl.col("source") == "")).then(pl.lit("read:missing_source"))
        .otherwise(pl.lit(None, dtype=pl.String))
    )
    out = out.with_columns(problem.alias("reason"))
    good = out.filter(pl.col("reason").is_null()).drop("reason", "__row")
    bad = out.filter(pl.col("reason").is_not_null())
    if bad.height:
        bad = bad.with_columns(
            pl.col("id").fill_null(pl.format("{}#{}", pl.lit(file_label), pl.col("__row"))),
            pl.col("source").fill_null(pl.lit(source or "")),
            pl.col("text").fill_null(""),
            pl.struct(pl.lit(file_label).alias("file"), pl.col("__row").alias("row"), pl.col("meta").alias("meta"))
            .struct.json_encode().alias("meta"),
            pl.lit(None, dtype=pl.String).alias("duplicate_of"),
        ).select(*CORE_COLUMNS, "reason", "duplicate_of")
    else:
        bad = bad.select(*CORE_COLUMNS, "reason").with_columns(pl.lit(None, dtype=pl.String).alias("duplicate_of"))
    return ReadBatch(good, bad)


def _empty_rows() -> pl.DataFrame:
    return pl.DataFrame(schema=CORE_SCHEMA)
