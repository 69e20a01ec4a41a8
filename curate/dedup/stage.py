"""``DedupBarrier``: what exact and MinHash dedup share as barriers.

``collect`` starts from the columns every keep policy needs (``id``, ``source``, ``_len``
and ``quality``, null when the batch has no scores); ``apply`` rejects this task's dropped ids with the
stage's single reason and ``duplicate_of`` set, keeping row order.
"""

from __future__ import annotations

import logging
from typing import ClassVar

import polars as pl

from winnow.curate.schema import empty_rejects, make_rejects
from winnow.curate.stages.base import Barrier, Plan, StageOutput

log = logging.getLogger(__name__)


class DedupBarrier(Barrier):
    """Base of the dedup stages: subclasses add their hash columns and the global grouping."""

    reason: ClassVar[str]
    releases_gil = True  # hashing in nogil numba kernels, grouping and joins in polars

    @staticmethod
    def policy_columns(batch: pl.DataFrame) -> pl.DataFrame:
        """Per-row columns the keep policies read: id, source, character length, quality.

        ``quality`` is always present (null when the batch has no scores) so that every
        task's spill has the same schema.
        """
        quality = pl.col("quality").cast(pl.Float64) if "quality" in batch.columns else pl.lit(None, dtype=pl.Float64)
        length = pl.col("text").fill_null("").str.len_chars().cast(pl.Int64)
        return batch.select(pl.col("id"), pl.col("source"), length.alias("_len"), quality.alias("quality"))

    def warn_unscored(self, keys: pl.LazyFrame) -> None:
        """Say so when ``keep = "quality"`` finds no row with a ``quality`` score: every group then keeps its lowest id
        (a score stage writing another ``column``, or none before the dedup)."""
        if self.config.keep == "quality" and not keys.select(pl.col("quality").is_not_null().any()).collect().item():
            log.warning(
                "%s: keep = 'quality', but no row has a quality score, so each group keeps its lowest id: put a score "
                "stage writing column = 'quality' before it, or set keep = 'first' or 'longest'",
                self.ctx.stage_id,
            )

    @staticmethod
    def has_keys(keys: pl.LazyFrame) -> bool:
        """False when no task spilled keys (the runner then passes a frame with only id and _task)."""
        return "_len" in keys.collect_schema().names()

    @staticmethod
    def no_duplicates() -> Plan:
        """The plan when there is nothing to compare."""
        decision = pl.DataFrame(schema={"id": pl.String, "_task": pl.Int32, "duplicate_of": pl.String})
        return Plan(
            decision,
            {"documents": 0, "clusters": 0, "removed": 0, "removed_per_source": {}, "cross_source_duplicates": {}},
        )

    DOC_COLUMNS: ClassVar[tuple[str, ...]] = ("id", "source", "_task", "_len", "quality")

    def apply(self, batch: pl.DataFrame, decision: pl.DataFrame | None = None) -> StageOutput:  # type: ignore[override]
        if decision is None or decision.height == 0 or batch.height == 0:
            return StageOutput(batch, empty_rejects(batch))
        # A mask, not a join of the whole batch: the text is copied once (into the kept rows).
        dropped = batch["id"].is_in(decision["id"].implode())
        if not dropped.any():
            return StageOutput(batch, empty_rejects(batch))
        kept = batch.filter(~dropped)
        marked = batch.filter(dropped).join(decision.select("id", pl.col("duplicate_of").alias("__dup")), on="id", how="left",
                                            maintain_order="left")  # fmt: skip
        rejected = make_rejects(marked, self.reason, pl.col("__dup")).drop("__dup")
        return StageOutput(kept, rejected)
