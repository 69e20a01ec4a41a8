"""Turning what a reader parsed into row-schema batches, and unreadable records into rejects."""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass, field
from typing import Any

import orjson
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from winnow.curate.readers.utf8 import cell_text, invalid_rows, printable
from winnow.curate.schema import CORE_COLUMNS, CORE_SCHEMA, INTERNAL_PREFIX, OPTIONAL_COLUMNS, REJECT_COLUMNS, SPLITS

_PREVIEW_CHARS = 1024  # of a read:too_long record's text, kept in its reject
_EXACT_FLOAT = float(2**53)  # from here on a float cannot tell integers apart

#: Read-error reasons (``read:<error>``), a closed set.
READ_REASONS: tuple[str, ...] = (
    "read:bad_json",
    "read:bad_utf8",
    "read:not_text",
    "read:not_an_object",
    "read:missing_text",
    "read:text_not_string",
    "read:missing_source",
    "read:bad_schema",
    "read:truncated",
    "read:too_long",
    "read:bad_record",
    "read:link_member",
    "read:special_member",
    "read:duplicate_member",
    "read:duplicate_id",
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
    # winnow's own columns (``OPTIONAL_COLUMNS``) a record carries, e.g. a WebDataset shard's split: null elsewhere
    extra: dict[str, list] = field(default_factory=dict)
    bad: dict[str, list] = field(default_factory=lambda: {c: [] for c in (*CORE_COLUMNS, "reason")})

    def __len__(self) -> int:
        return len(self.ids) + len(self.bad["id"])

    def add(self, id_: str, source: str, text: str, meta: str | None, extra: dict | None = None) -> None:
        n = len(self.ids)
        for name, value in (extra or {}).items():
            self.extra.setdefault(name, [None] * n).append(value)
        for values in self.extra.values():
            if len(values) == n:
                values.append(None)
        self.ids.append(id_)
        self.sources.append(source)
        self.texts.append(text)
        self.metas.append(meta)

    def reject(self, reason: str, *, id_: str, source: str, raw: bytes | str, where: dict) -> None:
        """Keep an unreadable record: its raw content as text, where it was and why in meta.

        Bytes that are not UTF-8 are shown decoded with U+FFFD in ``text`` and kept exactly in meta's
        ``raw_base64`` (to decode them another way: ``base64.b64decode(meta["raw_base64"]).decode("cp1252")``).
        """
        if isinstance(raw, str):
            text = printable(raw)
        else:
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = raw.decode("utf-8", errors="replace")
                where = {**where, "raw_base64": base64.b64encode(raw).decode("ascii")}
        try:
            meta = orjson.dumps(where).decode()
        except TypeError:  # a file or member name Python decoded with surrogateescape
            meta = orjson.dumps({k: printable(v) if isinstance(v, str) else v for k, v in where.items()}).decode()
        for col, value in zip((*CORE_COLUMNS, "reason"), (printable(id_), source, text, meta, reason)):
            self.bad[col].append(value)

    def flush(self) -> ReadBatch:
        rows = pl.DataFrame(
            {"id": self.ids, "source": self.sources, "text": self.texts, "meta": self.metas}, schema=CORE_SCHEMA
        )
        if self.extra:
            rows = rows.with_columns(
                pl.Series(c, v, dtype=OPTIONAL_COLUMNS[c], strict=False) for c, v in sorted(self.extra.items())
            )
            self.extra = {}
        rejects = pl.DataFrame(self.bad, schema={**CORE_SCHEMA, "reason": pl.String}).with_columns(
            pl.lit(None, dtype=pl.String).alias("duplicate_of")
        )
        self.ids, self.sources, self.texts, self.metas = [], [], [], []
        self.bad = {c: [] for c in (*CORE_COLUMNS, "reason")}
        return ReadBatch(rows, rejects)


def decode_meta(meta: dict) -> str | None:
    """A record's remaining fields as a JSON string (null when there are none); integers of any size stay exact."""
    return dumps_exact(meta) if meta else None


def dumps_exact(value: Any) -> str:
    """``value`` as compact JSON text; integers of any size stay exact (``loads_exact``'s inverse)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:  # an integer beyond 64 bits, which only loads_exact gives back exactly
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def loads_exact(data: bytes) -> Any:
    """A JSON document (raises ``json.JSONDecodeError``), with every integer exact, however large.

    orjson reads integers beyond 64 bits as floats (1.8446744073709552e+19): two hash ids would
    collide. Such a value is a float of magnitude >= 2**53, so only then is the document read
    again with the standard library's parser, whose integers have no limit.

    A document nesting deeper than ``MAX_DEPTH`` is refused like one that is not JSON: orjson stops
    at 1,024 levels and writes at most 254, and Python's parsers recurse once per level.
    """
    value = orjson.loads(data)
    if data.count(b"[") + data.count(b"{") > MAX_DEPTH:  # only then can it nest that deep
        depth, huge = _walk(value)
        if depth > MAX_DEPTH:
            raise json.JSONDecodeError(f"the record nests {depth} levels deep; winnow reads up to {MAX_DEPTH}", "", 0)
    else:
        huge = _walk(value)[1]
    return json.loads(data) if huge else value


#: The deepest nesting of a record winnow reads (a record is level 1, an object or list in it level 2).
MAX_DEPTH = 200


def _walk(value: Any) -> tuple[int, bool]:
    """(nesting depth, whether a float of magnitude >= 2**53 is in ``value``), without recursion."""
    depth, huge, todo = 0, False, [(value, 1)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, float):
            huge = huge or abs(item) >= _EXACT_FLOAT
        elif isinstance(item, (dict, list)):
            depth = max(depth, level)
            todo.extend((v, level + 1) for v in (item.values() if isinstance(item, dict) else item))
    return depth, huge


def id_text(value: Any, field: str, raw: bytes) -> str:
    """A given id as its text: a string as is, a number exactly as written (``raw`` is its JSON record), else its JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None or isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if isinstance(value, int):
        return str(value)  # a JSON integer's decimal text
    record = json.loads(raw, parse_float=str, parse_int=str)  # 1e3, 0.10: the text, not a float's repr
    written = record.get(field) if isinstance(record, dict) else None
    return written if isinstance(written, str) else str(value)


def id_part(source: str | None) -> str:
    """A source name as the first part of a derived id (``<source>/<file>@<offset>``): ``%`` and ``/`` escaped, so
    that a source taken from a field (``source_field = "src"`` holding ``a/b``) cannot make another file's id."""
    return (source or "").replace("%", "%25").replace("/", "%2F")


def keep_own_source(meta: str | None, theirs: str) -> str:
    """A winnow-layout row's ``meta`` (a JSON object's text, or None) with the row's own source name ``theirs`` kept in
    it, where the input's source replaces the row's: under ``"source"``, or ``"source.row"`` where meta already
    names another source. Meta that is not a JSON object is kept whole under ``"meta"``: nothing of it is lost."""
    try:
        found = loads_exact(meta.encode()) if meta is not None and meta.strip() else {}
    except (orjson.JSONDecodeError, json.JSONDecodeError):
        return dumps_exact({"source": theirs, "meta": meta})
    if not isinstance(found, dict):
        return dumps_exact({"source": theirs, "meta": found})
    key = "source" if found.get("source", theirs) == theirs else "source.row"
    return dumps_exact({key: theirs, **{k: v for k, v in found.items() if k != key}})


def _meta_keeping_source(out: pl.DataFrame, theirs: pl.Series, source: str | None) -> pl.DataFrame:
    """``out`` (rows of a winnow-layout file) with the ``meta`` of each row whose own source (``theirs``) is not the
    input's (``[[inputs]] source``, which every row gets) keeping that name (``keep_own_source``), as a file outside
    winnow's layout keeps its column. Read as JSON row by row: only the rows of files that hold other sources."""
    theirs = theirs.cast(pl.String)
    moved = (theirs.is_not_null() & (theirs != source)).fill_null(False)
    if not moved.any():
        return out
    at = moved.arg_true()
    kept = [keep_own_source(m, t) for m, t in zip(out["meta"].gather(at), theirs.gather(at), strict=True)]
    return out.with_columns(out["meta"].scatter(at, pl.Series(kept, dtype=pl.String)))


def rows_from_arrow(
    table: pa.Table | pa.RecordBatch,
    *,
    source: str | None,
    source_field: str | None,
    text_field: str,
    id_field: str,
    file_label: str,
    row_offset: int,
    max_record_bytes: int | None = None,
) -> ReadBatch:
    """Columnar conversion of an Arrow batch (Parquet, HF datasets) to rows and rejects.

    A batch that already has winnow's core columns keeps them verbatim (so shards read back
    unchanged); otherwise every column besides text, id and the source field goes into ``meta``.
    """
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    names = table.column_names
    # the rows' numbers, under a name no input column has or starts with, so its stand-ins (``__row_blank0``,
    # ``__row_error``) are no input column's either (an input's own ``__row`` goes to meta)
    row = "__row"
    while any(n.startswith(row) for n in names):
        row = "_" + row
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:  # a column name given twice: the later ones are told apart by their place (``x#3``) in ``meta``
        table = table.rename_columns(_told_apart(names))
    # a column named "" (polars would call it column_N) under a stand-in name, named "" again in meta
    blank = {f"{row}_blank{i}": "" for i, n in enumerate(table.column_names) if n == ""}
    if blank:
        table = table.rename_columns([f"{row}_blank{i}" if n == "" else n for i, n in enumerate(table.column_names)])
    # ...but which one is the text, the id or the source? Then every row is kept as a reject
    ambiguous = [n for n in repeated if n in (text_field, id_field, source_field)]
    table = as_text_columns(table, [c for c in (text_field, id_field, source_field) if c is not None])
    table, unreadable = _split_invalid_utf8(
        table,
        source=source,
        text_field=text_field,
        id_field=id_field,
        file_label=file_label,
        row_offset=row_offset,
        row=row,
    )
    df = pl.from_arrow(polars_ready(table))
    if isinstance(df, pl.Series):
        df = df.to_frame()
    n = df.height

    def reject_all(reason: str, error: str) -> ReadBatch:
        raw = df.drop(row)
        raw = raw.with_columns(_json_ready(raw, raw.columns))
        payload = raw.select(pl.struct(pl.all()).struct.json_encode().alias("_raw")) if df.width > 1 else None
        if payload is not None:
            payload = payload.with_columns(_nonfinite_kept(payload["_raw"], raw, {c: c for c in raw.columns}))
        bad = pl.DataFrame(
            {
                "id": [f"{file_label}#{i}" for i in df[row].to_list()],
                "source": [source or ""] * n,
                "text": payload["_raw"] if payload is not None else [""] * n,
                "meta": df.select(
                    pl.struct(
                        pl.lit(file_label).alias("file"), pl.col(row).alias("row"), pl.lit(error).alias("error")
                    ).struct.json_encode()
                )
                .to_series()
                .to_list(),
                "reason": [reason] * n,
                "duplicate_of": [None] * n,
            },
            schema={**CORE_SCHEMA, "reason": pl.String, "duplicate_of": pl.String},
        )
        return ReadBatch(_empty_rows(), _with_unreadable(bad, unreadable))

    if ambiguous:
        return reject_all(
            "read:bad_schema", f"column name(s) {ambiguous} appear more than once; write each column under its own name"
        )
    if text_field not in df.columns:
        return reject_all("read:bad_schema", f"no column {text_field!r}; columns are {df.columns[:-1]}")
    if df.schema[text_field] not in (pl.String, pl.Null):
        return reject_all("read:bad_schema", f"column {text_field!r} has type {df.schema[text_field]}, expected string")
    if source_field is not None and source_field not in df.columns:
        return reject_all("read:bad_schema", f"no column {source_field!r} (source_field)")
    for key, name in (("id_field", id_field), ("source_field", source_field)):
        if name in df.columns and df.schema[name].is_nested():
            return reject_all(
                "read:bad_schema",
                f"column {name!r} ({key}) has type {df.schema[name]}; ids and sources "
                "are strings or numbers (name a column of those, or none to derive ids)",
            )

    native = native_layout({c: t for c, t in df.schema.items() if c != row}, text_field=text_field, id_field=id_field)
    if native and df.schema["meta"] == pl.Null:
        df = df.with_columns(pl.col("meta").cast(pl.String))
    src_expr = pl.col(source_field).cast(pl.String) if source_field else pl.lit(source, dtype=pl.String)
    escaped = src_expr.str.replace_all("%", "%25", literal=True).str.replace_all("/", "%2F", literal=True)
    derived_id = pl.format("{}/{}/{}", escaped, pl.lit(file_label), pl.col(row))  # id_part's escapes
    # a null or empty id is derived as a missing one is (as in JSONL), so no row reaches the stages without an id
    given = pl.col(id_field).cast(pl.String)
    if id_field in df.columns and df.schema[id_field].is_float():  # NaN, a missing float (pandas), is no id either
        given = pl.when(~pl.col(id_field).is_nan()).then(given)
    id_expr = pl.coalesce(pl.when(given != "").then(given), derived_id) if id_field in df.columns else derived_id
    schema_error = pl.lit(None, dtype=pl.String)
    extra: list[str] = []  # a winnow-layout file's columns besides the core ones
    if native:
        extra = [c for c in df.columns if c not in CORE_COLUMNS and c != row and c != source_field]
        reserved = [c for c in extra if c in OPTIONAL_COLUMNS]
        # winnow's own columns hold their own types, and a split is one winnow writes: a value that is neither
        # (a text quality, a split such as '../x' that would name a folder) is the row's reject, never written
        for c in reversed(reserved):
            value = pl.col(c).cast(OPTIONAL_COLUMNS[c], strict=False)
            wrong = pl.col(c).is_not_null() & value.is_null()
            if c == "split":
                wrong = wrong | (value.is_not_null() & ~value.is_in(SPLITS))
            whole = OPTIONAL_COLUMNS[c].is_integer()  # counts and ranks: a fraction would be cut (1.5 -> 1)
            if whole:
                exact = pl.col(c).cast(pl.Float64, strict=False) == value.cast(pl.Float64)
                wrong = wrong | (value.is_not_null() & (~exact.fill_null(False) | (value < 0)))
            allowed = (
                "'train' or 'val'"
                if c == "split"
                else f"a whole number >= 0 ({OPTIONAL_COLUMNS[c]})"
                if whole
                else f"a {OPTIONAL_COLUMNS[c]}"
            )
            schema_error = (
                pl.when(wrong)
                .then(
                    pl.format(
                        "column {} holds {}; allowed: {}", pl.lit(repr(c)), pl.col(c).cast(pl.String), pl.lit(allowed)
                    )
                )
                .otherwise(schema_error)
            )
        out = df.select(
            id_expr.alias("id"),
            src_expr.alias("source"),
            pl.col("text"),
            pl.col("meta"),
            *[pl.col(c).cast(OPTIONAL_COLUMNS[c], strict=False) if c in OPTIONAL_COLUMNS else pl.col(c) for c in extra],
            pl.col(row),
            schema_error.alias(row + "_error"),
        )
        if source_field is None and "source" in df.columns:
            out = _meta_keeping_source(out, df["source"], source)
    else:
        rest = [c for c in df.columns if c not in (text_field, id_field, source_field, row)]
        df = df.with_columns(_json_ready(df, rest))
        fields = [pl.col(c).alias(blank.get(c, c)) for c in rest]
        meta = pl.struct(fields).struct.json_encode() if rest else pl.lit(None, dtype=pl.String)
        out = df.select(
            id_expr.alias("id"),
            src_expr.alias("source"),
            pl.col(text_field).cast(pl.String).alias("text"),
            meta.alias("meta"),
            pl.col(row),
            schema_error.alias(row + "_error"),
        )
        out = out.with_columns(_nonfinite_kept(out["meta"], df, {c: blank.get(c, c) for c in rest}))
    too_long = pl.col("text").str.len_bytes() > max_record_bytes if max_record_bytes is not None else pl.lit(False)
    problem = (
        pl.when(pl.col("text").is_null())
        .then(pl.lit("read:missing_text"))
        .when(pl.col("source").is_null() | (pl.col("source") == ""))
        .then(pl.lit("read:missing_source"))
        .when(too_long)
        .then(pl.lit("read:too_long"))
        .when(pl.col(row + "_error").is_not_null())
        .then(pl.lit("read:bad_schema"))
        .otherwise(pl.lit(None, dtype=pl.String))
    )
    out = out.with_columns(problem.alias("reason"))
    good = out.filter(pl.col("reason").is_null()).drop("reason", row, row + "_error")
    bad = out.filter(pl.col("reason").is_not_null())
    if bad.height:
        # a winnow-layout row's other columns (url, quality...) kept beside its meta, so the reject holds all of it
        columns = [pl.struct(*extra).alias("columns")] if native and extra else []
        located = pl.struct(
            pl.lit(file_label).alias("file"), pl.col(row).alias("row"), pl.col("meta").alias("meta"), *columns
        )
        bad = bad.with_columns(
            pl.col("id").fill_null(pl.format("{}#{}", pl.lit(file_label), pl.col(row))),
            pl.col("source").fill_null(pl.lit(source or "")),
            pl.when(pl.col("reason") == "read:too_long")
            .then(pl.col("text").str.slice(0, _PREVIEW_CHARS))
            .otherwise(pl.col("text"))
            .fill_null(""),
            pl.when(pl.col(row + "_error").is_null())
            .then(located.struct.json_encode())
            .otherwise(located.struct.with_fields(pl.col(row + "_error").alias("error")).struct.json_encode())
            .alias("meta"),
            pl.lit(None, dtype=pl.String).alias("duplicate_of"),
        ).select(*CORE_COLUMNS, "reason", "duplicate_of")
    else:
        bad = bad.select(*CORE_COLUMNS, "reason").with_columns(pl.lit(None, dtype=pl.String).alias("duplicate_of"))
    return ReadBatch(good, _with_unreadable(bad, unreadable))


#: Columns of a job's rejects that its shards never have: a file holding them is read as any Parquet file.
REJECTS_ONLY = (*REJECT_COLUMNS, "stage", "extra")


def native_layout(schema: dict[str, pl.DataType], *, text_field: str, id_field: str) -> bool:
    """Whether rows of ``schema`` (polars types, text columns decoded by ``as_text_columns``) are in winnow's own
    layout, a job's shards read back (``not_native`` says why not). Any other file's columns go to ``meta`` (its
    ``id`` too, when ``id_field`` names another column)."""
    return not_native(schema, text_field=text_field, id_field=id_field) is None


def not_native(schema: dict[str, pl.DataType], *, text_field: str, id_field: str) -> str | None:
    """Why rows of ``schema`` are not in winnow's own layout, or None when they are: text and ids in winnow's columns,
    the core columns as strings (``meta`` may be all null: a writer that rebuilds rows from records types such a
    column as null), no internal names, no column of a rejects file (a job's ``rejects/`` curated again keeps its
    reasons in ``meta``, where no stage's reason replaces them), and no binary column, which JSON cannot hold (a
    tar's ``.json``, a reject's ``extra``)."""
    if text_field != "text" or id_field != "id":
        return f"text_field = {text_field!r}, id_field = {id_field!r} (winnow's layout: 'text' and 'id')"
    for c in CORE_COLUMNS:
        if c not in schema:
            return f"it has no {c!r} column"
        if schema[c] != pl.String and not (c == "meta" and schema[c] == pl.Null):
            return f"its {c!r} column is {schema[c]}, not a string"
    if odd := next((c for c in schema if c.startswith(INTERNAL_PREFIX) or c in REJECTS_ONLY), None):
        return f"it has the column {odd!r}, which winnow's shards never have"
    if odd := next((c for c, t in schema.items() if _holds_binary(t)), None):
        return f"its column {odd!r} holds bytes"
    return None


def _holds_binary(dtype: pl.DataType) -> bool:
    if dtype == pl.Binary:
        return True
    if isinstance(dtype, pl.Struct):
        return any(_holds_binary(f.dtype) for f in dtype.fields)
    if isinstance(dtype, (pl.List, pl.Array)):
        return _holds_binary(dtype.inner)
    return False


def as_text_columns(table: pa.Table, names: list[str]) -> pa.Table:
    """The columns ``names`` as plain strings, whatever Arrow encoding a writer chose for them.

    Dictionary-encoded and view strings are decoded; a binary column (binary, large, view or
    fixed-size, or a dictionary of those) is read as UTF-8 text without validating it here, so a
    value that is not UTF-8 becomes a ``read:bad_utf8`` reject (``_split_invalid_utf8``), not a panic.
    Other types (numbers, ids) are left for the caller to cast or refuse.
    """
    for name in names:
        if name not in table.column_names:
            continue
        i = table.column_names.index(name)
        col = table.column(i)
        kind = col.type.value_type if pa.types.is_dictionary(col.type) else col.type
        if _is_binary(kind):
            chunks = [_bytes_as_text(chunk.cast(pa.large_binary())) for chunk in col.chunks]
            col = pa.chunked_array(chunks, pa.large_string())
        elif pa.types.is_dictionary(col.type) or pa.types.is_string_view(kind):
            col = col.cast(pa.large_string())
        else:
            continue
        table = table.set_column(i, table.field(i).with_type(col.type), col)
    return table


def _is_binary(t: pa.DataType) -> bool:
    return (
        pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_fixed_size_binary(t)
        or pa.types.is_binary_view(t)
    )


def _bytes_as_text(arr: pa.Array) -> pa.Array:
    """A large_binary array's buffers as a large_string array (validation is the caller's)."""
    return pa.Array.from_buffers(
        pa.large_string(), len(arr), arr.buffers(), null_count=arr.null_count, offset=arr.offset
    )


def _json_ready(df: pl.DataFrame, columns: list[str]) -> list[pl.Expr]:
    """Columns polars cannot write as JSON, made writable without losing a byte: binary as base64 text."""
    out = []
    for name in columns:
        dtype = df.schema[name]
        if dtype == pl.Binary:
            out.append(pl.col(name).bin.encode("base64"))
        elif "Binary" in str(dtype):  # bytes nested in lists or structs: each value as its JSON, bytes in base64
            values = [
                None if v is None else json.dumps(_base64(v), ensure_ascii=False, default=str)
                for v in df.get_column(name).to_list()
            ]
            out.append(pl.Series(name, values, dtype=pl.String))
    return out


def _base64(value: Any) -> Any:
    import base64

    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, float) and not math.isfinite(value):  # as _nonfinite_kept writes it: JSON has no NaN
        return _nonfinite_words(value, None)
    if isinstance(value, dict):
        return {k: _base64(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_base64(v) for v in value]
    return value


def _split_invalid_utf8(
    table: pa.Table | pa.RecordBatch,
    *,
    source: str | None,
    text_field: str,
    id_field: str,
    file_label: str,
    row_offset: int,
    row: str = "__row",
) -> tuple[pa.Table, pl.DataFrame | None]:
    """Number the rows (column ``row``) and take out those holding invalid UTF-8 as ``read:bad_utf8`` rejects."""
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    table = table.append_column(row, pa.array(range(row_offset, row_offset + table.num_rows), pa.int64()))
    bad = invalid_rows(table)
    if not bad:
        return table, None

    def cells(name: str) -> list:
        if name not in table.column_names:
            return [None] * len(bad)
        col = table.column(name).take(bad)
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            col = col.cast(pa.large_binary())  # no validation, so the bytes can be read back
        try:
            return col.to_pylist()
        except (UnicodeDecodeError, pa.ArrowInvalid):  # invalid bytes nested inside the column
            return [None] * len(bad)

    ids, texts = cells(id_field), cells(text_field)
    kept = [_raw_bytes(t) for t in texts]  # a text cell that is not UTF-8, exactly, beside its shown form
    columns = _invalid_columns(table, bad)
    error = f"column(s) {columns} hold bytes that are not valid UTF-8"
    if id_field in columns:
        error += (
            f"; ids of raw bytes (digests) need a text form: write them as hex, or set id_field to another "
            f"column (id_field = {id_field!r} now)"
        )
    rejects = pl.DataFrame(
        {
            "id": [cell_text(i) if i is not None else f"{file_label}#{row_offset + r}" for i, r in zip(ids, bad)],
            "source": [source or ""] * len(bad),
            "text": [cell_text(t) if t is not None else "" for t in texts],
            "meta": [
                orjson.dumps(
                    {
                        "file": file_label,
                        "row": row_offset + r,
                        "error": error,
                        **({"text_base64": raw} if raw else {}),
                    }
                ).decode()
                for r, raw in zip(bad, kept)
            ],
            "reason": ["read:bad_utf8"] * len(bad),
            "duplicate_of": [None] * len(bad),
        },
        schema={**CORE_SCHEMA, "reason": pl.String, "duplicate_of": pl.String},
    )
    bad_set = set(bad)
    return table.filter(pa.array([i not in bad_set for i in range(table.num_rows)])), rejects


#: A float JSON cannot hold, as the text ``meta`` keeps it in (``json_encode`` would write null).
NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _nonfinite_kept(encoded: pl.Series, df: pl.DataFrame, keys: dict[str, str]) -> pl.Series:
    """``encoded`` (JSON objects, one a row of ``df``, whose key ``keys[c]`` holds column ``c``) with every NaN or
    infinite float of those columns, at any depth (float16 to float64, in lists, arrays and structs), written as
    ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (``NONFINITE``): JSON has no such numbers, and polars writes them as
    null, which would read as a value that was never there. Found by column; only the rows holding one are read again."""
    checks = {c: e for c in keys if (e := _nonfinite_in(pl.col(c), df.schema[c])) is not None}
    if not checks:
        return encoded
    odd = df.select(pl.any_horizontal(checks.values()).fill_null(False)).to_series()
    if not odd.any():
        return encoded
    rows = odd.arg_true()
    values = {c: df[c].gather(rows).to_list() for c in checks}
    metas = []
    for k, meta in enumerate(encoded.gather(rows).to_list()):
        record = json.loads(meta)
        for c in checks:
            record[keys[c]] = _nonfinite_words(values[c][k], record[keys[c]])
        metas.append(dumps_exact(record))
    return encoded.scatter(rows, metas)


def _nonfinite_in(expr: pl.Expr, dtype: pl.DataType) -> pl.Expr | None:
    """Per row, whether ``expr`` (of ``dtype``) holds a NaN or infinite float at any depth (null where the value is
    null); None where ``dtype`` holds no float."""
    if dtype.is_float():
        return ~expr.is_finite()
    if isinstance(dtype, pl.Array):
        expr, dtype = expr.arr.to_list(), pl.List(dtype.inner)
    if isinstance(dtype, pl.List):
        inner = _nonfinite_in(pl.element(), dtype.inner)
        return None if inner is None else expr.list.eval(inner.fill_null(False)).list.any()
    if isinstance(dtype, pl.Struct):
        parts = [e for f in dtype.fields if (e := _nonfinite_in(expr.struct.field(f.name), f.dtype)) is not None]
        return pl.any_horizontal(parts) if parts else None
    return None


def _nonfinite_words(value: Any, written: Any) -> Any:
    """``written`` (``value`` as polars wrote it in JSON) with each NaN or infinite float of ``value`` as its word."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, list) and isinstance(written, list):
        return [_nonfinite_words(v, w) for v, w in zip(value, written, strict=True)]
    if isinstance(value, dict) and isinstance(written, dict):
        return {k: _nonfinite_words(value.get(k), w) for k, w in written.items()}
    return written


def polars_ready(table: pa.Table) -> pa.Table:
    """``table`` with every column of a type polars cannot read, or JSON cannot hold, as one they can, losing nothing.

    At any depth: a ``decimal256`` as its decimal text (polars panics on it); a UUID as its canonical text
    (``8c2e...-...``), any other extension type as its storage; a map whose keys are not strings as a list of
    ``{"key", "value"}`` (a JSON object's keys are strings); a struct naming a field twice with the later
    ones told apart by their place (``a#1``, as for a column given twice; polars panics on it); a list view
    (``list_view``, ``large_list_view``) as the list of its values (polars cannot read one). Other
    columns are left as they are, untouched.
    """
    for i, column in enumerate(table.columns):
        if _awkward(column.type):
            chunks = [_plain(chunk) for chunk in column.chunks]
            kind = chunks[0].type if chunks else _plain(pa.array([], column.type)).type
            table = table.set_column(i, table.field(i).with_type(kind), pa.chunked_array(chunks, kind))
    return table


def _awkward(t: pa.DataType) -> bool:
    if isinstance(t, pa.BaseExtensionType) or (pa.types.is_decimal(t) and t.bit_width == 256):
        return True
    if pa.types.is_map(t):
        return not (pa.types.is_string(t.key_type) or pa.types.is_large_string(t.key_type)) or _awkward(t.item_type)
    if pa.types.is_struct(t):
        names = [t.field(k).name for k in range(t.num_fields)]
        return len(set(names)) < len(names) or any(_awkward(t.field(k).type) for k in range(t.num_fields))
    if pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _awkward(t.value_type)
    return False


def _plain(arr: pa.Array) -> pa.Array:
    """``arr`` in the types ``polars_ready`` gives (an array of a type ``_awkward`` passes is returned as it is)."""
    t = arr.type
    if not _awkward(t):
        return arr
    nulls = arr.is_null() if arr.null_count else None
    if isinstance(t, pa.BaseExtensionType):
        if t.extension_name == "arrow.uuid":
            return pa.array([None if v is None else str(v) for v in arr.to_pylist()], pa.string())
        return _plain(arr.storage)
    if pa.types.is_decimal(t):
        return arr.cast(pa.string())
    if pa.types.is_fixed_size_list(t):
        return _plain(arr.cast(pa.list_(t.value_type)))
    if pa.types.is_map(t):
        entries = pa.StructArray.from_arrays([_plain(arr.keys), _plain(arr.items)], names=["key", "value"])
        return pa.ListArray.from_arrays(_offsets(arr), entries, mask=nulls)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        kind = pa.ListArray if pa.types.is_list(t) else pa.LargeListArray
        return kind.from_arrays(_offsets(arr), _plain(arr.values), mask=nulls)
    if pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        # built from the views' values in row order: pyarrow's cast to a list (26.0) writes an offsets
        # buffer one entry short, an array that polars reads past
        kind = pa.ListArray if pa.types.is_list_view(t) else pa.LargeListArray
        lengths = pc.fill_null(pc.list_value_length(arr), 0)
        offsets = pa.concat_arrays([pa.array([0], lengths.type), pc.cumulative_sum(lengths)])
        return kind.from_arrays(offsets, _plain(pc.list_flatten(arr)), mask=nulls)
    names = _told_apart([t.field(k).name for k in range(t.num_fields)])
    return pa.StructArray.from_arrays([_plain(arr.field(k)) for k in range(t.num_fields)], names=names, mask=nulls)


def _offsets(arr: pa.Array) -> pa.Array:
    """A list or map array's offsets, copied where ``arr`` is a slice (a batch read on from a damaged row group's
    row): ``from_arrays`` refuses sliced offsets beside a null mask."""
    offsets = arr.offsets
    return pa.concat_arrays([offsets]) if offsets.offset else offsets


def _told_apart(names: list[str]) -> list[str]:
    """``names`` with each one given before told apart by its place (``x#3``), and where another name is already that
    (``x, x, x#1``), by a count after it too (``x#1#1``): no two names alike, whatever the input's."""
    taken, seen, out = set(names), set(), []
    for place, name in enumerate(names):
        if name in seen:
            stand_in, count = f"{name}#{place}", 0
            while stand_in in taken:
                count += 1
                stand_in = f"{name}#{place}#{count}"
            taken.add(stand_in)
            name = stand_in
        seen.add(name)
        out.append(name)
    return out


def _invalid_columns(table: pa.Table, rows: list[int]) -> list[str]:
    """The columns whose values at ``rows`` hold a string that is not valid UTF-8."""
    out = []
    for name in table.column_names:
        try:
            table.column(name).take(rows).validate(full=True)
        except pa.ArrowInvalid:
            out.append(name)
    return out


def _raw_bytes(cell: object) -> str | None:
    """A cell's bytes in base64 when they are not UTF-8 (the reject's text shows them with U+FFFD), else None."""
    if not isinstance(cell, bytes):
        return None
    try:
        cell.decode("utf-8")
        return None
    except UnicodeDecodeError:
        return base64.b64encode(cell).decode("ascii")


def _with_unreadable(bad: pl.DataFrame, unreadable: pl.DataFrame | None) -> pl.DataFrame:
    return bad if unreadable is None else pl.concat([bad, unreadable.select(bad.columns)])


def _empty_rows() -> pl.DataFrame:
    return pl.DataFrame(schema=CORE_SCHEMA)
