"""Plain text files, one document per file."""

from __future__ import annotations

from collections.abc import Iterator

import orjson

from winnow.curate.config import InputConfig
from winnow.curate.errors import InputError
from winnow.curate.readers.files import InputFile, codec, file_kind, open_binary, refuse_compressed
from winnow.curate.readers.jsonl import BOM, PREVIEW, Truncated, decompressed_chunks
from winnow.curate.readers.rows import ReadBatch, RowBuffer, id_part
from winnow.curate.readers.utf8 import valid_utf8


def read_text_files(
    cfg: InputConfig, files: list[InputFile], batch_rows: int, skipped: list[dict] | None = None
) -> Iterator[ReadBatch]:
    """Yield batches of documents, one per file; a file that is not UTF-8 becomes a reject. A file that cannot be
    opened (a link to a folder, no permission) or is compressed under a plain name raises ``InputError``, or with
    ``skipped`` is listed there."""
    buf = RowBuffer()
    source = cfg.source or ""
    for file in files:
        id_ = f"{id_part(source)}/{file.rel}"
        try:
            with open_binary(file.url, cfg.storage_options, decompress=False) as fh:
                raw, size = _bounded(decompressed_chunks(file.url, fh), cfg.max_record_bytes)
            if codec(file.url) is None:  # a compressed file named as plain would be one reject of binary bytes
                refuse_compressed(raw[:16], file.url, cfg.label)
        except InputError as err:
            if skipped is None:
                raise
            skipped.append({"task": file.url, "error": str(err)})
            continue
        except (OSError, EOFError, Truncated) as err:  # a failed read, damaged or cut compression: incomplete
            buf.reject(
                "read:truncated",
                id_=id_,
                source=source,
                raw=b"",
                where={"file": file.url, "offset": 0, "error": f"{type(err).__name__}: {err}"},
            )
            continue
        other = file_kind(raw[:1024], raw[-4:])  # a folder of text files holds an image, a PDF, UTF-16 text...
        if other is not None and (b"\0" in raw or not valid_utf8(raw)):  # not a note that starts "%PDF-1.7 is..."
            error = f"{other[0]} (its first bytes say so), not UTF-8 text; {other[1]}"
            buf.reject("read:not_text", id_=id_, source=source, raw=raw[:PREVIEW], where=_at(file, error))
            continue
        if size > cfg.max_record_bytes:
            error = (
                f"a document of {size} bytes, over [[inputs]] max_record_bytes = {cfg.max_record_bytes}; raise it "
                "to read such documents"
            )
            buf.reject("read:too_long", id_=id_, source=source, raw=raw[:PREVIEW], where=_at(file, error, bytes=size))
            continue
        if raw.startswith(BOM):  # an encoding mark, not the document's text (JSONL's readers drop it too)
            raw, size = raw[len(BOM) :], size - len(BOM)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            buf.reject(
                "read:bad_utf8",
                id_=id_,
                source=source,
                raw=raw,
                where={"file": file.url, "offset": err.start, "error": str(err)},
            )
        else:
            buf.add(id_, source, text, orjson.dumps({"path": file.rel}).decode())
        if len(buf) >= batch_rows:
            yield buf.flush()
    if len(buf):
        yield buf.flush()


def _bounded(chunks: Iterator[bytes], limit: int) -> tuple[bytes, int]:
    """The first ``limit + 1`` bytes of the stream and its whole size, never holding more: a huge file (or a
    compression bomb) is one reject. The chunks are decompressed as JSONL's are (``decompressed_chunks``): every
    gzip member or zstd frame, and a damaged or cut stream raises ``Truncated``."""
    held, size = [], 0
    for chunk in chunks:
        if size <= limit:
            held.append(chunk[: limit + 1 - size])
        size += len(chunk)
    return b"".join(held), size


def _at(file: InputFile, error: str, **more) -> dict:
    """A whole file's reject's ``meta``: the file, offset 0, what else is known, and what went wrong."""
    return {"file": file.url, "offset": 0, **more, "error": error}
