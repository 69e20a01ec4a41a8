"""Per-source shard sets: a curated job's train shards split once into one shard set per source.

Every variant of a study mixes these sets at load time by token weight
(``train.data.mix_weights``), so nothing is re-curated and the curriculum order is kept.
A set is reused while the job's manifest is unchanged (its sha256 is recorded in the set's own
``manifest.json``, which is written last and atomically: it is the set's completion marker).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
from pathlib import Path

import polars as pl

from winnow.curate.atomic import write_bytes_atomic
from winnow.curate.errors import ConfigError
from winnow.curate.writers.layout import shard_dir
from winnow.curate.writers.tokens import TOKENIZER_FILE, subset_token_shard
from winnow.pipelines.ablate.layout import source_folder, write_atomic
from winnow.pipelines.provenance import manifest_sha256
from winnow.train.data.shards import job_manifest
from winnow.train.errors import ShardError
from winnow.train.paths import inside

log = logging.getLogger(__name__)

#: the shard formats a per-source set is made of (WebDataset tars are not read by training)
VIEW_FORMATS = ("parquet", "tokens")


def split_by_source(job_dir: str, out: Path) -> tuple[dict[str, str], dict[str, float]]:
    """One train shard set per source from the job's train shards; returns folders and shares.

    Each set holds the formats the job has (Parquet, tokens or both), each shard the source's rows
    of the job's shard of the same name in the same order. Shares are the sources' tokens where the job has
    token shards (the curated mix as the trainer reads it, whatever the tokenizer), else their bytes of text. A source with no train rows gets no folder
    and no share; the study's plan refuses variants that need it.
    """
    if not (Path(job_dir) / "manifest.json").is_file():
        raise ConfigError(
            f"{job_dir}/manifest.json does not exist: re-mixing by source (a study, [train.mixing] adaptive, or "
            "per-source weights in train.shards) needs a job folder `winnow curate` wrote, and never re-curates; "
            "curate the job first (`winnow curate JOB.toml` or `winnow run JOB.toml`)"
        )
    manifest = job_manifest(job_dir)
    entries = [e for e in manifest["shards"] if e.get("split") == "train" and e.get("format") in VIEW_FORMATS]
    if not entries:
        raise ConfigError(
            f"{job_dir}/manifest.json lists no Parquet or token train shards; [output] formats must "
            "include 'parquet' or 'tokens'"
        )
    outside = next((e.get("path") for e in entries if not inside(e.get("path"))), None)
    if outside is not None:  # token shards too: a view copies their rows, from wherever the path points
        raise ShardError(f"{job_dir}/manifest.json lists the shard path {outside!r}, which leaves the job folder")
    formats = sorted({e["format"] for e in entries})
    digest = manifest_sha256(job_dir)
    folders, sizes = {}, {}
    for source in manifest["sources"]:
        folder = source_folder(out, source)
        view = _reusable_view(folder, digest, formats)
        if view is None:
            view = _write_view(job_dir, manifest, entries, source, folder, digest)
        if view is None:
            log.warning("source %s has no train rows in %s", source, job_dir)
            continue
        folders[source] = str(folder)
        sizes[source] = view["tokens_of_source"] if "tokens" in formats else view["bytes_of_text"]
    total = sum(sizes.values())
    return folders, {s: b / total for s, b in sizes.items()}


def _verified(job_dir: str, entry: dict) -> bytes:
    """A job's Parquet shard, checked against its manifest entry (its place, size and sha256), as the loader checks
    the shards it reads: a view gets checksums of its own, so a shard missing, cut short or replaced is refused here,
    naming it, or it is trained on without a word."""
    where = f"{job_dir}/manifest.json"
    path = Path(job_dir) / entry["path"]  # inside the job folder: split_by_source checked every entry
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ShardError(
            f"{path} is not there, though {where} lists it: copy the folder whole again, or curate the job again"
        ) from None
    size, digest = entry.get("bytes"), entry.get("sha256")
    if (size is not None and len(data) != size) or (digest is not None and hashlib.sha256(data).hexdigest() != digest):
        raise ShardError(
            f"{path}: {len(data)} bytes that are not the shard {where} lists ({size} bytes, its sha256) (cut short "
            "or replaced): copy the folder whole again, or curate the job again"
        )
    return data


def _reusable_view(folder: Path, digest: str, formats: list[str]) -> dict | None:
    """The source's view made earlier for the same job manifest and formats, or None (made again: it is winnow's)."""
    path = folder / "manifest.json"
    if not path.is_file():
        return None
    try:
        view = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        log.warning("%s cannot be read (%s): making the view of its source again", path, err)
        return None
    if not isinstance(view, dict) or not isinstance(view.get("derived_from"), dict):
        log.warning("%s is not a view's manifest: making the view of its source again", path)
        return None
    same = view["derived_from"].get("manifest_sha256") == digest
    return view if same and view.get("formats", ["parquet"]) == formats else None


def _write_view(
    job_dir: str, manifest: dict, entries: list[dict], source: str, folder: Path, digest: str
) -> dict | None:
    """The view of one source: per job shard (by name, in manifest order) its rows of ``source`` in every format."""
    stems = list(dict.fromkeys(_stem(e["path"]) for e in entries))
    shards, text_bytes, n_tokens = [], 0, 0
    for entry in entries:
        if not (entry.get("sources") or {}).get(source, 1):
            continue
        name = f"part-{stems.index(_stem(entry['path'])):05d}"
        if entry["format"] == "tokens":
            path = (shard_dir(folder, "tokens", "train") / f"{name}.bin").relative_to(folder).as_posix()
            written = subset_token_shard(Path(job_dir), entry, source, folder, path)
            if written is not None:
                shards.append(written)
                n_tokens += written["tokens"]
            continue
        rows = pl.read_parquet(io.BytesIO(_verified(job_dir, entry))).filter(pl.col("source") == source)
        if rows.is_empty():
            continue
        path = (shard_dir(folder, "parquet", "train") / f"{name}.parquet").relative_to(folder).as_posix()
        buffer = io.BytesIO()
        rows.write_parquet(buffer)
        data = buffer.getvalue()
        # renamed into place whole: every rank of a distributed run splits the same job, and a reader (or the
        # checksum) must never see another rank's half-written file
        write_bytes_atomic(folder / path, data)
        shards.append(
            {
                "split": "train",
                "format": "parquet",
                "path": path,
                "rows": rows.height,
                "sha256": hashlib.sha256(data).hexdigest(),
                "sources": {source: rows.height},
            }
        )
        text_bytes += int(rows.get_column("text").str.len_bytes().sum())
    if not shards:
        return None
    tokenizer = _tokenizer_file(job_dir, entries)
    if tokenizer is not None:  # a tokenizer.json beside the token shards, as in the job folder
        write_atomic(shard_dir(folder, "tokens", "train").parent / tokenizer.name, tokenizer.read_text())
    view = {
        "format_version": 1,
        "job": f"{manifest.get('job')}:{source}",
        "sources": [source],
        "shards": shards,
        "formats": sorted({e["format"] for e in entries}),
        "bytes_of_text": text_bytes,
        "tokens_of_source": n_tokens,
        "derived_from": {"path": str(job_dir), "manifest_sha256": digest},
    }
    write_atomic(folder / "manifest.json", json.dumps(view, indent=1))
    return view


def _stem(path: str) -> str:
    return path.rsplit("/", 1)[-1].split(".", 1)[0]


def _tokenizer_file(job_dir: str, entries: list[dict]) -> Path | None:
    tokens = [e for e in entries if e["format"] == "tokens"]
    if not tokens:
        return None
    path = Path(job_dir) / tokens[0]["path"].rsplit("/", 2)[0] / TOKENIZER_FILE
    return path if path.is_file() else None
