"""``filter.fineweb``: FineWeb's extra quality rules (Penedo et al. 2024, "The FineWeb Datasets",
section 3.3; thresholds of datatrove's ``FineWebQualityFilter``, which produced FineWeb).

Lines are the non-blank pieces between ``\\n`` (a line keeps a trailing ``\\r`` or space, as
in datatrove, so it then does not "end with punctuation"). Terminal punctuation is the
Unicode ``Sentence_Terminal`` property; datatrove lists the same set from an older Unicode
version (it lacks 14 characters added since and has 3 Khmer signs the property lacks).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from winnow.curate.errors import ConfigError
from winnow.curate.stages.filters.base import FilterConfig, RuleFilter
from winnow.curate.text.words import TOKEN_PATTERN, per_row

_HASH_SEED = 0xF1AE


@dataclass(kw_only=True, slots=True)
class FineWebConfig(FilterConfig):
    """Thresholds of FineWeb (Penedo et al. 2024; datatrove ``FineWebQualityFilter`` defaults); ``None`` disables a rule."""

    reject_empty: bool = True  # no non-blank line: nothing to measure
    min_line_punct_ratio: float | None = 0.12  # share of lines ending in terminal punctuation
    line_punct_exclude_zero: bool = False  # do not apply the rule to documents where no line ends in punctuation
    max_short_line_ratio: float | None = 0.67  # share of lines of at most ``short_line_length`` characters
    short_line_length: int = 30  # a line of at most this many characters is short
    max_char_dup_ratio: float | None = 0.01  # characters in duplicated lines / characters outside newlines
    max_list_ratio: float | None = 0.3  # newlines per word: list-like documents

    def __post_init__(self) -> None:
        for name in ("min_line_punct_ratio", "max_short_line_ratio", "max_char_dup_ratio"):
            v = getattr(self, name)
            if v is not None and not 0.0 <= v <= 1.0:
                raise ConfigError(f"filter.fineweb.{name} = {v!r} is invalid; allowed: a fraction in [0, 1] or unset")
        if self.max_list_ratio is not None and self.max_list_ratio < 0:
            raise ConfigError(
                f"filter.fineweb.max_list_ratio = {self.max_list_ratio!r} is invalid; allowed: >= 0 or unset"
            )
        if self.short_line_length < 0:
            raise ConfigError(
                f"filter.fineweb.short_line_length = {self.short_line_length!r} is invalid; allowed: >= 0"
            )


def fineweb_metrics(text: pl.Series, *, short_line_length: int = 30) -> pl.DataFrame:
    """FineWeb's line ratios per document (null where the document has no non-blank line or no word)."""
    lines = (
        pl.DataFrame({"text": text})
        .select(pl.int_range(pl.len(), dtype=pl.UInt32).alias("row"), pl.col("text").str.split("\n").alias("line"))
        .explode("line")
        .filter(pl.col("line").str.strip_chars() != "")
        .with_columns(pl.col("line").hash(seed=_HASH_SEED).alias("h"), pl.col("line").str.len_chars().alias("chars"))
    )
    per_line = lines.group_by("row").agg(
        pl.len().alias("fineweb_lines"),
        pl.col("line").str.contains(r"\p{Sentence_Terminal}$").mean().alias("fineweb_line_punct_ratio"),
        (pl.col("chars") <= short_line_length).mean().alias("fineweb_short_line_ratio"),
    )
    groups = lines.group_by("row", "h").agg(pl.len().alias("n"), pl.col("chars").first())
    dups = groups.group_by("row").agg(((pl.col("n") - 1) * pl.col("chars")).sum().alias("dup_chars"))
    t = pl.col("text")
    frame = pl.concat(
        [
            pl.DataFrame({"text": text}),
            per_row(per_line, len(text), {"fineweb_lines": 0}),
            per_row(dups, len(text), {"dup_chars": 0}),
        ],
        how="horizontal",
    )
    return frame.select(
        pl.col("fineweb_lines").cast(pl.Int64),
        pl.col("fineweb_line_punct_ratio").cast(pl.Float64),
        pl.col("fineweb_short_line_ratio").cast(pl.Float64),
        (
            pl.col("dup_chars")
            / (t.str.len_chars() - t.str.count_matches("\n", literal=True)).cast(pl.Float64).replace(0.0, None)
        ).alias("fineweb_char_dup_ratio"),
        (
            t.str.count_matches("\n", literal=True)
            / t.str.count_matches(TOKEN_PATTERN).cast(pl.Float64).replace(0.0, None)
        ).alias("fineweb_list_ratio"),
    )


class FineWebFilter(RuleFilter):
    """Rejects documents failing a FineWeb rule; the reason names the rule."""

    kind = "filter.fineweb"
    Config = FineWebConfig
    reasons = (
        "filter:fineweb_empty",
        "filter:fineweb_line_punct_ratio",
        "filter:fineweb_short_line_ratio",
        "filter:fineweb_char_dup_ratio",
        "filter:fineweb_list_ratio",
    )
    config: FineWebConfig

    def metrics(self, batch: pl.DataFrame) -> pl.DataFrame:
        return fineweb_metrics(batch["text"], short_line_length=self.config.short_line_length)

    def rules(self) -> list[tuple[str, pl.Expr]]:
        c = self.config
        out = []
        if c.reject_empty:
            out.append(("filter:fineweb_empty", pl.col("fineweb_lines") == 0))
        if c.min_line_punct_ratio is not None:
            ratio = pl.col("fineweb_line_punct_ratio")
            low = ratio < c.min_line_punct_ratio
            out.append(("filter:fineweb_line_punct_ratio", low & (ratio != 0) if c.line_punct_exclude_zero else low))
        if c.max_short_line_ratio is not None:
            out.append(("filter:fineweb_short_line_ratio", pl.col("fineweb_short_line_ratio") > c.max_short_line_ratio))
        if c.max_char_dup_ratio is not None:
            out.append(("filter:fineweb_char_dup_ratio", pl.col("fineweb_char_dup_ratio") > c.max_char_dup_ratio))
        if c.max_list_ratio is not None:
            out.append(("filter:fineweb_list_ratio", pl.col("fineweb_list_ratio") > c.max_list_ratio))
        return out
