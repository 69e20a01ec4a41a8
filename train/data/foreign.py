"""A view of a folder of Parquet files that no ``winnow curate`` wrote: shards without a manifest.

Any folder (local or fsspec URL) of Parquet files with a ``text`` column can be trained on; a
``source`` column, if there is one, gives the per-source accounting, otherwise every row belongs
to one source named after the folder. The split's files are found the way Hub datasets lay them
out, first match wins:

* a split folder: ``<root>/<split>/``, ``<root>/shards/parquet/<split>/`` (winnow's own layout)
  or ``<root>/shards/<split>/`` — for ``val`` also ``validation/``, ``valid/`` and ``dev/``;
* split-named files anywhere below the root: ``train-00000-of-00004.parquet``, ``val_0.parquet``;
* for ``train`` only: every ``*.parquet`` file below the root.

Files are read in natural path order (``part-2`` before ``part-10``). The view records each file's
row count (from its footer) and size; there is no checksum to verify. The source names are read
from the ``source`` column alone (Parquet reads one column without the rest), once, when the view
is made, because the trainer sizes its per-source tables before the first batch.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from winnow.train.errors import NoShardsError, ShardError
from winnow.train.runfolder import CURATED

log = logging.getLogger(__name__)

_VIEWS: dict[tuple, dict] = {}
_SAID: set[tuple] = set()  # the warnings of files passed over, said once per process
SPLIT_NAMES = {"train": ("train",), "val": ("val", "validation", "valid", "dev")}
_NEVER_TRAINED = ("test",)  # a test split is held back from everything: never a training file


def _natural(path: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", path)]


def find_split_files(fs: fsspec.AbstractFileSystem, root: str, split: str) -> list[str]:
    """Paths (relative to ``root``) of the split's Parquet files, in natural order; [] when none. Files the rule that
    chose them passed over, which a later rule would have taken, are named in a warning."""
    every = _parquet_files(fs, root)
    chosen, rule = _split_files(every, split)
    rest, passed_over = [p for p in every if p not in set(chosen)], []
    while chosen and (more := _split_files(rest, split)[0]):
        passed_over += more
        rest = [p for p in rest if p not in set(more)]
    passed_over = sorted(passed_over, key=_natural)
    if chosen and passed_over and (root, split, tuple(passed_over)) not in _SAID:
        _SAID.add((root, split, tuple(passed_over)))
        log.warning(
            "%s: split %r is read from %s (%d file(s)), the first of the layouts looked for; %d other Parquet "
            "file(s) a later layout would give it are not read (%s%s): move them there, or into a folder of their own",
            root, split, rule, len(chosen), len(passed_over), ", ".join(passed_over[:3]),
            ", ..." if len(passed_over) > 3 else "",
        )  # fmt: skip
    return chosen


def _split_files(every: list[str], split: str) -> tuple[list[str], str]:
    """The split's files among ``every`` by the first rule that finds any, and that rule in words."""
    names = SPLIT_NAMES.get(split, (split,))
    for name in names:
        for prefix in (f"{name}/", f"shards/parquet/{name}/", f"shards/{name}/"):
            found = [p for p in every if p.startswith(prefix)]
            if found:
                return found, prefix
    # train.parquet, validation-00000-of-00002.parquet, data/test_0.parquet: the split's name, then an end or a separator
    pattern = re.compile(rf"(^|/)({'|'.join(names)})([-_.][^/]*)?\.parquet$")
    named = [p for p in every if pattern.search(p)]
    if named or split != "train":
        return named, "the files named after it"
    others = {n for ns in SPLIT_NAMES.values() for n in ns} - set(names) | set(_NEVER_TRAINED)
    rest = [p for p in every if not any(re.search(rf"(^|/){o}(/|([-_.][^/]*)?\.parquet$)", p) for o in others)]
    return rest, "every Parquet file but other splits'"


def _parquet_files(fs: fsspec.AbstractFileSystem, root: str) -> list[str]:
    """Every ``*.parquet`` below ``root`` (relative, natural order), but temporary and work files (``.x``, ``_x``).

    On a local disk, linked folders are followed (fsspec's walk does not: their rows were left out without a
    word), a file reached twice through links is read once, with a warning, and anything but a regular file (a
    named pipe, which would block the read forever; a device) is refused naming it."""
    protocol = fs.protocol[0] if isinstance(fs.protocol, (tuple, list)) else fs.protocol
    if protocol not in ("file", "local"):
        every = [p[len(root) + 1 :] for p in fs.find(root) if p.endswith(".parquet")]
    else:
        every, seen = [], set()
        for folder, dirs, files in os.walk(root, followlinks=True):
            here = os.stat(folder)
            if (here.st_dev, here.st_ino) in seen:  # a link back up the tree: walked once
                dirs.clear()
                continue
            seen.add((here.st_dev, here.st_ino))
            every += [os.path.relpath(os.path.join(folder, f), root) for f in files if f.endswith(".parquet")]
    every = [p for p in every if not any(part.startswith((".", "_")) for part in p.split("/"))]
    every = sorted(every, key=_natural)
    if protocol not in ("file", "local"):
        return every
    files, first = [], {}
    for rel in every:
        try:
            st = os.stat(os.path.join(root, rel))
        except OSError as err:
            raise ShardError(f"{root}/{rel}: cannot read it ({err.strerror}); fix or remove the link") from err
        if not stat.S_ISREG(st.st_mode):
            raise ShardError(
                f"{root}/{rel}: not a regular file (a named pipe or a device, which a read would wait on forever); "
                "remove it from the folder"
            )
        if (st.st_dev, st.st_ino) in first:
            log.warning("%s/%s is %s again (through a link): read once", root, rel, first[st.st_dev, st.st_ino])
            continue
        first[st.st_dev, st.st_ino] = rel
        files.append(rel)
    return files


_TAIL_BYTES = 1 << 20  # of each Parquet file, hashed: its footer, and the last of its data


def _identity(fs: fsspec.AbstractFileSystem, url: str) -> tuple:
    """A file's path, size and modification time: an unchanged file has the same (for the views' cache)."""
    info = fs.info(url)
    return url, info.get("size"), str(info.get("mtime") or info.get("LastModified") or info.get("created"))


def _job_folder(fs: fsspec.AbstractFileSystem, folder: str) -> bool:
    """Whether ``folder`` is a `winnow curate` job folder: its marker, or a manifest.json beside a ``shards/``."""
    return fs.exists(f"{folder}/{CURATED}") or (fs.exists(f"{folder}/manifest.json") and fs.isdir(f"{folder}/shards"))


def _refuse_inside_a_job(fs: fsspec.AbstractFileSystem, root: str, data: str) -> None:
    """ShardError when ``root`` lies inside a `winnow curate` job folder (its ``shards/``, its ``rejects/``: the rows
    curation removed) or holds job folders (a study's, a folder of jobs): read as plain Parquet, the rows would
    train without the manifest's splits, order and checksums, or the rejects as data."""
    parts = root.rstrip("/").split("/")
    for up in range(len(parts) - 1, 0, -1):
        above = "/".join(parts[:up]) or "/"
        if _job_folder(fs, above):
            inner = "/".join(parts[up:])
            what = "the rows curation removed, with their reasons" if inner.startswith("rejects") else "part of it"
            raise ShardError(
                f"{data}: inside the `winnow curate` job folder {above} ({inner}: {what}); give the job folder "
                f"itself (train.shards = {above!r}, or --shards {above}): its manifest names the shards, their "
                "splits, order and checksums"
            )
    marks = (p.rsplit("/", 1)[0] for p in fs.find(root) if p.endswith((f"/{CURATED}", "/manifest.json")))
    job = next((folder for folder in marks if _job_folder(fs, folder)), None)
    if job is not None:
        raise ShardError(
            f"{data}: holds a `winnow curate` job folder ({job}), whose files would be read as plain Parquet files "
            "without its manifest; give the job folder itself, or list each job under [train] shards"
        )


def folder_view(fs: fsspec.AbstractFileSystem, root: str, data: str, *, split: str, fmt: str) -> dict:
    """A manifest-shaped view of ``root``'s ``split`` files: ``{"sources", "shards", "view_of"}``."""
    if fmt != "parquet":
        raise ShardError(
            f"{data}: no manifest.json; a folder without one is read as Parquet files, so set "
            'train.data.format = "parquet" (tar shards need the manifest `winnow curate` writes)'
        )
    if not fs.isdir(root):
        raise ShardError(
            f"{data}: no manifest.json, and no such folder; train.shards (or --shards DIR) must be a "
            "job folder written by `winnow curate` or any folder of Parquet files with a 'text' column "
            "(curated with `--output X`? then train with `--shards X`)"
        )
    if fs.exists(f"{root}/_work"):
        raise ShardError(
            f"{data}: a `winnow curate` job that has not finished (_work/ but no manifest.json); "
            "re-run the same curate command to finish it"
        )
    if fs.exists(f"{root}/{CURATED}"):  # its shards' order, splits, sources and checksums are in the manifest alone
        raise ShardError(
            f"{data}: a `winnow curate` job folder ({CURATED}) whose manifest.json is missing; read as plain Parquet "
            "files it would lose its curriculum order, its sources and its checksums: run the job's `winnow curate` "
            "command again (it writes the folder anew) or restore the manifest"
        )
    paths = find_split_files(fs, root, split)
    key = (data, split, tuple(_identity(fs, f"{root}/{p}") for p in paths))
    if key in _VIEWS:  # held-out loaders are rebuilt for every evaluation: view an unchanged folder once
        return _VIEWS[key]
    _refuse_inside_a_job(fs, root, data)
    if not paths:
        raise NoShardsError(
            f"{data}: no manifest.json and no Parquet files for split {split!r} "
            f"(looked for {', '.join(f'{n}/' for n in SPLIT_NAMES.get(split, (split,)))} and "
            f"{split}.parquet, {split}-*.parquet{'' if split != 'train' else ', then any *.parquet but val and test'})"
        )
    default = root.rstrip("/").rsplit("/", 1)[-1] or "data"
    shards, sources = [], {}
    for rel in paths:
        with fs.open(f"{root}/{rel}", "rb") as fh:
            try:
                pf = pq.ParquetFile(fh)
            except (pa.ArrowInvalid, OSError) as err:
                raise ShardError(
                    f"{data}/{rel}: not a readable Parquet file ({err}); remove or replace it, or point train.shards "
                    "at a folder of Parquet files"
                ) from err
            names = pf.schema_arrow.names
            if "text" not in names:
                raise ShardError(
                    f"{data}/{rel}: no 'text' column (has {names}); every file needs the document text "
                    "in a string column named 'text'"
                )
            if not _textual(pf.schema_arrow.field("text").type):  # found here, not when the loader reaches it
                raise ShardError(
                    f"{data}/{rel}: its 'text' column holds {pf.schema_arrow.field('text').type} values; every file "
                    "needs the document text as strings (or UTF-8 binary): write the column as text, or move the "
                    "file out of the folder"
                )
            if "source" in names:
                column = pf.read(columns=["source"]).column("source")
                if column.null_count:  # a row of no source: each batch would stop the run at its first one
                    first = int(np.flatnonzero(column.is_null().to_numpy())[0])
                    raise ShardError(
                        f"{data}/{rel}: {column.null_count} of its {len(column)} rows have no source (null in its "
                        f"'source' column; the first is row {first}); fill the column for every row, drop the column "
                        "(every row is then of one source, named after the folder), or curate the folder with "
                        "winnow curate"
                    )
                for name in _source_names(column, f"{data}/{rel}"):
                    sources.setdefault(name, None)
            else:
                sources.setdefault(default, None)
            size = fs.size(f"{root}/{rel}")
            fh.seek(max(0, size - _TAIL_BYTES))
            shards.append(
                {
                    "split": split,
                    "format": "parquet",
                    "path": rel,
                    "rows": pf.metadata.num_rows,
                    "bytes": size,
                    "sha256": None,
                    # the footer (row groups' offsets, sizes and statistics): a file rewritten to the same size
                    # and rows with other text differs there, where reading it whole for a hash would not pay
                    "tail_sha256": hashlib.sha256(fh.read(_TAIL_BYTES)).hexdigest(),
                    "source": None if "source" in names else default,
                }
            )
    view = {"format_version": 2, "view_of": data, "sources": [s for s in sources if s is not None], "shards": shards}
    log.info(
        "%s has no manifest.json: made a view of its %d Parquet file(s) for split %r (%d rows; sources %s)",
        data,
        len(shards),
        split,
        sum(s["rows"] for s in shards),
        view["sources"],
    )
    _VIEWS[key] = view
    return view


def _textual(kind: pa.DataType) -> bool:
    """Whether a column of this type reads as text: strings, or UTF-8 bytes (what older Spark and Hive write),
    dictionary-encoded or not (pandas' category, polars' Categorical)."""
    kind = kind.value_type if pa.types.is_dictionary(kind) else kind
    return (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)
            or pa.types.is_binary(kind) or pa.types.is_large_binary(kind))  # fmt: skip


def _source_names(column: pa.ChunkedArray, where: str) -> list[str]:
    """The distinct names of a ``source`` column: strings, or UTF-8 bytes (what older Spark and Hive write), as the
    batches read them; ShardError naming the file for any other type."""
    if not _textual(column.type):
        raise ShardError(
            f"{where}: its 'source' column holds {column.type} values; a source is a name: write the column as "
            "strings, or drop it (every row is then of one source, named after the folder)"
        )
    names = []
    for name in column.unique().to_pylist():
        if isinstance(name, bytes):
            try:
                name = name.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ShardError(
                    f"{where}: a 'source' value {name[:40]!r} is not UTF-8 text; write names as text"
                ) from err
        names.append(name)
    return names


def view_fingerprint(view: dict) -> str:
    """What identifies the viewed files (paths, rows, sizes, the hash of each one's last bytes) for resuming."""
    files = [[s["path"], s["rows"], s["bytes"], s.get("tail_sha256")] for s in view["shards"]]
    return hashlib.sha256(json.dumps(files).encode()).hexdigest()[:16]  # a name not UTF-8 (escaped surrogates) too
