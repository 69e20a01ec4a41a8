"""``score.difficulty``: a ``difficulty`` column in [0, 1] for the curriculum (the order stage sorts by it).

Three measures, each turned into "the share of the pool that is easier" by the pool's own
empirical CDF (so each lies in [0, 1] and means the same thing on any corpus), then blended
with ``weights`` (default length 0.2, rare_words 0.3, perplexity 0.5):

* ``length``: ``log1p`` of the document's word count (all of it);
* ``rare_words``: share of its tokens outside the pool's common vocabulary, the most
  frequent hashed words that together cover ``common_mass`` (90%) of the pool's tokens;
* ``perplexity``: mean per-token negative log-likelihood under a hashed bigram model fit on
  the pool, interpolated with the unigram model:
  ``p(w | v) = lam * min(c(v w) / c(v), 1) + (1 - lam) * (c(w) + 1) / (N + buckets)``
  (``lam`` = ``bigram_weight``); the ``min`` guards against hash collisions.

Per-token measures use each document's first ``max_tokens`` tokens, in plan and in apply.
``collect`` spills ``id``, the word count and those tokens' bucket ids; ``plan`` streams the
spill twice (counts, then the measures of a seeded sample of ``calibration_docs`` documents
for the CDFs) and saves the model to ``artifacts/<stage>/difficulty.npz``.
"""

from __future__ import annotations

import logging
import math
import shutil
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from winnow.curate.errors import ConfigError, StageError
from winnow.curate.stages.base import Barrier, Plan, StageConfig, StageOutput
from winnow.curate.stages.scores.features import (
    check_column,
    check_positive_int,
    features_column,
    iter_spill,
    list_csr,
    load_model,
    sample_cdf,
    save_model,
    split_spilled,
    token_buckets,
)
from winnow.curate.stages.scores.tokens import hash_strings, hash_tokens

log = logging.getLogger(__name__)

MEASURES: tuple[str, ...] = ("length", "rare_words", "perplexity")
MODEL_FILE = "difficulty.npz"


@dataclass(kw_only=True, slots=True)
class DifficultyScoreConfig(StageConfig):
    """The blend of measures and the n-gram model behind them."""

    column: str = "difficulty"  # the column the difficulty in [0, 1] is written to
    # blend of the measures length, rare_words and perplexity
    weights: dict[str, float] = field(default_factory=lambda: {"length": 0.2, "rare_words": 0.3, "perplexity": 0.5})
    buckets: int = 1 << 20  # hashed word buckets of the n-gram model
    max_tokens: int = 1024  # tokens per document the per-token measures read
    common_mass: float = 0.9  # the common vocabulary: the most frequent words covering this share of the pool's tokens
    bigram_weight: float = 0.7  # share of the bigram model in the interpolated perplexity (the rest: unigram)
    calibration_docs: int = 20_000  # documents sampled to fit each measure's distribution
    quantiles: int = 1000  # resolution of each measure's fitted distribution

    def __post_init__(self) -> None:
        check_column(self.column)
        unknown = sorted(set(self.weights) - set(MEASURES))
        if unknown:
            raise ConfigError(f"weights: unknown measure(s) {unknown}; allowed: {list(MEASURES)}")
        if any(not v >= 0 for v in self.weights.values()) or not 0 < sum(self.weights.values()) < math.inf:
            raise ConfigError(
                f"score.difficulty.weights = {self.weights!r} is invalid; allowed: >= 0 with a positive, finite sum (they are relative)"
            )
        check_positive_int("buckets", self.buckets, low=2)
        check_positive_int("max_tokens", self.max_tokens)
        check_positive_int("calibration_docs", self.calibration_docs)
        check_positive_int("quantiles", self.quantiles, low=2, high=100_000)
        for name in ("common_mass", "bigram_weight"):
            v = getattr(self, name)
            if not 0.0 < v < 1.0:
                raise ConfigError(f"score.difficulty.{name} = {v!r} is invalid; allowed: in (0, 1)")


class DifficultyScore(Barrier):
    """Fits pool word statistics in plan; writes a [0, 1] ``difficulty`` per row in apply."""

    kind = "score.difficulty"
    Config = DifficultyScoreConfig
    reasons = ()
    config: DifficultyScoreConfig

    def __init__(self, config: DifficultyScoreConfig, ctx) -> None:
        super().__init__(config, ctx)
        self._model: dict[str, np.ndarray] | None = None

    def collect(self, batch: pl.DataFrame) -> pl.DataFrame:
        th = hash_tokens(batch["text"], max_tokens=self.config.max_tokens)
        return pl.DataFrame(
            {
                "id": batch["id"],
                "_key": pl.Series(hash_strings(batch["id"], seed=self.ctx.seed), dtype=pl.UInt64),
                "n_words": pl.Series(th.n_words, dtype=pl.Int64),
                "feats": features_column(th, self.config.buckets),
            }
        )

    def measures(self, model: dict[str, np.ndarray], n_words: np.ndarray, indptr, values) -> dict[str, np.ndarray]:
        """Raw (un-normalized) measures of documents given as spilled-layout bucket lists."""
        return self.token_measures(model, n_words, *split_spilled(indptr, values))

    def token_measures(self, model: dict[str, np.ndarray], n_words: np.ndarray, doc, uni, bi) -> dict[str, np.ndarray]:
        """Raw measures of documents given as token-aligned bucket ids (``split_spilled``'s layout)."""
        cfg = self.config
        n_docs = n_words.shape[0]
        c_uni, c_bi = model["unigram"], model["bigram"]
        p_uni = (c_uni[uni] + 1.0) / (c_uni.sum() + cfg.buckets)
        prev = np.empty_like(uni)
        prev[1:] = uni[:-1]  # only read where bi >= 0, i.e. not at a document's first token
        has = bi >= 0
        p = p_uni.copy()
        cond = np.minimum(c_bi[bi[has]] / np.maximum(c_uni[prev[has]], 1.0), 1.0)
        p[has] = cfg.bigram_weight * cond + (1 - cfg.bigram_weight) * p_uni[has]
        n_tok = np.maximum(np.bincount(doc, minlength=n_docs), 1)
        return {
            "length": np.log1p(n_words.astype(np.float64)),
            "rare_words": np.bincount(doc, weights=model["rare"][uni].astype(np.float64), minlength=n_docs) / n_tok,
            "perplexity": np.bincount(doc, weights=-np.log(p), minlength=n_docs) / n_tok,
        }

    def plan(self, keys: pl.LazyFrame) -> Plan:
        cfg = self.config
        c_uni = np.zeros(cfg.buckets)
        c_bi = np.zeros(cfg.buckets)
        n_docs = 0
        for chunk in iter_spill(keys, ["feats"]):
            _, uni, bi = split_spilled(*list_csr(chunk["feats"]))
            c_uni += np.bincount(uni, minlength=cfg.buckets)
            c_bi += np.bincount(bi[bi >= 0], minlength=cfg.buckets)
            n_docs += chunk.height
        if n_docs == 0:
            raise StageError(f"{self.ctx.stage_id}: no rows reached the stage; nothing to fit")
        # Common vocabulary: most frequent buckets until common_mass of the tokens is covered.
        order = np.argsort(-c_uni, kind="stable")
        covered = np.cumsum(c_uni[order]) / max(c_uni.sum(), 1.0)
        n_common = int(np.searchsorted(covered, cfg.common_mass) + 1)
        rare = np.ones(cfg.buckets, dtype=bool)
        rare[order[:n_common]] = False
        model = {"unigram": c_uni, "bigram": c_bi, "rare": rare}
        calib = keys.bottom_k(cfg.calibration_docs, by="_key").select("_key", "n_words", "feats").collect().sort("_key")
        raw = self.measures(model, calib["n_words"].to_numpy(), *list_csr(calib["feats"]))
        probs = np.linspace(0.0, 1.0, cfg.quantiles)
        for name, values in raw.items():
            model[f"q_{name}"] = np.quantile(values, probs)
        meta = {"buckets": cfg.buckets, "max_tokens": cfg.max_tokens, "common_words": n_common}
        save_model(self.ctx.plan_dir / MODEL_FILE, model, meta)
        self.ctx.artifacts_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.ctx.plan_dir / MODEL_FILE, self.ctx.artifacts_dir / MODEL_FILE)
        self._model = model
        report = {
            "docs": n_docs,
            "tokens": int(c_uni.sum()),
            "common_words": n_common,
            "calibration_docs": calib.height,
            "medians": {k: float(np.median(v)) for k, v in raw.items()},
            "model": str(self.ctx.artifacts_dir / MODEL_FILE),
        }
        log.info("%s: %d docs, %d common words", self.ctx.stage_id, n_docs, n_common)
        return Plan(None, report)

    def _load(self) -> dict[str, np.ndarray]:
        if self._model is None:
            arrays, meta = load_model(self.ctx.plan_dir / MODEL_FILE)
            if meta["buckets"] != self.config.buckets or meta["max_tokens"] != self.config.max_tokens:
                raise StageError(f"{self.ctx.stage_id}: the saved model {meta} differs from the stage config")
            self._model = arrays
        return self._model

    def difficulty(self, text: pl.Series) -> np.ndarray:
        """float64 [N] in [0, 1]: the weighted blend of each measure's pool CDF."""
        model = self._load()
        th = hash_tokens(text, max_tokens=self.config.max_tokens)
        raw = self.token_measures(model, th.n_words, *token_buckets(th, self.config.buckets))
        total = sum(self.config.weights.values())
        out = np.zeros(text.len())
        for name, w in self.config.weights.items():
            out += (w / total) * sample_cdf(model[f"q_{name}"], raw[name])
        return np.clip(out, 0.0, 1.0)

    def apply(self, batch: pl.DataFrame, decision: pl.DataFrame | None = None) -> StageOutput:  # type: ignore[override]
        return self.keep_all(
            batch.with_columns(pl.Series(self.config.column, self.difficulty(batch["text"]), dtype=pl.Float64))
        )
