"""Readers: every input format streamed as batches of rows plus the records that could not be read.

``plan_read_tasks`` turns the job's ``[[inputs]]`` into read tasks (one per file, a large file
split into spans of about ``[job] task_bytes`` by ``curate.readers.ranges``; plain text files
grouped), and ``read_task`` streams one task. Read errors become rejects with a
``read:<error>`` reason (``READ_REASONS``); only a file that cannot be opened at all raises.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from winnow.curate.config import InputConfig
from winnow.curate.errors import ConfigError, InputError
from winnow.curate.readers.arrow import read_hf, read_parquet
from winnow.curate.readers.files import InputFile, distinct_names, list_files, open_binary
from winnow.curate.readers.jsonl import read_jsonl
from winnow.curate.readers.ranges import Span, split_file
from winnow.curate.readers.rows import READ_REASONS, ReadBatch, as_text_columns, not_native, polars_ready
from winnow.curate.readers.text import read_text_files
from winnow.curate.readers.utf8 import printable
from winnow.curate.readers.webdataset import read_webdataset
from winnow.curate.schema import CORE_COLUMNS, OPTIONAL_COLUMNS

log = logging.getLogger(__name__)

_PER_FILE = {"jsonl": read_jsonl, "parquet": read_parquet, "webdataset": read_webdataset, "hf": read_hf}
GROUP_FILES = 2000  # small whole files grouped into one read task: at most this many
_GROUPED = ("jsonl", "text")  # the formats whose small files share tasks


@dataclass(frozen=True, slots=True)
class ReadTask:
    """One unit of reading: an input and the files (one, or a group of text files) it covers.

    ``span`` is the part of a single file the task reads (None: all of it).
    """

    input_index: int
    files: tuple[InputFile, ...]
    span: Span | None = None

    @property
    def label(self) -> str:
        if len(self.files) > 1:
            return f"{self.files[0].url} (+{len(self.files) - 1} files)"
        return self.files[0].url if self.span is None else f"{self.files[0].url} [{self.span}]"


def _say_files_read_twice(inputs: list[InputConfig], listed: list[list[InputFile]]) -> None:
    """Warn when one file is matched by several inputs (a glob and a path under another source): each reads it,
    so its rows are curated once per input (as duplicates of one another when they carry ids)."""
    first: dict[str, int] = {}
    twice: dict[tuple[int, int], list[str]] = {}
    for index, files in enumerate(listed):
        for f in files:
            earlier = first.setdefault(f.url, index)
            if earlier != index:
                twice.setdefault((earlier, index), []).append(printable(f.url))
    for (a, b), urls in twice.items():
        log.warning(
            "inputs %s and %s both match %d file(s) (%s%s): each reads them, so their rows are curated twice; "
            "narrow one of the paths if that is not meant",
            inputs[a].label,
            inputs[b].label,
            len(urls),
            urls[0],
            ", ..." if len(urls) > 1 else "",
        )


def plan_read_tasks(
    inputs: list[InputConfig], task_bytes: int = 256 << 20, group_bytes: int = 32 << 20
) -> list[ReadTask]:
    """List every input's files and cut them into read tasks, in a stable order (file, then span).

    A file larger than ``task_bytes`` is split into spans; JSONL files under half of ``group_bytes``
    (``[job] group_bytes``; plain text files: all, up to ``task_bytes``) are grouped, in order, into tasks
    of up to that many bytes and ``GROUP_FILES`` files, so a folder of many small files costs a few tasks
    and shards, not one per file.
    """
    tasks: list[ReadTask] = []
    listed = distinct_names([(cfg, list_files(cfg)) for cfg in inputs])
    _say_files_read_twice(inputs, listed)
    for index, (cfg, files) in enumerate(zip(inputs, listed)):
        limit = task_bytes if cfg.format == "text" else min(task_bytes, group_bytes)
        group: list[InputFile] = []
        size = 0
        for f in files:
            spans = (
                [None] if cfg.format in ("text", "hf") else split_file(cfg.format, f, task_bytes, cfg.storage_options)
            )
            # Parquet and tar files each keep a task: their rows' columns are the file's (a Parquet file in winnow's
            # layout brings its own), and one task writes one schema
            alone = cfg.format not in _GROUPED or len(spans) > 1 or (cfg.format != "text" and f.size > limit // 2)
            if group and (alone or len(group) >= GROUP_FILES or size + f.size > limit):
                tasks.append(ReadTask(index, tuple(group)))
                group, size = [], 0
            if alone:
                tasks.extend(ReadTask(index, (f,), span) for span in spans)
                continue
            group.append(f)
            size += f.size
        if group:
            tasks.append(ReadTask(index, tuple(group)))
    return tasks


def largest_first(tasks: list[ReadTask]) -> list[int]:
    """Task indices, the most bytes first (ties in task order): started in this order, a phase's last task to
    finish is a small one, not a large file started late beside idle workers."""
    spans = Counter(t.files[0].url for t in tasks if t.span is not None)

    def size(task: ReadTask) -> int:
        if task.span is None:
            return sum(f.size for f in task.files)
        if task.span.unit in ("bytes", "frames"):  # file offsets
            stop = task.span.stop if task.span.stop >= 0 else task.files[0].size
            return max(stop - task.span.start, 0)
        return task.files[0].size // spans[task.files[0].url]  # row groups: the file's share

    return sorted(range(len(tasks)), key=lambda i: (-size(tasks[i]), i))


def _replaced_sources(cfg: InputConfig, metadata: pq.FileMetaData) -> set[str]:
    """The names a file in winnow's layout holds in its top-level ``source`` column besides its input's own source
    (``[[inputs]] source``, which every row gets: ``source_field`` keeps them). From the row groups' statistics,
    without reading the column."""
    if cfg.source is None or cfg.source_field is not None:
        return set()
    schema = metadata.schema
    column = next((i for i in range(len(schema)) if schema.column(i).path == "source"), None)
    if column is None:
        return set()
    found = set()
    for g in range(metadata.num_row_groups):
        stats = metadata.row_group(g).column(column).statistics
        if stats is not None and stats.has_min_max:
            found |= {v if isinstance(v, str) else bytes(v).decode("utf-8", "replace") for v in (stats.min, stats.max)}
    return found - {cfg.source}


def native_columns(inputs: list[InputConfig], tasks: list[ReadTask]) -> dict[str, pl.DataType]:
    """The columns Parquet files in winnow's own layout bring besides the core ones, with one type each over the
    job (from the files' footers): every row of the job gets them (null where its file has none), so every
    shard has the same columns. Types that differ between files meet at Float64 (numbers) or String."""
    out: dict[str, pl.DataType] = {}
    seen: set[str] = set()
    replaced: dict[str, tuple[set[str], list[str]]] = {}  # input -> (other source names, files holding them)
    split_files: dict[str, list[tuple[str, str]]] = {}  # input -> (file, why not winnow's layout) with a split column
    for task in tasks:
        cfg = inputs[task.input_index]
        if cfg.format != "parquet" or cfg.text_field != "text":
            continue
        for file in task.files:
            if file.url in seen:
                continue
            seen.add(file.url)
            try:
                with open_binary(file.url, cfg.storage_options, decompress=False) as fh:
                    metadata = pq.ParquetFile(fh).metadata
            except (pa.ArrowInvalid, OSError, InputError):
                continue  # a damaged or unreadable file is dealt with where it is read (a reject, or on_error)
            schema = metadata.schema.to_arrow_schema()
            names = schema.names
            if len(set(names)) < len(names):  # a name twice: its reader keeps the later ones in meta
                continue
            # the types its reader sees (rows_from_arrow): text columns decoded, then polars' types
            text_columns = [c for c in ("text", cfg.id_field, cfg.source_field) if c is not None and c in names]
            types = pl.from_arrow(polars_ready(as_text_columns(schema.empty_table(), text_columns))).schema
            if why := not_native(dict(types), text_field=cfg.text_field, id_field=cfg.id_field):
                if "split" in names:  # held-out rows of winnow's (or a copy of them) would train
                    split_files.setdefault(cfg.label, []).append((printable(file.url), why))
                continue
            others = _replaced_sources(cfg, metadata)
            if others:
                names_, files_ = replaced.setdefault(cfg.label, (set(), []))
                names_ |= others
                files_.append(printable(file.url))
            for name in names:
                if name in CORE_COLUMNS or name == cfg.source_field:
                    continue
                kind = OPTIONAL_COLUMNS.get(name, types[name])
                known = out.setdefault(name, kind)
                if known == kind:
                    continue
                if known.is_numeric() and kind.is_numeric():
                    out[name] = pl.Float64()
                elif known.is_nested() or kind.is_nested():
                    raise ConfigError(
                        f"input {cfg.label}: column {name!r} of {file.url} is {kind}, another file's is {known}; a column "
                        "has one type over the job's shards: write the files with one type"
                    )
                else:
                    out[name] = pl.String()
    for label, (names_, files_) in replaced.items():  # once per input, however many of its files
        log.warning(
            "input %s: %d file(s) in winnow's layout (%s%s) name other sources in their source column (%s) than the "
            'input\'s source, which every row gets: each row keeps its own in meta\'s "source" ("source.row" where '
            'meta names one already); set source_field = "source" (and no source) to make them the rows\' sources',
            label,
            len(files_),
            ", ".join(files_[:2]),
            ", ..." if len(files_) > 2 else "",
            ", ".join(repr(v) for v in sorted(names_)[:3]),
        )
    for label, found in split_files.items():
        log.warning(
            "input %s: %d file(s) with a split column are not in winnow's layout (%s: %s%s): their rows are read as "
            "training rows, the split kept in meta; to keep held-out rows held out, write them with id, source, text "
            "and meta as string columns (meta may be null)",
            label,
            len(found),
            found[0][0],
            found[0][1],
            "; ..." if len(found) > 1 else "",
        )
    return out


def read_task(
    cfg: InputConfig, task: ReadTask, batch_rows: int, skipped: list[dict] | None = None
) -> Iterator[ReadBatch]:
    """Stream one read task's batches. With ``skipped`` (``[job] on_error = "skip"``) a file of a group that cannot
    be read is listed there and the task's other files are read; otherwise its error ends the task."""
    if cfg.format == "text":
        yield from read_text_files(cfg, list(task.files), batch_rows, skipped)
        return
    for file in task.files:
        try:
            yield from _PER_FILE[cfg.format](cfg, file, batch_rows, task.span)
        except InputError as err:
            if skipped is None or len(task.files) == 1:
                raise
            skipped.append({"task": file.url, "error": str(err)})


__all__ = [
    "READ_REASONS",
    "InputFile",
    "ReadBatch",
    "ReadTask",
    "Span",
    "list_files",
    "native_columns",
    "plan_read_tasks",
    "read_task",
]
