"""The layout of a job's work folder, ``<output>/_work``: phase → task → completion marker.

::

    _work/fingerprint                          the job's fingerprint; another job clears the folder
    _work/phase-<k>/task-<NNNNN>/              one map task's outputs, renamed from .task-<NNNNN>.tmp/
        rows.parquet | sorted.parquet          kept rows (lz4; sorted by ``order`` in an ordered final phase)
        val.parquet                            final phase: validation rows, gathered into shards afterwards
        keys.parquet                           the next barrier's spilled keys (with ``_task``)
        stats.json                             the task's stats and outputs (what a re-run returns)
    _work/plans/<stage id>/                    a barrier's global step
        decision/task-<NNNNN>.parquet          that task's rows of the decision
        report.json, seconds.json, _SUCCESS    _SUCCESS is written last
    _work/write/task-<NNNNN>.json              an ordered-write task's result (its presence marks it done)
    _work/write-val/task-<NNNNN>.json          a validation write group's result, named by its first task

Rejects and shards go to the output folder itself, not here (``rejects/p<k>-t<NNNNN>.parquet``).
A folder or file is final only under its final name; everything is first written under a
temporary one (``fresh_tmp``) and renamed into place (``curate.atomic.rename_into_place``), so a crashed task leaves nothing a re-run would mistake for finished work.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

_DONE = "_SUCCESS"


def task_name(task: int) -> str:
    return f"task-{task:05d}"


def reject_name(phase: int, task: int) -> str:
    """A map task's rejects file in ``<output>/rejects/``."""
    return f"p{phase}-t{task:05d}.parquet"


@dataclass(frozen=True, slots=True)
class WorkDir:
    """Paths in one job's work folder, and its markers (picklable: tasks carry it)."""

    root: Path

    @property
    def fingerprint(self) -> Path:
        return self.root / "fingerprint"

    def phase(self, phase: int) -> Path:
        return self.root / f"phase-{phase}"

    def task(self, phase: int, task: int) -> Path:
        """A finished map task's folder; it exists only once the task is complete."""
        return self.phase(phase) / task_name(task)

    def task_files(self, phase: int, name: str) -> list[str]:
        """Every finished task's ``name`` file of a phase, in task order (for ``pl.scan_parquet``)."""
        return sorted(str(p) for p in self.phase(phase).glob(f"task-*/{name}"))

    def plan(self, stage_id: str) -> Path:
        return self.root / "plans" / stage_id

    def decision(self, stage_id: str, task: int) -> Path:
        return self.plan(stage_id) / "decision" / f"{task_name(task)}.parquet"

    def plan_done(self, stage_id: str) -> bool:
        return (self.plan(stage_id) / _DONE).exists()

    def mark_plan_done(self, stage_id: str) -> None:
        (self.plan(stage_id) / _DONE).touch()

    def write_marker(self, task: int) -> Path:
        """An ordered-write task's result file, written atomically as its completion marker."""
        return self.root / "write" / f"{task_name(task)}.json"

    def val_write_marker(self, first_task: int) -> Path:
        """A validation write group's result file (named by its first task), its completion marker."""
        return self.root / "write-val" / f"{task_name(first_task)}.json"


def fresh_tmp(final: Path) -> Path:
    """An empty temporary folder beside ``final`` (``.<name>.tmp``), left-overs of a crash removed."""
    tmp = final.with_name(f".{final.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp
