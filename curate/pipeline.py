"""The pipeline runner: plans a job as phases split at barriers and runs their tasks.

    read → [row-local stages] → collect(barrier 1)   map phase 0, one task per input file
         plan(barrier 1)                               global: reads only the spilled keys
    apply(barrier 1) → [stages] → collect(barrier 2)   map phase 1, one task per phase-0 task
         ...
    apply(last barrier) → [stages] → shards            final map phase
    (ordered output: write phase, one task per range of shards, reading sorted task outputs)

The runner alone counts rows, times stages, writes rejects and checks the nothing-is-lost
identity, per stage and for the whole job. Every task and every plan leaves a completion
marker, so re-running a job after a crash or Ctrl-C skips finished work and produces
byte-identical shards. Each phase and plan also records the key of the job prefix it depends
on (``phase_keys``), so another job that shares that prefix adopts it (``curate.reuse``).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import polars as pl

from winnow.curate.atomic import write_json_atomic, write_text_atomic
from winnow.curate.card import CARD, remove_card, write_card
from winnow.curate.config import Job, StageSpec
from winnow.curate.crashpoints import CRASH_ENV
from winnow.curate.errors import ConfigError, OutputError, StageError, disk_full, no_space
from winnow.curate.executors import Executor, release_memory
from winnow.curate.fields import resolve_field_types
from winnow.curate.fingerprint import (
    changed_local_inputs,
    inputs_digest,
    inputs_file,
    invalidate,
    record_inputs,
    referenced_files,
    stale_tasks,
    task_fingerprints,
)
from winnow.curate.lock import FolderLock
from winnow.curate.manifest import build_manifest, package_versions
from winnow.curate.ordered import plan_writes, write_range
from winnow.curate.outdir import (
    OWN_ENTRIES,
    check_no_foreign_files,
    check_owner,
    claim,
    clear_own_entries,
    make_folder,
    mark_owner,
    owner,
    refuse_inside_a_job,
    restrict_mode,
)
from winnow.curate.progress import PhaseProgress
from winnow.curate.readers import largest_first, native_columns, plan_read_tasks, read_task
from winnow.curate.readers.files import glob_matches
from winnow.curate.reuse import adopt_phase, adopt_plan, reused, write_key
from winnow.curate.schema import SPLITS
from winnow.curate.stages import Barrier, Plan, stage_class
from winnow.curate.stages.ids import (
    EXACT_MARKER,
    IDS_STAGE_ID,
    checked_stats,
    job_stages,
    optimistic_job,
    repeated_id,
    repeated_ids,
)
from winnow.curate.tasks import PhaseSpec, TaskSpec, build_stages, run_task, spill_codec
from winnow.curate.workdir import WorkDir, drop_root, is_url, task_name
from winnow.curate.writers.gather import plan_val_writes, write_val_group

log = logging.getLogger(__name__)


def plan_phases(job: Job) -> list[PhaseSpec]:
    """Split the stage list at barriers into map phases."""
    stages = job_stages(job)
    barriers = [i for i, (_, cls, config) in enumerate(stages) if cls.is_barrier(config)]
    phases: list[PhaseSpec] = []
    start, apply = 0, None
    for b in [*barriers, None]:
        end = len(stages) if b is None else b
        phases.append(
            PhaseSpec(index=len(phases), apply=apply, stages=tuple(range(start, end)), collect=b, final=b is None)
        )
        apply, start = b, (end + 1 if b is not None else end)
    return phases


# Readers and shard writers whose work is Arrow's or polars' (the GIL released): a phase that only
# reads these, runs stages that declare ``releases_gil`` and writes these runs its tasks as threads
# (WebDataset tars too: ``curate.writers.tar`` assembles them with Arrow).
THREADED_INPUTS = ("jsonl", "parquet")
THREADED_OUTPUTS = ("parquet", "webdataset")


# [job] keys that say where and how a job runs, not what it computes
_NOT_THE_JOB = (
    "workers",
    "output",
    "executor",
    "keep_work",
    "ray_address",
    "ray_max_retries",
    "storage_options",
    "memory_gb",
)


def job_fingerprint(job: Job) -> str:
    """What makes two runs the same job (workers, output folder and executor don't)."""
    data = dataclasses.asdict(job)
    data["job"] = {k: v for k, v in data["job"].items() if k not in _NOT_THE_JOB}
    data.pop("raw", None)
    data.pop("source_file", None)
    data["stage_classes"] = [stage_class(s.kind).identity() for s in job.stages]
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def phase_keys(job: Job, phases: list[PhaseSpec], prints: list, *, spill_ids: bool) -> list[str]:
    """Per phase, the key of the job prefix its task outputs (and its barrier's plan) depend on.

    The inputs with their files' fingerprints, the ``[job]`` settings ``job_fingerprint`` counts,
    and every stage up to the barrier the phase collects for (the final phase: all of them, and
    ``[output]``); ``spill_ids``: an optimistic run's phase 0 also writes the ids (``curate.stages.ids``).
    """
    stages = job_stages(job)
    base = {
        "job": {k: v for k, v in dataclasses.asdict(job.job).items() if k not in _NOT_THE_JOB},
        "inputs": [dataclasses.asdict(i) for i in job.inputs],
        "files": prints,
    }
    keys = []
    for phase in phases:
        last = len(stages) - 1 if phase.collect is None else phase.collect
        prefix = {
            **base,
            "spill_ids": spill_ids and phase.index == 0,
            "stages": [[sid, cls.identity(), dataclasses.asdict(config)] for sid, cls, config in stages[: last + 1]],
        }
        if phase.final:
            prefix["output"] = dataclasses.asdict(job.output)
        keys.append(hashlib.sha256(json.dumps(prefix, sort_keys=True, default=str).encode()).hexdigest()[:32])
    return keys


class Runner:
    """Runs one job; ``run()`` returns the manifest it wrote.

    ``reuse_from``: another job's output folder whose phases and plans this job adopts where their
    prefix keys are the same (``curate.reuse``).
    """

    def __init__(
        self, job: Job, *, progress: bool = True, reuse_from: str | Path | None = None, overwrite: bool = False
    ) -> None:
        if not is_url(job.job.output):
            job = dataclasses.replace(job, job=dataclasses.replace(job.job, output=str(Path(job.job.output).resolve())))
        self.job = job
        self.work = WorkDir(job.job.output, job.job.storage_options)  # a URL: every task publishes to the store
        self.reuse = (
            None
            if reuse_from is None
            else WorkDir(str(reuse_from) if is_url(reuse_from) else str(Path(reuse_from).resolve()))
        )
        self.out = self.work.out
        self.progress = progress
        self.columns: dict = {}  # what winnow-layout Parquet inputs bring: every read row gets them (_run)
        self.spill_codec = "lz4"  # how the spills are compressed (curate.tasks.spill_codec, _run)
        self.overwrite = overwrite  # replace another job's outputs, or a finished run made with another config
        self._prints: list = []  # the read tasks' fingerprints (_input_prints), of the tasks in _prints_of
        self._prints_of: list | None = None
        self.lock: FolderLock | None = None  # one run per output folder, taken before the folder is touched
        self.ordered = any(stage_class(s.kind).orders_output for s in job.stages)
        self._layout()
        self.plan_seconds: dict[str, float] = {}

    def _layout(self) -> None:
        """Phases and stages of the job as planned now: optimistic (no id barrier) until an id repeats."""
        self.plan_job = optimistic_job(self.job, self.work.root)
        self.optimistic = self.plan_job is not self.job
        self.phases = plan_phases(self.plan_job)
        self.stages = build_stages(self.plan_job, self.work)

    def run(self) -> dict[str, Any]:
        mode = self.job.output.mode
        umask = os.umask(0o777 & ~mode) if mode is not None else None  # local workers inherit it
        try:
            manifest = self._run()
        except Exception as err:
            if not disk_full(err):
                raise
            where = self.job.job.output if self.work.remote else self.out
            raise no_space(where, err, then="run the same command again: the tasks it finished are kept") from err
        finally:
            if umask is not None:
                os.umask(umask)
            if self.lock is not None:
                self.lock.release()
                self.lock = None
            drop_root(self.job.job.output)  # a URL output's local mirror: the store holds everything
        if mode is not None:
            restrict_mode(self.out, mode)  # also what Ray workers and the atomic writer made
        return manifest

    def _run(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        read_tasks = plan_read_tasks(
            self.job.inputs, self.job.job.task_bytes, self.job.job.group_bytes
        )  # a bad input is reported before the output is touched
        _check_inputs_outside(read_tasks, self.job.inputs, self.job.job.output)
        if any(i.keep_fields for i in self.job.inputs):
            self.job = resolve_field_types(self.job, lambda index: _first_batch(self.job, read_tasks, index))
        self.columns = native_columns(self.job.inputs, read_tasks)  # every shard gets the same columns
        executor = Executor(
            workers=self.job.job.workers,
            kind=self.job.job.executor,
            address=self.job.job.ray_address,
            max_retries=self.job.job.ray_max_retries,
        )
        executor.start()  # a Ray cluster that cannot be joined fails here, before the output is touched
        if self.lock is None:
            if not self.work.remote:
                refuse_inside_a_job(self.out)  # said before the lock makes the folder
                make_folder(self.out)  # a file, or a folder nobody may write: said before the lock goes in
            self.lock = FolderLock(
                self.job.job.output,
                what="output folder",
                setting="job.output",
                storage_options=self.job.job.storage_options,
            ).acquire()
        finished = self._up_to_date(read_tasks)
        if finished is not None:
            return finished
        self._prepare(read_tasks)
        self._layout()
        self.spill_codec = spill_codec(self.job.inputs, read_tasks, self.work)
        log.info(
            "job %s: %d read task(s), %d phase(s), output %s",
            self.job.job.name,
            len(read_tasks),
            len(self.phases),
            self.out,
        )
        results: list[list[dict]] = []
        switched = False
        keys = phase_keys(self.plan_job, self.phases, self.prints, spill_ids=self.optimistic)
        with executor as self.executor:
            for phase in self.phases:
                self.lock.check()  # on a store: stop if a stall let another run take the folder over
                if self.reuse is not None and not phase.final:
                    adopt_phase(self.work, self.reuse, phase.index, len(read_tasks), keys[phase.index])
                write_key(self.work.phase_prefix(phase.index), keys[phase.index])
                self.work.publish_file(self.work.phase_prefix(phase.index))
                specs = [self._task_spec(phase, i, read_tasks) for i in largest_first(read_tasks)]
                results.append(self._run_phase(phase, specs))
                if phase.index > 0 and not self.job.job.keep_work:
                    freed = self.work.release(phase.index - 1)
                    log.debug("phase %d read: %.1f MB of its spill deleted", phase.index, freed / 1e6)
                if self.optimistic and phase.index == 0 and not self._ids_unique(results[0]):
                    switched = True
                    break
                if phase.collect is not None:
                    self._plan(phase, len(read_tasks), keys[phase.index])
            else:
                write_results = self._write_ordered(results[-1]) if self.ordered else []
                write_results += self._write_val(results[-1])
        if switched:  # an id repeats: once more, with the id barrier first (the work folder now says so)
            return self._run()
        changed = changed_local_inputs(self.prints)
        if changed:  # cut, grown or rewritten while read: the shards hold what was read then
            log.warning(
                "inputs changed while the job read them: %s%s; the shards hold what was read, and the same command "
                "again curates the inputs as they are now",
                "; ".join(changed[:3]),
                f" (+{len(changed) - 3} more)" if len(changed) > 3 else "",
            )
        stages, reports = self.stages, {s.ctx.stage_id: self._report(s) for s in self.stages if isinstance(s, Barrier)}
        if self.optimistic and self.job.job.duplicate_ids == "reject":
            ids = build_stages(self.job, self.work)[0]  # for the manifest: the check ran, and found no repeat
            stages, reports[IDS_STAGE_ID] = [ids, *stages], {"rows": self._ids_rows, "ids_with_copies": 0, "removed": 0}
        manifest = build_manifest(
            self.job,
            stages,
            results,
            write_results,
            self.plan_seconds,
            reports=reports,
            seconds=time.perf_counter() - t0,
        )
        manifest["inputs_fingerprint"] = inputs_digest(self.prints)  # a re-run from the same inputs has nothing to do
        manifest["referenced_files"] = referenced_files(self.job.raw)  # ... nor one with the same tokenizer, models
        if self.reuse is not None:
            adopted = reused(self.work, [p.index for p in self.phases if not p.final], len(read_tasks), list(reports))
            if adopted["phases"] or adopted["plans"]:
                manifest["reused"] = {"from": self.reuse.output, **adopted}
        write_json_atomic(self.out / "manifest.json", manifest)
        self.work.publish_file(self.out / "manifest.json")
        if any(cfg.source_field is not None for cfg in self.job.inputs):
            _warn_unseen_sources(self.job.stages, sorted(manifest["by_source"]))
        _warn_all_held_out(manifest["shards"])
        if self.work.remote:  # the card reads the first Parquet shard's schema, and keeps a README of the user's
            self.work.fetch(self.out / CARD, missing_ok=True)
            first = next((s["path"] for s in manifest["shards"] if s["format"] == "parquet"), None)
            if first is not None:
                self.work.fetch(self.out / first)
        if write_card(self.out, manifest) is not None:
            self.work.publish_file(self.out / CARD)
        if not self.job.job.keep_work:
            self.work.remove(self.work.root)
        self.work.sweep_tmp(finals=("manifest.json", CARD))
        return manifest

    # -- set-up ---------------------------------------------------------------------------
    def _up_to_date(self, read_tasks: list) -> dict[str, Any] | None:
        """The output's manifest when the folder holds this job's finished outputs (the same fingerprint) from the
        same inputs (the read tasks' fingerprints a resume compares: ``fingerprint.task_fingerprints``), every shard
        and rejects file listed there at its size: nothing to curate. None otherwise (and always with ``overwrite``,
        a work folder, a reused job, or a URL output)."""
        if self.overwrite or self.work.remote or self.reuse is not None or self.work.root.exists():
            return None
        found = owner(self.out)
        if found.get("job") != self.job.job.name or found.get("fingerprint") != job_fingerprint(self.job):
            return None
        try:
            manifest = json.loads((self.out / "manifest.json").read_text())
            if (
                manifest.get("inputs_fingerprint") != inputs_digest(self._input_prints(read_tasks))
                or manifest.get("referenced_files") != referenced_files(self.job.raw)
                or manifest.get("packages") != package_versions()  # an upgrade curates again (a fix reaches the shards)
            ):
                return None
            for entry in manifest["shards"] + manifest["rejects"]:
                files = {entry["path"]: entry.get("bytes")}
                if entry.get("format") == "tokens":  # its index and document arrays beside the .bin
                    stem = entry["path"].removesuffix(".bin")
                    files |= {f"{stem}.idx": entry.get("index_bytes"), f"{stem}.doc.npy": entry.get("docs_bytes")}
                for name, size in files.items():
                    path = self.out / name
                    if not path.is_file() or (size is not None and path.stat().st_size != size):
                        return None
        except (OSError, ValueError, KeyError, TypeError):  # no manifest, or not one this job wrote whole
            return None
        logging.getLogger(PhaseProgress.__module__).info(  # a progress line: shown unless -q
            "%s is up to date: it holds this job's finished outputs, curated from the same inputs; nothing to "
            "curate (--overwrite curates it again)",
            self.out,
        )
        return manifest

    def _input_prints(self, read_tasks: list) -> list:
        """The read tasks' fingerprints (``fingerprint.task_fingerprints``: a read of each file's head and tail),
        taken once per run of the job."""
        if self._prints_of is not read_tasks:
            self._prints = task_fingerprints(read_tasks, [i.storage_options for i in self.job.inputs])
            self._prints_of = read_tasks
        return self._prints

    def _prepare(self, read_tasks: list) -> None:
        """Resume the same job's unfinished work (redoing what changed inputs touch); otherwise start afresh."""
        work = self.work
        had_outputs = claim(self.out, self.job.job.name, work=work)  # refuses a folder winnow did not make
        fingerprint = job_fingerprint(self.job)
        marker = work.fingerprint
        prints = self.prints = self._input_prints(read_tasks)
        if work.exists(marker) and work.read_text(marker) == fingerprint:
            if work.remote:  # what the resumed run reads of the work folder's control files
                work.fetch(inputs_file(work), missing_ok=True)
                work.fetch(work.root / EXACT_MARKER, missing_ok=True)
            stale, changes = stale_tasks(work, prints)
            if not stale:
                log.info("resuming: finished tasks in %s are kept", work.output if work.remote else work.root)
                return
            self._invalidate(stale, changes, len(read_tasks), prints)
            return
        if had_outputs and not self.overwrite:  # another job's outputs, or a finished run of another config
            check_owner(
                self.out,
                self.job.job.name,
                fingerprint,
                where=work.output,
                work=work,
                finished=work.exists(self.out / "manifest.json"),
            )
        if had_outputs:
            log.info("clearing previous outputs in %s", work.output)
        check_no_foreign_files(self.out, work)  # before anything goes
        remove_card(self.out, work=work)
        clear_own_entries(self.out, work=work)
        work.root.mkdir(parents=True, exist_ok=True)
        record_inputs(work, prints)  # before the fingerprint: without both, a re-run starts afresh
        mark_owner(self.out, self.job.job.name, fingerprint, work=work)
        write_text_atomic(marker, fingerprint)
        work.publish_file(marker)

    def _invalidate(self, stale: set[int], changes: list[str], n_tasks: int, prints: list) -> None:
        """Resume a work folder whose inputs changed: redo only what the changed read tasks touch."""
        log.warning(
            "resuming, but inputs changed since this job's work began: %s%s; redoing %d read task(s) "
            "and every phase after the first",
            "; ".join(changes[:3]),
            f" (+{len(changes) - 3} more)" if len(changes) > 3 else "",
            len(stale),
        )
        check_no_foreign_files(self.out, self.work)  # before anything goes
        invalidate(self.out, self.work, stale, n_tasks=n_tasks, single_phase=len(self.phases) == 1)
        remove_card(self.out, work=self.work)
        record_inputs(self.work, prints)

    def _ids_unique(self, phase0: list[dict]) -> bool:
        """After an optimistic phase 0: True when no id repeats; else switch to the exact plan (ids barrier first)."""
        if self.job.job.duplicate_ids == "allow":
            return True
        repeated = repeated_ids(self.work.task_files(0, "ids.parquet"))
        if not repeated:
            for r in phase0:
                r["stats"][IDS_STAGE_ID] = checked_stats(r["stats"])
            self._ids_rows = sum(r["stats"][IDS_STAGE_ID]["rows_in"] for r in phase0)
            return True
        log.info("%d id(s) occur more than once: running the job again with the id check first", repeated)
        # What phase 0 wrote (rejects; shards in a one-phase job), and its work, go.
        clear_own_entries(self.out, only=tuple(name for name in OWN_ENTRIES if name != "_work"), work=self.work)
        for name in self.work.listdir(self.work.root):
            if name not in ("fingerprint", "inputs.json"):
                self.work.remove(self.work.root / name)
        write_text_atomic(self.work.root / EXACT_MARKER, "an id repeats: the id barrier runs first\n")
        self.work.publish_file(self.work.root / EXACT_MARKER)
        return False

    def _task_spec(self, phase: PhaseSpec, task: int, read_tasks: list) -> TaskSpec:
        return TaskSpec(
            job=self.plan_job,
            phase=phase,
            task=task,
            work=self.work,
            ordered=self.ordered,
            read=read_tasks[task] if phase.index == 0 else None,
            decision_stage=self.stages[phase.apply].ctx.stage_id if phase.apply is not None else None,
            spill_ids=self.optimistic and phase.index == 0,
            repeated_ids=self.job.job.duplicate_ids == "allow",
            columns=self.columns if phase.index == 0 else {},
            spill_codec=self.spill_codec,
        )

    # -- phases ---------------------------------------------------------------------------
    def _run_phase(self, phase: PhaseSpec, specs: list[TaskSpec]) -> list[dict]:
        names = [self.stages[i].ctx.stage_id for i in phase.chain]
        if phase.index == 0:
            names.insert(0, "read")
        if phase.collect is not None:
            names.append(f"collect {self.stages[phase.collect].ctx.stage_id}")
        if phase.final:
            names.append("write" if not self.ordered else "sort")
        desc = f"phase {phase.index + 1}/{len(self.phases)}: {' → '.join(names)}"
        log.info(desc)
        results: dict[int, dict] = {}
        with PhaseProgress(desc, len(specs), enabled=self.progress) as progress:
            threads = self.threaded(phase)
            for result in self.executor.run(
                _run_task_indexed, specs, threads=threads, meanwhile=_set_up_kernels if threads else None
            ):
                results[result["task"]] = result
                progress.update()
        return [results[i] for i in range(len(specs))]

    def threaded(self, phase: PhaseSpec) -> bool:
        """Whether a local run may run ``phase``'s tasks as threads (``curate.executors``): all its work releases the GIL.

        Not for an output on a store (a task's scratch folder is per process) nor under the
        crash harness (it kills a process at its n-th write, counted per process).
        """
        if self.work.remote or os.environ.get(CRASH_ENV):
            return False
        ids = [*phase.chain, *(() if phase.collect is None else (phase.collect,))]
        if not all(type(self.stages[i]).releases_gil for i in ids):
            return False
        if phase.index == 0 and any(i.format not in THREADED_INPUTS for i in self.plan_job.inputs):
            return False
        return not phase.final or all(f in THREADED_OUTPUTS for f in self.job.output.formats)

    def _plan(self, phase: PhaseSpec, n_tasks: int, key: str) -> None:
        """A barrier's global step: plan over every task's keys, split the decision per task."""
        stage = self.stages[phase.collect]
        sid = stage.ctx.stage_id
        plan_dir = self.work.plan(sid)
        if self.work.plan_done(sid) or (self.reuse is not None and adopt_plan(self.work, self.reuse, sid, key)):
            return
        t0 = time.perf_counter()
        self.work.remove(plan_dir)  # what an interrupted plan left (here and, for a URL, on the store)
        plan_dir.mkdir(parents=True)
        key_files = self.work.task_files(phase.index, "keys.parquet")
        if key_files and self.job.job.duplicate_ids == "allow" and (same := repeated_id(key_files)) is not None:
            raise StageError(
                f"stage {sid}: two rows share the id {same!r}, and this stage decides by id; [job] duplicate_ids = "
                '"allow" skipped the check that rejects later copies: set duplicate_ids = "reject", or give each row '
                "its own id"
            )
        if key_files:
            log.info("planning %s over %d key file(s)", sid, len(key_files))
            plan = stage.plan(pl.scan_parquet(key_files, glob=False))  # type: ignore[attr-defined]
        else:  # no row reached the stage, so no task will apply it to one: there is nothing to plan
            log.info("planning %s: no rows reached it", sid)
            plan = Plan(None, {})
        if plan.per_task is not None:
            files = {Path(f).parent.name: f for f in key_files}
            for t in range(n_tasks):
                path = self.work.decision(sid, t)
                path.parent.mkdir(exist_ok=True)
                own = files.get(task_name(t))
                plan.per_task(t, pl.scan_parquet(own, glob=False) if own is not None else None).write_parquet(path)
            if plan.spill is not None:
                shutil.rmtree(plan.spill, ignore_errors=True)
        elif plan.decision is not None:
            if "_task" not in plan.decision.columns:
                raise StageError(f"stage {sid}: the plan's decision must keep the _task column")
            parts = {k[0]: g for k, g in plan.decision.group_by("_task")}
            empty = plan.decision.clear().drop("_task")
            for t in range(n_tasks):
                part = parts.get(t)
                path = self.work.decision(sid, t)
                path.parent.mkdir(exist_ok=True)
                (part.drop("_task") if part is not None else empty).write_parquet(path)
        write_json_atomic(plan_dir / "report.json", plan.report)
        self.plan_seconds[sid] = time.perf_counter() - t0
        log.info("planned %s in %.1f s", sid, self.plan_seconds[sid])
        write_json_atomic(plan_dir / "seconds.json", {"seconds": self.plan_seconds[sid]})
        write_key(self.work.plan_prefix(sid), key)
        self.work.publish_outputs(("artifacts",))  # what the plan keeps for the user (models, lists)
        self.work.mark_plan_done(sid)

    def _report(self, stage: Barrier) -> dict[str, Any]:
        path = stage.ctx.plan_dir / "report.json"
        seconds = stage.ctx.plan_dir / "seconds.json"
        if self.work.remote:  # a resumed run planned it in an earlier process
            self.work.fetch(path, missing_ok=True)
            self.work.fetch(seconds, missing_ok=True)
        if seconds.exists():
            self.plan_seconds.setdefault(stage.ctx.stage_id, json.loads(seconds.read_text())["seconds"])
        return json.loads(path.read_text()) if path.exists() else {}

    # -- ordered output -------------------------------------------------------------------
    def _write_ordered(self, final_results: list[dict]) -> list[dict]:
        """Write train shards in rank order (``curate.ordered``), one write task per range of shards."""
        specs = plan_writes(self.job, self.work, self.phases[-1].index, final_results)
        out = []
        with PhaseProgress("write ordered shards", len(specs), enabled=self.progress) as progress:
            for result in self.executor.run(write_range, specs):
                out.append(result)
                progress.update()
        return sorted(out, key=lambda r: r["task"])

    def _write_val(self, final_results: list[dict]) -> list[dict]:
        """Validation rows of every task, gathered into shards of about ``shard_bytes``."""
        specs = plan_val_writes(self.job, self.work, self.phases[-1].index, final_results)
        return sorted(self.executor.run(write_val_group, specs), key=lambda r: r["task"])


def _first_batch(job: Job, read_tasks: list, index: int) -> pl.DataFrame | None:
    """The first batch of input ``index`` (to infer ``keep_fields`` types), or None if it has no rows."""
    task = next((t for t in read_tasks if t.input_index == index), None)
    return (
        None
        if task is None
        else next((rb.rows for rb in read_task(job.inputs[index], task, 1000) if rb.rows.height), None)
    )


def _set_up_kernels() -> None:
    """numba's one-time setup of this process (``curate.dedup.jit.set_up``), where a stage's module compiles its
    kernels through ``curate.dedup.jit``: done by the thread that started the phase's task threads, while they
    read. It only saves time: should it fail, the first kernel call does the setup as it always would."""
    jit = sys.modules.get("winnow.curate.dedup.jit")
    if jit is None:
        return
    try:
        jit.set_up()
    except Exception as err:  # noqa: BLE001 - numba's internals moved: nothing is lost but the head start
        log.debug("numba's setup ahead of the tasks failed: %s", err)


def _run_task_indexed(spec: TaskSpec) -> dict[str, Any]:
    try:
        return {**run_task(spec), "task": spec.task}
    finally:
        release_memory()  # workers (and threads) live for the whole job


def _check_inputs_outside(read_tasks, inputs, output: str) -> None:
    """Refuse inputs inside the output folder, and an output inside an input folder: winnow would read what it writes
    there (its manifest, work files and shards as documents) and, on a rerun, clear what it is reading."""
    local = not is_url(output)

    def where(path: str) -> str:  # local paths resolved (links, "..") so the comparison is of real folders
        return os.path.realpath(path) if local and not is_url(path) else path.rstrip("/")

    def within(path: str, folder: str) -> bool:
        return path == folder or path.startswith(folder.rstrip("/") + "/")

    root = where(output)
    for cfg in inputs:
        for pattern in cfg.paths:
            if local and not is_url(pattern) and os.path.isdir(pattern) and within(root, where(pattern)):
                raise ConfigError(
                    f"[job] output {output} is inside the input folder {pattern} (input {cfg.label}): a rerun would "
                    "read the shards, rejects and manifest winnow writes there; choose an output outside it"
                )
            written = _output_files_matched(pattern, output)
            if written is not None:
                raise ConfigError(
                    f"input {cfg.label}'s path {pattern} matches files winnow writes in the job's output folder "
                    f"{output} ({written}): every later run would read them as input (and refuse to start); choose "
                    "a [job] output it does not reach, or a narrower pattern"
                )
    for task in read_tasks:
        for file in task.files:
            if within(where(file.url), root):
                raise ConfigError(
                    f"input file {file.url} is inside the job's output folder {output}: winnow would read the files it "
                    "writes there; choose a [job] output outside every input path (or move the inputs)"
                )


#: Files of every kind winnow writes in a job's output folder (``OWN_ENTRIES``), as a pattern may reach them.
_OUTPUT_SAMPLES = (
    "manifest.json",
    "README.md",
    "shards/parquet/train/part-00000-00000.parquet",
    "shards/webdataset/train/part-00000-00000.tar",
    "shards/tokens/train/part-00000-00000.bin",
    "rejects/p1-t00000.parquet",
)


def _output_files_matched(pattern: str, output: str) -> str | None:
    """The first of the files winnow writes in ``output`` that the input glob ``pattern`` lists (relative to
    ``output``), or None; a pattern without wildcards names its files or folders itself (checked on what it lists)."""
    if not any(c in pattern for c in "*?["):
        return None
    if is_url(pattern) != is_url(output):
        return None
    if is_url(pattern):
        pattern, output = pattern.split("://", 1)[1], output.split("://", 1)[1]
    else:
        pattern, output = os.path.abspath(os.path.expanduser(pattern)), os.path.abspath(output)
    return next((f for f in _OUTPUT_SAMPLES if glob_matches(pattern, f"{output.rstrip('/')}/{f}")), None)


def _warn_all_held_out(shards: list[dict[str, Any]]) -> None:
    """Say so when every row written is held out (a split holding out each source whole): nothing to train on."""
    first = shards[0]["format"] if shards else None  # each format holds every row: count one
    rows = {split: sum(s["rows"] for s in shards if s["format"] == first and s["split"] == split) for split in SPLITS}
    if rows["val"] and not rows["train"]:
        log.warning(
            "every row written is held out (%d val rows, no train rows): nothing here can be trained on; lower the "
            "split stage's val fractions or rows",
            rows["val"],
        )


def _warn_unseen_sources(stages: list[StageSpec], seen: list[str]) -> None:
    """Where sources come from a column (``source_field``), a stage key naming a source no row had (``Web`` read,
    ``web`` written) was checked only as a possibility before the run: say which, now that the sources are known."""
    for i, spec in enumerate(stages):
        for key in type(spec.config).SOURCE_KEYS:
            value = getattr(spec.config, key, None)
            for name in [value] if isinstance(value, str) else list(value or []):
                if name not in seen:
                    close = difflib.get_close_matches(name, seen, n=1) or [s for s in seen if s.lower() == name.lower()]
                    log.warning(
                        "[[stages]] #%d (%s) key %r names source %r, which no row had%s: the stage did nothing for "
                        "it; the data's sources: %s",
                        i + 1,
                        spec.kind,
                        key,
                        name,
                        f" (did you mean {close[0]!r}?)" if close else "",
                        ", ".join(seen),
                    )


def run_job(
    job: Job, *, progress: bool = True, reuse_from: str | Path | None = None, overwrite: bool = False
) -> dict[str, Any]:
    """Run a curation job end to end and return its manifest (also written to ``manifest.json``).

    ``reuse_from``: the output folder of a job curated with ``keep_work``, whose phases and plans
    this job adopts where they depend on the same job prefix (``curate.reuse``). ``overwrite``: start
    afresh even over another job's outputs, or over a finished run of this job made with another
    configuration (both are refused otherwise).
    """
    if not isinstance(job, Job):
        raise OutputError(f"run_job expects a curate.config.Job, got {type(job).__name__}")
    return Runner(job, progress=progress, reuse_from=reuse_from, overwrite=overwrite).run()
