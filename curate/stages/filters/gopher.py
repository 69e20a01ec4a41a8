"""``filter.gopher_quality``: the MassiveText quality rules (Rae et al. 2021, "Scaling Language
Models: Methods, Analysis & Insights from Training Gopher", appendix A.1.1).

Words are the tokens of ``curate.text.words`` (an approximation of the spaCy tokenizer
datatrove uses); like datatrove's ``GopherQualityFilter``, the word-count and mean
word-length rules count only words with at least one letter, digit or mark ("non-symbol
words"), while the symbol and alphabetic ratios divide by all tokens. The counts come from two
compiled passes over the column's bytes (``curate.text.quality``): one over the tokens, one over the
characters and lines.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from winnow.curate.dedup.text import string_buffers
from winnow.curate.errors import ConfigError
from winnow.curate.stages.filters.base import FilterConfig, RuleFilter
from winnow.curate.text.codepoints import TABLE
from winnow.curate.text.quality import COUNTS, LAYOUT_COUNTS, layout_counts, quality_counts, stop_word_buffers

#: Gopher's stop words ("the", "be", "to", "of", "and", "that", "have", "with"), Rae et al. 2021 A.1.1.
GOPHER_STOP_WORDS: tuple[str, ...] = ("the", "be", "to", "of", "and", "that", "have", "with")


@dataclass(kw_only=True, slots=True)
class GopherQualityConfig(FilterConfig):
    """Thresholds; every default is the published one (Rae et al. 2021, A.1.1). ``None`` disables a rule."""

    min_words: int | None = 50  # "fewer than 50 ... words"
    max_words: int | None = 100_000  # "or more than 100,000 words"
    min_mean_word_length: float | None = 3.0  # "mean word length is outside the range of 3 to 10 characters"
    max_mean_word_length: float | None = 10.0  # upper end of the mean word length range
    max_hash_ratio: float | None = 0.1  # "symbol-to-word ratio greater than 0.1 for either the hash symbol"
    max_ellipsis_ratio: float | None = 0.1  # "... or the ellipsis"
    max_bullet_lines: float | None = 0.9  # "more than 90% of lines starting with a bullet point"
    max_ellipsis_lines: float | None = 0.3  # "more than 30% ending with an ellipsis"
    min_alpha_words: float | None = 0.8  # "80% of words in a document contain at least one alphabetic character"
    min_stop_words: int | None = 2  # "at least two of the following English words"
    # the words min_stop_words counts (Gopher's: the, be, to, of, and, that, have, with)
    stop_words: list[str] = field(default_factory=lambda: list(GOPHER_STOP_WORDS))

    def __post_init__(self) -> None:
        for name in ("min_words", "max_words", "min_mean_word_length", "max_mean_word_length", "min_stop_words"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise ConfigError(f"filter.gopher_quality.{name} = {v!r} is invalid; allowed: >= 0 or unset")
        for name in (
            "max_hash_ratio",
            "max_ellipsis_ratio",
            "max_bullet_lines",
            "max_ellipsis_lines",
            "min_alpha_words",
        ):
            v = getattr(self, name)
            if v is not None and not 0.0 <= v <= 1.0:
                raise ConfigError(
                    f"filter.gopher_quality.{name} = {v!r} is invalid; allowed: a fraction in [0, 1] or unset"
                )
        for lo, hi in (("min_words", "max_words"), ("min_mean_word_length", "max_mean_word_length")):
            a, b = getattr(self, lo), getattr(self, hi)
            if a is not None and b is not None and a > b:
                raise ConfigError(f"filter.gopher_quality: {lo} ({a!r}) is greater than {hi} ({b!r})")
        if self.min_stop_words is not None and self.min_stop_words > len(set(self.stop_words)):
            raise ConfigError(
                f"filter.gopher_quality: min_stop_words ({self.min_stop_words}) exceeds the {len(set(self.stop_words))} "
                f"distinct stop_words given; lower it or add stop words"
            )


def gopher_quality_metrics(text: pl.Series, stop_words: tuple[str, ...] = GOPHER_STOP_WORDS) -> pl.DataFrame:
    """The Gopher quality metrics of each document, one column each (null where a ratio has no words or lines)."""
    offsets, data = string_buffers(text.fill_null(""))
    props, fold = TABLE.cover(offsets, data)
    counts = quality_counts(offsets, data, props, fold, *stop_word_buffers(stop_words))
    c = dict(zip(COUNTS, counts)) | dict(zip(LAYOUT_COUNTS, layout_counts(offsets, data, props)))
    frame = pl.DataFrame(
        {
            **{k: c[k] for k in ("tokens", "words", "alpha", "stop_words", *LAYOUT_COUNTS)},
            "mean_word_length": np.where(c["words"] > 0, c["word_chars"] / np.maximum(c["words"], 1), np.nan),
        }
    )
    # Ratios over zero tokens or lines are undefined: null, so no ratio rule fires on them.
    tokens_n = pl.col("tokens").cast(pl.Float64).replace(0.0, None)
    lines_n = pl.col("lines").cast(pl.Float64).replace(0.0, None)
    return frame.select(
        pl.col("words").alias("gopher_words"),
        pl.col("mean_word_length").fill_nan(None).alias("gopher_mean_word_length"),
        (pl.col("hashes") / tokens_n).alias("gopher_hash_ratio"),
        (pl.col("ellipses") / tokens_n).alias("gopher_ellipsis_ratio"),
        (pl.col("bullet_lines") / lines_n).alias("gopher_bullet_lines"),
        (pl.col("ellipsis_lines") / lines_n).alias("gopher_ellipsis_lines"),
        (pl.col("alpha") / tokens_n).alias("gopher_alpha_words"),
        pl.col("stop_words").alias("gopher_stop_words"),
    )


class GopherQualityFilter(RuleFilter):
    """Rejects documents failing a Gopher quality rule; the reason names the rule."""

    kind = "filter.gopher_quality"
    Config = GopherQualityConfig
    reasons = (
        "filter:gopher_min_words",
        "filter:gopher_max_words",
        "filter:gopher_min_mean_word_length",
        "filter:gopher_max_mean_word_length",
        "filter:gopher_hash_ratio",
        "filter:gopher_ellipsis_ratio",
        "filter:gopher_bullet_lines",
        "filter:gopher_ellipsis_lines",
        "filter:gopher_alpha_words",
        "filter:gopher_stop_words",
    )
    config: GopherQualityConfig

    def metrics(self, batch: pl.DataFrame) -> pl.DataFrame:
        return gopher_quality_metrics(batch["text"], tuple(self.config.stop_words))

    def rules(self) -> list[tuple[str, pl.Expr]]:
        c = self.config
        checks = [  # (reason, threshold, rejects_when) in datatrove's order
            ("gopher_min_words", c.min_words, lambda t: pl.col("gopher_words") < t),
            ("gopher_max_words", c.max_words, lambda t: pl.col("gopher_words") > t),
            ("gopher_min_mean_word_length", c.min_mean_word_length, lambda t: pl.col("gopher_mean_word_length") < t),
            ("gopher_max_mean_word_length", c.max_mean_word_length, lambda t: pl.col("gopher_mean_word_length") > t),
            ("gopher_hash_ratio", c.max_hash_ratio, lambda t: pl.col("gopher_hash_ratio") > t),
            ("gopher_ellipsis_ratio", c.max_ellipsis_ratio, lambda t: pl.col("gopher_ellipsis_ratio") > t),
            ("gopher_bullet_lines", c.max_bullet_lines, lambda t: pl.col("gopher_bullet_lines") > t),
            ("gopher_ellipsis_lines", c.max_ellipsis_lines, lambda t: pl.col("gopher_ellipsis_lines") > t),
            ("gopher_alpha_words", c.min_alpha_words, lambda t: pl.col("gopher_alpha_words") < t),
            ("gopher_stop_words", c.min_stop_words, lambda t: pl.col("gopher_stop_words") < t),
        ]
        return [(f"filter:{name}", when(t)) for name, t, when in checks if t is not None]
