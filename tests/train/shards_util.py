"""Tiny job folders in the shard format of DESIGN.md, written with pyarrow and tarfile.

The loader tests build their inputs here so they do not depend on curate's writers.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def make_docs(n: int, sources: tuple[str, ...] = ("web", "code", "books"), *, prefix: str = "") -> list[dict]:
    """``n`` rows whose text names their source and id, of varied lengths (some empty-ish, some long)."""
    rows = []
    for i in range(n):
        source = sources[i % len(sources)]
        body = "é" * (i % 3) + "x" * ((i * 37) % 90)
        rows.append({"id": f"{prefix}{source}/{i}", "source": source, "text": f"<{source}:{i}>{body}", "meta": None})
    return rows


def _tar_bytes(rows: list[dict]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for row in rows:
            key = row["id"].replace("%", "%25").replace("/", "%2F").replace(".", "%2E").replace("~", "%7E")
            other = {k: v for k, v in row.items() if k != "text"}
            for ext, data in (("txt", row["text"].encode()), ("json", json.dumps(other).encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write_job(
    folder: Path,
    shards: list[list[dict]],
    *,
    split: str = "train",
    val: list[list[dict]] | None = None,
    sources: list[str] | None = None,
) -> Path:
    """Write ``shards`` (lists of rows) as Parquet and tar shards plus ``manifest.json``; returns ``folder``."""
    folder = Path(folder)
    entries = []
    for split_name, groups in ((split, shards), ("val", val or [])):
        out = folder / "shards" / split_name
        out.mkdir(parents=True, exist_ok=True)
        for i, rows in enumerate(groups):
            table = pa.table(
                {c: pa.array([r.get(c) for r in rows], pa.string()) for c in ("id", "source", "text", "meta")}
            )
            base = f"part-00000-{i:05d}"
            sink = io.BytesIO()
            pq.write_table(table, sink)
            for fmt, ext, data in (("parquet", "parquet", sink.getvalue()), ("webdataset", "tar", _tar_bytes(rows))):
                (out / f"{base}.{ext}").write_bytes(data)
                counts: dict[str, int] = {}
                for r in rows:
                    counts[r["source"]] = counts.get(r["source"], 0) + 1
                entries.append(
                    {
                        "split": split_name,
                        "format": fmt,
                        "path": f"shards/{split_name}/{base}.{ext}",
                        "rows": len(rows),
                        "bytes": len(data),
                        "sha256": hashlib.sha256(data).hexdigest(),
                        "sources": counts,
                        "means": {},
                    }
                )
    all_sources = sources if sources is not None else sorted({r["source"] for g in shards for r in g})
    manifest = {"format_version": 1, "job": folder.name, "sources": all_sources, "shards": entries, "stages": []}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return folder


def write_token_job(
    folder: Path,
    shards: list[list[dict]],
    *,
    val: list[list[dict]] | None = None,
    tokenizer: str = "byte",
    eos_token: str | None = None,
    formats: tuple[str, ...] = ("parquet", "tokens"),
    sources: list[str] | None = None,
) -> Path:
    """``write_job``'s shards written by curation's own writer as Parquet plus token shards (``.bin``/``.idx``),
    or in ``formats``."""
    import polars as pl

    from winnow.curate.config import OutputConfig, TokensConfig
    from winnow.curate.writers.shards import ShardWriter

    folder = Path(folder)
    output = OutputConfig(formats=list(formats), tokens=TokensConfig(tokenizer=tokenizer, eos_token=eos_token))
    entries = []
    for split, groups in (("train", shards), ("val", val or [])):
        for i, rows in enumerate(groups):
            writer = ShardWriter(folder, f"part-{i:05d}", output, split=split)
            writer.write(pl.DataFrame(rows, schema=dict.fromkeys(("id", "source", "text", "meta"), pl.String)))
            entries += [{**e, "path": str(Path(e["path"]).relative_to(folder))} for e in writer.close()]
    sources = sources if sources is not None else sorted({r["source"] for g in shards for r in g})
    manifest = {"format_version": 1, "job": folder.name, "sources": sources, "shards": entries, "stages": []}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return folder
