"""``score.heuristic``: a composite quality score in [0, 1] from filter-style text metrics.

Each component maps one metric to [0, 1] (1 = looks like clean prose) by a clipped linear
ramp anchored at the published filter threshold, so a document that would just pass that
filter gets 1 and one far past it gets 0. The score is the weighted mean of the components
(weights configurable, default equal):

=============  ===========================================  =================================
component      metric                                       ramp (1 at ... , 0 at ...)
=============  ===========================================  =================================
length         words (``\\S+``)                             1 at >= 50 words (Gopher), 0 at 0
word_length    mean non-space chars per word                 1 in [3, 10] (Gopher), 0 at <= 1 or >= 20
alpha          letters / non-space chars                     1 at >= 0.8 (Gopher's 80% words), 0 at <= 0.4
symbols        (``#`` + ``...`` + ``…``) / words             1 at 0, 0 at >= 0.1 (Gopher)
stop_words     Gopher stop words (the, be, to, of, ...)      1 at >= 2 (Gopher), 0 at 0
line_punct     non-empty lines ending in terminal punct.     1 at >= 0.12 (FineWeb), 0 at 0
dup_lines      duplicate non-empty lines / non-empty lines   1 at 0, 0 at >= 0.3 (Gopher)
=============  ===========================================  =================================

Gopher: Rae et al. 2021, "Scaling Language Models", appendix A; FineWeb: Penedo et al. 2024.
Clean prose scores near 1; keyboard mash loses ``stop_words`` and ``line_punct``; symbol soup
loses ``alpha``, ``symbols`` and ``word_length``; repeated lines lose ``dup_lines``. An empty
document scores 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from winnow.curate.dedup.text import string_buffers
from winnow.curate.errors import ConfigError
from winnow.curate.schema import make_rejects
from winnow.curate.stages.base import Stage, StageConfig, StageOutput
from winnow.curate.stages.scores.features import check_column
from winnow.curate.text.codepoints import TABLE
from winnow.curate.text.quality import PROSE_COUNTS, prose_counts

COMPONENTS: tuple[str, ...] = ("length", "word_length", "alpha", "symbols", "stop_words", "line_punct", "dup_lines")


@dataclass(kw_only=True, slots=True)
class HeuristicScoreConfig(StageConfig):
    """Where to write the score, how to weigh its components, and an optional minimum."""

    column: str = "quality"  # the column the score is written to
    # weight of each component: length, word_length, alpha, symbols, stop_words, line_punct, dup_lines
    weights: dict[str, float] = field(default_factory=lambda: dict.fromkeys(COMPONENTS, 1.0))
    min_quality: float | None = None  # reject rows scoring below this
    keep_metrics: bool = False  # keep each component as a ``heuristic_<component>`` column

    def __post_init__(self) -> None:
        unknown = sorted(set(self.weights) - set(COMPONENTS))
        if unknown:
            raise ConfigError(f"weights: unknown component(s) {unknown}; allowed: {list(COMPONENTS)}")
        bad = {k: v for k, v in self.weights.items() if not v >= 0}
        if bad or not 0 < sum(self.weights.values()) < math.inf:  # relative: 1e308 each would overflow the sum
            raise ConfigError(
                f"score.heuristic.weights = {self.weights!r} is invalid; allowed: >= 0 with a positive, finite sum (they are relative)"
            )
        if self.min_quality is not None and not 0.0 <= self.min_quality <= 1.0:
            raise ConfigError(
                f"score.heuristic.min_quality = {self.min_quality!r} is invalid; allowed: in [0, 1] or unset"
            )
        check_column(self.column)


def _ramp(x: pl.Expr, zero_at: float, one_at: float) -> pl.Expr:
    """Linear from 0 at ``zero_at`` to 1 at ``one_at`` (either direction), clipped to [0, 1]."""
    return ((x - zero_at) / (one_at - zero_at)).clip(0.0, 1.0)


def metrics(text: pl.Series) -> pl.DataFrame:
    """The text metrics every component is made of, one ``_m_*`` column each, in one compiled pass
    (``curate.text.quality.prose_counts``): the words (``\\S+``), non-space characters, letters (``\\p{L}``),
    ``#`` plus ``...`` and ``…``, stop words, and the non-empty lines (split at ``\\n``, stripped), those
    ending in terminal punctuation and the distinct ones."""
    offsets, data = string_buffers(text.fill_null(""))
    counts = prose_counts(offsets, data, TABLE.cover(offsets, data)[0]).astype(np.float64)
    return pl.DataFrame({f"_m_{name}": counts[i] for i, name in enumerate(PROSE_COUNTS)})


def component_exprs() -> dict[str, pl.Expr]:
    """Each component as a polars expression over the metric columns (``metrics``), in [0, 1]."""
    n_words, non_space, n_lines = pl.col("_m_words"), pl.col("_m_non_space"), pl.col("_m_lines")
    mean_len = non_space / n_words
    exprs = {
        "length": _ramp(n_words, 0.0, 50.0),
        "word_length": pl.min_horizontal(_ramp(mean_len, 1.0, 3.0), _ramp(mean_len, 20.0, 10.0)),
        "alpha": _ramp(pl.col("_m_letters") / non_space, 0.4, 0.8),
        "symbols": _ramp(pl.col("_m_symbols") / n_words, 0.1, 0.0),
        "stop_words": _ramp(pl.col("_m_stop_words"), 0.0, 2.0),
        "line_punct": _ramp(pl.col("_m_punct_lines") / n_lines, 0.0, 0.12),
        "dup_lines": _ramp((n_lines - pl.col("_m_unique_lines")) / n_lines, 0.3, 0.0),
    }
    # No words: every ratio is undefined; such a document is worth nothing as prose.
    return {k: pl.when(n_words > 0).then(e.fill_nan(0.0)).otherwise(0.0) for k, e in exprs.items()}


def with_components(batch: pl.DataFrame, names: list[str], prefix: str = "heuristic_") -> pl.DataFrame:
    """``batch`` plus a ``<prefix><name>`` column per component in ``names``."""
    exprs = component_exprs()
    # over the metrics alone: a row field of the same name as a metric can neither clash nor be read
    return batch.with_columns(metrics(batch["text"]).select([exprs[k].alias(f"{prefix}{k}") for k in names]))


class HeuristicScore(Stage):
    """Writes a composite heuristic quality score; rejects below ``min_quality`` when set."""

    kind = "score.heuristic"
    Config = HeuristicScoreConfig
    reasons = ("score:heuristic_min_quality",)
    config: HeuristicScoreConfig

    def apply(self, batch: pl.DataFrame) -> StageOutput:
        cfg = self.config
        used = {k: w for k, w in cfg.weights.items() if w > 0}
        total = sum(used.values())
        metric_cols = [f"heuristic_{k}" for k in used]
        df = with_components(batch, list(used))
        score = pl.sum_horizontal([pl.col(f"heuristic_{k}") * (w / total) for k, w in used.items()]).clip(0.0, 1.0)
        df = df.with_columns(score.cast(pl.Float64).alias(cfg.column))
        if not cfg.keep_metrics:
            df = df.drop(metric_cols)
        if cfg.min_quality is None:
            return self.keep_all(df)
        low = pl.col(cfg.column) < cfg.min_quality
        rejected = make_rejects(df.filter(low), "score:heuristic_min_quality")
        return StageOutput(df.filter(~low), rejected)
