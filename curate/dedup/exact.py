"""``dedup.exact``: drop documents whose normalized text is identical to another's, across all sources.

Each row is keyed by the 128-bit MurmurHash3 of its normalized text (two uint64 columns);
``plan`` groups the keys of every task with polars, one hash partition (``_h1 % parts``,
as many as ``[job] memory_gb`` needs: ``curate.dedup.budget``) at a time, and keeps one row
per group by the keep policy. With 10**9 documents the chance of any 128-bit collision is about 10**-21.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import polars as pl

from winnow.curate.dedup.budget import EXACT_BYTES, partitions
from winnow.curate.dedup.clusters import KEEP_POLICIES, KeepPolicy, choose_keepers, cluster_report, decision_frame
from winnow.curate.dedup.kernels import hash128_column
from winnow.curate.dedup.stage import DedupBarrier
from winnow.curate.dedup.text import Normalization, check_normalization, normalized_buffers
from winnow.curate.errors import ConfigError
from winnow.curate.stages.base import Plan, StageConfig

log = logging.getLogger(__name__)


@dataclass(kw_only=True, slots=True)
class ExactConfig(StageConfig):
    """Options of ``dedup.exact``."""

    # what counts as the same text: none (bytes), whitespace (runs of spaces collapsed), lower (and lowercased), words
    # (and punctuation dropped)
    normalize: Normalization = "whitespace"
    keep: KeepPolicy = "first"  # first (lowest id) | longest | quality (highest score, then lowest id)
    seed: int = 0  # hash seed; changing it changes nothing but the hash values

    def __post_init__(self) -> None:
        check_normalization("normalize", self.normalize)
        if self.keep not in KEEP_POLICIES:
            raise ConfigError(f"keep = {self.keep!r} is not a keep policy; allowed: {', '.join(KEEP_POLICIES)}")
        if not 0 <= self.seed < 2**64:
            raise ConfigError(f"seed = {self.seed} must be in [0, 2**64)")


def text_hashes(texts: pl.Series, *, normalize: str = "whitespace", seed: int = 0) -> pl.DataFrame:
    """``_h1``/``_h2``: the two uint64 halves of each text's 128-bit hash after normalization.

    A text that normalization empties but whitespace alone does not (only emoji or symbols, under ``words``) is
    hashed as it is, under another seed: otherwise every such text would be the duplicate of every other, where
    empty and blank texts stay duplicates of each other."""
    offsets, data = normalized_buffers(texts, normalize)
    hi, lo = hash128_column(offsets, data, seed)
    emptied = (np.diff(offsets) == 0) & (texts.fill_null("").str.strip_chars().str.len_bytes() > 0).to_numpy()
    if normalize != "none" and emptied.any():
        raw_hi, raw_lo = hash128_column(*normalized_buffers(texts.filter(pl.Series(emptied)), "none"), seed ^ 1)
        hi, lo = hi.copy(), lo.copy()
        hi[emptied], lo[emptied] = raw_hi, raw_lo
    return pl.DataFrame({"_h1": hi, "_h2": lo})


class ExactDedup(DedupBarrier):
    """Keeps one document per group of identical normalized texts."""

    kind = "dedup.exact"
    Config = ExactConfig
    reasons = ("dedup:exact",)
    reason = "dedup:exact"
    config: ExactConfig

    def collect(self, batch: pl.DataFrame) -> pl.DataFrame:
        hashes = text_hashes(batch["text"], normalize=self.config.normalize, seed=self.config.seed)
        return pl.concat([self.policy_columns(batch), hashes], how="horizontal")

    def plan(self, keys: pl.LazyFrame) -> Plan:
        if not self.has_keys(keys):
            return self.no_duplicates()
        self.warn_unscored(keys)
        n_docs = keys.select(pl.len()).collect().item()
        # Groups are wholly inside one hash partition, so partitioning changes nothing but memory.
        parts = partitions(
            n_docs, EXACT_BYTES, self.ctx.memory_gb, what=f"{self.ctx.stage_id}'s groups over {n_docs} documents"
        )
        dropped, n_clusters = [], 0
        for part in range(parts):
            scan = keys.filter(pl.col("_h1") % parts == part) if parts > 1 else keys
            docs = scan.select(*self.DOC_COLUMNS, "_h1", "_h2").filter(pl.len().over("_h1", "_h2") > 1).collect()
            members = docs.with_columns(pl.struct("_h1", "_h2").rank("dense").alias("_cluster")).drop("_h1", "_h2")
            n_clusters += members["_cluster"].n_unique() if members.height else 0
            dropped.append(choose_keepers(members, self.config.keep))
        dropped = pl.concat(dropped).sort("id")
        report = {**cluster_report(dropped, n_clusters, n_docs), "partitions": parts}
        log.info(
            "%s: %d exact duplicates in %d groups over %d documents",
            self.ctx.stage_id,
            dropped.height,
            n_clusters,
            n_docs,
        )
        return Plan(decision_frame(dropped), report)
