"""Columnar inputs: Parquet files and Hugging Face ``datasets`` (saved folders or local files)."""

from __future__ import annotations

import glob
import json
import os
import posixpath
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from winnow.curate.config import InputConfig
from winnow.curate.errors import InputError, require
from winnow.curate.readers.files import InputFile, filesystem, is_local, open_binary, refuse_not_parquet
from winnow.curate.readers.ranges import Span
from winnow.curate.readers.rows import ReadBatch, RowBuffer, rows_from_arrow
from winnow.curate.readers.utf8 import printable


def _convert(cfg: InputConfig, batch: pa.RecordBatch | pa.Table, label: str, offset: int) -> ReadBatch:
    return rows_from_arrow(
        batch,
        source=cfg.source,
        source_field=cfg.source_field,
        text_field=cfg.text_field,
        id_field=cfg.id_field,
        file_label=label,
        row_offset=offset,
        max_record_bytes=cfg.max_record_bytes,
    )


def _truncated(cfg: InputConfig, file: InputFile, row: int, error: str, rows: int | None = None) -> ReadBatch:
    """The one reject of a file that could not be read on from ``row`` (or, with ``rows``, of those rows of a damaged
    row group): what came before it is kept."""
    buf = RowBuffer()
    buf.reject(
        "read:truncated",
        id_=f"{file.url}#{row}",
        source=cfg.source or "",
        raw=b"",
        where={"file": file.url, "row": row, "error": error, **({} if rows is None else {"rows": rows})},
    )
    return buf.flush()


def read_parquet(cfg: InputConfig, file: InputFile, batch_rows: int, span: Span | None = None) -> Iterator[ReadBatch]:
    """Yield batches from one Parquet file (or a span of its row groups).

    A damaged row group ends in one reject for its rows not read (``rows`` in its meta), and the row groups after it
    are read; a file whose footer cannot be read is one reject. Rows are numbered by their index in the file
    (``<source>/<file>/<row>`` where they name no id), so a span's ids are those the whole file's read gives.
    """
    offset = 0 if span is None else span.base
    with open_binary(file.url, cfg.storage_options, decompress=False) as fh:
        refuse_not_parquet(fh.read(1024), file.url, cfg.label)  # another format is the input's mistake, not damage
        fh.seek(0)
        try:
            pf = pq.ParquetFile(fh)
        except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as err:
            yield _truncated(cfg, file, offset, f"{type(err).__name__}: {err}")
            return
        first = 0 if span is None else span.start
        stop = pf.num_row_groups if span is None or span.stop < 0 else span.stop
        try:  # every group at once, so batches run across groups
            for batch in pf.iter_batches(batch_size=batch_rows, row_groups=range(first, stop)):
                yield _convert(cfg, batch, file.rel, offset)
                offset += batch.num_rows
            return
        except (pa.ArrowInvalid, pa.ArrowIOError, OSError):
            pass
        # a group is damaged (a batch reads ahead, so not necessarily the one holding row `offset`): group by group on
        ends = (0 if span is None else span.base) + np.cumsum(
            [pf.metadata.row_group(g).num_rows for g in range(first, stop)]
        )
        for k in range(int(np.searchsorted(ends, offset, side="right")), stop - first):
            done = offset - (int(ends[k - 1]) if k else (0 if span is None else span.base))  # rows of it yielded
            try:
                for batch in pf.iter_batches(batch_size=batch_rows, row_groups=[first + k]):
                    if done >= batch.num_rows:
                        done -= batch.num_rows
                        continue
                    batch, done = batch.slice(done), 0
                    yield _convert(cfg, batch, file.rel, offset)
                    offset += batch.num_rows
            except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as err:
                yield _truncated(cfg, file, offset, f"{type(err).__name__}: {err}", rows=int(ends[k]) - offset)
                offset = int(ends[k])


def _check_builder(datasets, cfg: InputConfig) -> None:
    """InputError unless ``hf_builder`` names a builder ``datasets`` ships, or a local builder folder or script:
    any other name is a dataset on the Hub, which ``load_dataset`` would go and fetch."""
    from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES

    if cfg.hf_builder in _PACKAGED_DATASETS_MODULES or Path(cfg.hf_builder).exists():
        return
    raise InputError(
        f"input {cfg.label}: inputs.hf_builder = {cfg.hf_builder!r} is not a builder datasets {datasets.__version__} "
        f"ships ({', '.join(sorted(_PACKAGED_DATASETS_MODULES))}) nor a local builder; name one of those "
        "(json for JSON Lines), or read the files with winnow's own reader (format = 'jsonl', 'parquet', 'text')"
    )


def _chosen_splits(cfg: InputConfig, file: InputFile, names: list[str] | None) -> list[str]:
    """The splits to read of a saved dataset whose ``dataset_dict.json`` lists ``names`` (None: a ``Dataset``, read
    whole as split ""): the one ``hf_split`` names, or a ``DatasetDict``'s only split. InputError for a
    ``DatasetDict`` of several splits and no ``hf_split``: read together, a test split would train."""
    if names is None:
        return [""]
    if cfg.hf_split is not None:
        if cfg.hf_split not in names:
            raise InputError(
                f"input {cfg.label}: inputs.hf_split = {cfg.hf_split!r}, but {file.url} holds the splits "
                f"{', '.join(names)}; name one of them"
            )
        return [cfg.hf_split]
    if len(names) > 1:
        raise InputError(
            f"input {cfg.label}: {file.url} is a DatasetDict of the splits {', '.join(names)}; set inputs.hf_split to "
            "the one to curate (read together, a held-out or test split would be trained on), and give another split "
            "an [[inputs]] entry of its own if you want it too"
        )
    return names


def read_hf(cfg: InputConfig, file: InputFile, batch_rows: int, span: Span | None = None) -> Iterator[ReadBatch]:
    """Yield batches from a ``save_to_disk`` folder, or local files through ``load_dataset(hf_builder)`` (never split)."""
    datasets = require("datasets", extra="hf", feature="format = 'hf'")
    with _unchained(file.url) as path:
        if cfg.hf_builder:
            _check_builder(datasets, cfg)
            yield from _read_built(datasets, cfg, file, path, batch_rows)
            return
        fs, root = filesystem(path, cfg.storage_options)
        listing = posixpath.join(root, datasets.config.DATASETDICT_JSON_FILENAME)
        names = None  # a Dataset; or not a saved dataset, which load_from_disk names
        if not fs.isfile(posixpath.join(root, datasets.config.DATASET_STATE_JSON_FILENAME)) and fs.isfile(listing):
            try:  # a DatasetDict: the splits load_from_disk would read
                names = [str(name) for name in json.loads(fs.cat_file(listing))["splits"]]
            except (ValueError, KeyError, TypeError) as err:
                raise InputError(
                    f"cannot open {file.url} as a saved Hugging Face dataset: {printable(listing)} is "
                    f"damaged ({type(err).__name__}: {err}); save it again"
                ) from err
        for split in _chosen_splits(cfg, file, names):
            yield from _read_saved(datasets, cfg, file, path, split, batch_rows)


@contextmanager
def _unchained(url: str) -> Iterator[str]:
    """``url``; or for a local path holding ``::``, a link to it whose path does not: ``datasets`` opens paths as
    fsspec URLs, whose ``::`` chains file systems (``docs/std::vector.jsonl`` would be read as ``docs/std``)."""
    if "::" not in url or not is_local(url):
        yield url
        return
    with tempfile.TemporaryDirectory(prefix="winnow-hf-") as folder:
        link = os.path.join(folder, posixpath.basename(url.rstrip("/")).rsplit("::", 1)[-1] or "input")
        os.symlink(os.path.abspath(url), link)
        yield link


def _read_built(datasets, cfg: InputConfig, file: InputFile, path: str, batch_rows: int) -> Iterator[ReadBatch]:
    """Batches of one file read by ``load_dataset(hf_builder)``, streamed; where its parser gives up, one reject."""
    if file.size == 0:
        return  # no rows (the csv builder's pandas refuses an empty file; the json builder raised StopIteration)
    offset = 0
    try:
        # data_files are glob patterns: a name's own [, *, ? escaped (data[1].jsonl is not data1.jsonl)
        ds = datasets.load_dataset(cfg.hf_builder, data_files=[glob.escape(path)], split="train", streaming=True)
        for rows in ds.iter(batch_size=batch_rows):
            table = pa.Table.from_pydict(rows)
            yield _convert(cfg, table, file.rel, offset)
            offset += table.num_rows
    except StopIteration:  # the json builder takes its schema from the first table: the file (compressed) has none
        return
    except (pa.ArrowException, ValueError, TypeError, OSError) as err:  # the builder's parser gave up
        yield _truncated(
            cfg,
            file,
            offset,
            f"the {cfg.hf_builder!r} builder could not read on from here ({type(err).__name__}: {err}); rows "
            "before it are kept. Read the file with winnow's own reader (format = 'jsonl', 'parquet') to get a "
            "reject per bad record",
        )


def _read_saved(
    datasets, cfg: InputConfig, file: InputFile, path: str, split: str, batch_rows: int
) -> Iterator[ReadBatch]:
    """Batches of one saved ``Dataset``: the ``save_to_disk`` folder ``path``, or its ``split``'s folder."""
    label = f"{file.rel}/{split}" if split else file.rel
    folder = posixpath.join(path, split) if split else path
    fs, root = filesystem(folder, cfg.storage_options)
    state_json = posixpath.join(root, datasets.config.DATASET_STATE_JSON_FILENAME)
    try:
        state = json.loads(fs.cat_file(state_json)) if fs.isfile(state_json) else None
        if state is not None and not state.get("_data_files", True):
            return  # saved with no rows, so with no .arrow file (load_from_disk fails to concatenate no tables)
        ds = datasets.load_from_disk(folder, storage_options=cfg.storage_options or None)
    except (FileNotFoundError, ValueError) as err:
        raise InputError(f"cannot open {file.url} as a saved Hugging Face dataset: {err}") from err
    except (OSError, pa.ArrowException) as err:  # an .arrow file cut short or damaged
        if state is None:
            raise InputError(f"cannot open {file.url} as a saved Hugging Face dataset: {err}") from err
        ds = None
    if ds is None:
        yield from _salvaged(cfg, file, fs, root, [e["filename"] for e in state["_data_files"]], split, batch_rows)
        return
    offset = 0
    for table in ds.with_format("arrow").iter(batch_size=batch_rows):
        yield _convert(cfg, table, label, offset)
        offset += table.num_rows


def _salvaged(
    cfg: InputConfig, file: InputFile, fs, root: str, names: list[str], split: str, batch_rows: int
) -> Iterator[ReadBatch]:
    """The rows of a saved dataset that ``load_from_disk`` refused, read from its ``.arrow`` files ``names`` (Arrow
    IPC streams, in order) up to the first damage, then one ``read:truncated`` reject for the rest."""
    label, offset = f"{file.rel}/{split}" if split else file.rel, 0
    for name in names:
        try:
            with fs.open(posixpath.join(root, name), "rb") as fh:
                for batch in pa.ipc.open_stream(fh):
                    for start in range(0, batch.num_rows, batch_rows):
                        part = batch.slice(start, batch_rows)
                        yield _convert(cfg, part, label, offset)
                        offset += part.num_rows
        except (OSError, pa.ArrowException) as err:
            where = printable(posixpath.join(file.url, split, name))
            yield _truncated(
                cfg,
                file,
                offset,
                f"{where} is cut short or damaged ({type(err).__name__}: {err}); the rows before it are kept, the "
                "rest of the dataset is not read: save it again, or get an intact copy",
            )
            return
