"""Provenance of a run folder: the job file, the data manifest's sha256, package versions and the git commit.

Every figure in a report comes from a run folder; ``provenance.json`` beside ``metrics.jsonl``
ties it to the exact job file, the exact curated data (the manifest lists every shard's
sha256, so its own hash pins all of them) and the code that produced it.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import fsspec
import orjson

from winnow.curate.atomic import write_json_atomic, write_text_atomic
from winnow.curate.errors import InputError
from winnow.curate.manifest import package_versions
from winnow.curate.wholefile import JOB_FILE_BYTES, MANIFEST_BYTES, read_whole

log = logging.getLogger(__name__)

FILE = "provenance.json"
_PACKAGES = (
    "torch",
    "numpy",
    "polars",
    "pyarrow",
    "numba",
    "datasketch",
    "webdataset",
    "tokenizers",
    "fsspec",
    "matplotlib",
)


def _manifest_bytes(data: str | Path) -> bytes:
    """The bytes of ``<data>/manifest.json`` (a job output folder, local or any fsspec URL)."""
    url = f"{str(data).rstrip('/')}/manifest.json"
    try:
        fs, path = fsspec.core.url_to_fs(url)
        exists = fs.exists(path)
    except (OSError, ValueError):
        exists = False
    if not exists:
        raise InputError(f"{url}: no data manifest to record; train on a job output folder written by `winnow curate`")
    return read_whole(url, limit=MANIFEST_BYTES, what="manifest")


def manifest_sha256(data: str | Path) -> str:
    """sha256 of ``<data>/manifest.json``."""
    return hashlib.sha256(_manifest_bytes(data)).hexdigest()


def shards_digest(data: str | Path, manifest: bytes | None = None) -> str:
    """The fingerprint of the shards ``<data>/manifest.json`` (or its bytes, ``manifest``) lists, every split and
    format (each one's path, rows and sha256): unlike the manifest's own sha256 it stays when the same job is
    curated again to the same shards."""
    from winnow.train.data.shards import shard_digest

    return shard_digest(orjson.loads(manifest if manifest is not None else _manifest_bytes(data)).get("shards") or [])


def _data_record(data: str | Path) -> dict[str, object]:
    """The data folder, its manifest's sha256 and its shards' fingerprint; a folder without a manifest was trained
    on through a view."""
    where = str(data) if "://" in str(data) else os.path.abspath(data)  # a report run elsewhere finds it
    try:
        raw = _manifest_bytes(data)  # read once for both
        return {
            "path": where,
            "manifest_sha256": hashlib.sha256(raw).hexdigest(),
            "shards": shards_digest(data, raw),
        }
    except InputError:
        return {"path": where, "manifest_sha256": None, "view": "data_view.json (no manifest.json in the folder)"}


def git_commit(where: str | Path | None = None) -> dict[str, object] | None:
    """The commit of the checkout holding this code (and whether it had local changes); None outside git."""
    cwd = Path(where) if where is not None else Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": bool(dirty)}


def provenance(*, job_file: str | Path | None, data: Sequence[str | Path], extra: dict | None = None) -> dict:
    """What ``write_provenance`` records, as a dict."""
    job = None
    if job_file is not None:
        path = Path(job_file)
        text = read_whole(str(path), limit=JOB_FILE_BYTES, what="job file").decode("utf-8", errors="replace")
        job = {"path": str(path.resolve()), "text": text}
    return {
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": sys.argv,
        "job_file": job,
        "data": [_data_record(d) for d in data],
        "packages": package_versions(_PACKAGES),
        "git": git_commit(),
        **(extra or {}),
    }


def write_provenance(
    run_dir: str | Path, *, job_file: str | Path | None, data: Sequence[str | Path], extra: dict | None = None
) -> Path:
    """Write ``<run_dir>/provenance.json`` (and a copy of the job file beside it); returns its path."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    record = provenance(job_file=job_file, data=data, extra=extra)
    if record["job_file"] is not None:
        write_text_atomic(run_dir / "job.toml", record["job_file"]["text"])
    target = run_dir / FILE
    write_json_atomic(target, record)
    log.info("provenance written to %s", target)
    return target
