"""``filter.length``: bounds on characters, words and lines."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from winnow.curate.errors import ConfigError
from winnow.curate.stages.filters.base import FilterConfig, RuleFilter


@dataclass(kw_only=True, slots=True)
class LengthConfig(FilterConfig):
    """Each bound is inclusive; ``None`` disables it."""

    min_chars: int | None = None  # reject documents with fewer characters; None: no minimum
    max_chars: int | None = None  # reject documents with more characters; None: no maximum
    min_words: int | None = None  # reject documents with fewer words; None: no minimum
    max_words: int | None = None  # reject documents with more words; None: no maximum
    min_lines: int | None = None  # reject documents with fewer lines; None: no minimum
    max_lines: int | None = None  # reject documents with more lines; None: no maximum

    def __post_init__(self) -> None:
        for unit in ("chars", "words", "lines"):
            lo, hi = getattr(self, f"min_{unit}"), getattr(self, f"max_{unit}")
            for name, v in ((f"min_{unit}", lo), (f"max_{unit}", hi)):
                if v is not None and v < 0:
                    raise ConfigError(f"filter.length.{name} = {v!r} is invalid; allowed: >= 0")
            if lo is not None and hi is not None and lo > hi:
                raise ConfigError(f"min_{unit} ({lo}) is greater than max_{unit} ({hi})")


class LengthFilter(RuleFilter):
    """Rejects documents outside the configured length bounds."""

    kind = "filter.length"
    Config = LengthConfig
    reasons = tuple(f"filter:length_{b}_{u}" for u in ("chars", "words", "lines") for b in ("min", "max"))
    config: LengthConfig

    def metrics(self, batch: pl.DataFrame) -> pl.DataFrame:
        text = pl.col("text")
        return batch.select(
            text.str.len_chars().alias("length_chars"),
            text.str.count_matches(r"\S+").alias("length_words"),
            # A document has one more line than it has newlines, unless it is empty.
            pl.when(text.str.len_bytes() == 0)
            .then(0)
            .otherwise(text.str.count_matches("\n") + 1)
            .alias("length_lines"),
        )

    def rules(self) -> list[tuple[str, pl.Expr]]:
        out = []
        for unit in ("chars", "words", "lines"):
            metric = pl.col(f"length_{unit}")
            lo, hi = getattr(self.config, f"min_{unit}"), getattr(self.config, f"max_{unit}")
            if lo is not None:
                out.append((f"filter:length_min_{unit}", metric < lo))
            if hi is not None:
                out.append((f"filter:length_max_{unit}", metric > hi))
        return out
