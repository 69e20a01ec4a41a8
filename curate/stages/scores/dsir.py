"""``score.dsir``: DSIR importance weights toward a target source, for the mix stage's resampling.

Data Selection with Importance Resampling (Xie et al. 2023, https://arxiv.org/abs/2302.03169):
fit two bag-of-hashed-n-grams models (unigrams + bigrams, ``buckets`` = 10,000 as in the
paper), one on the target source and one on the raw pool (every source, target included),
each a multinomial over buckets with add-``smoothing`` counts. A document's log importance
weight is ``sum over its n-grams f of log p_target(f) - log p_raw(f)``; with ``per_token`` it
is divided by the number of n-grams, so long documents do not dominate resampling.

* ``collect`` spills ``id``, ``source`` and the bucket ids of each document's first
  ``max_tokens`` tokens (never the text); ``plan`` streams them into two count vectors
  (memory: two ``buckets``-long arrays) and saves both models as artifacts
  (``artifacts/<stage>/dsir_target.npz``, ``dsir_raw.npz``);
* ``apply`` writes the log weight of every document (all its tokens) into ``column``.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import polars as pl

from winnow.curate.errors import ConfigError, StageError
from winnow.curate.schema import make_rejects
from winnow.curate.stages.base import Barrier, Plan, StageConfig, StageOutput
from winnow.curate.stages.scores.features import (
    bucket_features,
    check_column,
    check_positive_int,
    features_column,
    iter_spill,
    list_csr,
    load_model,
    save_model,
)
from winnow.curate.stages.scores.tokens import hash_tokens

log = logging.getLogger(__name__)

MODEL_FILES = {"target": "dsir_target.npz", "raw": "dsir_raw.npz"}


@dataclass(kw_only=True, slots=True)
class DsirScoreConfig(StageConfig):
    """The target source, the hashed feature space, smoothing and an optional minimum."""

    SOURCE_KEYS: ClassVar[tuple[str, ...]] = ("sources", "target_source")

    target_source: str | None = None  # required: the source whose distribution to resample toward
    column: str = "dsir_weight"  # the column the log importance weight is written to
    buckets: int = 10_000  # Xie et al. 2023, section 4
    max_tokens: int = 1024  # tokens per document used to fit the models
    smoothing: float = 1.0  # add-alpha counts, so unseen n-grams have finite log-probability
    per_token: bool = False  # divide the log weight by the document's n-gram count
    min_weight: float | None = None  # reject rows whose log weight is below this

    def __post_init__(self) -> None:
        if not self.target_source:
            raise ConfigError("target_source is required: the name of the source to resample toward")
        if self.sources and self.target_source not in self.sources:  # rows out of scope never reach the stage
            raise ConfigError(
                f"target_source = {self.target_source!r} is not among the stage's sources {list(self.sources)}: the stage sees "
                f"only those sources' rows, so its target would be missing; add it to sources, or unset sources"
            )
        check_column(self.column)
        check_positive_int("buckets", self.buckets, low=2)
        check_positive_int("max_tokens", self.max_tokens)
        if not self.smoothing > 0:
            raise ConfigError(f"score.dsir.smoothing = {self.smoothing!r} is invalid; allowed: > 0")


class DsirScore(Barrier):
    """Fits target and raw hashed n-gram models in plan; writes log importance weights in apply."""

    kind = "score.dsir"
    Config = DsirScoreConfig
    reasons = ("score:dsir_min_weight",)
    config: DsirScoreConfig

    def __init__(self, config: DsirScoreConfig, ctx) -> None:
        super().__init__(config, ctx)
        self._log_ratio: np.ndarray | None = None

    def collect(self, batch: pl.DataFrame) -> pl.DataFrame:
        th = hash_tokens(batch["text"], max_tokens=self.config.max_tokens)
        return pl.DataFrame(
            {"id": batch["id"], "source": batch["source"], "feats": features_column(th, self.config.buckets)}
        )

    def plan(self, keys: pl.LazyFrame) -> Plan:
        cfg = self.config
        counts = {name: np.zeros(cfg.buckets, dtype=np.float64) for name in MODEL_FILES}
        docs = dict.fromkeys(MODEL_FILES, 0)
        for chunk in iter_spill(keys, ["source", "feats"]):
            indptr, feats = list_csr(chunk["feats"])
            counts["raw"] += np.bincount(feats, minlength=cfg.buckets)
            docs["raw"] += chunk.height
            is_target = (chunk["source"] == cfg.target_source).fill_null(False).to_numpy()
            if is_target.any():
                per_doc = np.repeat(is_target, np.diff(indptr))
                counts["target"] += np.bincount(feats[per_doc], minlength=cfg.buckets)
                docs["target"] += int(is_target.sum())
        if docs["target"] == 0 or counts["target"].sum() == 0:
            seen = keys.select(pl.col("source").unique().sort()).collect()["source"].to_list()
            raise StageError(
                f"{self.ctx.stage_id}: target_source {cfg.target_source!r} has no tokens in the pool; sources seen: {seen}"
            )
        self.ctx.artifacts_dir.mkdir(parents=True, exist_ok=True)
        for name, file in MODEL_FILES.items():
            meta = {"buckets": cfg.buckets, "smoothing": cfg.smoothing, "docs": docs[name], "model": name}
            save_model(self.ctx.plan_dir / file, {"counts": counts[name]}, meta)
            shutil.copyfile(self.ctx.plan_dir / file, self.ctx.artifacts_dir / file)
        p_t, p_r = (self._probs(counts[n]) for n in ("target", "raw"))
        report = {
            "target_source": cfg.target_source,
            "docs": docs,
            "ngrams": {n: int(c.sum()) for n, c in counts.items()},
            "kl_target_raw": float(np.sum(p_t * (np.log(p_t) - np.log(p_r)))),  # how far the target is from the pool
            "models": [str(self.ctx.artifacts_dir / f) for f in MODEL_FILES.values()],
        }
        log.info(
            "%s: target %d docs, raw %d docs, KL %.3f",
            self.ctx.stage_id,
            docs["target"],
            docs["raw"],
            report["kl_target_raw"],
        )
        return Plan(None, report)

    def _probs(self, counts: np.ndarray) -> np.ndarray:
        smoothed = counts + self.config.smoothing
        return smoothed / smoothed.sum()

    def _load(self) -> np.ndarray:
        if self._log_ratio is None:
            logp = {}
            for name, file in MODEL_FILES.items():
                arrays, meta = load_model(self.ctx.plan_dir / file)
                if meta["buckets"] != self.config.buckets:
                    raise StageError(
                        f"{self.ctx.stage_id}: model {file} has {meta['buckets']} buckets, config {self.config.buckets}"
                    )
                logp[name] = np.log(self._probs(arrays["counts"]))
            self._log_ratio = logp["target"] - logp["raw"]
        return self._log_ratio

    def weights(self, text: pl.Series) -> np.ndarray:
        """float64 [N]: the log importance weight of each document."""
        doc, ids = bucket_features(hash_tokens(text), self.config.buckets)
        n = text.len()
        total = np.bincount(doc, weights=self._load()[ids], minlength=n)
        if self.config.per_token:
            total = total / np.maximum(np.bincount(doc, minlength=n), 1)
        return total

    def apply(self, batch: pl.DataFrame, decision: pl.DataFrame | None = None) -> StageOutput:  # type: ignore[override]
        cfg = self.config
        df = batch.with_columns(pl.Series(cfg.column, self.weights(batch["text"]), dtype=pl.Float64))
        if cfg.min_weight is None:
            return self.keep_all(df)
        low = pl.col(cfg.column) < cfg.min_weight
        return StageOutput(df.filter(~low), make_rejects(df.filter(low), "score:dsir_min_weight"))
