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
import posixpath
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from winnow.train.data.foreign import folder_view, view_fingerprint
from winnow.train.data.tarshard import read_tar
from winnow.train.errors import NoShardsError, ShardError
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


def manifest_sources(manifest: dict) -> list[str]:
    """The manifest's ``sources``; without that key, the sources its shard entries count, in order of appearance."""
    listed = manifest.get("sources")
    if listed:
        return list(listed)
    found: dict[str, None] = {}
    for entry in manifest.get("shards") or []:
        for name in entry.get("sources") or ([entry["source"]] if entry.get("source") else []):
            found.setdefault(name, None)
    return list(found)


def split_rows(manifest: dict, split: str) -> dict[str, int]:
    """Rows per source in the ``split`` shards of a manifest (the first format listed for it: each format holds the
    same rows)."""
    entries = [e for e in manifest.get("shards") or [] if isinstance(e, dict) and e.get("split") == split]
    rows: dict[str, int] = {}
    for entry in (e for e in entries if e.get("format") == entries[0].get("format")):
        for source, n in (entry.get("sources") or {}).items():
            rows[source] = rows.get(source, 0) + n
    return rows


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
    _check_entries(manifest, where)
    return manifest


def job_manifest(job_dir: str | Path) -> dict:
    """A local job folder's ``manifest.json``, checked as training reads it (``read_manifest_file``), with its
    ``shards`` and ``sources`` filled in where a manifest lacks them (``manifest_sources``)."""
    manifest = read_manifest_file(fsspec.filesystem("file"), str(job_dir), str(job_dir))
    manifest.setdefault("shards", [])
    manifest["sources"] = manifest_sources(manifest)
    return manifest


#: The types of the manifest keys training reads: the job's, and each shard entry's.
_MANIFEST_TYPES: dict[str, type | tuple[type, ...]] = {"shards": list, "sources": list}
_ENTRY_TYPES: dict[str, type | tuple[type, ...]] = {
    "path": str,
    "format": str,
    "split": str,
    "rows": int,
    "bytes": int,
    "sha256": str,
    "source": str,
    "sources": (dict, list),
    "tokens": int,
    "dtype": str,
    "tokenizer": dict,
    "source_names": list,
    "max_id": int,
    "index_bytes": int,
    "docs_bytes": int,
}
_JSON_NAMES = {str: "string", int: "integer", dict: "object", list: "list"}
_TOKEN_KEYS = ("rows", "tokens", "dtype")  # what a token shard cannot be read without


def _check_entries(manifest: dict, where: str) -> None:
    """A ShardError naming the key of the first entry whose type is not what winnow writes (a hand-edited manifest)."""

    def wrong(key: str, value: Any, kind: type | tuple[type, ...], at: str) -> ShardError:
        names = " or ".join(_JSON_NAMES[k] for k in (kind if isinstance(kind, tuple) else (kind,)))
        return ShardError(
            f"{where}: {at}{key} = {value!r} is not a JSON {names}; the manifest is damaged or not winnow's: "
            "curate the job again, or correct it"
        )

    for key, kind in _MANIFEST_TYPES.items():
        if key in manifest and not isinstance(manifest[key], kind):
            raise wrong(key, manifest[key], kind, "")
    for i, entry in enumerate(manifest.get("shards") or []):
        at = f"shards[{i}]."
        if not isinstance(entry, dict):
            raise ShardError(
                f"{where}: shards[{i}] = {entry!r} is not an object; the manifest is damaged or not winnow's"
            )
        required = ("path", *(_TOKEN_KEYS if entry.get("format") == "tokens" else ()))
        absent = [k for k in required if k not in entry]
        if absent:
            raise ShardError(f"{where}: {at}{absent[0]} is missing; the manifest is damaged or not winnow's")
        for key, kind in _ENTRY_TYPES.items():
            value = entry.get(key)
            if value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
                raise wrong(key, value, kind, at)


def shard_digest(entries: list[dict]) -> str:
    """The fingerprint of the shards a manifest lists (each entry's path, rows and sha256, in order)."""
    return hashlib.sha256(orjson.dumps([[e["path"], e.get("rows"), e.get("sha256")] for e in entries])).hexdigest()[:16]


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
    chosen = [e for e in entries if e.get("split", "train") == split and e.get("format") == _FORMATS[fmt]]
    shards = [
        ShardInfo(
            path=e["path"], rows=e.get("rows"), sha256=e.get("sha256"), source=e.get("source"), bytes=e.get("bytes")
        )
        for e in chosen
    ]
    if not shards:
        raise NoShardsError(f"{where}: manifest lists no {fmt!r} shards for split {split!r}")
    twice = listed_twice(s.path for s in shards)
    if twice is not None:  # a run would read it once per listing: other data than the job curated
        raise ShardError(
            f"{where} lists the shard {twice} twice; a job's manifest names each shard once (this one is damaged "
            "or edited by hand): curate the job again"
        )
    refuse_two_splits([e for e in entries if e.get("format") == _FORMATS[fmt]], where)
    if view is None:
        check_listed(
            fs,
            root,
            [s.path for s in shards],
            where,
            missing=missing,
            sizes={s.path: s.bytes for s in shards},
            remedy=remedy(manifest, data),
        )
    digest = view_fingerprint(view) if view else shard_digest(chosen)
    protocol = fs.protocol[0] if isinstance(fs.protocol, tuple) else fs.protocol
    prefix = "" if protocol in ("file", "local") else f"{protocol}://"
    return ShardSet(
        root=prefix + root,
        fs=fs,
        shards=shards,
        sources=manifest_sources(manifest),
        fingerprint=digest,
        storage_options=dict(storage_options or {}),
        view=view,
    )


def listed_twice(paths) -> str | None:
    """The first of a manifest's shard ``paths`` it lists twice, under one spelling or two (``train/a``,
    ``train/./a`` and ``train//a`` are one file), or None."""
    return next((p for p, n in Counter(posixpath.normpath(p) for p in paths).items() if n > 1), None)


def in_two_splits(entries: list[dict]) -> str | None:
    """The first shard path that a manifest's ``entries`` (of one format) list under two splits, or None: a run
    would train on the rows it measures as held out."""
    splits: dict[str, set] = {}
    for e in entries:
        splits.setdefault(posixpath.normpath(e["path"]), set()).add(e.get("split", "train"))
    return next((path for path, found in splits.items() if len(found) > 1), None)


def refuse_two_splits(entries: list[dict], where: str) -> None:
    twice = in_two_splits(entries)
    if twice is not None:
        raise ShardError(
            f"{where} lists the shard {twice} under two splits; its rows would be trained on and measured as held "
            "out (the manifest is damaged or edited by hand): curate the job again"
        )


def remedy(manifest: dict, data: str) -> str | None:
    """What to do about a damaged folder that a study made of one source (``pipelines.ablate.sources``: its manifest
    is ``derived_from`` the job's), or None for a job folder (copy it again, or curate the job again)."""
    derived = manifest.get("derived_from")
    if not isinstance(derived, dict):
        return None
    return f"remove {data} and run the study again (`winnow ablate`): it makes that folder again from {derived.get('path')}"


def check_listed(
    fs: fsspec.AbstractFileSystem,
    root: str,
    paths: list[str],
    where: str,
    *,
    missing: str = "raise",
    sizes: dict[str, Any] | None = None,
    remedy: str | None = None,
) -> None:
    """Every file a manifest lists is inside its folder, there, and of the size it gives (``sizes``, where the
    manifest records one), checked before the first batch (one listing per folder, also on an object store);
    a ShardError names the first ones that are not."""
    outside = [p for p in paths if not inside(p)]
    if outside:
        raise ShardError(
            f"{where} lists shard path(s) {outside[:3]} that leave the job folder; the manifest is "
            "damaged or not winnow's (shard paths are relative, inside the folder)"
        )
    present: dict[str, Any] = {}  # folder/name -> size
    for folder in sorted({p.rpartition("/")[0] for p in paths}):
        try:
            listed = fs.ls(f"{root}/{folder}".rstrip("/"), detail=True)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in listed:
            present[f"{folder}/{entry['name'].rstrip('/').rsplit('/', 1)[-1]}".lstrip("/")] = entry.get("size")
    absent = [p for p in paths if p.lstrip("/") not in present]
    wrong = [
        p
        for p in paths
        if p not in absent and isinstance((sizes or {}).get(p), int) and present[p.lstrip("/")] != sizes[p]
    ]
    messages = []
    if absent:
        more = f", and {len(absent) - 1} more of its files" if len(absent) > 1 else ""
        messages.append(
            f"shard {root}/{absent[0]}: missing (listed in {where} but not found{more}): the folder is "
            f"incomplete (copied in part, or files deleted); {remedy or 'copy it whole, or curate the job again'}"
        )
    if wrong:
        more = f", and {len(wrong) - 1} more of its files" if len(wrong) > 1 else ""
        messages.append(
            f"shard {root}/{wrong[0]}: {present[wrong[0].lstrip('/')]} bytes where {where} says {sizes[wrong[0]]}{more} "
            f"(cut short or replaced): {remedy or 'copy the folder whole again, or curate the job again'}"
        )
    for message in messages:
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


_SAID_EMPTY: set[str] = set()  # shards of folders without a manifest whose empty texts were said once


def _as_text(table: pa.Table, column: str, url: str) -> pa.Table:
    """``table`` with ``column`` as strings: dictionary-encoded (pandas' category, polars' Categorical), view and
    UTF-8 binary columns decoded, as curation reads them; another type, or bytes that are not UTF-8, a ShardError."""
    kind = table.schema.field(column).type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return table
    values = table.column(column)
    try:
        if pa.types.is_dictionary(kind):
            values = values.cast(kind.value_type)
            kind = kind.value_type
        if pa.types.is_string_view(kind) or pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
            values = values.cast(pa.large_string())  # checks the bytes are UTF-8
        elif not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise pa.ArrowInvalid(f"type {table.schema.field(column).type}")
    except pa.ArrowInvalid as err:
        raise ShardError(
            f"shard {url}: wrong columns: {column!r} has type {table.schema.field(column).type}, expected text "
            f"(a string, dictionary of strings or UTF-8 binary column): {err}"
        ) from err
    return table.set_column(table.schema.get_field_index(column), column, values)


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
        table = _as_text(table, c, url)
    if info.rows is not None and table.num_rows != info.rows:
        raise ShardError(
            f"shard {url}: has {table.num_rows} rows, the manifest says {info.rows} (truncated or replaced?)"
        )
    if shard_set.view is not None and url not in _SAID_EMPTY:  # winnow's own shards hold no row without text
        text = table.column("text")
        empty = text.null_count + int(pc.sum(pc.equal(pc.utf8_length(text), 0)).as_py() or 0)
        if empty:
            _SAID_EMPTY.add(url)
            log.warning(
                "shard %s: %d of %d rows have no text (null or empty); each is read as an empty document (an "
                "end-of-document token alone): curate the folder (winnow curate) to leave them out",
                url,
                empty,
                table.num_rows,
            )
    return table
