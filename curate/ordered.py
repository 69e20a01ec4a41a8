"""Ordered output: train shards written in the rank a stage gave each row (its ``order`` column).

A stage whose class sets ``orders_output`` (``order``) ranks the train rows 0..N-1 without
gaps. The final map phase then does not write train shards itself: each task sorts its own
train rows by rank (``sort_task_rows``), and a write phase gives each write task a contiguous
range of ranks (``plan_writes``), which it reads from every task's sorted file with row-group
pruning (``write_range``) — so shards follow the curriculum and no process holds the whole job.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import polars as pl

from winnow.curate.atomic import write_json_atomic
from winnow.curate.config import Job
from winnow.curate.errors import StageError
from winnow.curate.workdir import WorkDir, task_scratch
from winnow.curate.writers.layout import even_cuts, row_bytes, write_ranges
from winnow.curate.writers.shards import ShardWriter

ORDER_COLUMN = "order"
SORTED_ROWS = "sorted.parquet"
_SORTED_ROW_GROUP = 4096  # small groups: a write task's range prunes most of every file


def sort_task_rows(unsorted: Path, compression: str) -> None:
    """Replace a task's rows file by ``sorted.parquet`` beside it, sorted by rank (streaming); ``compression`` is
    the spill's (``curate.tasks.spill_codec``)."""
    pl.scan_parquet(unsorted, glob=False).sort(ORDER_COLUMN).sink_parquet(
        unsorted.with_name(SORTED_ROWS),
        row_group_size=_SORTED_ROW_GROUP,
        compression="uncompressed" if compression == "none" else compression,
    )
    unsorted.unlink()


@dataclasses.dataclass(frozen=True, slots=True)
class WriteSpec:
    """One write task: the rows ranked ``lo <= order < hi`` of ``files``, as train shards."""

    job: Job
    work: WorkDir
    files: list[str]  # the sorted task files, relative to the output folder (resolved where the task runs)
    task: int
    lo: int
    hi: int
    total: int


def plan_writes(job: Job, work: WorkDir, final_phase: int, final_results: list[dict]) -> list[WriteSpec]:
    """Contiguous rank ranges of whole shards (``writers.layout.write_ranges``), one write task each."""
    files = [Path(f).relative_to(work.out).as_posix() for f in work.task_files(final_phase, SORTED_ROWS, fetch=False)]
    total = sum(r["rows_written"] for r in final_results)
    total_bytes = sum(r.get("rows_bytes", 0) for r in final_results)
    ranges = write_ranges(total, total_bytes, job.output)
    return [WriteSpec(job, work, files, w, lo, hi, total) for w, (lo, hi) in enumerate(ranges)]


def write_range(spec: WriteSpec) -> dict[str, Any]:
    """Run one write task (or return its result if its marker is in place)."""
    with task_scratch(spec.work.output):
        return _write_range(spec)


def _write_range(spec: WriteSpec) -> dict[str, Any]:
    work = spec.work
    marker = work.write_marker(spec.task)
    if work.exists(marker):
        return json.loads(work.read_text(marker))
    files = [work.out / f for f in spec.files]
    if work.remote:  # read in place: the row groups' statistics prune what is fetched
        import pyarrow.dataset as ds

        filesystem, keys = work.arrow_files(files)
        order = ds.field(ORDER_COLUMN)
        table = ds.dataset(keys, format="parquet", filesystem=filesystem).to_table(
            filter=(order >= spec.lo) & (order < spec.hi)
        )
        df = pl.from_arrow(table).sort(ORDER_COLUMN)
    else:
        in_range = pl.col(ORDER_COLUMN).is_between(spec.lo, spec.hi, closed="left")
        df = pl.scan_parquet([str(f) for f in files], glob=False).filter(in_range).collect().sort(ORDER_COLUMN)
    ranks = df[ORDER_COLUMN]
    gapless = df.height < 2 or bool((ranks.diff().slice(1) == 1).all())  # a tie and a gap would keep the ends
    if df.height != spec.hi - spec.lo or (
        df.height and (ranks[0] != spec.lo or ranks[-1] != spec.hi - 1 or not gapless)
    ):
        raise StageError(
            f"the order column must be a rank 0..{spec.total - 1} without gaps or ties; ranks {spec.lo}..{spec.hi - 1} "
            f"hold {df.height} rows"
        )
    writer = ShardWriter.for_job(spec.job, f"part-{spec.task:05d}", split="train")
    if spec.job.output.shard_rows is None:  # equal halves of a range a little over shard_bytes, not a sliver
        for a, b in even_cuts(row_bytes(df), spec.job.output.shard_bytes):
            writer.write_shard(df.slice(a, b - a))
    else:
        writer.write(df)
    shards = [{**s, "path": str(Path(s["path"]).relative_to(spec.job.output_dir))} for s in writer.close()]
    result = {"task": spec.task, "shards": shards}
    work.publish_outputs(("shards",))
    write_json_atomic(marker, result)
    work.publish_file(marker)
    return result
