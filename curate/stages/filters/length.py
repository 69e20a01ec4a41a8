"""``filter.length``: bounds on characters, words and lines.

Words are runs of non-whitespace (polars' ``str.count_matches(r"\\S+")``), counted by a compiled
pass over the column's bytes with the regex engine's own whitespace classes
(``curate.text.codepoints``); only the lengths a bound reads are measured, unless
``keep_metrics`` asks for all three.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from winnow.curate.dedup.jit import njit
from winnow.curate.dedup.text import string_buffers
from winnow.curate.errors import ConfigError
from winnow.curate.stages.filters.base import FilterConfig, RuleFilter
from winnow.curate.text.codepoints import SPACE, TABLE
from winnow.curate.text.tokens import code_point

_UNITS = ("chars", "words", "lines")


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
        for unit in _UNITS:
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
    reasons = tuple(f"filter:length_{b}_{u}" for u in _UNITS for b in ("min", "max"))
    config: LengthConfig

    def metrics(self, batch: pl.DataFrame) -> pl.DataFrame:
        c = self.config
        units = [
            u
            for u in _UNITS
            if c.keep_metrics or getattr(c, f"min_{u}") is not None or getattr(c, f"max_{u}") is not None
        ]
        text = pl.col("text")
        columns = {
            "chars": lambda: text.str.len_chars(),
            "words": lambda: pl.Series(count_words(batch["text"]), dtype=pl.UInt32),
            # A document has one more line than it has newlines, unless it is empty.
            "lines": lambda: pl.when(text.str.len_bytes() == 0).then(0).otherwise(text.str.count_matches("\n") + 1),
        }
        return batch.select(*(columns[u]().alias(f"length_{u}") for u in units))

    def rules(self) -> list[tuple[str, pl.Expr]]:
        out = []
        for unit in _UNITS:
            metric = pl.col(f"length_{unit}")
            lo, hi = getattr(self.config, f"min_{unit}"), getattr(self.config, f"max_{unit}")
            if lo is not None:
                out.append((f"filter:length_min_{unit}", metric < lo))
            if hi is not None:
                out.append((f"filter:length_max_{unit}", metric > hi))
        return out


def count_words(text: pl.Series) -> np.ndarray:
    """Words (runs of non-whitespace) per string of ``text``: ``text.str.count_matches(r"\\S+")``, compiled."""
    offsets, data = string_buffers(text.fill_null(""))
    return _count_words(offsets, data, TABLE.cover(offsets, data)[0])


@njit(cache=True, nogil=True)
def _count_words(offsets, data, props):
    n = offsets.shape[0] - 1
    out = np.zeros(n, dtype=np.uint32)
    for i in range(n):
        words, space, p, end = 0, True, offsets[i], offsets[i + 1]
        while p < end:
            c, w = code_point(data, p)
            if props[c] & SPACE:
                space = True
            elif space:
                words += 1
                space = False
            p += w
        out[i] = words
    return out
