"""Where a job's shards live and how big they are: ``shards/<format>/<split>/part-*.<ext>``.

One folder per format and split, so a folder holds files of one kind only and
``polars.scan_parquet("out/job/shards/parquet/train")``, ``pyarrow.dataset.dataset(...)``
or a WebDataset brace pattern work on it directly (the tokens format writes
``shards/tokens/<split>/`` next to them). The manifest lists every file with its path
relative to the job folder, so readers that go through the manifest (the loader, the
report, ``winnow ablate``) also read job folders whose manifest lists both formats under ``shards/<split>/``.

Sizes are counted in uncompressed row bytes (string lengths plus 8 bytes per other value, null or not),
as Hugging Face ``datasets`` counts ``max_shard_size``: that is what a reader holds in memory
and about what a tar file of long documents weighs (each sample adds two 512-byte headers and padding to
a block, so short ones make tars several times larger); zstd Parquet files come out several times smaller.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl

from winnow.curate.config import OutputConfig

EXTENSIONS = {"parquet": "parquet", "webdataset": "tar"}
SHARDS = "shards"
RANGE_FILL = 0.8  # an ordered write range holds about this share of shard_bytes on average


def shard_dir(root: Path, fmt: str, split: str) -> Path:
    """The folder of one format's shards of one split under the job folder ``root``."""
    return Path(root) / SHARDS / fmt / split


def row_bytes(df: pl.DataFrame) -> pl.Series:
    """Uncompressed bytes of each row: string lengths (a null string 0), 8 bytes for every other value, null or not."""
    parts = [
        pl.col(c).str.len_bytes().fill_null(0).cast(pl.Int64) if dtype == pl.String else pl.lit(8, pl.Int64)
        for c, dtype in df.schema.items()
    ]
    return df.select(pl.sum_horizontal(parts).alias("bytes")).to_series() if parts else pl.Series("bytes", [], pl.Int64)


def write_ranges(total_rows: int, total_bytes: int, output: OutputConfig) -> list[tuple[int, int]]:
    """Contiguous ``[lo, hi)`` rank ranges for the write tasks of ordered output.

    Ranges of equal rows, one per ``RANGE_FILL`` of ``shard_bytes`` (so most fit one shard; the writer
    cuts one that does not into equal halves, ``even_cuts``) and per ``shard_rows`` when set, as
    multiples of it, so only the very last shard is short. They depend on the rows alone, never on
    how many tasks read them, so neither do the shard files.
    """
    if total_rows <= 0:
        return []
    needed = math.ceil(total_bytes / (RANGE_FILL * output.shard_bytes)) if total_bytes else 1
    if output.shard_rows is not None:
        needed = max(needed, math.ceil(total_rows / output.shard_rows))
    per = math.ceil(total_rows / max(1, min(needed, total_rows)))
    if output.shard_rows is not None:
        per = math.ceil(per / output.shard_rows) * output.shard_rows
    return [(lo, min(total_rows, lo + per)) for lo in range(0, total_rows, per)]


def even_cuts(sizes: pl.Series, shard_bytes: int) -> list[tuple[int, int]]:
    """``[a, b)`` row slices of about equal bytes, as few as keep each within ``shard_bytes`` (give or take a row).

    An ordered write range a little over ``shard_bytes`` becomes two halves, not a full shard and a
    sliver.
    """
    n = sizes.len()
    total = int(sizes.sum() or 0)
    k = max(1, min(n, math.ceil(total / shard_bytes)))
    if k == 1:
        return [(0, n)] if n else []
    cum = sizes.cum_sum().to_numpy()
    cuts = np.searchsorted(cum, [total * j / k for j in range(1, k)], side="left") + 1
    edges = [0, *sorted({int(c) for c in np.clip(cuts, 1, n - 1)}), n]
    return list(zip(edges[:-1], edges[1:]))


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
