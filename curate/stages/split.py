"""``split``: hold out a validation set per source, chosen by a hash of the row id.

A row is held out when the hash of its id falls in the lowest part of the hash range:
below ``fraction`` of it, or among the ``rows`` smallest hashes of its source (a count
needs a global view, so ``Split`` is a barrier). The choice depends on
nothing but the id and ``seed``: it is stable across re-runs, across changes to other
sources, and a smaller held-out set is always a subset of a larger one. The ``split``
column (``train`` / ``val``) routes rows to ``shards/<format>/train`` and ``shards/<format>/val``;
``mix`` and ``order`` pass ``val`` rows through untouched, so every source keeps its own
held-out set for the trainer's per-source held-out loss.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import polars as pl

from winnow.curate.errors import ConfigError, StageError
from winnow.curate.schema import empty_rejects
from winnow.curate.stages.base import Barrier, Plan, StageConfig, StageOutput
from winnow.curate.stages.mixing.hashing import hash_strings, seed_key

log = logging.getLogger(__name__)

_MAX = float(2**64)


@dataclass(kw_only=True, slots=True)
class SplitConfig(StageConfig):
    """Per source, the first of these that names it wins: ``val_rows_by_source``,
    ``val_fraction_by_source``, ``val_rows``, ``val_fraction``."""

    SOURCE_KEYS: ClassVar[tuple[str, ...]] = ("sources", "val_fraction_by_source", "val_rows_by_source")

    val_fraction: float = 0.01  # share of each source's rows held out as val
    val_rows: int | None = None  # a row count for every source instead of a fraction
    val_fraction_by_source: dict[str, float] = field(default_factory=dict)  # source -> its own val fraction
    val_rows_by_source: dict[str, int] = field(default_factory=dict)  # source -> its own val row count
    seed: int = 0  # changes which rows are held out; independent of the job seed on purpose

    def __post_init__(self) -> None:
        fractions = {"val_fraction": self.val_fraction} | {
            f"val_fraction_by_source.{k}": v for k, v in self.val_fraction_by_source.items()
        }
        for key, v in fractions.items():
            if not 0.0 <= v <= 1.0:
                raise ConfigError(f"split.{key} = {v!r} is invalid; allowed: a fraction in [0, 1]")
        if self.val_fraction == 1.0 and self.val_rows is None and not self.val_fraction_by_source:
            raise ConfigError(
                "split.val_fraction = 1.0 holds out every row of every source, leaving no training rows; "
                "to hold out whole sources set val_fraction_by_source.<source> = 1.0, or lower val_fraction"
            )
        counts = {"val_rows": self.val_rows} | {
            f"val_rows_by_source.{k}": v for k, v in self.val_rows_by_source.items()
        }
        for key, v in counts.items():
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ConfigError(f"split.{key} = {v!r} is invalid; allowed: a row count >= 0")

    @property
    def uses_counts(self) -> bool:
        return self.val_rows is not None or bool(self.val_rows_by_source)

    def fraction_for(self, source: str) -> float:
        return self.val_fraction_by_source.get(source, self.val_fraction)

    def rows_for(self, source: str) -> int | None:
        """The held-out row count for ``source``, or None when a fraction applies."""
        if source in self.val_rows_by_source:
            return self.val_rows_by_source[source]
        return None if source in self.val_fraction_by_source else self.val_rows


class Split(Barrier):
    """Marks each row ``train`` or ``val`` by the hash of its id.

    A barrier when row counts are asked for (they need the k smallest hashes of each
    source); with fractions only it runs row-local, and the held-out rows per source are
    in its counters (``("val_rows", source)``).
    """

    kind = "split"
    Config = SplitConfig
    reasons = ()
    config: SplitConfig

    @classmethod
    def is_barrier(cls, config: SplitConfig) -> bool:  # type: ignore[override]
        """Only row counts need the global view; fractions are decided row by row (one pass fewer)."""
        return config.uses_counts

    def _hashes(self, ids: pl.Series) -> np.ndarray:
        return hash_strings(ids, seed_key("split", self.config.seed))

    def _mark(self, batch: pl.DataFrame, is_val: np.ndarray) -> StageOutput:
        if "split" in batch.columns:
            log.warning("%s: rows already carry a split column; it is replaced", self.ctx.stage_id)
        out = batch.with_columns(pl.Series("split", np.where(is_val, "val", "train"), dtype=pl.String))
        counts = out.group_by("source", "split").len()
        counters = {(f"{row['split']}_rows", row["source"]): float(row["len"]) for row in counts.iter_rows(named=True)}
        return StageOutput(out, empty_rejects(out), counters=counters)

    def collect(self, batch: pl.DataFrame) -> pl.DataFrame:
        return batch.select("id", "source").with_columns(pl.Series("_h", self._hashes(batch["id"]), dtype=pl.UInt64))

    def plan(self, keys: pl.LazyFrame) -> Plan:
        if "source" not in keys.collect_schema().names():  # no rows reached the stage
            return Plan(pl.DataFrame(schema={"id": pl.String, "_task": pl.Int32}), {"sources": {}})
        df = keys.select("id", "source", "_h", "_task").collect()
        names = sorted(df["source"].unique().to_list())
        rows = {n: self.config.rows_for(n) for n in names}
        frac = {n: self.config.fraction_for(n) * _MAX for n in names}
        # Rank ties (equal hashes mean equal ids) fall back to the id so the plan is order-free.
        rank = pl.struct("_h", "id").rank("ordinal").over("source") - 1
        by_count = pl.col("source").replace_strict(rows, default=None, return_dtype=pl.Int64)
        by_frac = pl.col("_h").cast(pl.Float64) < pl.col("source").replace_strict(frac, return_dtype=pl.Float64)
        is_val = pl.when(by_count.is_not_null()).then(rank < by_count).otherwise(by_frac)
        df = df.with_columns(is_val.alias("_val"))
        per_source = (
            df.group_by("source").agg(pl.len().alias("rows"), pl.col("_val").sum().alias("val_rows")).sort("source")
        )
        report = {
            r["source"]: {
                "rows": r["rows"],
                "val_rows": r["val_rows"],
                "rule": "rows" if rows[r["source"]] is not None else "fraction",
            }
            for r in per_source.iter_rows(named=True)
        }
        short = [s for s, r in report.items() if rows[s] is not None and r["val_rows"] < rows[s]]
        if short:
            log.warning(
                "%s: sources %s have fewer rows than their val_rows; all of them are held out", self.ctx.stage_id, short
            )
        return Plan(df.filter("_val").select("id", "_task"), {"sources": report})

    def apply(self, batch: pl.DataFrame, decision: pl.DataFrame | None = None) -> StageOutput:  # type: ignore[override]
        """Mark the rows the plan held out; without a plan, only the fraction rule can be applied."""
        if decision is not None:
            return self._mark(batch, batch["id"].is_in(decision["id"].implode()).to_numpy())
        if self.config.uses_counts:
            raise StageError(
                f"{self.ctx.stage_id}: val_rows needs the global plan; run split through the pipeline (as a barrier)"
            )
        sources = batch["source"]
        names = sources.unique().to_list()
        limit = sources.replace_strict(
            names, [self.config.fraction_for(n) * _MAX for n in names], return_dtype=pl.Float64
        )
        return self._mark(batch, self._hashes(batch["id"]).astype(np.float64) < limit.to_numpy())
