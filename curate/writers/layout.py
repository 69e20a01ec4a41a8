"""Where a job's shards live and how big they are: ``shards/<format>/<split>/part-*.<ext>``.

One folder per format and split, so a folder holds files of one kind only and
``polars.scan_parquet("out/job/shards/parquet/train")``, ``pyarrow.dataset.dataset(...)``
or a WebDataset brace pattern work on it directly (the tokens format writes
``shards/tokens/<split>/`` next to them). The manifest lists every file with its path
relative to the job folder, so readers that go through the manifest (the loader, the
report, ``winnow ablate``) also read job folders whose manifest lists both formats under ``shards/<split>/``.

Sizes are counted in uncompressed row bytes (string lengths plus 8 bytes per other value),
as Hugging Face ``datasets`` counts ``max_shard_size``: that is what a reader holds in memory
and about what a tar file weighs; zstd Parquet files come out several times smaller.
"""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl

from winnow.curate.config import OutputConfig

EXTENSIONS = {"parquet": "parquet", "webdataset": "tar"}
SHARDS = "shards"


def shard_dir(root: Path, fmt: str, split: str) -> Path:
    """The folder of one format's shards of one split under the job folder ``root``."""
    return Path(root) / SHARDS / fmt / split


def row_bytes(df: pl.DataFrame) -> pl.Series:
    """Uncompressed bytes of each row: string lengths, 8 bytes for every other value."""
    parts = [
        pl.col(c).str.len_bytes().fill_null(0).cast(pl.Int64) if dtype == pl.String else pl.lit(8, pl.Int64)
        for c, dtype in df.schema.items()
    ]
    return df.select(pl.sum_horizontal(parts).alias("bytes")).to_series() if parts else pl.Series("bytes", [], pl.Int64)


def write_ranges(total_rows: int, total_bytes: int, n_tasks: int, output: OutputConfig) -> list[tuple[int, int]]:
    """Contiguous ``[lo, hi)`` rank ranges for the write tasks of ordered output.

    As many tasks as shards are needed (by bytes, and by rows when ``shard_rows`` is set), at
    most ``n_tasks``; with ``shard_rows`` the ranges are multiples of it, so only the very last
    shard is short.
    """
    if total_rows <= 0:
        return []
    needed = math.ceil(total_bytes / output.shard_bytes) if total_bytes else 1
    if output.shard_rows is not None:
        needed = max(needed, math.ceil(total_rows / output.shard_rows))
    n = max(1, min(n_tasks, needed))
    per = math.ceil(total_rows / n)
    if output.shard_rows is not None:
        per = math.ceil(per / output.shard_rows) * output.shard_rows
    return [(lo, min(total_rows, lo + per)) for lo in range(0, total_rows, per)]


def group_small_files(sizes: list[int], target: int) -> list[list[int]]:
    """Consecutive indices grouped so that each group's bytes stay within ``target`` (a file alone may pass it).

    The final phase spills each task's few validation rows; grouping them before writing keeps a
    small validation set from becoming one tiny shard per task.
    """
    groups: list[list[int]] = []
    room = 0
    for i, size in enumerate(sizes):
        if not size:
            continue
        if not groups or size > room:
            groups.append([])
            room = target
        groups[-1].append(i)
        room -= size
    return groups
