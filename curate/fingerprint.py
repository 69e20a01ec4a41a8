"""Input fingerprints: a resumed job notices an input that changed since its finished work was done.

Each read task's fingerprint covers its files' URLs, sizes, modification times, a SHA-256 of
their first and last 64 KiB, and what the storage says of the file's identity: a local file's
inode and change time (``st_ctime``, which any write moves and ``os.utime`` cannot set back), an
object's ETag, generation or version. Where the storage gives no identity, a SHA-256 of 16 blocks
of 4 KiB spread between the head and the tail stands in. So an edit is noticed even when it keeps
the size and the mtime: locally always (any rewrite counts, even of the same bytes), on a store
whenever it keeps an ETag (S3, GCS, Azure all do), and elsewhere when it touches a sampled block.
``_work/inputs.json`` keeps them from the run that started the work folder. On resume,
a task whose fingerprint differs — or that no longer exists, because a glob now matches
other files — is stale. Only phase 0 reads inputs; every later phase and the ordered and
validation writes depend on the global plans, which depend on every task of phase 0. So
exactly the stale phase-0 tasks (with their rejects and, in a one-phase job, their shards)
and everything after phase 0 are redone; the other phase-0 tasks are kept.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
from pathlib import Path
from typing import Any

import fsspec

from winnow.curate.atomic import write_json_atomic
from winnow.curate.readers import ReadTask
from winnow.curate.readers.files import filesystem
from winnow.curate.stages.ids import EXACT_MARKER
from winnow.curate.workdir import WorkDir

log = logging.getLogger(__name__)

BLOCK = 64 << 10
SAMPLES, SAMPLE = 16, 4 << 10  # blocks hashed between the head and the tail
_IDENTITY = ("ETag", "etag", "md5Hash", "generation", "VersionId", "version_id", "content_md5")  # fsspec info keys


def file_fingerprint(url: str, size: int, mtime: float | None, storage_options: dict) -> dict[str, Any]:
    """Size, mtime, identity and a hash of the first and last ``BLOCK`` bytes of one input file (and of sampled
    blocks between them where the storage gives no identity)."""
    digest, blocks = hashlib.sha256(), hashlib.sha256()
    identity = _identity(url, storage_options)
    try:
        fs, path = filesystem(url, storage_options)  # a local name holding '::' is that file, not a chained URL
        with fs.open(path, "rb") as fh:
            digest.update(fh.read(BLOCK))
            if size > 2 * BLOCK:
                samples = 0 if identity else SAMPLES
                for i in range(1, samples + 1):  # evenly spaced between the head and the tail
                    fh.seek(BLOCK + (size - 2 * BLOCK - SAMPLE) * i // (SAMPLES + 1))
                    blocks.update(fh.read(SAMPLE))
                fh.seek(size - BLOCK)
            digest.update(fh.read(BLOCK))
    except IsADirectoryError:
        pass  # a saved HF dataset is a folder: its size and mtime speak for it
    except OSError as err:  # unreadable: the read task reports it (or skips it, with on_error = "skip")
        digest.update(f"unreadable: {err}".encode())
    return {
        "url": url,
        "size": size,
        "mtime": mtime,
        "head_tail_sha256": digest.hexdigest()[:32],
        "blocks_sha256": blocks.hexdigest()[:32],
        "identity": identity,
    }


def _identity(url: str, storage_options: dict) -> dict[str, Any]:
    """What changes whenever the file's bytes are rewritten: a local inode and change time, an object's ETag."""
    try:
        if "://" not in url or url.startswith("file://"):
            st = os.stat(url.removeprefix("file://"))
            return {"dev": st.st_dev, "ino": st.st_ino, "ctime_ns": st.st_ctime_ns}
        fs, path = fsspec.core.url_to_fs(url, **storage_options)
        info = fs.info(path)
    except OSError:
        return {}
    return {k: str(info[k]) for k in _IDENTITY if info.get(k) is not None}


def task_fingerprints(tasks: list[ReadTask], storage_options: list[dict]) -> list[list[dict[str, Any]]]:
    """Per read task, its files' fingerprints (``storage_options`` by input index), and its span of the file.

    A file split into several tasks is read (head and tail) once.
    """
    cache: dict[str, dict[str, Any]] = {}
    prints = []
    for t in tasks:
        files = []
        for f in t.files:
            if f.url not in cache:
                cache[f.url] = file_fingerprint(f.url, f.size, f.mtime, storage_options[t.input_index])
            files.append(cache[f.url] if t.span is None else {**cache[f.url], "span": str(t.span)})
        prints.append(files)
    return prints


def referenced_files(raw: Any) -> dict[str, str]:
    """The local files a job file's curation tables (``[job]``, ``[[stages]]``, ``[output]``) name (a tokenizer, a
    model, a word list), each with the sha256 of its bytes: a job that reads them curates again when one changes.
    The inputs' own files are the read tasks' fingerprints; ``[train]`` is not curation's."""
    found: dict[str, str] = {}

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)
        elif isinstance(value, str) and "://" not in value and len(value) < 4096 and value not in found:
            try:
                if os.path.isfile(value):
                    digest = hashlib.sha256()
                    with open(value, "rb") as f:
                        while chunk := f.read(1 << 20):
                            digest.update(chunk)
                    found[value] = digest.hexdigest()
            except (OSError, ValueError):  # not a path this process can read: a name, a pattern
                pass

    walk([raw.get(table) for table in ("job", "stages", "output")] if isinstance(raw, dict) else raw)
    return dict(sorted(found.items()))


def inputs_digest(prints: list[list[dict[str, Any]]]) -> str:
    """One sha256 of every read task's fingerprints (the manifest's ``inputs_fingerprint``)."""
    return hashlib.sha256(json.dumps(prints, sort_keys=True).encode()).hexdigest()


def record_inputs(work: WorkDir, prints: list[list[dict[str, Any]]]) -> None:
    """Keep the fingerprints the work folder's tasks are computed from."""
    write_json_atomic(inputs_file(work), prints, indent=None)
    work.publish_file(inputs_file(work))


def inputs_file(work: WorkDir) -> Path:
    return work.root / "inputs.json"


def stale_tasks(work: WorkDir, prints: list[list[dict[str, Any]]]) -> tuple[set[int], list[str]]:
    """Read tasks whose inputs differ from those the work folder was started with, and what changed."""
    path = inputs_file(work)
    if not path.exists():  # a work folder from before fingerprints: nothing to compare, trust nothing
        return set(range(len(prints))), [f"{path} is missing (a work folder from an older winnow)"]
    old = json.loads(path.read_text())
    stale, changes = set(), []
    for i in range(max(len(old), len(prints))):
        before = old[i] if i < len(old) else None
        now = prints[i] if i < len(prints) else None
        if before == now:
            continue
        stale.add(i)
        changes.append(_describe(before, now))
    return stale, changes


def changed_local_inputs(prints: list[list[dict[str, Any]]]) -> list[str]:
    """The local input files whose size or identity (inode, change time: any write moves it) is not what
    ``prints`` recorded: one ``stat`` each, no read. Files on a store are not asked again (a request each)."""
    changed, seen = [], set()
    for files in prints:
        for f in files:
            url = f["url"]
            if url in seen or ("://" in url and not url.startswith("file://")):
                continue
            seen.add(url)
            path = url.removeprefix("file://")
            try:
                st = os.stat(path)
                # a saved Hugging Face dataset is a folder: its size is its files' (as the read tasks counted it)
                size = _folder_bytes(path) if stat.S_ISDIR(st.st_mode) else st.st_size
            except OSError as err:
                changed.append(f"input {url} is gone ({err.strerror})")
                continue
            if size != f["size"] or f["identity"] and st.st_ctime_ns != f["identity"].get("ctime_ns"):
                changed.append(f"input {url} changed (size {f['size']} -> {size}, or rewritten)")
    return changed


def _folder_bytes(path: str) -> int:
    """The bytes of the files under a local folder, as ``readers.files`` sizes one (``fsspec``'s ``du``)."""
    return sum(fsspec.filesystem("file").du(path, total=False).values())


def _describe(before: list[dict] | None, now: list[dict] | None) -> str:
    if before is None:
        return f"new input task {now[0]['url']}"
    if now is None:
        return f"input {before[0]['url']} is no longer listed"
    for b, n in zip(before, now):
        if b["url"] != n["url"]:
            return f"input files changed: {b['url']} is now {n['url']}"
        if b != n:
            what = [
                k for k in ("size", "mtime", "head_tail_sha256", "blocks_sha256", "identity") if b.get(k) != n.get(k)
            ]
            return f"input {n['url']} changed ({', '.join(f'{k} {b.get(k)} -> {n.get(k)}' for k in what)})"
    return f"input files of {now[0]['url']} changed in number ({len(before)} -> {len(now)})"


def invalidate(out: Path, work: WorkDir, stale: set[int], *, n_tasks: int, single_phase: bool) -> None:
    """Remove what depends on the stale read tasks: their phase-0 work, and everything after phase 0.

    A phase-0 task whose spill was released (``WorkDir.release``) is redone as well: its rows are gone.

    Kept: the other phase-0 task folders and the files they list (their rejects; in a one-phase
    job their shards too). Everything else the job wrote is removed, so it is rewritten. Works
    through ``work`` on a local folder and on a store alike (there, an unmarked task folder goes too).
    """
    keep: set[Path] = set()
    phase0 = work.phase(0)
    for name in work.listdir(phase0):
        folder = phase0 / name
        if not name.startswith("task-"):  # a crashed attempt's .task-N.tmp
            work.remove(folder)
            continue
        task = int(name.split("-")[1])
        if task in stale or task >= n_tasks or not work.task_done(0, task) or work.released(0, task):
            work.remove(folder)
            continue
        stats = json.loads(work.read_text(folder / "stats.json"))
        keep.update(out / r["path"] for r in stats["rejects"])
        if single_phase:
            keep.update(out / s["path"] for s in stats["shards"])
    for name in work.listdir(work.root):
        if name not in ("phase-0", "fingerprint", inputs_file(work).name, EXACT_MARKER):
            work.remove(work.root / name)
    for folder in ("shards", "rejects", "artifacts"):
        for path in work.files(out / folder):
            if path not in keep:
                work.remove(path)
    work.remove(out / "manifest.json")
