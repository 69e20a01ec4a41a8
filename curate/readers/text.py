"""Plain text files, one document per file."""

from __future__ import annotations

from collections.abc import Iterator

import orjson

from winnow.curate.config import InputConfig
from winnow.curate.readers.files import InputFile, open_binary
from winnow.curate.readers.jsonl import PREVIEW
from winnow.curate.readers.rows import ReadBatch, RowBuffer


def read_text_files(cfg: InputConfig, files: list[InputFile], batch_rows: int) -> Iterator[ReadBatch]:
    """Yield batches of documents, one per file; a file that is not UTF-8 becomes a reject."""
    buf = RowBuffer()
    source = cfg.source or ""
    for file in files:
        id_ = f"{source}/{file.rel}"
        try:
            with open_binary(file.url, cfg.storage_options) as fh:
                raw = fh.read(cfg.max_record_bytes + 1)  # never more: a huge file (or a .gz bomb) is one reject
                size = len(raw) + (_skip(fh) if len(raw) > cfg.max_record_bytes else 0)
        except (OSError, EOFError) as err:  # a failed read, a damaged .gz: the document is incomplete
            buf.reject(
                "read:truncated",
                id_=id_,
                source=source,
                raw=b"",
                where={"file": file.url, "offset": 0, "error": f"{type(err).__name__}: {err}"},
            )
            continue
        if size > cfg.max_record_bytes:
            buf.reject(
                "read:too_long",
                id_=id_,
                source=source,
                raw=raw[:PREVIEW],
                where={
                    "file": file.url,
                    "offset": 0,
                    "bytes": size,
                    "error": f"a document of {size} bytes, over [[inputs]] max_record_bytes = "
                    f"{cfg.max_record_bytes}; raise it to read such documents",
                },
            )
            continue
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


def _skip(fh) -> int:
    """Read the rest of ``fh`` in bounded pieces, for its size only."""
    n = 0
    while piece := fh.read(1 << 20):
        n += len(piece)
    return n
