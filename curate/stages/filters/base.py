"""``RuleFilter``: the shared shape of every heuristic filter.

A filter computes metric columns for a whole batch (``metrics``) and lists its rules as
``(reason, condition)`` pairs over those columns (``rules``), where the condition is true
for rows the rule rejects. A row is rejected with the first rule that fires, so each
reject has exactly one reason; rules whose threshold is ``None`` are left out by the
subclass. Metric columns are kept on the rows when ``keep_metrics = true``.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass

import polars as pl

from winnow.curate.errors import StageError
from winnow.curate.schema import make_rejects
from winnow.curate.stages.base import Stage, StageConfig, StageOutput


@dataclass(kw_only=True, slots=True)
class FilterConfig(StageConfig):
    """Options every filter has."""

    keep_metrics: bool = False  # keep metric columns on kept and rejected rows, to tune thresholds


class RuleFilter(Stage):
    """Base class: subclasses implement ``metrics`` and ``rules``."""

    config: FilterConfig

    @abstractmethod
    def metrics(self, batch: pl.DataFrame) -> pl.DataFrame:
        """Metric columns for ``batch`` (same height, names unique to this filter)."""

    @abstractmethod
    def rules(self) -> list[tuple[str, pl.Expr]]:
        """``(reason, rejects_when)`` pairs, in the order they are checked."""

    def beside(self, batch: pl.DataFrame, metrics: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, str]]:
        """``batch`` with the ``metrics`` columns beside it, and the renames that undo what was set aside.

        A row field with a metric's name (an input's ``keep_fields``) is set aside under another name while the
        rules read the metric, and comes back once the metrics are dropped; with ``keep_metrics`` both would
        be written, so that is refused.
        """
        taken = [c for c in metrics.columns if c in batch.columns]
        if taken and self.config.keep_metrics:
            raise StageError(
                f"{self.ctx.stage_id}: keep_metrics would write the column(s) {taken}, which the rows already hold "
                "(an input's keep_fields, or an earlier stage's metrics); set keep_metrics = false, or drop them "
                "from keep_fields"
            )
        aside = {c: f"__row_{c}" for c in taken}
        return pl.concat([batch.rename(aside), metrics], how="horizontal"), {v: k for k, v in aside.items()}

    def apply(self, batch: pl.DataFrame) -> StageOutput:
        metrics = self.metrics(batch)
        df, back = self.beside(batch, metrics)
        rules = self.rules()
        if rules:
            reason = pl.coalesce(
                [pl.when(cond.fill_null(False)).then(pl.lit(name, dtype=pl.String)) for name, cond in rules]
            )
        else:
            reason = pl.lit(None, dtype=pl.String)
        df = df.with_columns(reason.alias("__reason"))
        if not self.config.keep_metrics:
            df = df.drop(metrics.columns).rename(back)
        rejected = df.filter(pl.col("__reason").is_not_null())
        kept = df.filter(pl.col("__reason").is_null()).drop("__reason")
        return StageOutput(kept, make_rejects(rejected, pl.col("__reason")).drop("__reason"))
