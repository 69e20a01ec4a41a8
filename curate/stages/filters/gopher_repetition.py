"""``filter.gopher_repetition``: the MassiveText repetition rules (Rae et al. 2021, appendix A.1.1, table A1).

Every count comes from one compiled pass per document (``curate.text.repetition``):
duplicate lines and paragraphs, and the top and duplicate word n-grams. Every fraction is
over the document's characters, as in datatrove's ``GopherRepetitionFilter``, whose
segmentation (paragraphs split on ``\\n{2,}`` of the stripped text, lines on ``\\n+``) this
mirrors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from winnow.curate.dedup.text import string_buffers
from winnow.curate.errors import ConfigError, StageError
from winnow.curate.stages.filters.base import FilterConfig, RuleFilter
from winnow.curate.text.codepoints import TABLE
from winnow.curate.text.repetition import DUP_NS, MAX_WORDS, SEGMENT_COUNTS, TOP_NS, repetition_counts

#: Table A1 of Rae et al. 2021: top n-gram character fraction thresholds, n = 2..4.
TOP_NGRAM_DEFAULTS = {"2": 0.20, "3": 0.18, "4": 0.16}
#: Table A1 of Rae et al. 2021: duplicate n-gram character fraction thresholds, n = 5..10.
DUP_NGRAM_DEFAULTS = {"5": 0.15, "6": 0.14, "7": 0.13, "8": 0.12, "9": 0.11, "10": 0.10}


@dataclass(kw_only=True, slots=True)
class GopherRepetitionConfig(FilterConfig):
    """Thresholds of Rae et al. 2021, table A1; ``None`` disables a rule, and an n-gram size left out of a table is not checked."""

    reject_empty: bool = True  # datatrove rejects empty text before any ratio (there are no characters to divide by)
    max_dup_line_frac: float | None = 0.30  # duplicate line fraction
    max_dup_para_frac: float | None = 0.30  # duplicate paragraph fraction
    max_dup_line_char_frac: float | None = 0.20  # duplicate line character fraction
    max_dup_para_char_frac: float | None = 0.20  # duplicate paragraph character fraction
    # n -> most the most frequent n-gram's characters may be of all characters
    max_top_ngram_char_frac: dict[str, float] = field(default_factory=lambda: dict(TOP_NGRAM_DEFAULTS))
    # n -> most the characters in duplicated n-grams may be of all characters
    max_dup_ngram_char_frac: dict[str, float] = field(default_factory=lambda: dict(DUP_NGRAM_DEFAULTS))

    def __post_init__(self) -> None:
        for name in ("max_dup_line_frac", "max_dup_para_frac", "max_dup_line_char_frac", "max_dup_para_char_frac"):
            v = getattr(self, name)
            if v is not None and not 0.0 <= v <= 1.0:
                raise ConfigError(
                    f"filter.gopher_repetition.{name} = {v!r} is invalid; allowed: a fraction in [0, 1] or unset"
                )
        for name, allowed in (("max_top_ngram_char_frac", range(2, 5)), ("max_dup_ngram_char_frac", range(5, 11))):
            for n, v in getattr(self, name).items():
                if n not in {str(a) for a in allowed}:  # "2", not "02", "٢" or "²": one key per size
                    raise ConfigError(
                        f"filter.gopher_repetition: {name} key {n!r} is not an n-gram size; allowed: "
                        f"{', '.join(str(a) for a in allowed)}"
                    )
                if not 0.0 <= v <= 1.0:
                    raise ConfigError(
                        f"filter.gopher_repetition.{name}[{n!r}] = {v!r} is invalid; allowed: a fraction in [0, 1]"
                    )


def gopher_repetition_metrics(text: pl.Series, top_ns=TOP_NS, dup_ns=DUP_NS) -> pl.DataFrame:
    """Gopher repetition fractions per document; null for empty documents and n-gram sizes longer than the document."""
    text = text.fill_null("")
    offsets, data = string_buffers(text)
    longest = int((offsets[1:] - offsets[:-1]).max()) if len(text) else 0
    if longest >= MAX_WORDS:
        row = int((offsets[1:] - offsets[:-1]).argmax())
        raise StageError(
            f"filter.gopher_repetition: document at row {row} of the batch holds {longest} bytes; "
            f"documents of {MAX_WORDS} bytes or more are not supported: split it first"
        )
    segments, top, dup = repetition_counts(offsets, data, *TABLE.cover(offsets, data))
    counts = {name: segments[i] for i, name in enumerate(SEGMENT_COUNTS)}
    ngrams = {f"gopher_top_{n}gram_frac": top[TOP_NS.index(n)] for n in top_ns}
    ngrams |= {f"gopher_dup_{n}gram_frac": dup[DUP_NS.index(n)] for n in dup_ns}
    return repetition_fractions(pl.DataFrame({**counts, **ngrams}), list(ngrams))


def repetition_fractions(counts: pl.DataFrame, ngrams: list[str]) -> pl.DataFrame:
    """The metric columns from per-document counts (``SEGMENT_COUNTS``, ``chars`` among them, and the n-gram character columns)."""
    n_chars = pl.col("chars").cast(pl.Float64).replace(0.0, None)
    return counts.select(
        (pl.col("para_dups") / pl.col("paras").cast(pl.Float64).replace(0.0, None)).alias("gopher_dup_para_frac"),
        (pl.col("para_dup_chars") / n_chars).alias("gopher_dup_para_char_frac"),
        (pl.col("line_dups") / pl.col("lines").cast(pl.Float64).replace(0.0, None)).alias("gopher_dup_line_frac"),
        (pl.col("line_dup_chars") / n_chars).alias("gopher_dup_line_char_frac"),
        # a top n-gram count of -1: the document has fewer than n words, so no such n-gram and no rule.
        *[(pl.col(c).replace(-1, None) / n_chars).alias(c) for c in ngrams],
    )


class GopherRepetitionFilter(RuleFilter):
    """Rejects documents that repeat lines, paragraphs or n-grams too much; the reason names the rule."""

    kind = "filter.gopher_repetition"
    Config = GopherRepetitionConfig
    reasons = (
        "filter:gopher_repetition_empty",
        "filter:gopher_dup_para_frac",
        "filter:gopher_dup_para_char_frac",
        "filter:gopher_dup_line_frac",
        "filter:gopher_dup_line_char_frac",
        *(f"filter:gopher_top_{n}gram_frac" for n in range(2, 5)),
        *(f"filter:gopher_dup_{n}gram_frac" for n in range(5, 11)),
    )
    config: GopherRepetitionConfig

    def metrics(self, batch: pl.DataFrame) -> pl.DataFrame:
        c = self.config
        return gopher_repetition_metrics(
            batch["text"],
            top_ns=tuple(sorted(int(n) for n in c.max_top_ngram_char_frac)),
            dup_ns=tuple(sorted(int(n) for n in c.max_dup_ngram_char_frac)),
        )

    def rules(self) -> list[tuple[str, pl.Expr]]:
        c = self.config
        thresholds = [  # datatrove's order: paragraphs, lines, top n-grams, duplicate n-grams
            ("gopher_dup_para_frac", c.max_dup_para_frac),
            ("gopher_dup_para_char_frac", c.max_dup_para_char_frac),
            ("gopher_dup_line_frac", c.max_dup_line_frac),
            ("gopher_dup_line_char_frac", c.max_dup_line_char_frac),
            *(
                (f"gopher_top_{n}gram_frac", c.max_top_ngram_char_frac[n])
                for n in sorted(c.max_top_ngram_char_frac, key=int)
            ),
            *(
                (f"gopher_dup_{n}gram_frac", c.max_dup_ngram_char_frac[n])
                for n in sorted(c.max_dup_ngram_char_frac, key=int)
            ),
        ]
        rules = [(f"filter:{name}", pl.col(name) > t) for name, t in thresholds if t is not None]
        if c.reject_empty:
            rules.insert(0, ("filter:gopher_repetition_empty", pl.col("text").str.len_bytes() == 0))
        return rules
