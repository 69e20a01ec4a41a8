"""Map tasks: the unit of work a worker runs, a pure function of its input and the job.

A task streams batches (from its read task, or from the previous phase's rows file),
applies the phase's stages, and writes — all under temporary names — its surviving rows
(or, in the last phase, shards), its rejects, a barrier's keys, and its stats. It then
renames its folder into place: the folder's presence is the completion marker, so a
re-run skips the task, and a crashed task leaves nothing half-written under a final name.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from winnow.curate.atomic import rename_into_place, write_json_atomic
from winnow.curate.config import InputConfig, Job
from winnow.curate.errors import InputError, StageError, disk_usage
from winnow.curate.executors import worker_info
from winnow.curate.fields import extract_fields, job_fields
from winnow.curate.ordered import sort_task_rows
from winnow.curate.readers import ReadBatch, ReadTask, read_task
from winnow.curate.readers.files import codec
from winnow.curate.schema import CORE_COLUMNS, SPLITS, validate_rows
from winnow.curate.stages import Stage, StageContext
from winnow.curate.stages.ids import job_stages
from winnow.curate.stats import StageStats
from winnow.curate.workdir import TASK_MARKER, WorkDir, fresh_tmp, reject_name, task_scratch
from winnow.curate.writers.gather import VAL_ROWS
from winnow.curate.writers.layout import row_bytes
from winnow.curate.writers.shards import ShardWriter
from winnow.curate.writers.tokens import SUFFIXES as TOKEN_SUFFIXES

READ_STAGE_ID = "00.read"
_SPILL_WRITE_BATCH = 256  # rows per Parquet write batch in the spill files
_PARQUET_VIEWS = int(pa.__version__.split(".")[0]) >= 21  # Arrow writes string and binary views to Parquet
_BATCH_BYTES = 64 << 20  # about the most row data a later phase's batch holds (a phase-0 reader's blocks are smaller)


@dataclass(frozen=True, slots=True)
class PhaseSpec:
    """Which stages a map phase runs: a barrier's apply, row-local stages, the next barrier's collect."""

    index: int
    apply: int | None
    stages: tuple[int, ...]
    collect: int | None
    final: bool

    @property
    def chain(self) -> tuple[int, ...]:
        """The stages a task applies to each batch, in order: the barrier's apply, then the row-local ones."""
        return ((self.apply,) if self.apply is not None else ()) + self.stages


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """Everything a worker needs to run one map task (picklable)."""

    job: Job
    phase: PhaseSpec
    task: int
    work: WorkDir
    ordered: bool  # final rows carry an ``order`` column: train rows are sorted, not sharded, here
    read: ReadTask | None = None  # phase 0
    decision_stage: str | None = None  # later phases: the barrier whose decision this task applies
    spill_ids: bool = False  # phase 0 of an optimistic run: also write the read rows' ids (curate.stages.ids)
    # the user's [job] duplicate_ids = "allow" (``job`` is the plan's, which an optimistic run sets to "allow")
    repeated_ids: bool = False
    # phase 0: the columns winnow-layout Parquet inputs bring (readers.native_columns); every read row gets them
    columns: dict[str, pl.DataType] = field(default_factory=dict)
    spill_codec: str = "lz4"  # how the files for the next phase are compressed (``spill_codec``)

    # Paths are computed where the task runs (on a store, in its own scratch folder: curate.workdir).
    @property
    def folder(self) -> Path:
        return self.work.task(self.phase.index, self.task)

    @property
    def rows_path(self) -> Path | None:
        """Later phases: the previous phase's rows of this task."""
        return self.work.task(self.phase.index - 1, self.task) / "rows.parquet" if self.phase.index > 0 else None

    @property
    def decision_path(self) -> Path | None:
        return self.work.decision(self.decision_stage, self.task) if self.decision_stage is not None else None


def spill_codec(inputs: list[InputConfig], read_tasks: list[ReadTask], work: WorkDir) -> str:
    """How a job's spills (the rows, keys and ids only the next phase reads) are compressed: not at all when its
    inputs, as text, would take under 1% of the free space of the disk the spills go to; else lz4, which writes
    them about twice as fast as zstd (random 64-bit hashes and shingle sets come out under a tenth larger).

    lz4 makes text spills about 2.5x smaller for about 2 s of CPU per GB written and read back: a job that is
    small against its disk would spend that time for nothing. Inputs other than plain JSON Lines and text files
    (gzip, zstd, Parquet, tars, Hugging Face folders) count five times their size. Spills to an object store are
    always compressed (each is uploaded and fetched). Either way each phase reads what the one before wrote: the
    outputs are the same.
    """
    if work.remote:
        return "lz4"
    sizes = {
        f.url: f.size * (1 if inputs[t.input_index].format in ("jsonl", "text") and codec(f.url) is None else 5)
        for t in read_tasks
        for f in t.files
    }
    return "none" if 100 * sum(sizes.values()) <= disk_usage(work.root).free else "lz4"


def build_stages(job: Job, work: WorkDir) -> list[Stage]:
    """Instantiate the job's stages with their contexts."""
    stages = []
    for sid, cls, config in job_stages(job):
        ctx = StageContext(
            stage_id=sid,
            job_name=job.job.name,
            output_dir=job.output_dir,
            plan_dir=work.plan(sid),
            sources=job.declared_sources,
            seed=job.job.seed,
            memory_gb=job.job.memory_gb,
            workers=job.job.workers,
        )
        stages.append(cls(config, ctx))
    return stages


@dataclass(slots=True)
class _Outputs:
    """The files one task writes, opened lazily."""

    spec: TaskSpec
    tmp: Path
    rows: pq.ParquetWriter | None = None
    keys: pq.ParquetWriter | None = None
    rejects: pq.ParquetWriter | None = None
    val: pq.ParquetWriter | None = None  # final phase: validation rows, gathered across tasks into shards later
    ids: pq.ParquetWriter | None = None  # optimistic phase 0: the read rows' ids
    shards: dict[str, ShardWriter] = field(default_factory=dict)
    rows_written: int = 0
    rows_bytes: int = 0
    val_rows: int = 0
    val_bytes: int = 0
    rejects_written: int = 0

    def _writer(self, name: str, path: Path, df: pl.DataFrame, compression: str) -> pq.ParquetWriter:
        writer = getattr(self, name)
        spilled = name in ("keys", "ids")
        intermediate = spilled or (name == "rows" and not self.spec.phase.final)  # only the next phase reads it
        # polars' own string and binary views go to Arrow without a copy (Parquet takes them from Arrow 21); the
        # oldest layout (large_string) copies every text, and is what winnow's outputs hold
        table = df.to_arrow(compat_level=pl.CompatLevel.newest() if intermediate and _PARQUET_VIEWS else None)
        if writer is None:
            # Spilled keys are mostly random 64-bit hashes and unique ids: a dictionary only costs time there,
            # but for the source names, which repeat on every row.
            options = {"use_dictionary": [c for c in ("source",) if c in df.columns] if spilled else True}
            if intermediate:
                # Files only the next phase reads: Arrow buffers a page per 1,024 rows by default,
                # which for long documents is ~3x the batch's text; 256-row pages cost no time.
                options["write_batch_size"] = _SPILL_WRITE_BATCH
            writer = pq.ParquetWriter(path, table.schema, compression=compression, **options)
            setattr(self, name, writer)
        writer.write_table(table.cast(writer.schema))
        return writer

    def abandon(self) -> None:
        """Close and remove every file of a task that failed, ignoring a second failure (a full disk fails the
        last flush again, and an unclosed writer would repeat it at exit); the task runs anew on resume."""
        for name in ("rows", "keys", "rejects", "val", "ids"):
            if getattr(self, name) is not None:
                with contextlib.suppress(OSError):
                    getattr(self, name).close()
                setattr(self, name, None)
        for writer in self.shards.values():
            writer.abandon()
        with contextlib.suppress(OSError):
            self.reject_tmp.unlink(missing_ok=True)
        shutil.rmtree(self.tmp, ignore_errors=True)  # room back on a full disk

    def remove_shards(self) -> None:
        """Remove the shards the task closed (``abandon`` leaves them: a task run anew writes them again under the
        same names), for a run of the task that will not write them again."""
        for writer in self.shards.values():
            for entry in writer.written:
                path = Path(entry["path"])
                sidecars = [path.with_suffix(s) for s in TOKEN_SUFFIXES] if entry["format"] == "tokens" else []
                for file in (path, *sidecars):
                    file.unlink(missing_ok=True)
        self.shards.clear()

    def write_rows(self, df: pl.DataFrame) -> None:
        self._writer("rows", self.tmp / "rows.parquet", df, self.spec.spill_codec)
        self.rows_written += df.height
        if self.spec.phase.final:
            self.rows_bytes += int(row_bytes(df).sum())

    def write_keys(self, df: pl.DataFrame) -> None:
        self._writer(
            "keys",
            self.tmp / "keys.parquet",
            df.with_columns(pl.lit(self.spec.task, pl.Int32).alias("_task")),
            self.spec.spill_codec,
        )

    def write_rejects(self, df: pl.DataFrame, sid: str) -> None:
        if df.height:
            self._writer("rejects", self.reject_tmp, normalize_rejects(df, sid), "zstd")
            self.rejects_written += df.height

    def write_shard_rows(self, df: pl.DataFrame) -> None:
        split_col = df["split"] if "split" in df.columns else None
        groups = (
            {"train": df}
            if split_col is None
            else {
                k[0]: g
                for k, g in df.with_columns(pl.col("split").fill_null("train")).group_by("split", maintain_order=True)
            }
        )
        for split, part in groups.items():
            if split not in SPLITS:  # a folder name under shards/<format>/: never a value winnow did not choose
                raise StageError(
                    f"{part.height} row(s) carry split = {split!r}; a stage may set only {list(SPLITS)} (or null: train)"
                )
            if split == "val":
                self._writer("val", self.tmp / VAL_ROWS, part, self.spec.spill_codec)
                self.val_rows += part.height
                self.val_bytes += int(row_bytes(part).sum())
                continue
            if split not in self.shards:
                self.shards[split] = ShardWriter(
                    self.spec.job.output_dir,
                    f"part-{self.spec.task:05d}",
                    self.spec.job.output,
                    split=split,
                    repeated_ids=self.spec.repeated_ids,
                )
            self.shards[split].write(part)

    @property
    def reject_name(self) -> str:
        return reject_name(self.spec.phase.index, self.spec.task)

    @property
    def reject_tmp(self) -> Path:
        folder = self.spec.job.output_dir / "rejects"
        folder.mkdir(parents=True, exist_ok=True)
        return folder / f".{self.reject_name}.tmp"


def normalize_rejects(df: pl.DataFrame, sid: str) -> pl.DataFrame:
    """One reject schema for every stage: core columns, reason, duplicate_of, stage, and ``extra`` (JSON)."""
    extra_cols = [c for c in df.columns if c not in (*CORE_COLUMNS, "reason", "duplicate_of")]
    extra = pl.struct(extra_cols).struct.json_encode() if extra_cols else pl.lit(None, dtype=pl.String)
    return df.select(
        *[pl.col(c).cast(pl.String) for c in CORE_COLUMNS],
        pl.col("reason").cast(pl.String),
        pl.col("duplicate_of").cast(pl.String),
        pl.lit(sid).alias("stage"),
        extra.alias("extra"),
    )


def _with_columns(rows: pl.DataFrame, columns: dict[str, pl.DataType]) -> pl.DataFrame:
    """``rows`` with every one of ``columns``, of its type (null where the rows' file has none), in one order."""
    if not columns:
        return rows
    typed = [
        pl.col(c).cast(t) if c in rows.columns else pl.lit(None, t).alias(c) for c, t in columns.items()
    ]  # the types are each column's over the job: a cast to them loses nothing (numbers to Float64, or to String)
    rest = [c for c in rows.columns if c not in columns]
    return rows.select(*rest, *typed)


class _SkippedAfterRows(Exception):
    """A file refused (``[job] on_error = "skip"``) after some of its rows were written: the task runs again
    without it, so a skipped file gives the output nothing (its first batches in the shards, the rest nowhere,
    would count rows of a file the manifest says was skipped)."""

    def __init__(self, url: str, entry: dict) -> None:
        super().__init__(entry["error"])
        self.url = url
        self.entry = entry


def _batches(
    spec: TaskSpec, skipped: list[dict], left_out: frozenset[str] = frozenset()
) -> Iterator[tuple[pl.DataFrame, pl.DataFrame | None]]:
    """(rows, read rejects) per batch: from the read task in phase 0 (less the files in ``left_out``), else from
    the previous phase."""
    batch_rows = spec.job.job.batch_rows
    if spec.read is not None:
        cfg = spec.job.inputs[spec.read.input_index]
        fields, every = cfg.keep_fields if isinstance(cfg.keep_fields, dict) else {}, job_fields(spec.job)
        for rb in _read_batches(
            spec.read, cfg, batch_rows, skipped if spec.job.job.on_error == "skip" else None, left_out
        ):
            yield _with_columns(extract_fields(rb.rows, fields, every), spec.columns), rb.rejects
        return
    if spec.rows_path is not None and spec.rows_path.exists():
        for rows in read_batches(spec.rows_path, batch_rows):
            yield rows, None


def _read_batches(
    task: ReadTask, cfg: InputConfig, batch_rows: int, skipped: list[dict] | None, left_out: frozenset[str]
) -> Iterator[ReadBatch]:
    """A read task's batches. With ``skipped`` (``on_error = "skip"``) a file refused before any of its batches is
    listed there and left out; one refused after raises ``_SkippedAfterRows``."""
    if skipped is None:
        yield from read_task(cfg, task, batch_rows)
        return
    if cfg.format == "text":  # one document per file, each refused before it is yielded
        yield from read_task(cfg, task, batch_rows, skipped)
        return
    for file in task.files:
        if file.url in left_out:
            continue
        yielded = False
        try:
            for rb in read_task(cfg, replace(task, files=(file,)), batch_rows):
                yielded = True
                yield rb
        except InputError as err:
            entry = {"task": task.label if len(task.files) == 1 else file.url, "error": str(err)}
            if yielded:
                raise _SkippedAfterRows(file.url, entry) from err
            skipped.append(entry)


def read_batches(path: Path, batch_rows: int) -> Iterator[pl.DataFrame]:
    """A rows file in batches of ``batch_rows`` rows, or fewer where its rows average over ``_BATCH_BYTES /
    batch_rows`` (long documents: 8,192 rows of 1 MB would be 8 GB at once), each in one chunk.

    polars reads each batch straight into its own buffers (one copy of the text, where Arrow's
    reader and ``from_arrow`` held two), and only the row groups the batch spans. One chunk per
    batch as before: shards are written chunk by chunk and Parquet pages follow chunk boundaries.
    """
    meta = pq.ParquetFile(path).metadata
    rows = meta.num_rows
    size = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    step = max(1, min(batch_rows, _BATCH_BYTES * rows // max(size, 1)))
    for lo in range(0, rows, step):
        yield pl.scan_parquet(path, glob=False).slice(lo, step).collect().rechunk()


def run_task(spec: TaskSpec) -> dict[str, Any]:
    """Run one map task to completion (or skip it if its folder is already in place).

    For an output on a store the task runs in a private scratch folder: it fetches the
    previous phase's rows and the applied plan, and publishes its outputs, marker last.
    """
    with task_scratch(spec.work.output):
        return _run_task(spec)


def _run_task(spec: TaskSpec) -> dict[str, Any]:
    final = spec.folder
    work = spec.work
    if work.task_done(spec.phase.index, spec.task):
        return json.loads(work.read_text(final / TASK_MARKER))
    if work.remote:
        if spec.rows_path is not None and work.task_done(spec.phase.index - 1, spec.task):
            work.fetch(spec.rows_path, missing_ok=True)
        if spec.decision_stage is not None:
            work.fetch_plan(spec.decision_stage, task=spec.task)
    decision = (
        pl.read_parquet(spec.decision_path, glob=False) if spec.decision_path and spec.decision_path.exists() else None
    )
    left_out: dict[str, dict] = {}  # files refused after some of their rows were written, and why
    while True:
        stages = build_stages(spec.job, spec.work)  # afresh: a stage may hold what it saw of the first run's rows
        stats: dict[str, StageStats] = {}
        skipped = list(left_out.values())
        out = _Outputs(spec, fresh_tmp(final))
        try:
            _map_batches(spec, stages, decision, stats, skipped, out, frozenset(left_out))
            return _finish(spec, out, stats, skipped, final)
        except _SkippedAfterRows as err:  # run again without the file: nothing of it may stay in the output
            out.abandon()
            out.remove_shards()
            left_out[err.url] = err.entry
        except BaseException:
            out.abandon()
            raise


def _map_batches(
    spec: TaskSpec,
    stages: list[Stage],
    decision: pl.DataFrame | None,
    stats: dict[str, StageStats],
    skipped: list[dict],
    out: _Outputs,
    left_out: frozenset[str] = frozenset(),
) -> None:
    """Read the task's rows batch by batch, run the phase's stages on each and write what they keep to ``out``
    (its last batch is not held while ``_finish`` flushes the shards)."""
    phase = spec.phase
    for rows, read_rejects in _batches(spec, skipped, left_out):
        if read_rejects is not None:
            read = stats.setdefault(READ_STAGE_ID, StageStats())
            read.add_batch(pl.concat([rows.select("source"), read_rejects.select("source")]), rows, read_rejects, 0)
            out.write_rejects(read_rejects, READ_STAGE_ID)
        if spec.spill_ids and rows.height:
            out._writer("ids", out.tmp / "ids.parquet", rows.select("id"), spec.spill_codec)
        batch, rows = rows, None  # the stages' output replaces the read rows in memory
        for i in phase.chain:
            if not batch.height:
                break
            batch = _apply(stages[i], batch, decision if i == phase.apply else None, i == phase.apply, stats, out)
        if phase.collect is not None and batch.height:
            stage = stages[phase.collect]
            t0 = time.perf_counter()
            in_scope, _ = _scope(stage, batch)
            if in_scope.height:
                out.write_keys(stage.collect(in_scope))  # type: ignore[attr-defined]
            stats.setdefault(stage.ctx.stage_id, StageStats()).seconds += time.perf_counter() - t0
        if not batch.height:
            continue
        if phase.final and not spec.ordered:
            out.write_shard_rows(batch)
        elif phase.final and "split" in batch.columns:
            is_val = (pl.col("split") == "val").fill_null(False)  # null: a source the split was not scoped to
            out.write_shard_rows(batch.filter(is_val))
            out.write_rows(batch.filter(~is_val))
        else:
            out.write_rows(batch)


def _apply(
    stage: Stage,
    batch: pl.DataFrame,
    decision: pl.DataFrame | None,
    planned: bool,
    stats: dict[str, StageStats],
    out: _Outputs,
) -> pl.DataFrame:
    sid = stage.ctx.stage_id
    t0 = time.perf_counter()
    in_scope, passed = _scope(stage, batch)
    if not in_scope.height and passed is not None:  # every row is out of the stage's scope: it sees none
        stats.setdefault(sid, StageStats()).add_batch(passed, passed, passed.head(0), 0)
        return passed.with_columns(_columns_added(stage, in_scope, decision, planned))
    result = stage.apply(in_scope, decision) if planned else stage.apply(in_scope)
    elapsed = time.perf_counter() - t0
    kept, rejected = validate_rows(result.kept, where=sid), result.rejected
    if in_scope.height + result.repeats != kept.height + rejected.height:
        raise StageError(
            f"stage {sid} lost rows: {in_scope.height} in + {result.repeats} repeats != "
            f"{kept.height} kept + {rejected.height} rejected; a stage must keep or reject every row"
        )
    if rejected.height:
        bad = set(rejected["reason"].unique().to_list()) - set(stage.reasons)
        if bad:
            raise StageError(
                f"stage {sid} gave reason(s) {sorted(map(str, bad))} not declared in {type(stage).__name__}.reasons"
            )
    s = stats.setdefault(sid, StageStats())
    s.add_batch(in_scope, kept, rejected, result.repeats)
    s.seconds += elapsed
    s.counters.update(result.counters)
    out.write_rejects(rejected, sid)
    if passed is not None and passed.height:
        s.add_batch(passed, passed, passed.head(0), 0)  # out of scope: counted as passing through
        kept = pl.concat([kept, passed], how="diagonal_relaxed")
    return kept


def _columns_added(stage: Stage, empty: pl.DataFrame, decision: pl.DataFrame | None, planned: bool) -> list[pl.Expr]:
    """The columns ``stage`` adds to its rows (a score, metrics), as nulls of their types: rows out of its scope get
    them too, so every shard of the job has the same columns (a batch of both gets them from the concatenation)."""
    try:
        kept = (stage.apply(empty, decision) if planned else stage.apply(empty)).kept
    except StageError:  # a barrier no row reached has no plan to apply: then no shard gets its columns either
        return []
    return [pl.lit(None, dtype).alias(name) for name, dtype in kept.schema.items() if name not in empty.columns]


def _scope(stage: Stage, batch: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame | None]:
    """Rows the stage is scoped to (its ``sources``), and the rest, which pass untouched."""
    sources = stage.config.sources
    if sources is None:
        return batch, None
    mask = pl.col("source").is_in(sources)
    return batch.filter(mask), batch.filter(~mask)


def _finish(
    spec: TaskSpec, out: _Outputs, stats: dict[str, StageStats], skipped: list[dict], final: Path
) -> dict[str, Any]:
    for name in ("rows", "keys", "rejects", "val", "ids"):
        if getattr(out, name) is not None:
            getattr(out, name).close()
    shards = []
    for split in sorted(out.shards):
        shards.extend(out.shards[split].close())
    if out.rows is not None and spec.phase.final:
        sort_task_rows(out.tmp / "rows.parquet", spec.spill_codec)  # ordered output (curate.ordered)
    rejects = []
    if out.rejects is not None:
        rename_into_place(out.reject_tmp, out.reject_tmp.with_name(out.reject_name))
        rejects.append({"path": f"rejects/{out.reject_name}", "rows": out.rejects_written})
    result = {
        "stats": {k: v.to_json() for k, v in stats.items()},
        "shards": [{**s, "path": str(Path(s["path"]).relative_to(spec.job.output_dir))} for s in shards],
        "rejects": rejects,
        "skipped_files": skipped,
        "rows_written": out.rows_written,
        "rows_bytes": out.rows_bytes,
        "val": {"rows": out.val_rows, "bytes": out.val_bytes},
    }
    result["worker"] = worker_info()  # where it ran: host, pid, and under Ray its task, worker and node ids
    write_json_atomic(out.tmp / TASK_MARKER, result, indent=None)
    rename_into_place(out.tmp, final)
    if spec.work.remote:  # shards and rejects first, the task folder with its marker last
        spec.work.publish_outputs()
        spec.work.publish_folder(final, marker=TASK_MARKER)
    return result
