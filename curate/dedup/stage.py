"""``DedupBarrier``: what exact and MinHash dedup share as barriers.

``collect`` starts from the columns every keep policy needs (``id``, ``source``, ``_len``
and ``quality`` when the batch has it); ``apply`` rejects this task's dropped ids with the
stage's single reason and ``duplicate_of`` set, keeping row order.
"""

from __future__ import annotations

from typing import ClassVar

import polars as pl

from curate.schema import empty_rejects, make_rejects
from curate.stages.base import Barrier, StageOutput


class DedupBarrier(Barrier):
    """Base of the dedup stages: subclasses add their hash columns and the global grouping."""

    reason: ClassVar[str]

    @staticmethod
    def policy_columns(batch: pl.DataFrame) -> pl.DataFrame:
        """Per-row columns the keep policies read: id, source, character length, quality."""
        columns = [pl.col("id"), pl.col("source"), pl.col("text").fill_null("").str.len_chars().cast(pl.Int64).alias("_len")]
        if "quality" in batch.columns:
            columns.append(pl.col("quality").cast(pl.Float64))
        return batch.select(columns)

    @staticmethod
    def doc_columns(keys: pl.LazyFrame, *extra: str) -> list[str]:
        """The per-document columns ``plan`` reads besides the hashes."""
        names = keys.collect_schema().names()
        return ["id", "source", "_task", "_len", *extra, *(["quality"] if "quality" in names else [])]

    def apply(self, batch: pl.DataFrame, decision: pl.DataFrame | None = None) -> StageOutput:  # type: ignore[override]
        if decision is None or decision.height == 0 or batch.height == 0:
            return StageOutput(batch, empty_rejects(batch))
        marked = batch.join(decision.select("id", pl.col("duplicate_of").alias("__dup")), on="id", how="left", maintain_order="left")
        dropped = pl.col("__dup").is_not_null()
        kept = marked.filter(~dropped).drop("__dup")
        rejected = make_rejects(marked.filter(dropped), self.reason, pl.col("__dup")).drop("__dup")
        return StageOutput(kept, rejected)
