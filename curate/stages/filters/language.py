"""``filter.language``: keep documents in the configured languages, with the ``lang`` and
``lang_score`` columns written on every row.

Identification uses ``py3langid`` (a maintained fork of langid.py, Lui & Baldwin 2012):
a naive Bayes model over byte n-grams that ships inside the wheel, so nothing is
downloaded at run time. It is an optional dependency: ``pip install py3langid``.
Each document is classified on its first ``max_chars`` characters, one model call per
document: that call is the one per-row step here (the model has no batch API), and it
costs ~0.1 ms for a page of text. A document without a letter (empty, digits, punctuation, emoji) has no
language: ``lang`` is ``""`` and ``lang_score`` 0 (the model would answer its prior, ``sr`` at 0.014).
``languages`` are checked against the codes the model reports, when the stage is built.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from functools import lru_cache

import polars as pl

from winnow.curate.errors import ConfigError, require
from winnow.curate.stages.base import StageContext, StageOutput
from winnow.curate.stages.filters.base import FilterConfig, RuleFilter


@dataclass(kw_only=True, slots=True)
class LanguageConfig(FilterConfig):
    """Allowed languages (ISO 639-1 codes as py3langid reports them) and the minimum confidence."""

    keep_metrics: bool = True  # ``lang`` and ``lang_score`` are useful downstream (mixing by language)
    languages: list[str] = field(default_factory=lambda: ["en"])  # empty: any language, only the score rule
    # FineWeb keeps pages whose language-id score is >= 0.65 (Penedo et al. 2024, section 3.2).
    min_score: float | None = 0.65
    max_chars: int = 10_000  # classify the first characters only: bounded cost on huge documents

    def __post_init__(self) -> None:
        if self.min_score is not None and not 0.0 <= self.min_score <= 1.0:
            raise ConfigError(
                f"filter.language.min_score = {self.min_score!r} is invalid; allowed: a probability in [0, 1] or unset"
            )
        if self.max_chars < 1:
            raise ConfigError(f"filter.language.max_chars = {self.max_chars!r} is invalid; allowed: >= 1")
        bad = [
            code for code in self.languages if not (isinstance(code, str) and 2 <= len(code) <= 3 and code.isalpha())
        ]
        if bad:
            raise ConfigError(
                f"filter.language.languages = {bad!r} is invalid; allowed: ISO 639 codes such as 'en' or 'de'"
            )


@lru_cache(maxsize=1)
def _identifier():
    """The py3langid model, loaded once per process (unpickling it takes about a second)."""
    langid = require("py3langid.langid", package="py3langid", extra="lang", feature="filter.language")
    return langid.LanguageIdentifier.from_model_file(langid.MODEL_FILE, norm_probs=True)


class LanguageFilter(RuleFilter):
    """Identifies each document's language and rejects those outside ``languages`` or below ``min_score``."""

    kind = "filter.language"
    Config = LanguageConfig
    reasons = ("filter:language_low_score", "filter:language_not_allowed")
    config: LanguageConfig

    def __init__(self, config: LanguageConfig, ctx: StageContext) -> None:
        super().__init__(config, ctx)
        self._identifier = _identifier()
        known = sorted(set(self._identifier.nb_classes))
        unknown = [code for code in config.languages if code not in known]
        if unknown:  # "EN" or "eng" would never match: every document of that language rejected as not allowed
            close = {c: difflib.get_close_matches(c.lower(), known, n=1) for c in unknown}
            hints = ", ".join(f"{c!r} (did you mean {m[0]!r}?)" if m else repr(c) for c, m in close.items())
            raise ConfigError(
                f"filter.language.languages names {hints}, which the language model never reports; it reports "
                f"lower-case ISO 639 codes: {', '.join(known)}"
            )

    def metrics(self, batch: pl.DataFrame) -> pl.DataFrame:
        texts = batch["text"].str.slice(0, self.config.max_chars)
        letters = texts.str.contains(r"\p{L}").fill_null(False).to_list()
        # text without a letter (empty, digits, emoji, "!!!") has no language: the model would answer its prior
        found = [self._identifier.classify(t) if has else ("", 0.0) for t, has in zip(texts.to_list(), letters)]
        return pl.DataFrame(
            {"lang": [lang for lang, _ in found], "lang_score": [float(p) for _, p in found]},
            schema={"lang": pl.String, "lang_score": pl.Float64},
        )

    def rules(self) -> list[tuple[str, pl.Expr]]:
        out = []
        if self.config.min_score is not None:
            out.append(("filter:language_low_score", pl.col("lang_score") < self.config.min_score))
        if self.config.languages:
            out.append(("filter:language_not_allowed", ~pl.col("lang").is_in(self.config.languages)))
        return out

    def apply(self, batch: pl.DataFrame) -> StageOutput:
        # A second language filter in one job replaces the first one's columns.
        return super().apply(batch.drop("lang", "lang_score", strict=False))
