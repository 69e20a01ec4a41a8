"""JSON Lines (plain, ``.gz``, ``.zst``, ``.bz2``, ``.xz``): streamed in byte chunks, one record per line.

Lines are parsed with orjson; a line that is not valid UTF-8 or JSON, not an object, or
lacks a string text field becomes a reject carrying its raw bytes, file and byte offset. A
line that names no id is ``<source>/<file>@<offset>``, by the uncompressed byte offset of the
line, so ids do not depend on how the file is split into tasks. UTF-8 is checked before Arrow's block parser sees a block (it does not check),
and a ``\\ud800``-style escape, which no UTF-8 text can hold, is ``read:bad_utf8`` too.
A truncated compressed file keeps every complete line before the damage and adds one
``read:truncated`` reject at the offset where decompression failed.
"""

from __future__ import annotations

import bz2
import io
import json
import logging
import lzma
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import orjson
import polars as pl
import pyarrow as pa
import pyarrow.json as pa_json

from winnow.curate.config import InputConfig
from winnow.curate.readers.files import InputFile, codec, open_binary, refuse_other_format
from winnow.curate.readers.ranges import Span
from winnow.curate.readers.rows import ReadBatch, RowBuffer, decode_meta, id_part, id_text, loads_exact
from winnow.curate.readers.utf8 import first_bad_byte, valid_utf8

log = logging.getLogger(__name__)

CHUNK_BYTES = 4 << 20
BOM = b"\xef\xbb\xbf"
# Compressed bytes fed to zstd per call: a zstd block of >= 4 bytes expands to at most 128 KiB, so one
# call yields at most 8 KiB x 32768 = 256 MiB however hostile the file (python-zstandard has no
# max_length); gzip is bounded exactly by zlib's max_length.
_ZSTD_PIECE = 8 << 10
# Compressed bytes read per call for gzip, bzip2 and xz: where a stream is damaged, the call that meets the damage
# yields nothing, so the output of at most this much input is at stake (gzip's is then salvaged, ``_salvaged``;
# bzip2 loses the damaged block whatever the piece, up to 900 kB of text, as it checks a block before yielding it).
_PIECE = {"gzip": 64 << 10, "bz2": 8 << 10, "xz": 8 << 10, "zstd": CHUNK_BYTES}
# The largest zstd window decoded: 2 GiB, zstd's largest, which `zstd --long=31` writes and `zstd -d --long=31` reads
# (zstandard's default limit, 128 MiB, made such an intact file one read:truncated reject). Only the part of the
# window a file's data fills is touched.
_ZSTD_WINDOW = 1 << 31
_SALVAGE_PIECE = 64  # compressed bytes per call when salvaging a damaged gzip piece
PREVIEW = 1 << 10  # bytes of a too-long record kept in its reject


class Truncated(Exception):
    """The compressed stream ended early or is damaged; everything before it was yielded. ``unplaced``: the damage was
    found only by a checksum at the stream's end (gzip's), so it lies somewhere before, and lines decoded after it
    may be garbled."""

    def __init__(self, message: str, *, unplaced: bool = False) -> None:
        super().__init__(message)
        self.unplaced = unplaced


def decompressed_chunks(url: str, fh) -> Iterator[bytes]:
    """Decompress by hand, so a damaged file still yields every byte before the damage.

    Chunks are about ``CHUNK_BYTES`` whatever the compression ratio: a small file that expands
    to gigabytes (one huge line) is read in bounded pieces, never at once.
    """
    kind = codec(url)
    if kind is None:
        while chunk := fh.read(CHUNK_BYTES):
            yield chunk
        return
    gzip = kind == "gzip"
    if gzip:
        new = lambda: zlib.decompressobj(wbits=zlib.MAX_WBITS | 32)  # noqa: E731 - gzip, multi-member
    elif kind == "zstd":
        import zstandard

        new = zstandard.ZstdDecompressor(max_window_size=_ZSTD_WINDOW).decompressobj
    else:
        new = bz2.BZ2Decompressor if kind == "bz2" else lzma.LZMADecompressor
    dec, finished, out, held = new(), True, [], 0
    while raw := fh.read(_PIECE[kind]):
        full = False  # the decompressor stopped at max_length: it may hold more output with all input in
        while raw or full:
            if dec.eof:  # a member or frame ended exactly where a read did: the next one starts here
                raw = raw.lstrip(b"\0") if kind == "xz" else raw  # xz's stream padding: zeros between streams
                if not raw.strip(b"\0"):  # zeros after the last member (a padded tape or disk image)
                    break
                dec = new()
            saved = dec.copy() if gzip else None  # where this call starts: a damaged piece is salvaged from it
            try:
                if gzip:  # zlib: at most CHUNK_BYTES out per call, the rest waits in unconsumed_tail
                    part = dec.decompress(raw, CHUNK_BYTES)
                    rest, full = dec.unconsumed_tail, len(part) == CHUNK_BYTES
                elif kind == "zstd":  # a piece at a time, through a view (slicing bytes would copy the rest each time)
                    view = memoryview(raw)
                    part, rest = dec.decompress(view[:_ZSTD_PIECE]), view[_ZSTD_PIECE:]
                else:  # bz2 / xz: at most CHUNK_BYTES out per call, the rest of the input buffered inside
                    part, rest = dec.decompress(raw, CHUNK_BYTES), b""
                    full = not dec.eof and not dec.needs_input
            except Exception as err:  # zlib.error / ZstdError / OSError / LZMAError: corrupt data
                yield b"".join(out) + (_salvaged(saved, raw) if saved is not None else b"")
                raise Truncated(f"{type(err).__name__}: {err}", unplaced=gzip and "check" in str(err)) from err
            out.append(part)
            held += len(part)
            if held >= CHUNK_BYTES:
                yield b"".join(out)
                out, held = [], 0
            finished = dec.eof
            if finished:  # the next gzip member or zstd frame; zlib's unconsumed_tail repeats its unused_data then
                raw, full = dec.unused_data + (b"" if gzip else bytes(rest)), False
                if kind == "xz":  # stream padding (null bytes) may sit between two xz streams
                    raw = raw.lstrip(b"\0")
                if not raw.strip(b"\0"):  # zero padding after a member or frame: gzip, bzip2 and xz read it as the end
                    raw = b""
                if raw:
                    dec, finished = new(), False
            else:
                raw = rest
    yield b"".join(out)
    if not finished:
        raise Truncated("compressed stream ended before its end marker (truncated file)")


def _salvaged(dec, raw: bytes) -> bytes:
    """What a zlib stream ``dec`` yields from ``raw`` before the damage that stopped the call fed all of it: ``raw``
    again, a few bytes at a time, until the damage."""
    parts = []
    for at in range(0, len(raw), _SALVAGE_PIECE):
        try:
            parts.append(dec.decompress(raw[at : at + _SALVAGE_PIECE]))
        except zlib.error:
            break
    return b"".join(parts)


def _owned(chunks: Iterator[bytes], pos: int, span: Span | None) -> Iterator[tuple[int, bytes]]:
    """``(offset, bytes)`` of the lines a span owns, from chunks of the uncompressed stream starting at ``pos``.

    A span ``[a, b)`` owns the bytes after the first newline at or after ``a`` (from the
    start when ``a`` is 0) through the first newline at or after ``b`` (to the end when ``b``
    is -1): whole lines, each in exactly one span (``curate.readers.ranges``).
    """
    start, stop = (
        (0, -1) if span is None else ((span.base, span.base_stop) if span.unit == "frames" else (span.start, span.stop))
    )
    skipping = start > 0
    for chunk in chunks:
        if skipping:
            nl = chunk.find(b"\n", max(start - pos, 0)) if pos + len(chunk) > start else -1
            if nl < 0:
                pos += len(chunk)
                continue
            chunk, pos, skipping = chunk[nl + 1 :], pos + nl + 1, False
            if 0 <= stop < pos:  # the first line starting in the span starts after it: it owns nothing
                return
        if stop >= 0 and pos + len(chunk) > stop:
            nl = chunk.find(b"\n", max(stop - pos, 0))
            if nl >= 0:
                yield pos, chunk[: nl + 1]
                return
        if chunk:
            yield pos, chunk
        pos += len(chunk)


def read_jsonl(cfg: InputConfig, file: InputFile, batch_rows: int, span: Span | None = None) -> Iterator[ReadBatch]:
    """Yield batches of rows (and rejects) from one JSONL file, or the span of it a read task covers."""
    buf = RowBuffer()
    offset = 0  # uncompressed byte offset of the next line
    tail = b""
    long: _LongLine | None = None  # a line past max_record_bytes, skipped to its end without holding it
    plain = codec(file.url) is None
    with open_binary(file.url, cfg.storage_options, decompress=False) as fh:
        pos = 0
        if span is not None:
            fh.seek(span.start)
            pos = span.base if span.unit == "frames" else span.start
        try:
            for at, chunk in _owned(decompressed_chunks(file.url, fh), pos, span):
                if long is not None:
                    nl = chunk.find(b"\n")
                    long.size += len(chunk) if nl < 0 else nl
                    if nl < 0:
                        continue
                    long.reject(cfg, file, buf)
                    long, chunk, at = None, chunk[nl + 1 :], at + nl + 1
                    if not chunk:
                        continue
                data = tail + chunk
                if not tail:
                    offset = at
                if at == 0:  # a compressed file named as plain, or another format, would be garbage line after line
                    refuse_other_format(data, file.url, cfg.label, plain=plain)  # the first chunk: a record or more
                if at == 0 and data.startswith(BOM):
                    # Windows tools start files with one; Arrow skips it but orjson refuses the line.
                    data, offset = data[len(BOM) :], len(BOM)
                cut = data.rfind(b"\n") + 1
                complete, tail = data[:cut], data[cut:]
                fast = _read_columnar(cfg, file, complete, offset) if complete else None
                if fast is not None:
                    if len(buf):
                        yield buf.flush()
                    for start in range(0, fast.rows.height, batch_rows):
                        yield ReadBatch(fast.rows.slice(start, batch_rows), fast.rejects)
                    offset += len(complete)
                else:
                    for line in complete.split(b"\n")[:-1]:
                        _parse_line(cfg, file, line, offset, buf)
                        offset += len(line) + 1
                        if len(buf) >= batch_rows:
                            yield buf.flush()
                if len(tail) > cfg.max_record_bytes:  # no end in sight: keep its start and size only
                    long, tail = _LongLine(offset, len(tail), tail[:PREVIEW]), b""
            if long is not None:
                long.reject(cfg, file, buf)
            elif tail.strip():
                _parse_line(cfg, file, tail, offset, buf)
        except (Truncated, OSError) as err:
            # Complete lines before the damage (or the failed read: a bad disk, a dropped connection)
            # are kept; the partial last line is the reject.
            error = str(err) if isinstance(err, Truncated) else f"reading failed: {type(err).__name__}: {err}"
            if getattr(err, "unplaced", False):
                error += " (the gzip checksum at the end: the damage lies before it, and rows past it may be garbled)"
                log.warning(
                    "%s: its gzip checksum fails at byte %d of its text: the damage lies before it and was not found "
                    "where it is, so rows read from the file may be garbled past it; get an intact copy of the file",
                    file.url,
                    offset,
                )
            buf.reject(
                "read:truncated",
                id_=derived_id(cfg.source, file, offset),
                source=cfg.source or "",
                raw=tail,
                where={"file": file.url, "offset": offset, "error": error},
            )
    if len(buf):
        yield buf.flush()


@dataclass(slots=True)
class _LongLine:
    """A record longer than ``[[inputs]] max_record_bytes``: where it starts, its size so far, its first bytes."""

    offset: int
    size: int
    preview: bytes

    def reject(self, cfg: InputConfig, file: InputFile, buf: RowBuffer) -> None:
        too_long(cfg, file, self.offset, self.size, self.preview, buf)


def too_long(cfg: InputConfig, file: InputFile, offset: int, size: int, preview: bytes, buf: RowBuffer) -> None:
    """A ``read:too_long`` reject: the record's first ``PREVIEW`` bytes, where it is and how long."""
    buf.reject(
        "read:too_long",
        id_=derived_id(cfg.source, file, offset),
        source=cfg.source or "",
        raw=preview[:PREVIEW],
        where={
            "file": file.url,
            "offset": offset,
            "bytes": size,
            "error": f"a record of {size} bytes, over [[inputs]] max_record_bytes = {cfg.max_record_bytes}; "
            "raise it to read such records",
        },
    )


def derived_id(source: str | None, file: InputFile, offset: int) -> str:
    """The id of a line that names none: ``<source>/<file>@<byte offset of the line>``, whatever the task split."""
    return f"{id_part(source)}/{file.rel}@{offset}"


# The columnar path takes flat records only; a block whose lines may nest deeper goes line by line, where
# orjson refuses past 1,024 levels (``read:bad_json``). Arrow's parser is never handed deep nesting: it
# recurses once per level and a few thousand levels (one hostile line) overflow the process's stack.
_COLUMNAR_DEPTH = 64
_BRACKETS = bytes(range(256)).translate(None, b"[]{}\n")  # every byte but these five, for bytes.translate


def _nesting_bound(lines: bytes) -> int:
    """An upper bound of the deepest nesting of any line of ``lines``: brackets in strings count too."""
    marks = np.frombuffer(lines.translate(None, _BRACKETS), dtype=np.uint8)  # brackets and newlines only
    if not len(marks):
        return 0
    step = np.where((marks == 91) | (marks == 123), 1, np.where(marks == 10, 0, -1))
    depth = np.cumsum(step)
    newline = marks == 10
    last_newline = np.maximum.accumulate(np.where(newline, np.arange(len(marks)), -1))
    at_line_start = np.where(last_newline >= 0, depth[np.maximum(last_newline, 0)], 0)
    return int((depth - at_line_start).max())


def _read_columnar(cfg: InputConfig, file: InputFile, lines: bytes, offset: int) -> ReadBatch | None:
    """Arrow's multithreaded JSON parser for a block of complete lines, when the result is exact.

    It is taken only when every line is a record with a string text, a present id (or none
    at all), and flat, never-null other fields: then ``meta`` re-encoded from the columns
    equals the record's other fields. Anything else (a bad line, nested or missing fields,
    blank lines) returns None and the block is parsed line by line, with per-line rejects.
    """
    if b"\n\n" in lines or lines.startswith(b"\n") or cfg.source_field is not None or b"\n" + BOM in lines:
        return None  # (a byte-order mark starting a line: files joined with `cat`; the lines path reads past it)
    if len(lines) > cfg.max_record_bytes:  # a line past the limit may be in the block: the lines path rejects it
        ends = np.flatnonzero(np.frombuffer(lines, dtype=np.uint8) == 10)
        if np.diff(ends, prepend=-1).max() - 1 > cfg.max_record_bytes:
            return None
    if not valid_utf8(lines):  # Arrow's parser does not check; the lines path rejects the bad lines
        return None
    if _nesting_bound(lines) > _COLUMNAR_DEPTH:  # Arrow's parser recurses per level: thousands overflow its stack
        return None
    try:
        table = pa_json.read_json(io.BytesIO(lines), read_options=pa_json.ReadOptions(block_size=len(lines) + 1))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    names = table.column_names
    if "" in names:  # polars names an empty key column_N: the lines path keeps it as written
        return None
    text = cfg.text_field
    if text not in names or not pa.types.is_string(table.schema.field(text).type) or table.column(text).null_count:
        return None
    rest = [n for n in names if n not in (text, cfg.id_field)]
    if cfg.id_field in names and not _exact_text(table.schema.field(cfg.id_field).type):
        return (
            None  # a float id (1e3, or an integer past 64 bits that Arrow read as one): the lines path keeps its text
        )
    try:
        checked = [table.column(n).combine_chunks() for n in rest + [n for n in (cfg.id_field,) if n in names]]
        for column in checked:  # Arrow's parser can build an invalid list array ([null, 0.5] first in a block)
            if pa.types.is_nested(column.type):
                column.validate(full=True)
    except pa.ArrowException:
        return None
    if not all(_exact(column) for column in checked):
        return None
    ends = np.flatnonzero(np.frombuffer(lines, dtype=np.uint8) == 10)
    if len(ends) != table.num_rows:  # two objects on a line, or a blank line Arrow skipped: the lines path decides
        return None
    df = pl.from_arrow(table)
    if cfg.id_field in names and (df[cfg.id_field].cast(pl.String) == "").any():
        return None  # an empty id is derived from the line's offset: the lines path does it
    source = pl.lit(cfg.source, dtype=pl.String)
    if cfg.id_field in names:
        ids = pl.col(cfg.id_field).cast(pl.String)
    else:
        starts = np.concatenate(([0], ends[:-1] + 1)) + offset
        ids = pl.format("{}/{}@{}", pl.lit(id_part(cfg.source)), pl.lit(file.rel), pl.Series(starts, dtype=pl.Int64))
    meta = pl.struct(rest).struct.json_encode() if rest else pl.lit(None, dtype=pl.String)
    rows = df.select(ids.alias("id"), source.alias("source"), pl.col(text).alias("text"), meta.alias("meta"))
    return ReadBatch(rows, RowBuffer().flush().rejects)


def _scalar(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_floating(t)


def _exact_text(t: pa.DataType) -> bool:
    """Whether a column of this type, cast to text, is what the lines said (strings, and integers Arrow parsed)."""
    return pa.types.is_string(t) or pa.types.is_integer(t)


def _exact(arr: pa.Array, *, nulls: bool = False) -> bool:
    """True when re-encoding ``arr`` as JSON gives back exactly what was parsed.

    Floats must all be finite fractions: an integral one may have been an integer (``7`` beside a
    float reads as ``7.0``, one past 64 bits is rounded), and orjson refuses the ``NaN`` and
    ``Infinity`` Arrow accepts (the lines path rejects them). Values Arrow converted (an ISO date
    string read as a timestamp) rule it out too, inside lists as anywhere. A null where a record had no
    such key (Arrow fills missing keys with nulls, at any depth) would add a key, so nulls in fields and
    struct members rule the fast path out; ``nulls``: the elements of a list, whose nulls are real JSON nulls.
    """
    t = arr.type
    if arr.null_count and not nulls:
        return False
    if pa.types.is_floating(t):
        values = arr.drop_null().to_numpy(zero_copy_only=False)
        return bool(np.isfinite(values).all()) and not (values == np.floor(values)).any()
    if _scalar(t):
        return True
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        values = arr.flatten()
        return _exact(values, nulls=not pa.types.is_struct(values.type))
    if pa.types.is_struct(t):
        return all(_exact(arr.field(i)) for i in range(t.num_fields))
    return False


def _parse_line(cfg: InputConfig, file: InputFile, line: bytes, offset: int, buf: RowBuffer) -> None:
    if len(line) > cfg.max_record_bytes:
        too_long(cfg, file, offset, len(line), line, buf)
        return
    if line.startswith(BOM):  # a file that started with one, joined to another (`cat a.jsonl b.jsonl`)
        line = line[len(BOM) :]
    if not line.strip():
        return
    where = {"file": file.url, "offset": offset}
    fallback_id = derived_id(cfg.source, file, offset)
    try:
        record = loads_exact(line)
    except (orjson.JSONDecodeError, json.JSONDecodeError) as err:
        reason, error = "read:bad_json", str(err)
        if not valid_utf8(line):
            at, why = first_bad_byte(line)
            reason, error = "read:bad_utf8", f"byte {offset + at} of the file is not UTF-8 ({why})"
            where["byte"] = offset + at
            fallback_id = _given_id(cfg, line) or fallback_id
        elif "surrogate" in error:  # a \ud800-style escape: valid JSON, but no UTF-8 text can hold it
            reason, error = (
                "read:bad_utf8",
                f"a JSON \\u escape decodes to a lone surrogate, which UTF-8 cannot hold ({err})",
            )
            fallback_id = _surrogate_line_id(cfg, line) or fallback_id
        buf.reject(reason, id_=fallback_id, source=cfg.source or "", raw=line, where={**where, "error": error})
        return
    if not isinstance(record, dict):
        buf.reject(
            "read:not_an_object",
            id_=fallback_id,
            source=cfg.source or "",
            raw=line,
            where={**where, "error": f"a JSON {type(record).__name__}, not an object"},
        )
        return
    text = record.pop(cfg.text_field, None)
    source = cfg.source if cfg.source_field is None else record.pop(cfg.source_field, None)
    given_id = record.pop(cfg.id_field, None)
    id_ = fallback_id if given_id in (None, "") else id_text(given_id, cfg.id_field, line)  # "" names nothing
    if isinstance(source, (int, float)) and not isinstance(source, bool):  # a numeric name: as written, like an id
        source = id_text(source, cfg.source_field, line)
    if not isinstance(source, str) or not source:
        buf.reject(
            "read:missing_source",
            id_=id_,
            source="",
            raw=line,
            where={**where, "error": f"field {cfg.source_field!r} missing, empty, or not a string or number"},
        )
    elif text is None:
        buf.reject(
            "read:missing_text",
            id_=id_,
            source=source,
            raw=line,
            where={**where, "error": f"no field {cfg.text_field!r}"},
        )
    elif not isinstance(text, str):
        buf.reject(
            "read:text_not_string",
            id_=id_,
            source=source,
            raw=line,
            where={**where, "error": f"field {cfg.text_field!r} is a {type(text).__name__}"},
        )
    else:
        if given_id in (None, "") and cfg.source_field is not None:
            id_ = derived_id(source, file, offset)
        buf.add(id_, source, text, decode_meta(record))


def _surrogate_line_id(cfg: InputConfig, line: bytes) -> str | None:
    """The id a line with a lone-surrogate escape names, when the escape is elsewhere in the line (Python's own
    parser reads such escapes; orjson refuses the whole line)."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None
    given = record.get(cfg.id_field) if isinstance(record, dict) else None
    if given is None or isinstance(given, (dict, list)):
        return None
    try:
        str(given).encode("utf-8")
    except UnicodeEncodeError:  # the surrogate is in the id itself
        return None
    return id_text(given, cfg.id_field, line)


def _given_id(cfg: InputConfig, line: bytes) -> str | None:
    """The id a line that is not UTF-8 names, when the bad bytes are elsewhere in the line."""
    text = line.decode("utf-8", errors="replace").encode()
    try:
        record = loads_exact(text)
    except (orjson.JSONDecodeError, json.JSONDecodeError):
        return None
    given = record.get(cfg.id_field) if isinstance(record, dict) else None
    if given is None or isinstance(given, (dict, list)) or "\ufffd" in str(given):
        return None
    return id_text(given, cfg.id_field, text)
