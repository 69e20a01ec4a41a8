"""The stage contract.

A stage takes a batch (a polars DataFrame with the row schema of ``curate.schema``) and
returns the rows it keeps and the rows it rejects, each reject with a reason from the
stage's closed ``reasons`` set. Counting, timing, the nothing-is-lost check and writing
rejects live once, in the runner (``curate.pipeline``), never in a stage.

Two shapes:

* ``Stage`` — row-local: ``apply(batch)`` sees one batch at a time (filters, scores, clean).
* ``Barrier`` — needs all the data (dedup, mix, order, corpus statistics). The runner calls

  1. ``collect(batch)`` in every map task, on the rows reaching the stage; it returns small
     per-row keys (hashes, lengths, scores — never the text) that the runner spills to disk
     with an added ``_task`` column;
  2. ``plan(keys)`` once, globally, over a lazy scan of all spills; it returns a ``Plan``
     whose ``decision`` frame (keyed by ``id``, carrying ``_task``) the runner splits per
     task, and may write shared artifacts into ``ctx.plan_dir``;
  3. ``apply(batch, decision)`` in the next map phase, with that task's decision rows.

A barrier's ``plan`` must be deterministic; ``collect`` and ``apply`` must be pure
functions of the batch (and the decision), so tasks can be re-run after a crash.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import polars as pl

from winnow.curate.names import path_name
from winnow.curate.schema import empty_rejects
from winnow.curate.stats import CounterKey


@dataclass(kw_only=True, slots=True)
class StageConfig:
    """Base of every stage's config; subclasses add fields with defaults and validate in ``__post_init__``.

    ``sources`` scopes a stage to some sources (e.g. prose filters on web text only); rows of
    other sources pass it untouched. The runner applies the scope, so stages never see it.

    ``SOURCE_KEYS`` names the keys whose values (or table keys) are source names: the job file
    checks each against the sources its inputs declare, so a misspelt name is an error, not a
    stage that silently never runs.
    """

    SOURCE_KEYS: ClassVar[tuple[str, ...]] = ("sources",)
    SCOPED: ClassVar[bool] = True  # False: the stage acts on the whole mixture, and refuses ``sources``
    # run the stage on these sources only (rows of others pass it untouched); None: every source
    sources: list[str] | None = None


@dataclass(kw_only=True, slots=True)
class StageContext:
    """Runtime facts a stage may need; built by the runner, never from the job file directly."""

    stage_id: str  # stable, e.g. "03.dedup.minhash"; keys stats and folders
    job_name: str
    output_dir: Path  # the job's output folder; artifacts a user keeps go under artifacts_dir
    plan_dir: Path  # a barrier's global artifacts (written in plan, read in apply)
    sources: tuple[str, ...]  # source names declared by the job's inputs (source_field sources appear at run time)
    seed: int = 0
    memory_gb: float = 4.0  # [job] memory_gb: what a barrier's plan may hold (curate.dedup.budget)
    workers: int = 1  # [job] workers: tasks at once; a plan may use as many threads

    @property
    def artifacts_dir(self) -> Path:
        return self.output_dir / "artifacts" / path_name(self.stage_id)  # a plugin's kind may be any entry-point name


@dataclass(slots=True)
class StageOutput:
    """What a stage returns for one batch."""

    kept: pl.DataFrame
    rejected: pl.DataFrame  # same columns as kept plus ``reason`` and ``duplicate_of``
    repeats: int = 0  # extra copies in ``kept`` (up-sampling); the runner checks in + repeats == kept + rejected
    counters: dict[CounterKey, float] = field(default_factory=dict)  # summed over batches and tasks; keys are data


#: One task's decision rows (without ``_task``), made from that task's keys (None: the task spilled none).
TaskDecision = Callable[[int, "pl.LazyFrame | None"], pl.DataFrame]


@dataclass(slots=True)
class Plan:
    """What a barrier's global step returns.

    A plan whose decision has a row per document (mix, order) gives ``per_task`` instead of
    ``decision``: the runner calls it task by task with that task's keys, so no process holds
    the decision of the whole job.
    """

    decision: pl.DataFrame | None  # per-row decisions with ``id`` and ``_task``; None when apply needs none
    report: dict[str, Any] = field(default_factory=dict)  # JSON-able, lands in the manifest under the stage id
    per_task: TaskDecision | None = None
    # scratch that ``per_task`` reads; the runner removes it once every task's part is written
    spill: Path | None = None

    def gather(self, keys: pl.LazyFrame) -> pl.DataFrame | None:
        """The whole decision with ``_task`` (for small jobs and tests): ``per_task`` over every task of ``keys``."""
        if self.per_task is None:
            return self.decision
        tasks = keys.select(pl.col("_task").unique().sort()).collect().to_series().to_list()
        parts = [
            self.per_task(t, keys.filter(pl.col("_task") == t)).with_columns(pl.lit(t, pl.Int32).alias("_task"))
            for t in tasks
        ]
        return pl.concat(parts) if parts else self.per_task(0, None).with_columns(pl.lit(0, pl.Int32).alias("_task"))


class Stage(ABC):
    """A row-local stage."""

    kind: ClassVar[str]
    Config: ClassVar[type[StageConfig]] = StageConfig
    #: Every reason this stage may give, in full (``"filter:gopher_mean_word_length"``).
    reasons: ClassVar[tuple[str, ...]] = ()
    #: Whether this stage ranks the train rows (an ``order`` column, 0..N-1): the runner then
    #: writes train shards in that rank (``curate.ordered``) instead of per task.
    orders_output: ClassVar[bool] = False
    #: Whether the stage's per-batch work (``apply``, a barrier's ``collect``) runs outside the
    #: GIL (compiled kernels with ``nogil``, polars, Arrow) and its instances share no mutable
    #: state: a local job may then run a phase made of such stages as threads of one process
    #: instead of worker processes (``curate.pipeline.Runner.threaded``).
    releases_gil: ClassVar[bool] = False
    #: The format of what the stage spills and plans (keys, plan files). Raise it when a change makes a
    #: work folder's keys or plans from before it wrong for the new code: it is part of the job's
    #: fingerprint and phase keys (``identity``), so such a folder is started clean, not resumed.
    artifacts: ClassVar[int] = 1

    @classmethod
    def identity(cls) -> str:
        """What names this stage's code in a job's fingerprint and phase keys: its class, and its ``artifacts``
        format where that was raised."""
        name = f"{cls.__module__}.{cls.__qualname__}"
        return name if cls.artifacts == 1 else f"{name}/{cls.artifacts}"

    def __init__(self, config: StageConfig, ctx: StageContext) -> None:
        self.config = config
        self.ctx = ctx

    @classmethod
    def is_barrier(cls, config: StageConfig) -> bool:
        """Whether this configuration needs the collect → plan → apply protocol."""
        return False

    @abstractmethod
    def apply(self, batch: pl.DataFrame) -> StageOutput:
        """Split ``batch`` into kept and rejected rows."""

    # Helpers for subclasses -------------------------------------------------------------
    @staticmethod
    def keep_all(batch: pl.DataFrame, **counters: float) -> StageOutput:
        return StageOutput(batch, empty_rejects(batch), counters=dict(counters))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.ctx.stage_id}, {self.config})"


class Barrier(Stage):
    """A stage that needs a global view: collect keys per task, plan once, apply per task.

    A barrier class may answer ``is_barrier(config) = False`` for configurations that need
    no global view; the runner then calls ``apply(batch)`` with no decision, as for any stage.
    """

    @classmethod
    def is_barrier(cls, config: StageConfig) -> bool:
        return True

    @abstractmethod
    def collect(self, batch: pl.DataFrame) -> pl.DataFrame:
        """Small per-row keys of ``batch`` (must include ``id``), spilled by the runner."""

    @abstractmethod
    def plan(self, keys: pl.LazyFrame) -> Plan:
        """Global decision from every task's keys (``keys`` has an added ``_task`` column)."""

    @abstractmethod
    def apply(self, batch: pl.DataFrame, decision: pl.DataFrame | None = None) -> StageOutput:  # type: ignore[override]
        """Apply this task's part of the decision to ``batch``."""
