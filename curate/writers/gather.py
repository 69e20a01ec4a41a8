"""Validation shards gathered across tasks, so a small validation set is not one tiny file per task.

The final map phase spills each task's validation rows to ``val.parquet`` in its task folder
(they are few: a fraction of every task). Afterwards consecutive tasks' spills are grouped up
to ``shard_bytes`` and each group is written as shards by one write task, in task order, so
the validation shards are the same for the same job whatever the worker count.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq

from winnow.curate.atomic import write_json_atomic
from winnow.curate.config import Job
from winnow.curate.workdir import WorkDir, task_scratch
from winnow.curate.writers.layout import group_small_files
from winnow.curate.writers.shards import ShardWriter

VAL_ROWS = "val.parquet"


@dataclass(frozen=True, slots=True)
class ValWriteSpec:
    """One group of task spills written as validation shards (picklable)."""

    job: Job
    work: WorkDir
    final_phase: int
    tasks: tuple[int, ...]  # their spills (paths are made where the write task runs)

    @property
    def first_task(self) -> int:
        return self.tasks[0]


def plan_val_writes(job: Job, work: WorkDir, final_phase: int, results: list[dict[str, Any]]) -> list[ValWriteSpec]:
    """Write groups over the final phase's task results (index = task), each within ``shard_bytes``."""
    sizes = [(r.get("val") or {}).get("bytes", 0) if (r.get("val") or {}).get("rows") else 0 for r in results]
    return [
        ValWriteSpec(job, work, final_phase, tuple(group)) for group in group_small_files(sizes, job.output.shard_bytes)
    ]


def write_val_group(spec: ValWriteSpec) -> dict[str, Any]:
    """Stream one group's spilled rows into shards; a marker makes a re-run skip a finished group."""
    with task_scratch(spec.work.output):
        return _write_val_group(spec)


def _write_val_group(spec: ValWriteSpec) -> dict[str, Any]:
    work = spec.work
    marker = work.val_write_marker(spec.first_task)
    if work.exists(marker):
        return json.loads(work.read_text(marker))
    writer = ShardWriter.for_job(spec.job, f"part-{spec.first_task:05d}", split="val")
    for t in spec.tasks:
        path = work.task(spec.final_phase, t) / VAL_ROWS
        work.fetch(path)
        for batch in pq.ParquetFile(path).iter_batches(batch_size=spec.job.job.batch_rows):
            writer.write(pl.from_arrow(batch))
    shards = [{**s, "path": str(Path(s["path"]).relative_to(spec.job.output_dir))} for s in writer.close()]
    result = {"task": spec.first_task, "shards": shards}
    work.publish_outputs(("shards",))
    write_json_atomic(marker, result)
    work.publish_file(marker)
    return result
