"""WebDataset tar shards: consecutive members sharing a key form one sample.

The text comes from the ``txt`` member (or the member whose extension is ``text_field``),
the ``json`` member's fields go to ``meta`` — unless the sample is one of winnow's shards (``meta``,
``source`` and winnow's own columns alone): then ``meta`` is kept as written and ``split``,
``quality``, ``repeat``... come back as columns, as from the Parquet shard of the same rows.
Other members (``url``, ``cls``...) go to ``meta`` under their extension (``url.member`` where the
json has that key too), as text, or as ``{"base64": ...}`` when they are not UTF-8. A sample without
a text member is ``read:missing_text`` holding every member it has, and naming them.

A sample's members must be consecutive (``tar --sort=name`` writes them so; a plain ``tar cf`` of a
folder on most file systems does not): a key whose new members reappear after another sample's is
refused, naming the file, the key and the fix, as it would otherwise be read as two samples.
"""

from __future__ import annotations

import base64
import json
import posixpath
import sys
import tarfile
from collections.abc import Iterator
from typing import IO

import orjson
import polars as pl

from winnow.curate.config import InputConfig
from winnow.curate.errors import InputError
from winnow.curate.readers.files import InputFile, codec, compressed_kind, file_kind, open_binary
from winnow.curate.readers.jsonl import PREVIEW, Truncated, decompressed_chunks
from winnow.curate.readers.ranges import Span
from winnow.curate.readers.rows import ReadBatch, RowBuffer, decode_meta, id_part, id_text, keep_own_source, loads_exact
from winnow.curate.readers.utf8 import printable, valid_utf8
from winnow.curate.schema import OPTIONAL_COLUMNS, SPLITS


def split_key(name: str) -> tuple[str, str]:
    """``a/b/key.ext.gz`` → (``a/b/key``, ``ext.gz``), as webdataset groups members."""
    folder, base = posixpath.split(name)
    key, _, ext = base.partition(".")
    return posixpath.join(folder, key), ext


class SampleKeys:
    """The sample keys a tar has shown so far, each with its members' extensions: tells a sample whose members are
    not consecutive (the reader refuses the file; a span plan reads such a file whole, so it is refused alike)."""

    def __init__(self) -> None:
        self._exts: dict[str, tuple[str, ...]] = {}  # tuples of interned extensions: a few bytes per sample

    def scattered(self, key: str, ext: str, current: str | None) -> bool:
        """Note the member ``key.ext``, read after a member of ``current``; whether it belongs to an earlier sample:
        a key seen before another sample's, with an extension it did not have (a copy of a whole sample, as in
        ``cat a.tar a.tar``, is read as a copy)."""
        exts = self._exts.get(key, ())
        if ext not in exts:
            self._exts[key] = (*exts, sys.intern(ext))
        return key != current and bool(exts) and ext not in exts


class NotedTarInfo(tarfile.TarInfo):
    """A ``TarInfo`` that notes on its archive (``damaged``: header offsets and errors) each header that fails.

    With ``ignore_zeros`` (read past end-of-archive markers, as ``tar -i``) ``tarfile`` also steps over a
    damaged header block by block without a word, and with it the member the header began; a header cut
    short by the end of the file ends the archive as quietly. The reader makes each run of such blocks a
    reject, and a file where no header parses is not a tar.
    """

    @classmethod
    def fromtarfile(cls, tar: tarfile.TarFile) -> tarfile.TarInfo:
        at = tar.offset
        try:
            return super().fromtarfile(tar)
        except tarfile.HeaderError as err:  # zero blocks (end markers, padding) and the file's clean end are not damage
            if not isinstance(err, (tarfile.EOFHeaderError, tarfile.EmptyHeaderError)):
                tar.__dict__.setdefault("damaged", []).append((at, str(err)))
            raise


def _damaged_regions(tar: tarfile.TarFile) -> list[tuple[int, int, str]]:
    """The runs of failed header blocks ``NotedTarInfo`` noted since the last call: (first offset, blocks, error)."""
    noted = tar.__dict__.pop("damaged", [])
    regions: list[tuple[int, int, str]] = []
    for at, error in noted:
        if regions and at == regions[-1][0] + regions[-1][1] * tarfile.BLOCKSIZE:
            regions[-1] = (regions[-1][0], regions[-1][1] + 1, regions[-1][2])
        else:
            regions.append((at, 1, error))
    return regions


def member_id(source: str | None, file: InputFile, name: str) -> str:
    """The id of a sample (or member) ``name`` of a tar that names none: ``<source>/<file>/<name>``."""
    return f"{id_part(source)}/{file.rel}/{name}"


def read_webdataset(
    cfg: InputConfig, file: InputFile, batch_rows: int, span: Span | None = None
) -> Iterator[ReadBatch]:
    """Yield batches from one tar shard (or a span of its members, from one header offset to another), streaming."""
    text_ext = "txt" if cfg.text_field == "text" else cfg.text_field
    buf = RowBuffer()
    current: str | None = None
    parts: dict[str, bytes] = {}
    base = 0 if span is None else span.start  # tarfile counts member offsets from where the stream starts
    offset = base  # of the current sample's first member, in the file

    seen = SampleKeys()  # the keys read so far in this span

    def emit() -> None:
        if current is not None and parts is not None:
            _add_sample(cfg, file, current, parts, offset, text_ext, buf)

    def damage(tar: tarfile.TarFile) -> None:
        for at, blocks, error in _damaged_regions(tar):
            buf.reject(
                "read:truncated",
                id_=f"{id_part(cfg.source)}/{file.rel}#{base + at}",
                source=cfg.source or "",
                raw=b"",
                where={
                    "file": file.url,
                    "offset": base + at,
                    "error": f"a damaged tar header ({error}): the member it began is lost, {blocks} block(s) of "
                    f"{tarfile.BLOCKSIZE} bytes skipped to the next header that parses",
                },
            )

    with open_binary(file.url, cfg.storage_options, decompress=False) as fh:
        try:
            if base:
                fh.seek(base)
            # ignore_zeros: past an end-of-archive marker to the members after it (`cat a.tar b.tar`, as `tar -i`)
            with tarfile.open(
                fileobj=fh if span is not None else _tar_stream(file.url, fh),  # a span is of a plain tar
                mode="r|",
                ignore_zeros=True,
                tarinfo=NotedTarInfo,
            ) as tar:
                members = 0
                for member in tar:
                    members += 1
                    damage(tar)
                    at = base + member.offset
                    if span is not None and 0 <= span.stop <= at:
                        break
                    if not member.isfile():
                        _reject_member(cfg, file, member, at, buf)
                        continue
                    key, ext = split_key(printable(member.name))
                    if seen.scattered(key, ext, current):
                        _refuse_scattered(file, key, member, at)
                    if key != current:
                        emit()
                        if len(buf) >= batch_rows:
                            yield buf.flush()
                        current, parts, offset = key, {}, at
                    if member.size > cfg.max_record_bytes:  # a header may promise gigabytes: never read them
                        buf.reject(
                            "read:too_long",
                            id_=member_id(cfg.source, file, key),
                            source=cfg.source or "",
                            raw=tar.extractfile(member).read(PREVIEW),
                            where={
                                "file": file.url,
                                "offset": at,
                                "member": printable(member.name),
                                "bytes": member.size,
                                "error": f"a member of {member.size} bytes, over "
                                f"[[inputs]] max_record_bytes = {cfg.max_record_bytes}; raise it to read it",
                            },
                        )
                        parts = None  # the sample's other members go with it: one reject per sample
                    if parts is not None and ext in parts:  # the same member name again: the first copy is read
                        buf.reject(
                            "read:duplicate_member",
                            id_=member_id(cfg.source, file, f"{key}.{ext}"),
                            source=cfg.source or "",
                            raw=tar.extractfile(member).read(),
                            where={
                                "file": file.url,
                                "offset": at,
                                "member": printable(member.name),
                                "error": "a member name the sample already has; the first copy is read",
                            },
                        )
                    elif parts is not None:
                        parts[ext] = tar.extractfile(member).read()
                if members == 0 and base == 0 and tar.__dict__.get("damaged"):
                    _refuse_not_tar(cfg, file)  # not one header parses in the whole file
                damage(tar)
            emit()
        except (tarfile.TarError, EOFError, OSError, Truncated) as err:
            # a damaged or cut compressed stream (Truncated), a tar cut short, a read that failed: what was read stays
            compressed = isinstance(err, Truncated)
            error = str(err) if compressed else f"{type(err).__name__}: {err}"
            if compressed and (err.unplaced or "checksum" in error):  # gzip's at its end, or zstd's at a frame's
                error += (
                    " (found by a checksum at the end: the damage lies before it, and samples past it may be garbled)"
                )
            buf.reject(
                "read:truncated",
                id_=f"{file.url}#{offset}",
                source=cfg.source or "",
                raw=b"",
                where={"file": file.url, "offset": offset, "error": error},
            )
    if len(buf):
        yield buf.flush()


def _tar_stream(url: str, fh: IO[bytes]) -> IO[bytes] | _ChunkStream:
    """``fh``'s tar: decompressed when its name says gzip, zstd, bzip2 or xz, or a ``.tar``'s first bytes do.

    Decompressed as JSON Lines are (``jsonl.decompressed_chunks``), for every compression alike: every gzip member,
    zstd frame and xz stream (past xz's padding), every byte before a damage, then ``Truncated``. (``tarfile``'s
    own ``r|*`` reads no zstd, and only a gzip file's first member: the rest of ``cat a.tar.gz b.tar.gz`` was lost.)
    """
    if codec(url) is None:
        kind = compressed_kind(fh.read(16))
        fh.seek(0)
        if kind not in ("gzip", "zstd", "bz2", "xz"):  # lz4, snappy: no tar header parses, and the refusal names it
            return fh
        url = f"{url}.{kind}"  # decompressed_chunks goes by the name's ending: .gzip, .zstd, .bz2, .xz
    return _ChunkStream(decompressed_chunks(url, fh))


class _ChunkStream:
    """A stream of bytes that ``tarfile``'s stream mode (``r|``) reads from an iterator of chunks."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._chunk = memoryview(b"")
        self._at = 0

    def read(self, size: int = -1) -> bytes:
        while self._at >= len(self._chunk):
            chunk = next(self._chunks, None)
            if chunk is None:
                return b""
            self._chunk, self._at = memoryview(chunk), 0
        end = len(self._chunk) if size < 0 else self._at + size
        out = bytes(self._chunk[self._at : end])
        self._at += len(out)
        return out


def _refuse_not_tar(cfg: InputConfig, file: InputFile) -> None:
    """Raise ``InputError``: not one tar header parses in ``file``, so it is another format (named where its first
    bytes say), not a tar with damage; read on, it would be no rows and no reject."""
    with open_binary(file.url, cfg.storage_options, decompress=False) as fh:
        head = fh.read(1024)
    found, kind = file_kind(head), compressed_kind(head)
    if found is not None:
        what, todo = found
    elif head.lstrip()[:1] in (b"{", b"["):
        what, todo = "JSON text", 'if it is JSON Lines, give it an [[inputs]] table with format = "jsonl"'
    else:
        what = f"{kind}-compressed data that holds no tar" if kind else "not a tar archive (no tar header parses in it)"
        todo = "give the input the format its files are in, or leave this file out of its path"
    raise InputError(f"input {cfg.label}: {printable(file.url)} is {what}, not a WebDataset tar shard; {todo}")


def _refuse_scattered(file: InputFile, key: str, member: tarfile.TarInfo, at: int) -> None:
    raise InputError(
        f"{printable(file.url)}: member {printable(member.name)!r} (byte {at}) belongs to sample {key!r}, whose "
        "other members came before another sample's: a WebDataset sample is consecutive members sharing a key, "
        "so it would be read as two samples. Write the tar with its members in name order "
        "(tar --sort=name -cf out.tar -C folder .), or give the files as a text or JSON Lines input"
    )


def _reject_member(cfg: InputConfig, file: InputFile, member: tarfile.TarInfo, at: int, buf: RowBuffer) -> None:
    """A link or special member holds no sample bytes: it becomes a reject, so it is counted, not lost.

    Folders carry nothing and are skipped. Links are never followed: a link member may
    point anywhere (``/etc/passwd``, another sample) and a reader must not go there.
    """
    if member.isdir():
        return
    name = printable(member.name)
    where = {"file": file.url, "offset": at, "member": name}
    if member.issym() or member.islnk():
        kind = "symbolic" if member.issym() else "hard"
        buf.reject(
            "read:link_member",
            id_=member_id(cfg.source, file, name),
            source=cfg.source or "",
            raw=printable(member.linkname),
            where={**where, "error": f"a {kind} link to {printable(member.linkname)!r}; links are not followed"},
        )
    else:
        buf.reject(
            "read:special_member",
            id_=member_id(cfg.source, file, name),
            source=cfg.source or "",
            raw=b"",
            where={**where, "error": f"a special member (tar type {member.type!r}), not a regular file"},
        )


def _add_sample(
    cfg: InputConfig, file: InputFile, key: str, parts: dict[str, bytes], offset: int, text_ext: str, buf: RowBuffer
) -> None:
    where = {"file": file.url, "offset": offset, "key": key}
    raw_text = parts.get(text_ext, parts.get("text"))
    record: dict = {}
    if "json" in parts:
        try:
            record = loads_exact(parts["json"])
        except (orjson.JSONDecodeError, json.JSONDecodeError) as err:
            # Bytes that are not UTF-8, or a \ud800-style escape, are bad UTF-8 as in JSONL; the rest bad JSON.
            not_utf8 = not valid_utf8(parts["json"]) or "surrogate" in str(err)
            buf.reject(
                "read:bad_utf8" if not_utf8 else "read:bad_json",
                id_=member_id(cfg.source, file, key),
                source=cfg.source or "",
                raw=parts["json"],
                where={**where, "error": str(err)},
            )
            return
        if not isinstance(record, dict):
            record = {"json": record}
    source = cfg.source if cfg.source_field is None else record.pop(cfg.source_field, None)
    given_id = record.pop(cfg.id_field, None)
    id_ = (
        id_text(given_id, cfg.id_field, parts["json"])
        if given_id not in (None, "")  # an empty id names nothing: derived, as a missing one is
        else member_id(source or cfg.source, file, key)
    )
    if not isinstance(source, str) or not source:
        buf.reject(
            "read:missing_source", id_=id_, source="", raw=raw_text or b"", where={**where, "error": "no source"}
        )
        return
    if raw_text is None:
        buf.reject(
            "read:missing_text",
            id_=id_,
            source=source,
            raw=_members_json(parts).encode(),  # every member, so nothing of the sample is lost
            where={
                **where,
                "error": f"no .{text_ext} member (it has: {', '.join(f'.{e}' if e else '(no extension)' for e in parts)}"
                f"); name the text member {key}.{text_ext}, or set [[inputs]] text_field to its extension",
            },
        )
        return
    try:
        text = raw_text.decode("utf-8")
    except UnicodeDecodeError as err:
        buf.reject("read:bad_utf8", id_=id_, source=source, raw=raw_text, where={**where, "error": str(err)})
        return
    extra = None
    others = {e: v for e, v in parts.items() if e not in (text_ext, "text", "json")} if len(parts) > 1 else {}
    if others:  # url, cls...: kept in meta under their extension
        for ext, value in others.items():
            record[ext if ext not in record else f"{ext}.member"] = _member_value(value)
    if not others and (meta := _winnows_meta(record)) is not False:
        # A winnow shard: meta is a JSON object's text; its own columns come back as columns, as from its
        # Parquet shard (a held-out row stays held out), and the columns a job added (keep_fields, keep_metrics,
        # a score's column) in meta
        added = {k: v for k, v in record.items() if k not in ("meta", "source", *OPTIONAL_COLUMNS)}
        if added:
            found = loads_exact(meta.encode()) if meta else {}
            meta = decode_meta({**found, **{k if k not in found else f"{k}.column": v for k, v in added.items()}})
        theirs = record.get("source")
        if cfg.source_field is None and theirs and theirs != source:
            meta = keep_own_source(meta, theirs)  # the input's source replaces it: kept in meta, as from Parquet
        # every key the sample's json has, null or not: a shard's samples all have its columns, so every batch
        # read from it has the same columns
        extra = {c: record[c] for c in OPTIONAL_COLUMNS if c in record}
        if wrong := _not_winnows({c: v for c, v in extra.items() if v is not None}):
            buf.reject("read:bad_schema", id_=id_, source=source, raw=text, where={**where, "error": wrong})
            return
    else:
        if cfg.source_field is None and record.get("source") == source:
            record.pop("source")
        meta = decode_meta(record)
    buf.add(id_, source, text, meta, extra)


def _member_value(data: bytes) -> str | dict:
    """A member's bytes as meta holds them: its text, or ``{"base64": ...}`` when it is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def _members_json(parts: dict[str, bytes]) -> str:
    """Every member of a sample as one JSON object, by extension."""
    return json.dumps({ext: _member_value(data) for ext, data in parts.items()}, ensure_ascii=False)


def _winnows_meta(record: dict) -> str | None | bool:
    """The ``meta`` (a JSON object's text, or None) of a sample's json as winnow writes its shards, or False when the
    json is not one: a ``meta`` that is null or a JSON object (or its text), a ``source`` that is a string, and
    no other keys than winnow's columns, or those and a ``split`` winnow writes (a job's kept fields and added
    columns come back in meta then). Another tool's json with a ``meta`` key is a plain sample: all of it in meta."""
    if "meta" not in record or not isinstance(record.get("source", ""), str):
        return False
    meta = record["meta"]
    if isinstance(meta, str):
        try:
            found = loads_exact(meta.encode())
        except (orjson.JSONDecodeError, json.JSONDecodeError):
            return False
        if not isinstance(found, dict):
            return False
    elif isinstance(meta, dict):
        meta = decode_meta(meta)
    elif meta is not None:
        return False
    if set(record) <= {"meta", "source", *OPTIONAL_COLUMNS} or record.get("split") in SPLITS:
        return meta
    return False


def _not_winnows(extra: dict) -> str | None:
    """Why a shard's own column holds a value winnow never writes there (a split '../x', a text quality), or None."""
    for name, value in extra.items():
        dtype = OPTIONAL_COLUMNS[name]
        if name == "split" and value not in SPLITS:
            return f"json field {name!r} holds {value!r}; allowed: 'train' or 'val'"
        if dtype == pl.String and not isinstance(value, str):
            return f"json field {name!r} holds {value!r}; allowed: a string"
        if dtype.is_integer() and (isinstance(value, bool) or not isinstance(value, int)):
            return f"json field {name!r} holds {value!r}; allowed: an integer"
        if dtype.is_float() and (isinstance(value, bool) or not isinstance(value, int | float)):
            return f"json field {name!r} holds {value!r}; allowed: a number"
    return None
