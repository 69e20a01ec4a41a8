"""Shards: the same rows written to Parquet and WebDataset tar, rotated by bytes (or rows).

Each format goes to its own folder (``curate.writers.layout``). Parquet files get row groups
of about ``row_group_bytes`` and page statistics (a column index) on every column but the
text and ``meta``, so readers can prune by ``source``, ``quality`` or ``order``.

Every file is written under a temporary name and renamed once complete, so a crash never
leaves a half-written shard under its final name. Both formats are byte-for-byte
deterministic for the same rows (fixed tar metadata, no timestamps), which is what lets a
re-run after a crash reproduce identical shards.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from winnow.curate.atomic import rename_into_place
from winnow.curate.config import Job, OutputConfig
from winnow.curate.writers.layout import EXTENSIONS, row_bytes, shard_dir
from winnow.curate.writers.tar import TarWriter
from winnow.curate.writers.tokens import TokenShardWriter, shard_tokenizer


def safe_keys(df: pl.DataFrame) -> pl.Series:
    """WebDataset keys: ids percent-escaped (no ``/``, ``.``, ``~`` or NUL, which ends a tar name), ``~<n>`` marks the
    n-th repeat; an empty id (a stage's: readers derive one) is ``%``, which no escaped id can be. (Where a job
    lets ids repeat, the shard writer adds ``~~<k>`` to the k-th later copy of a key in a shard: ``_Keys``.)"""
    key = (
        pl.col("id")
        .str.replace_all("%", "%25", literal=True)
        .str.replace_all("/", "%2F", literal=True)
        .str.replace_all(".", "%2E", literal=True)
        .str.replace_all("~", "%7E", literal=True)
        .str.replace_all("\x00", "%00", literal=True)
    )
    key = pl.when(key == "").then(pl.lit("%")).otherwise(key)
    if "repeat" in df.columns:
        key = pl.when(pl.col("repeat").fill_null(0) > 0).then(pl.format("{}~{}", key, pl.col("repeat"))).otherwise(key)
    return df.select(key.alias("key")).to_series()


class _Keys:
    """The keys a shard's tar holds so far, for a job whose ids may repeat (``[job] duplicate_ids = "allow"``): a
    key's k-th later copy in the shard becomes ``<key>~~<k>`` (an escaped id holds no ``~``, a repeat mark no
    ``~~``), so no two samples of a tar share a name (WebDataset readers refuse, or merge, such samples). A dict
    looked up per row, for such jobs only: a frame of the shard's keys joined to each batch would cost the
    shard's size per batch."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    def unique(self, keys: pl.Series) -> pl.Series:
        out = []
        for key in keys.to_list():
            k = self.seen.get(key, 0)
            self.seen[key] = k + 1
            out.append(f"{key}~~{k}" if k else key)
        return pl.Series(keys.name, out, dtype=pl.String)


@dataclass(slots=True)
class _OpenShard:
    name: str
    rows: int = 0
    bytes: int = 0  # uncompressed row bytes (layout.row_bytes)
    sources: Counter = field(default_factory=Counter)
    sums: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    parquet: pq.ParquetWriter | None = None
    tar: TarWriter | None = None
    keys: _Keys | None = None  # a job whose ids may repeat: the tar's keys so far
    pending: list[pa.Table] = field(default_factory=list)  # the Parquet row group being filled
    pending_bytes: int = 0
    tokens: TokenShardWriter | None = None


class ShardWriter:
    """Writes one split's rows as numbered shards in every configured format under the job folder ``root``."""

    def __init__(
        self, root: Path, prefix: str, output: OutputConfig, *, split: str, repeated_ids: bool = False
    ) -> None:
        self.root = Path(root)
        self.repeated_ids = repeated_ids  # ``[job] duplicate_ids = "allow"``: rows may share an id
        self.prefix = prefix
        self.output = output
        self.split = split
        self.folders = {fmt: shard_dir(self.root, fmt, split) for fmt in output.formats}
        for folder in self.folders.values():
            folder.mkdir(parents=True, exist_ok=True)
        self._shard: _OpenShard | None = None
        self._index = 0
        self._schema: pa.Schema | None = None
        self.written: list[dict[str, Any]] = []

    @classmethod
    def for_job(cls, job: Job, prefix: str, *, split: str) -> ShardWriter:
        """A writer of ``job``'s shards (the user's job: its ``duplicate_ids`` says whether ids may repeat)."""
        return cls(job.output_dir, prefix, job.output, split=split, repeated_ids=job.job.duplicate_ids == "allow")

    def write(self, df: pl.DataFrame) -> None:
        """Append rows, starting a new shard whenever the current one is full."""
        sizes = row_bytes(df)
        while df.height:
            shard = self._shard or self._open()
            room = df.height if self.output.shard_rows is None else self.output.shard_rows - shard.rows
            fits = int((sizes.cum_sum() <= self.output.shard_bytes - shard.bytes).sum())
            room = min(room, max(fits, 1 if shard.rows == 0 else 0))
            part, df = df.head(room), df.slice(room)
            if part.height:
                self._append(shard, part, int(sizes.head(room).sum()))
                sizes = sizes.slice(room)
            if df.height:
                self._close()

    def write_shard(self, df: pl.DataFrame) -> None:
        """Write ``df`` as one shard of its own, whatever its size (the caller has cut it)."""
        if self._shard is not None:
            self._close()
        if df.height:
            self._append(self._open(), df, int(row_bytes(df).sum()))
            self._close()

    def close(self) -> list[dict[str, Any]]:
        """Finish the open shard; returns one manifest entry per file written."""
        if self._shard is not None:
            self._close()
        return self.written

    def abandon(self) -> None:
        """Close the open shard's files without finishing them and remove them (a failed task's; the shards
        already closed stay, their names taken again when the task runs anew)."""
        shard, self._shard = self._shard, None
        if shard is None:
            return
        for fmt, handle in (("parquet", shard.parquet), ("webdataset", shard.tar)):
            if handle is not None:
                with contextlib.suppress(OSError):  # a full disk fails the last flush again
                    handle.close()
                self._tmp(shard, fmt).unlink(missing_ok=True)
        if shard.tokens is not None:
            shard.tokens.abandon()

    # -- internals ----------------------------------------------------------------------
    def _open(self) -> _OpenShard:
        self._shard = _OpenShard(name=f"{self.prefix}-{self._index:05d}")
        self._index += 1
        return self._shard

    def _append(self, shard: _OpenShard, df: pl.DataFrame, nbytes: int) -> None:
        shard.rows += df.height
        shard.bytes += nbytes
        shard.sources.update(dict(df["source"].value_counts().iter_rows()))
        for name, dtype in df.schema.items():
            if dtype.is_numeric() and name != "repeat":
                col = df[name]
                if dtype.is_float():  # NaN and infinities have no mean, and are no JSON: a column's finite values
                    col = col.filter(col.is_finite())
                shard.sums[name] = shard.sums.get(name, 0.0) + float(col.sum() or 0.0)
                shard.counts[name] = shard.counts.get(name, 0) + col.len() - col.null_count()
        if "parquet" in self.output.formats:
            table = df.to_arrow()
            self._schema = self._schema or table.schema
            shard.pending.append(table.cast(self._schema))
            shard.pending_bytes += nbytes
            if shard.pending_bytes >= self.output.row_group_bytes:
                self._flush_row_group(shard)
        if "webdataset" in self.output.formats:
            if shard.tar is None:
                shard.tar = TarWriter(self._tmp(shard, "webdataset").open("wb"))
                shard.keys = _Keys() if self.repeated_ids else None
            _add_samples(shard.tar, df, shard.keys)
        if "tokens" in self.output.formats:
            if shard.tokens is None:
                tok = shard_tokenizer(self.output.tokens.tokenizer, self.output.tokens.eos_token)
                shard.tokens = TokenShardWriter(self.folders["tokens"], shard.name, tok, split=self.split)
            shard.tokens.add(df)

    def _flush_row_group(self, shard: _OpenShard) -> None:
        """Write the pending rows as one row group (batches arrive smaller than a good row group)."""
        if not shard.pending:
            return
        assert self._schema is not None
        if shard.parquet is None:
            compression = None if self.output.compression == "none" else self.output.compression
            stats = [
                n for n in self._schema.names if n not in ("text", "meta")
            ]  # min/max of documents: useless and big
            shard.parquet = pq.ParquetWriter(
                self._tmp(shard, "parquet"),
                self._schema,
                compression=compression,
                write_statistics=stats,
                write_page_index=True,
            )
        table = pa.concat_tables(shard.pending)
        shard.parquet.write_table(table, row_group_size=max(1, table.num_rows))
        shard.pending, shard.pending_bytes = [], 0

    def _tmp(self, shard: _OpenShard, fmt: str) -> Path:
        return self.folders[fmt] / f".{shard.name}.{EXTENSIONS[fmt]}.tmp"

    def _close(self) -> None:
        shard, self._shard = self._shard, None
        assert shard is not None
        means = {k: shard.sums[k] / shard.counts[k] for k in shard.sums if shard.counts[k]}
        self._flush_row_group(shard)
        for fmt, handle in (("parquet", shard.parquet), ("webdataset", shard.tar)):
            if handle is None:
                continue
            handle.close()
            tmp, final = self._tmp(shard, fmt), self.folders[fmt] / f"{shard.name}.{EXTENSIONS[fmt]}"
            with tmp.open("rb") as fh:
                digest = hashlib.file_digest(fh, "sha256").hexdigest()
            rename_into_place(tmp, final)
            self.written.append(
                {
                    "split": self.split,
                    "format": fmt,
                    "path": final,
                    "rows": shard.rows,
                    "bytes": final.stat().st_size,
                    "row_bytes": shard.bytes,
                    "sha256": digest,
                    "sources": dict(sorted(shard.sources.items())),
                    "means": means,
                }
            )
        if shard.tokens is not None:
            self.written.append(shard.tokens.close())


def _json_objects(meta: pl.Series) -> pl.Series:
    """Which ``meta`` values are JSON objects (each is embedded in its sample's ``.json`` as it is written).

    polars' ``json_path_match("$")`` is null where the text is no JSON; it also gives up on nesting past
    127 levels, which readers keep (up to ``readers.rows.MAX_DEPTH``): those few rows are parsed whole.
    """
    looks = meta.str.starts_with("{") & meta.str.ends_with("}")
    valid = looks & meta.str.json_path_match("$").is_not_null()
    doubt = (looks & ~valid).fill_null(False)
    if doubt.any():
        parsed = [_parses(text) for text in meta.filter(doubt).to_list()]
        valid = valid.scatter(doubt.arg_true(), parsed)
    return valid.fill_null(False)


def _parses(text: str) -> bool:
    try:
        return isinstance(orjson.loads(text), dict)
    except orjson.JSONDecodeError:
        return False


def _add_samples(tar: TarWriter, df: pl.DataFrame, keys: _Keys | None = None) -> None:
    """Two members per row: ``<key>.txt`` and ``<key>.json`` (every column but the text).

    A ``meta`` that is a JSON object goes into the json member as that object, not as a string
    holding JSON (which readers would have to decode twice); any other ``meta`` (one a Parquet or
    WebDataset input brought that only looks like an object, say) goes in as a JSON string.
    """
    rest = df.drop("text", "meta", strict=False).select(pl.struct(pl.all()).struct.json_encode()).to_series()
    if "meta" in df.columns:
        meta = pl.col("meta")
        is_object = _json_objects(df["meta"])
        as_string = (
            pl.struct(meta.alias("m")).struct.json_encode().str.slice(5).str.head(-1)
        )  # '{"m":"..."}' -> '"..."'
        embedded = pl.when(meta.is_null()).then(pl.lit("null")).when(pl.lit(is_object)).then(meta).otherwise(as_string)
        tail = df.select(embedded).to_series()
        jsons = rest.str.head(-1) + ',"meta":' + tail + "}"
    else:
        jsons = rest
    names = safe_keys(df) if keys is None else keys.unique(safe_keys(df))
    tar.add(names, [(".txt", df["text"]), (".json", jsons)])
