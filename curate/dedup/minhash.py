"""``dedup.minhash``: near-duplicate removal with MinHash LSH and an exact Jaccard check.

collect (per task): normalized text -> word (or character) n-gram shingles -> MinHash
signature -> one uint64 key per LSH band (columns ``_band_0..``), plus each document's
32-bit shingle hashes (``_shingles``, one binary value per document) when candidates are verified.
plan (once): candidate pairs band by band, sort-based (``curate.dedup.lsh``); exact Jaccard
of each candidate (``curate.dedup.verify``); connected components; one kept row per cluster.

With ``verify = "all"`` (the default) the LSH is tuned loose, for a lower similarity
(``lsh_threshold``, default ``threshold - 0.3``), so that almost no pair at ``threshold`` is
missed, and the exact check removes the false positives: precision and recall against
exact Jaccard both come out near 1, where a tight LSH alone loses several percent of each.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import numpy as np
import polars as pl

from winnow.curate.dedup.clusters import KEEP_POLICIES, KeepPolicy, choose_keepers, cluster_report, decision_frame
from winnow.curate.dedup.grouping import GroupOptions, group
from winnow.curate.dedup.kernels import IDENTITY, PLAIN_SEP
from winnow.curate.dedup.lsh import candidate_probability, choose_bands, lsh_pairs
from winnow.curate.dedup.signatures import sketch_buffers
from winnow.curate.dedup.stage import DedupBarrier
from winnow.curate.dedup.text import (
    AltRows,
    Normalization,
    check_normalization,
    no_alt_rows,
    normalized_buffers,
    word_buffers,
)
from winnow.curate.dedup.verify import (
    SETS_COLUMN,
    SIG8_COLUMN,
    pack_sets,
    pack_sig8,
    sampled_false_positive_rate,
    verify_pairs,
)
from winnow.curate.errors import ConfigError
from winnow.curate.stages.base import Plan, StageConfig

log = logging.getLogger(__name__)


MAX_PERM = 1024  # signature slots: the LSH shape search and the signatures grow with them


@dataclass(kw_only=True, slots=True)
class MinHashConfig(StageConfig):
    """Options of ``dedup.minhash``; ``kind = "dedup.minhash"`` alone gives P and R >= 0.98 at 0.8."""

    threshold: float = 0.8  # Jaccard similarity at or above which two documents are duplicates
    ngram: int = 5  # shingle length, in words (or characters with shingle = "chars")
    shingle: Literal["words", "chars"] = "words"  # shingles of ngram words, or of ngram characters
    # text normalization before shingling: none, whitespace, lower, or words (lowercased, punctuation dropped)
    normalize: Normalization = "words"
    num_perm: int = 128  # signature slots (at most 1024)
    scheme: Literal["permutations", "oph"] = "oph"  # k permutations, or one permutation + densification
    bands: int | None = None  # LSH bands; with rows, overrides the search below
    rows: int | None = None  # LSH rows per band; with bands, overrides the search
    lsh_threshold: float | None = None  # similarity the LSH is tuned for; default threshold - 0.3 when verify = "all"
    # weight of false positives in the band search (as datasketch's MinHashLSH weighs them)
    false_positive_weight: float = 0.5
    false_negative_weight: float = 0.5  # weight of false negatives in the band search
    # exact Jaccard of all candidates, a sample (reports FP rate), none
    verify: Literal["all", "sample", "none"] = "all"
    verify_sample: int = 10_000  # pairs checked when verify = "sample"
    verify_chunk_pairs: int = 1_000_000  # pairs checked at a time (the Python API reads their shingle sets per chunk)
    keep: KeepPolicy = "first"  # first (lowest id) | longest | quality (highest score, then lowest id)
    seed: int = 1  # seed of the hash permutations

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold < 1.0:
            raise ConfigError(f"threshold = {self.threshold} must be in (0, 1)")
        for key in ("ngram", "num_perm", "verify_sample", "verify_chunk_pairs"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key} = {getattr(self, key)} must be >= 1")
        if self.num_perm > MAX_PERM:
            raise ConfigError(
                f"num_perm = {self.num_perm} must be at most {MAX_PERM}: the similarity estimate's standard error "
                f"is at most 0.5/sqrt(num_perm), {0.5 / MAX_PERM**0.5:.3f} there, while memory and time grow with it"
            )
        if self.shingle not in ("words", "chars"):
            raise ConfigError(f"shingle = {self.shingle!r}; allowed: words, chars")
        check_normalization("normalize", self.normalize)
        if self.scheme not in ("permutations", "oph"):
            raise ConfigError(f"scheme = {self.scheme!r}; allowed: permutations, oph")
        if self.verify not in ("all", "sample", "none"):
            raise ConfigError(f"verify = {self.verify!r}; allowed: all, sample, none")
        if self.keep not in KEEP_POLICIES:
            raise ConfigError(f"keep = {self.keep!r} is not a keep policy; allowed: {', '.join(KEEP_POLICIES)}")
        if (self.bands is None) != (self.rows is None):
            raise ConfigError(f"bands = {self.bands} and rows = {self.rows}: give both or neither")
        if self.bands is not None and (self.bands < 1 or self.rows < 1 or self.bands * self.rows > self.num_perm):
            raise ConfigError(
                f"bands * rows = {self.bands} * {self.rows} must be between 1 and num_perm = {self.num_perm}"
            )
        if self.lsh_threshold is not None and not 0.0 < self.lsh_threshold < 1.0:
            raise ConfigError(f"lsh_threshold = {self.lsh_threshold} must be in (0, 1)")
        for key in ("false_positive_weight", "false_negative_weight"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ConfigError(f"{key} = {getattr(self, key)} must be in [0, 1]")
        if not 0 <= self.seed < 2**63:
            raise ConfigError(f"seed = {self.seed} must be in [0, 2**63)")

    def lsh_shape(self) -> tuple[int, int]:
        """``(bands, rows)``: as given, or searched for ``lsh_threshold``."""
        if self.bands is not None:
            return self.bands, self.rows
        target = self.lsh_threshold
        if target is None:
            target = max(self.threshold - 0.3, 0.05) if self.verify == "all" else self.threshold
        return choose_bands(
            target, self.num_perm, fp_weight=self.false_positive_weight, fn_weight=self.false_negative_weight
        )


def band_columns(bands: int) -> list[str]:
    return [f"_band_{i}" for i in range(bands)]


def text_buffers(
    texts: pl.Series, config: MinHashConfig
) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray], AltRows]:
    """What the sketch kernels read: word shingles normalize ASCII text on the fly, character shingles need it normalized."""
    if config.shingle == "words":
        return word_buffers(texts, config.normalize)
    offsets, data = normalized_buffers(texts, config.normalize)
    return offsets, data, (PLAIN_SEP, IDENTITY), no_alt_rows(len(offsets) - 1)


def minhash_keys(texts: pl.Series, config: MinHashConfig, *, with_sets: bool) -> pl.DataFrame:
    """The hash columns of ``texts``: ``_nsh`` (shingle count), ``_band_*`` and optionally ``_shingles``."""
    bands, rows = config.lsh_shape()
    offsets, data, tables, alt = text_buffers(texts, config)
    sketch = sketch_buffers(
        offsets, data, ngram=config.ngram, chars=config.shingle == "chars", num_perm=config.num_perm, scheme=config.scheme,
        seed=config.seed, bands=bands, rows=rows, want_signatures=False, want_sets=with_sets, tables=tables, alt=alt,
    )  # fmt: skip
    columns = {"_nsh": pl.Series(sketch.n_shingles, dtype=pl.UInt32)}
    for i, name in enumerate(band_columns(bands)):
        columns[name] = pl.Series(sketch.band_keys[:, i])
    if with_sets:
        columns[SETS_COLUMN] = pl.Series(pack_sets(sketch.set_offsets, sketch.set_values))
        columns[SIG8_COLUMN] = pl.Series(pack_sig8(sketch.sig8))
    return pl.DataFrame(columns)


def near_duplicate_pairs(
    keys: pl.LazyFrame, n_docs: int, usable: np.ndarray, config: MinHashConfig
) -> tuple[np.ndarray, dict]:
    """Packed duplicate pairs over the rows of ``keys`` (candidates, verified as configured) and their stats."""
    bands, rows = config.lsh_shape()
    pairs = lsh_pairs(keys, band_columns(bands), np.arange(n_docs, dtype=np.uint32), usable)
    stats = {
        "bands": bands,
        "rows": rows,
        "candidate_probability_at_threshold": float(candidate_probability(config.threshold, bands, rows)),
        "candidate_pairs": int(len(pairs)),
    }
    chunk = config.verify_chunk_pairs
    if config.verify == "all":
        pairs = verify_pairs(keys, pairs, threshold=config.threshold, chunk_pairs=chunk)
        stats["verified_pairs"] = int(len(pairs))
    elif config.verify == "sample":
        checked, rate = sampled_false_positive_rate(
            keys, pairs, threshold=config.threshold, sample=config.verify_sample, seed=config.seed, chunk_pairs=chunk
        )
        stats.update(sampled_pairs=checked, estimated_false_positive_rate=rate)
    return pairs, stats


class MinHashDedup(DedupBarrier):
    """Keeps one document per cluster of near-duplicates (Jaccard of shingle sets >= threshold)."""

    kind = "dedup.minhash"
    Config = MinHashConfig
    reasons = ("dedup:minhash",)
    reason = "dedup:minhash"
    config: MinHashConfig

    def collect(self, batch: pl.DataFrame) -> pl.DataFrame:
        hashes = minhash_keys(batch["text"], self.config, with_sets=self.config.verify != "none")
        return pl.concat([self.policy_columns(batch), hashes], how="horizontal")

    def plan(self, keys: pl.LazyFrame) -> Plan:
        if not self.has_keys(keys):
            return self.no_duplicates()
        config = self.config
        self.warn_unscored(keys)
        bands, rows = config.lsh_shape()
        options = GroupOptions(
            verify=config.verify, threshold=config.threshold, chunk_pairs=config.verify_chunk_pairs,
            sample=config.verify_sample, seed=config.seed, memory_gb=self.ctx.memory_gb, stage=self.ctx.stage_id,
            workers=self.ctx.workers,
        )  # fmt: skip
        grouped = group(keys, band_columns(bands), options, folder=self.ctx.plan_dir / "minhash")
        n_docs = keys.select(pl.len()).collect().item()
        members = (
            keys.select(*self.DOC_COLUMNS).with_row_index("_row")
            .join(grouped.labels.lazy(), on="_row", how="inner").drop("_row").collect()
        )  # fmt: skip
        dropped = choose_keepers(members, config.keep)
        n_clusters = members["_cluster"].n_unique() if members.height else 0
        stats = {"bands": bands, "rows": rows, "candidate_probability_at_threshold": float(candidate_probability(config.threshold, bands, rows)),
                 **grouped.stats}  # fmt: skip
        report = {**cluster_report(dropped, n_clusters, n_docs), **stats}
        log.info(
            "%s: %d near-duplicates in %d clusters over %d documents",
            self.ctx.stage_id,
            dropped.height,
            n_clusters,
            n_docs,
        )
        return Plan(decision_frame(dropped).sort("id"), report)
