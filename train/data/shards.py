"""The shard format of DESIGN.md as the loader sees it: the manifest and one shard's rows.

``open_shards`` reads ``manifest.json`` of a job folder (a local path or any fsspec URL such
as ``s3://bucket/out/job``) and keeps the entries of one split and format, in manifest order:
that order is the curriculum and the loader never reorders across it. A folder without a
manifest is any folder of Parquet files with a ``text`` column: ``foreign.folder_view`` makes
the manifest-shaped view of it (and says so). ``read_shard`` fetches
one shard whole, checks its sha256 and row count against the manifest, checks the columns,
and returns an Arrow table; every failure is a ``ShardError`` naming the shard and the problem.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field

import fsspec
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from winnow.train.data.foreign import folder_view, view_fingerprint
from winnow.train.data.tarshard import read_tar
from winnow.train.errors import ShardError
from winnow.train.paths import JSON_BYTES, inside, read_capped

log = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("id", "source", "text")
SHARD_BYTES = 16 << 30  # a shard is read whole; one the manifest gives no size for may be at most this
MANIFEST = "manifest.json"
_FORMATS = {"parquet": "parquet", "webdataset": "webdataset"}


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """One manifest entry: where the shard is and what the manifest promises about it."""

    path: str  # relative to the job folder
    rows: int | None = None
    sha256: str | None = None
    source: str | None = None  # a viewed file without a ``source`` column: every row's source
    bytes: int | None = None


@dataclass(slots=True)
class ShardSet:
    """The shards of one split and format of a job folder, in read (curriculum) order."""

    root: str
    fs: fsspec.AbstractFileSystem
    shards: list[ShardInfo]
    sources: list[str] = field(default_factory=list)
    fingerprint: str = ""
    storage_options: dict = field(default_factory=dict)
    view: dict | None = None  # the view made of a folder without manifest.json (foreign.folder_view)

    def url(self, index: int) -> str:
        return f"{self.root}/{self.shards[index].path}"

    def reopen(self) -> None:
        """Replace the filesystem with a new one; a worker process must (async ones such as s3fs are not fork-safe)."""
        self.fs = fsspec.core.url_to_fs(self.root, **self.storage_options)[0]


def _manifest_sources(manifest: dict) -> list[str]:
    """The manifest's ``sources``; without that key, the sources its shard entries count, in order of appearance."""
    listed = manifest.get("sources")
    if listed:
        return list(listed)
    found: dict[str, None] = {}
    for entry in manifest.get("shards") or []:
        for name in entry.get("sources") or ([entry["source"]] if entry.get("source") else []):
            found.setdefault(name, None)
    return list(found)


def read_manifest_file(fs: fsspec.AbstractFileSystem, root: str, data: str) -> dict:
    """``<root>/manifest.json`` as a dict; ``ShardError`` naming it when it is not one (FileNotFoundError passes)."""
    where = f"{data}/{MANIFEST}"
    try:
        manifest = orjson.loads(
            read_capped(fs, f"{root}/{MANIFEST}", limit=JSON_BYTES, what="manifest", error=ShardError)
        )
    except orjson.JSONDecodeError as err:
        raise ShardError(f"{where}: manifest is not valid JSON: {err}") from err
    except NotADirectoryError as err:
        raise ShardError(
            f"{data} is a file; give the job folder (it holds manifest.json) or a folder of Parquet files"
        ) from err
    if not isinstance(manifest, dict):
        raise ShardError(f"{where}: manifest is not a JSON object; is it winnow's? curate the job again")
    return manifest


def open_shards(
    data: str, *, split: str, fmt: str, storage_options: dict | None = None, missing: str = "raise"
) -> ShardSet:
    """Read ``<data>/manifest.json`` and keep the ``split`` shards in format ``fmt``.

    A listed shard that is not there is a ShardError now (``missing = "warn"``: a warning, and the
    loader skips it when it comes, as ``skip_bad_shards`` asks), not when the loader reaches it.
    """
    fs, root = fsspec.core.url_to_fs(str(data), **(storage_options or {}))
    root = root.rstrip("/")
    where = f"{data}/{MANIFEST}"
    view = None
    try:
        manifest = read_manifest_file(fs, root, str(data))
    except FileNotFoundError:
        manifest = view = folder_view(fs, root, str(data), split=split, fmt=fmt)
    entries = manifest.get("shards")
    if not isinstance(entries, list):
        raise ShardError(f"{where}: manifest has no 'shards' list")
    shards = [
        ShardInfo(
            path=e["path"], rows=e.get("rows"), sha256=e.get("sha256"), source=e.get("source"), bytes=e.get("bytes")
        )
        for e in entries
        if e.get("split", "train") == split and e.get("format") == _FORMATS[fmt]
    ]
    if not shards:
        raise ShardError(f"{where}: manifest lists no {fmt!r} shards for split {split!r}")
    if view is None:
        check_listed(fs, root, [s.path for s in shards], where, missing=missing)
    digest = (
        view_fingerprint(view)
        if view
        else hashlib.sha256(orjson.dumps([[s.path, s.rows, s.sha256] for s in shards])).hexdigest()[:16]
    )
    protocol = fs.protocol[0] if isinstance(fs.protocol, tuple) else fs.protocol
    prefix = "" if protocol in ("file", "local") else f"{protocol}://"
    return ShardSet(
        root=prefix + root,
        fs=fs,
        shards=shards,
        sources=_manifest_sources(manifest),
        fingerprint=digest,
        storage_options=dict(storage_options or {}),
        view=view,
    )


def check_listed(
    fs: fsspec.AbstractFileSystem, root: str, paths: list[str], where: str, *, missing: str = "raise"
) -> None:
    """Every file a manifest lists is inside its folder and there, checked before the first batch (one listing
    per folder, also on an object store); a ShardError names the first ones that are not."""
    outside = [p for p in paths if not inside(p)]
    if outside:
        raise ShardError(
            f"{where} lists shard path(s) {outside[:3]} that leave the job folder; the manifest is "
            "damaged or not winnow's (shard paths are relative, inside the folder)"
        )
    present: set[str] = set()
    for folder in sorted({p.rpartition("/")[0] for p in paths}):
        try:
            present.update(
                name.rstrip("/").rsplit("/", 1)[-1] for name in fs.ls(f"{root}/{folder}".rstrip("/"), detail=False)
            )
        except (FileNotFoundError, NotADirectoryError):
            pass
    absent = [p for p in paths if p.rsplit("/", 1)[-1] not in present]
    if absent:
        more = f", and {len(absent) - 1} more of its files" if len(absent) > 1 else ""
        message = (
            f"shard {root}/{absent[0]}: missing (listed in {where} but not found{more}): the folder is "
            "incomplete (copied in part, or files deleted); copy it whole, or curate the job again"
        )
        if missing != "warn":
            raise ShardError(message)
        log.warning("%s (skip_bad_shards: skipped when the loader reaches it)", message)


def cat_shard(fs, url: str, *, what: str = "shard", size: int | None = None) -> bytes:
    """The bytes of one file a manifest lists, or a ShardError naming it; never more than the manifest's ``size``
    (a shorter file goes on to the checks that say what is wrong with it)."""
    try:
        return read_capped(fs, url, limit=SHARD_BYTES if size is None else size, what=what, error=ShardError)
    except FileNotFoundError as err:
        raise ShardError(f"{what} {url}: missing (listed in the manifest but not found)") from err
    except OSError as err:
        raise ShardError(f"{what} {url}: cannot be read: {err}") from err


def read_shard(shard_set: ShardSet, index: int, *, fmt: str, verify: bool) -> pa.Table:
    """The rows of shard ``index`` (``id``, ``source``, ``text``, ...), checked against the manifest."""
    info, url = shard_set.shards[index], shard_set.url(index)
    buf = cat_shard(shard_set.fs, url, size=info.bytes)
    if verify and info.sha256:
        digest = hashlib.sha256(buf).hexdigest()
        if digest != info.sha256:
            raise ShardError(f"shard {url}: checksum mismatch: sha256 is {digest}, the manifest says {info.sha256}")
    if fmt == "parquet":
        try:
            # ParquetFile, not pq.read_table: the latter imports pyarrow.dataset (~1 s per fresh worker)
            table = pq.ParquetFile(pa.BufferReader(buf)).read()
        except (pa.ArrowException, OSError) as err:
            raise ShardError(f"shard {url}: not a readable Parquet file (truncated or corrupt?): {err}") from err
    else:
        table = read_tar(buf, f"shard {url}")
    if info.source is not None and "source" not in table.column_names:
        table = table.append_column("source", pa.repeat(pa.scalar(info.source, pa.string()), table.num_rows))
    required = REQUIRED_COLUMNS if shard_set.view is None else ("source", "text")  # foreign files need no id
    missing = [c for c in required if c not in table.column_names]
    if missing:
        raise ShardError(f"shard {url}: wrong columns: lacks {missing}; has {table.column_names}")
    for c in required:
        if not (pa.types.is_string(table.schema.field(c).type) or pa.types.is_large_string(table.schema.field(c).type)):
            raise ShardError(
                f"shard {url}: wrong columns: {c!r} has type {table.schema.field(c).type}, expected string"
            )
    if info.rows is not None and table.num_rows != info.rows:
        raise ShardError(
            f"shard {url}: has {table.num_rows} rows, the manifest says {info.rows} (truncated or replaced?)"
        )
    return table
