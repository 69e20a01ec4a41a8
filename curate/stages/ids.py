"""``00.ids``: the job-wide check that every row's id is unique, run before any other stage.

Inputs often give ids (``id_field``), and two inputs — or two lines of one file — may give
the same one (a document crawled twice, a source exported into two folders). Then "every
input id is in the output or in the rejects, never both" cannot be checked, and a later
stage that keys decisions by id (dedup drops *ids*) would act on both copies. So the first
copy of each id, in input order (inputs as listed in the job, files sorted, rows in file
order), is kept and every later copy becomes a ``read:duplicate_id`` reject whose
``duplicate_of`` is that id.

As a barrier ahead of the job's own stages it would cost one more map phase for every
job (the read rows spilled once more: 2x on a job that only reads and writes). So the
runner first runs optimistically: the job's own phases, phase 0 also spilling the read
rows' ids (``ids.parquet`` per task). If no id repeats — the usual case — that is all, and
the manifest's ``00.ids`` entry records the check. If one does, the runner discards that
work, leaves ``_work/ids-exact``, and runs the job with this barrier first; the result is
the same as if it had done so from the start. ``[job] duplicate_ids = "allow"`` skips the
check when the ids are known to be unique. The keys spilled are ids and row numbers only.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import polars as pl

from winnow.curate.config import Job
from winnow.curate.schema import make_rejects
from winnow.curate.stages import stage_class
from winnow.curate.stages.base import Barrier, Plan, Stage, StageConfig, StageOutput

IDS_STAGE_ID = "00.ids"
REASON = "read:duplicate_id"
EXACT_MARKER = "ids-exact"  # in _work: an id repeats, so this job runs with the barrier first


class DuplicateIds(Barrier):
    """Keeps the first row of each id and rejects the later copies."""

    kind = "ids"
    reasons = (REASON,)
    releases_gil = True  # polars only; the row counters belong to the task's own instance

    def __init__(self, config: StageConfig, ctx) -> None:
        super().__init__(config, ctx)
        # Row numbers within the task: collect (phase 0) and apply (phase 1) see the same rows
        # in the same order, because phase 0 runs no stage before this one.
        self._collected = 0
        self._applied = 0

    def collect(self, batch: pl.DataFrame) -> pl.DataFrame:
        start, self._collected = self._collected, self._collected + batch.height
        return batch.select("id", pl.int_range(start, self._collected, dtype=pl.Int64).alias("_row"))

    def plan(self, keys: pl.LazyFrame) -> Plan:
        empty = pl.DataFrame(schema={"id": pl.String, "_task": pl.Int32, "_row": pl.Int64})
        if "_row" not in keys.collect_schema().names():
            return Plan(empty, {"rows": 0, "ids_with_copies": 0, "removed": 0})
        repeated = keys.group_by("id").agg(pl.len().alias("_n")).filter(pl.col("_n") > 1).select("id")
        copies = keys.join(repeated, on="id", how="semi").select("id", "_task", "_row").collect().sort("_task", "_row")
        later = copies.filter(pl.int_range(pl.len()).over("id") > 0)
        rows = keys.select(pl.len()).collect().item()
        report = {
            "rows": rows,
            "ids_with_copies": copies["id"].n_unique() if copies.height else 0,
            "removed": later.height,
        }
        return Plan(later if later.height else empty, report)

    def apply(self, batch: pl.DataFrame, decision: pl.DataFrame | None = None) -> StageOutput:  # type: ignore[override]
        start, self._applied = self._applied, self._applied + batch.height
        if decision is None or decision.height == 0:
            return self.keep_all(batch)
        later = pl.int_range(start, self._applied, dtype=pl.Int64).is_in(decision["_row"].implode())
        marked = batch.with_columns(later.alias("__later"))
        kept = marked.filter(~pl.col("__later")).drop("__later")
        rejected = make_rejects(marked.filter(pl.col("__later")).drop("__later"), REASON, pl.col("id"))
        return StageOutput(kept, rejected)


def optimistic_job(job: Job, work_root: Path) -> Job:
    """The job the runner plans: without the barrier while no repeated id has been seen (see the module doc)."""
    if job.job.duplicate_ids == "allow" or (work_root / EXACT_MARKER).exists():
        return job
    return dataclasses.replace(job, job=dataclasses.replace(job.job, duplicate_ids="allow"))


def _repeats(files: list[str]) -> pl.LazyFrame:
    """The ids that more than one row of ``files`` (id spills, or a barrier's keys) gives, with their counts;
    up-sampled copies, told apart by ``repeat``, do not count."""
    keys = pl.scan_parquet(files, glob=False)
    by = ["id", "repeat"] if "repeat" in keys.collect_schema().names() else ["id"]
    return keys.group_by(by).agg(pl.len().alias("_n")).filter(pl.col("_n") > 1)


def repeated_ids(files: list[str]) -> int:
    """How many ids occur more than once in the phase-0 id spills."""
    return _repeats(files).select(pl.len()).collect().item() if files else 0


def repeated_id(files: list[str]) -> str | None:
    """An id that two rows of a barrier's spilled keys share, or None: a job with ``duplicate_ids = "allow"``
    whose ids do repeat, which a stage deciding by id would get wrong (all copies of an id rejected with one)."""
    if "id" not in pl.scan_parquet(files, glob=False).collect_schema().names():
        return None
    same = _repeats(files).select("id").head(1).collect()
    return same["id"][0] if same.height else None


def checked_stats(task_stats: dict[str, dict]) -> dict[str, Any]:
    """The ``00.ids`` stats of an optimistic phase-0 task whose ids all turned out unique: every read row passed."""
    read = task_stats.get("00.read", {})
    rows, sources = read.get("rows_out", 0), read.get("source_out", {})
    return {
        "rows_in": rows,
        "rows_out": rows,
        "repeats": 0,
        "seconds": 0.0,
        "rejected": {},
        "source_in": sources,
        "source_out": sources,
        "source_rejected": {},
        "counters": {},
    }


def job_stages(job: Job) -> list[tuple[str, type[Stage], StageConfig]]:
    """``(stage id, class, config)`` of every stage a job runs: the id check first (unless allowed off), then the job's own.

    The check is not a ``kind`` a job file can name: the runner adds it, with the id ``00.ids``.
    """
    own = [(f"{i + 1:02d}.{spec.kind}", stage_class(spec.kind), spec.config) for i, spec in enumerate(job.stages)]
    if job.job.duplicate_ids == "allow":
        return own
    return [(IDS_STAGE_ID, DuplicateIds, StageConfig()), *own]
