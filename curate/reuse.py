"""Reusing another job's work: map phases and plans, keyed by the job prefix they depend on.

A map phase's task outputs (kept rows, spilled keys, rejects, stats) are a function of the inputs,
the ``[job]`` settings that shape tasks and batches, and the stages from the first up to the
barrier the phase collects for; a barrier's plan, of the same prefix. Nothing later in the job
reaches them. ``curate.pipeline.phase_keys`` hashes that prefix per phase, and the runner writes
it into the phase's folder and the plan's folder (``WorkDir.phase_prefix``, ``plan_prefix``).

A job run with ``reuse_from`` another job's output (``run_job(job, reuse_from=...)``: an ablation
study's variants, reusing their baseline) adopts each of that job's non-final phases and plans
whose key equals its own: hard links (copies across file systems) of the task folders, their
rejects and the plans' artifacts, made under temporary names and renamed into place, so
completion markers mean what they always mean. A job that differs from the other from stage
*i* on then computes only the phases from the one that collects for stage *i*. A changed stage,
input file or setting before that changes the key, so stale work is never adopted. Phases whose
rows were already released (the other job ran without ``keep_work``) and the final phase, which
writes the shards, are computed. Both outputs must be local folders.

Each adopted task folder and plan folder holds ``reused.json`` (where from, which key); the
manifest lists the adopted phases and plans under ``reused``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from winnow.curate.atomic import rename_into_place, write_json_atomic, write_text_atomic
from winnow.curate.workdir import REUSED, TASK_MARKER, WorkDir, fresh_tmp

log = logging.getLogger(__name__)


def write_key(path: Path, key: str) -> None:
    """Record the prefix key of a phase or plan folder (``WorkDir.phase_prefix`` / ``plan_prefix``)."""
    if not path.is_file() or path.read_text() != key:
        write_text_atomic(path, key)


def _has_key(path: Path, key: str) -> bool:
    return path.is_file() and path.read_text() == key


def _link(src: Path, dst: Path) -> None:
    """``dst`` as a hard link to ``src`` (a copy across file systems); neither job ever rewrites a file in place."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _link_tree(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, copy_function=_link, dirs_exist_ok=True)


def adopt_phase(work: WorkDir, source: WorkDir, phase: int, n_tasks: int, key: str) -> bool:
    """Link every task of ``source``'s phase ``phase`` into ``work`` when its key is ``key``; whether it did.

    A task's rejects go first, its folder (the completion marker) last, so a crash in between
    leaves a task that is simply run again.
    """
    if work.remote or source.remote or not _has_key(source.phase_prefix(phase), key):
        return False
    if not all(source.task_done(phase, t) and not source.released(phase, t) for t in range(n_tasks)):
        return False
    for t in range(n_tasks):
        final = work.task(phase, t)
        if work.task_done(phase, t):
            continue
        folder = source.task(phase, t)
        for rejects in json.loads((folder / TASK_MARKER).read_text())["rejects"]:
            target = work.out / rejects["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.reused.tmp")
            tmp.unlink(missing_ok=True)
            _link(source.out / rejects["path"], tmp)
            rename_into_place(tmp, target)
        tmp = fresh_tmp(final)
        _link_tree(folder, tmp)
        write_json_atomic(tmp / REUSED, {"from": source.output, "prefix": key})
        rename_into_place(tmp, final)
    log.info("phase %d: %d task(s) reused from %s", phase, n_tasks, source.output)
    return True


def adopt_plan(work: WorkDir, source: WorkDir, stage_id: str, key: str) -> bool:
    """Link ``source``'s finished plan of ``stage_id`` (and the artifacts it keeps) into ``work`` when its key is ``key``."""
    if (
        work.remote
        or source.remote
        or work.plan_done(stage_id)
        or not source.plan_done(stage_id)
        or not _has_key(source.plan_prefix(stage_id), key)
    ):
        return False
    plan = work.plan(stage_id)
    work.remove(plan)
    _link_tree(source.plan(stage_id), plan)
    (plan / "_SUCCESS").unlink()  # written again last, by mark_plan_done
    report = plan / "report.json"
    if report.is_file():  # paths of the artifacts it names: this job's copies, not the other job's
        text = report.read_text()
        report.unlink()
        write_text_atomic(report, text.replace(json.dumps(str(source.out))[1:-1], json.dumps(str(work.out))[1:-1]))
    artifacts = source.out / "artifacts" / stage_id
    if artifacts.is_dir():
        shutil.rmtree(work.out / "artifacts" / stage_id, ignore_errors=True)
        _link_tree(artifacts, work.out / "artifacts" / stage_id)
    write_json_atomic(plan / REUSED, {"from": source.output, "prefix": key})
    work.mark_plan_done(stage_id)
    log.info("plan %s reused from %s", stage_id, source.output)
    return True


def reused(work: WorkDir, phases: list[int], n_tasks: int, plans: list[str]) -> dict[str, list]:
    """The phases (every task) and plans of ``work`` that were adopted from another job, for the manifest."""
    return {
        "phases": [k for k in phases if n_tasks and all((work.task(k, t) / REUSED).is_file() for t in range(n_tasks))],
        "plans": [s for s in plans if (work.plan(s) / REUSED).is_file()],
    }
