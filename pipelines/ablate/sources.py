"""Per-source shard sets: a curated job's train shards split once into one shard set per source.

Every variant of a study mixes these sets at load time by token weight
(``train.data.mix_weights``), so nothing is re-curated and the curriculum order is kept.
A set is reused while the job's manifest is unchanged (its sha256 is recorded in the set's own
``manifest.json``, which is written last and atomically: it is the set's completion marker).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import polars as pl

from curate.errors import ConfigError
from curate.writers.layout import shard_dir
from pipelines.ablate.layout import write_atomic
from pipelines.provenance import manifest_sha256

log = logging.getLogger(__name__)


def split_by_source(job_dir: str, out: Path) -> tuple[dict[str, str], dict[str, float]]:
    """One train shard set per source from the job's Parquet train shards; returns folders and byte shares.

    A source with no train rows gets no folder and no share; the study's plan refuses variants
    that need it.
    """
    if not (Path(job_dir) / "manifest.json").is_file():
        raise ConfigError(f"{job_dir}/manifest.json does not exist: curate the job first (`winnow curate JOB.toml` "
                          "or `winnow run JOB.toml`); an ablation re-mixes curated shards and never re-curates")
    manifest = json.loads((Path(job_dir) / "manifest.json").read_text())
    entries = [e for e in manifest["shards"] if e.get("split") == "train" and e.get("format") == "parquet"]
    if not entries:
        raise ConfigError(f"{job_dir}/manifest.json lists no Parquet train shards; [output] formats must include 'parquet'")
    digest = manifest_sha256(job_dir)
    folders, sizes = {}, {}
    for source in manifest["sources"]:
        folder = out / source
        view = _reusable_view(folder, digest)
        if view is None:
            view = _write_view(job_dir, manifest, entries, source, folder, digest)
        if view is None:
            log.warning("source %s has no train rows in %s", source, job_dir)
            continue
        folders[source], sizes[source] = str(folder), view["bytes_of_text"]
    total = sum(sizes.values())
    return folders, {s: b / total for s, b in sizes.items()}


def _reusable_view(folder: Path, digest: str) -> dict | None:
    path = folder / "manifest.json"
    if not path.is_file():
        return None
    view = json.loads(path.read_text())
    return view if view.get("derived_from", {}).get("manifest_sha256") == digest else None


def _write_view(job_dir: str, manifest: dict, entries: list[dict], source: str, folder: Path,
                digest: str) -> dict | None:
    shards, text_bytes = [], 0
    out = shard_dir(folder, "parquet", "train")  # the job folders' own layout
    out.mkdir(parents=True, exist_ok=True)
    for i, entry in enumerate(entries):
        if not (entry.get("sources") or {}).get(source, 1):
            continue
        rows = pl.read_parquet(Path(job_dir) / entry["path"]).filter(pl.col("source") == source)
        if rows.is_empty():
            continue
        path = (out / f"part-{i:05d}.parquet").relative_to(folder).as_posix()
        rows.write_parquet(folder / path)
        data = (folder / path).read_bytes()
        shards.append({"split": "train", "format": "parquet", "path": path, "rows": rows.height,
                       "sha256": hashlib.sha256(data).hexdigest(), "sources": {source: rows.height}})
        text_bytes += int(rows.get_column("text").str.len_bytes().sum())
    if not shards:
        return None
    view = {"format_version": 1, "job": f"{manifest.get('job')}:{source}", "sources": [source], "shards": shards,
            "bytes_of_text": text_bytes, "derived_from": {"path": str(job_dir), "manifest_sha256": digest}}
    write_atomic(folder / "manifest.json", json.dumps(view, indent=1))
    return view
