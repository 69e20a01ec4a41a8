"""``score.classifier``: P(document looks like the reference source), from a classifier trained in the job.

The reference source (``positive_source``) gives the positives and the rest of the pool the
negatives, as in the GPT-3 / fastText quality classifiers. Features are hashed word unigrams
and bigrams of each document's first ``max_tokens`` tokens (``tokens.py``); the model is a
logistic regression on their mean (``linear.py``).

* ``collect`` spills ``id``, ``source``, a seeded hash of the id and the bucket ids (uint32,
  at most ``2 * max_tokens - 1`` per document) — never the text.
* ``plan`` trains on a seeded sample of at most ``max_train_docs`` documents per class (the
  ones with the smallest id hash, so the sample does not depend on how tasks were split),
  which bounds its memory at about ``2 * max_train_docs * (2 * max_tokens) * 4`` bytes
  (~80 MB at the defaults); reports ``folds``-fold cross-validated AUC and accuracy; trains
  the final model on the whole sample and saves it to ``artifacts/<stage>/classifier.npz``.
* ``apply`` scores every row with that model into ``column`` (default ``quality``).
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
    check_column,
    check_positive_int,
    features_column,
    features_csr,
    list_csr,
    load_model,
    save_model,
)
from winnow.curate.stages.scores.linear import LinearModel, roc_auc, take_rows
from winnow.curate.stages.scores.tokens import hash_strings, hash_tokens

log = logging.getLogger(__name__)

MODEL_FILE = "classifier.npz"


@dataclass(kw_only=True, slots=True)
class ClassifierScoreConfig(StageConfig):
    """The reference source, the features, the training budget and an optional minimum."""

    SOURCE_KEYS: ClassVar[tuple[str, ...]] = ("sources", "positive_source")

    positive_source: str | None = None  # required: the source whose documents are the positives
    column: str = "quality"  # the column the probability is written to
    buckets: int = 1 << 18  # hashed unigram+bigram buckets
    max_tokens: int = 512  # tokens per document used for features
    max_train_docs: int = 10_000  # per class; the seeded sample bounds the plan's memory
    folds: int = 5  # cross-validation folds reported in the manifest
    epochs: int = 5  # passes over the training sample
    learning_rate: float = 0.2  # Adagrad step size
    l2: float = 1e-6  # L2 regularization of the logistic regression
    min_quality: float | None = None  # reject rows whose probability is below this

    def __post_init__(self) -> None:
        if not self.positive_source:
            raise ConfigError("positive_source is required: the name of the reference (positive) source")
        if self.sources and self.positive_source not in self.sources:  # rows out of scope never reach the stage
            raise ConfigError(
                f"positive_source = {self.positive_source!r} is not among the stage's sources {list(self.sources)}: the stage sees "
                f"only those sources' rows, so its positives would be missing; add it to sources, or unset sources"
            )
        check_column(self.column)
        check_positive_int("buckets", self.buckets, low=2)
        check_positive_int("max_tokens", self.max_tokens)
        check_positive_int("max_train_docs", self.max_train_docs, low=2)
        check_positive_int("folds", self.folds, low=2, high=20)
        check_positive_int("epochs", self.epochs, high=1000)
        if not self.learning_rate > 0:
            raise ConfigError(f"score.classifier.learning_rate = {self.learning_rate!r} is invalid; allowed: > 0")
        if not self.l2 >= 0:
            raise ConfigError(f"score.classifier.l2 = {self.l2!r} is invalid; allowed: >= 0")
        if self.min_quality is not None and not 0.0 <= self.min_quality <= 1.0:
            raise ConfigError(
                f"score.classifier.min_quality = {self.min_quality!r} is invalid; allowed: in [0, 1] or unset"
            )


class ClassifierScore(Barrier):
    """Trains a reference-vs-pool classifier in plan and writes its probability in apply."""

    kind = "score.classifier"
    Config = ClassifierScoreConfig
    reasons = ("score:classifier_min_quality",)
    config: ClassifierScoreConfig

    def __init__(self, config: ClassifierScoreConfig, ctx) -> None:
        super().__init__(config, ctx)
        self._model: LinearModel | None = None

    def _features(self, text: pl.Series) -> tuple[np.ndarray, np.ndarray]:
        return features_csr(hash_tokens(text, max_tokens=self.config.max_tokens), self.config.buckets)

    def collect(self, batch: pl.DataFrame) -> pl.DataFrame:
        th = hash_tokens(batch["text"], max_tokens=self.config.max_tokens)
        return pl.DataFrame(
            {
                "id": batch["id"],
                "source": batch["source"],
                "_key": pl.Series(hash_strings(batch["id"], seed=self.ctx.seed), dtype=pl.UInt64),
                "feats": features_column(th, self.config.buckets),
            }
        )

    def _sample(self, keys: pl.LazyFrame) -> pl.DataFrame:
        """The seeded training sample: per class, the non-empty documents with the smallest id hash."""
        cap = self.config.max_train_docs
        is_pos = pl.col("source") == self.config.positive_source
        usable = keys.filter(pl.col("feats").list.len() > 0)
        parts = [usable.filter(cond).bottom_k(cap, by="_key") for cond in (is_pos, ~is_pos)]
        return pl.concat(parts).select(is_pos.alias("y"), "_key", "feats").collect().sort("_key")

    def plan(self, keys: pl.LazyFrame) -> Plan:
        cfg = self.config
        pool = keys.group_by("source").agg(pl.len().alias("n")).collect().sort("source")
        sample = self._sample(keys)
        y = sample["y"].to_numpy().astype(np.int8)
        n_pos, n_neg = int(y.sum()), int(y.shape[0] - y.sum())
        if n_pos < cfg.folds or n_neg < cfg.folds:
            raise StageError(
                f"{self.ctx.stage_id}: positive_source {cfg.positive_source!r} gave {n_pos} usable positives and the "
                f"rest of the pool {n_neg} negatives; each needs at least folds={cfg.folds}. "
                f"Sources seen: {pool['source'].to_list()}"
            )
        indptr, feats = list_csr(sample["feats"])
        fold = (sample["_key"].to_numpy() >> np.uint64(17)) % np.uint64(cfg.folds)
        fit = dict(buckets=cfg.buckets, epochs=cfg.epochs, lr=cfg.learning_rate, l2=cfg.l2, seed=self.ctx.seed)
        oof = np.empty(y.shape[0], dtype=np.float64)
        fold_auc = []
        for k in range(cfg.folds):
            held = np.flatnonzero(fold == k)
            train = np.flatnonzero(fold != k)
            model = LinearModel.fit(*take_rows(indptr, feats, train), y[train], **fit)
            oof[held] = model.predict(*take_rows(indptr, feats, held))
            fold_auc.append(roc_auc(y[held], oof[held]))
        self._model = LinearModel.fit(indptr, feats, y, **fit)
        if not (np.isfinite(self._model.weights).all() and np.isfinite(self._model.bias)):
            raise StageError(  # every probability would be NaN, and no row below min_quality
                f"{self.ctx.stage_id}: the classifier's training diverged (weights not finite) at learning_rate = "
                f"{cfg.learning_rate!r}; lower it (the default is 0.2)"
            )
        meta = {"buckets": cfg.buckets, "max_tokens": cfg.max_tokens, "positive_source": cfg.positive_source}
        path = self.ctx.plan_dir / MODEL_FILE
        save_model(path, {"weights": self._model.weights, "bias": np.array([self._model.bias])}, meta)
        self.ctx.artifacts_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, self.ctx.artifacts_dir / MODEL_FILE)
        report = {
            "positive_source": cfg.positive_source,
            "pool_docs": dict(zip(pool["source"].to_list(), pool["n"].to_list())),
            "train_docs": {"positive": n_pos, "negative": n_neg},
            "cv_auc": roc_auc(y, oof),
            "cv_accuracy": float(((oof >= 0.5) == (y == 1)).mean()),
            "fold_auc": fold_auc,
            "model": str(self.ctx.artifacts_dir / MODEL_FILE),
        }
        log.info(
            "%s: CV AUC %.3f, accuracy %.3f on %d+%d docs",
            self.ctx.stage_id,
            report["cv_auc"],
            report["cv_accuracy"],
            n_pos,
            n_neg,
        )
        return Plan(None, report)

    def _load(self) -> LinearModel:
        if self._model is None:
            arrays, meta = load_model(self.ctx.plan_dir / MODEL_FILE)
            if meta["buckets"] != self.config.buckets or meta["max_tokens"] != self.config.max_tokens:
                raise StageError(f"{self.ctx.stage_id}: the saved model's features {meta} differ from the stage config")
            self._model = LinearModel(arrays["weights"], float(arrays["bias"][0]))
        return self._model

    def apply(self, batch: pl.DataFrame, decision: pl.DataFrame | None = None) -> StageOutput:  # type: ignore[override]
        cfg = self.config
        prob = self._load().predict(*self._features(batch["text"]))
        df = batch.with_columns(pl.Series(cfg.column, prob, dtype=pl.Float64))
        if cfg.min_quality is None:
            return self.keep_all(df)
        low = pl.col(cfg.column) < cfg.min_quality
        return StageOutput(df.filter(~low), make_rejects(df.filter(low), "score:classifier_min_quality"))
