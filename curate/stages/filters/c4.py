"""``filter.c4``: the C4 cleaning rules (Raffel et al. 2020, "Exploring the Limits of Transfer
Learning with a Unified Text-to-Text Transformer", section 2.2; code: TFDS ``c4_utils``).

C4 works line by line: lines failing a line rule are removed from the text (the stage
rewrites ``text`` to the kept lines, as C4 did, unless ``remove_lines = false``), and a
document is rejected when a kept-so-far line holds "lorem ipsum" or a curly bracket, or
when fewer than ``min_sentences`` sentences remain. Removed lines are counted per rule as
``("c4_lines_removed", rule)``. The bad-words rule of the paper is not included: it needs a
word list the paper links to rather than ships.

Sentences are counted with a regex (a run of ``.!?`` closing a word, optional closing
quotes or brackets, whitespace, then a non-punctuation character), where datatrove runs
spaCy's sentencizer; the two differ on abbreviations such as "Mr." that spaCy's
tokenizer keeps whole.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from winnow.curate.errors import ConfigError
from winnow.curate.schema import make_rejects
from winnow.curate.stages.base import StageOutput
from winnow.curate.stages.filters.base import FilterConfig, RuleFilter
from winnow.curate.text.words import unify_line_breaks

#: C4's terminal punctuation (TFDS c4_utils ``_END_MARKS``), applied to stripped lines.
END_MARKS = (".", "?", "!", '"', "'")
#: Policy and cookie-banner phrases (TFDS c4_utils ``_POLICY_SUBSTRINGS``).
POLICY_SUBSTRINGS = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")
CITATION_PATTERN = r"\[\d*]|\[edit]|\[citation needed]"
SENTENCE_END_PATTERN = r"\w[.!?…。！？]+[\"'”’)\]]*\s+[^\s.!?…]"
LINE_RULES = ("long_word", "no_terminal_punct", "few_words", "javascript", "policy")


@dataclass(kw_only=True, slots=True)
class C4Config(FilterConfig):
    """C4's rules (Raffel et al. 2020, section 2.2); each can be switched off."""

    remove_lines: bool = True  # rewrite ``text`` to the lines that pass every line rule (C4's behaviour)
    remove_citations: bool = True  # strip Wikipedia-style "[1]", "[edit]", "[citation needed]" from lines
    require_terminal_punct: bool = True  # "only retained lines that ended in a terminal punctuation mark"
    min_words_per_line: int | None = 3  # "only retained lines that contained at least 3 words"
    max_word_length: int | None = 1000  # TFDS: drop lines with a word over 1000 characters
    drop_javascript_lines: bool = True  # "removed any line with the word Javascript"
    drop_policy_lines: bool = True  # TFDS: drop lines with cookie / terms-of-use phrases
    reject_lorem_ipsum: bool = True  # "removed any page where the phrase 'lorem ipsum' appeared"
    reject_curly_bracket: bool = True  # "removed any pages that contained a curly bracket"
    min_sentences: int | None = 5  # "discarded any page with fewer than 5 sentences"

    def __post_init__(self) -> None:
        for name in ("min_words_per_line", "min_sentences"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise ConfigError(f"filter.c4.{name} = {v!r} is invalid; allowed: >= 0 or unset")
        if self.max_word_length is not None and not 1 <= self.max_word_length <= 10_000:
            raise ConfigError(
                f"filter.c4.max_word_length = {self.max_word_length!r} is invalid; allowed: in [1, 10000] or unset"
            )


def c4_lines(text: pl.Series, c: C4Config) -> pl.DataFrame:
    """One row per line: ``row``, the cleaned ``line``, the line rule that removes it (``drop``), and doc-rule hits."""
    stripped = pl.col("line").str.strip_chars()
    lines = (
        pl.DataFrame({"text": text})
        .select(
            pl.int_range(pl.len(), dtype=pl.UInt32).alias("row"),
            unify_line_breaks(pl.col("text")).str.split("\n").alias("line"),
        )
        .explode("line")
        .with_columns(stripped.alias("line"))
    )
    line = pl.col("line").str.replace_all(CITATION_PATTERN, "") if c.remove_citations else pl.col("line")
    lines = lines.with_columns(line.alias("clean"))
    line, lower = pl.col("clean"), pl.col("clean").str.to_lowercase()
    no_punct = ~pl.any_horizontal([line.str.ends_with(m) for m in END_MARKS]) | line.str.ends_with("...")
    never = pl.lit(False)
    # Checked in TFDS's order; the first line rule that fires removes the line.
    line_checks = [
        ("long_word", pl.col("line").str.contains(rf"\S{{{c.max_word_length + 1},}}") if c.max_word_length else never),
        ("no_terminal_punct", no_punct if c.require_terminal_punct else never),
        (
            "few_words",
            pl.col("line").str.count_matches(r"\S+") < c.min_words_per_line if c.min_words_per_line else never,
        ),
    ]
    lines = lines.with_columns(
        pl.coalesce([pl.when(cond).then(pl.lit(name)) for name, cond in line_checks]).alias("drop"),
        (lower.str.contains("lorem ipsum", literal=True) if c.reject_lorem_ipsum else never).alias("lorem"),
        (lower.str.contains("javascript", literal=True) if c.drop_javascript_lines else never).alias("js"),
        (line.str.contains("{", literal=True) if c.reject_curly_bracket else never).alias("curly"),
        (
            pl.any_horizontal([lower.str.contains(p, literal=True) for p in POLICY_SUBSTRINGS])
            if c.drop_policy_lines
            else never
        ).alias("policy"),
    )
    passed, lorem, js, curly, policy = (pl.col(n) for n in ("drop", "lorem", "js", "curly", "policy"))
    passed = passed.is_null()
    lorem_hit, curly_hit = passed & lorem, passed & ~lorem & ~js & curly
    drop = (
        pl.when(lorem_hit | curly_hit)
        .then(pl.lit("doc_rule"))
        .when(passed & js)
        .then(pl.lit("javascript"))
        .when(passed & policy)
        .then(pl.lit("policy"))
        .otherwise(pl.col("drop"))
    )
    return lines.select(
        "row",
        line.alias("line"),
        drop.alias("drop"),
        lorem_hit.alias("lorem"),
        curly_hit.alias("curly"),
        (line.str.count_matches(SENTENCE_END_PATTERN) + 1).alias("sentences"),
    )


def c4_metrics(text: pl.Series, c: C4Config) -> tuple[pl.DataFrame, pl.Series, dict[str, float]]:
    """Per-document C4 metrics, the text of kept lines, and removed-line counts per line rule."""
    lines = c4_lines(text, c)
    kept = pl.col("drop").is_null()
    per_doc = (
        lines.group_by("row", maintain_order=True)
        .agg(
            pl.col("sentences").filter(kept).sum().cast(pl.Int64).alias("c4_sentences"),
            pl.col("lorem").any().alias("c4_lorem_ipsum"),
            pl.col("curly").any().alias("c4_curly_bracket"),
            pl.col("line").filter(kept).str.join("\n").str.strip_chars().alias("c4_text"),
        )
        .sort("row")
    )
    removed = lines.filter(pl.col("drop").is_in(LINE_RULES) & (pl.col("line") != "")).group_by("drop").len()
    counters = {("c4_lines_removed", r): float(n) for r, n in removed.iter_rows()}
    return per_doc.drop("row", "c4_text"), per_doc["c4_text"], counters


class C4Filter(RuleFilter):
    """Removes lines failing C4's line rules and rejects documents failing its page rules."""

    kind = "filter.c4"
    Config = C4Config
    reasons = ("filter:c4_lorem_ipsum", "filter:c4_curly_bracket", "filter:c4_min_sentences", "filter:c4_empty")
    config: C4Config

    def metrics(self, batch: pl.DataFrame) -> pl.DataFrame:
        return c4_metrics(batch["text"], self.config)[0]

    def rules(self) -> list[tuple[str, pl.Expr]]:
        c = self.config
        out = []
        if c.reject_lorem_ipsum:
            out.append(("filter:c4_lorem_ipsum", pl.col("c4_lorem_ipsum")))
        if c.reject_curly_bracket:
            out.append(("filter:c4_curly_bracket", pl.col("c4_curly_bracket")))
        if c.min_sentences is not None:
            out.append(("filter:c4_min_sentences", pl.col("c4_sentences") < c.min_sentences))
        return out

    def apply(self, batch: pl.DataFrame) -> StageOutput:
        # Like RuleFilter.apply, but kept rows get the text of their kept lines; rejects keep the original.
        metrics, kept_text, counters = c4_metrics(batch["text"], self.config)
        rules = self.rules()
        if self.config.remove_lines:  # every line removed (min_sentences unset lets such a page pass): no document
            emptied = (kept_text.str.strip_chars().str.len_bytes() == 0) & (
                batch["text"].fill_null("").str.strip_chars().str.len_bytes() > 0
            )
            rules.append(("filter:c4_empty", pl.lit(emptied)))
        reason = pl.coalesce(
            [pl.when(cond).then(pl.lit(name, dtype=pl.String)) for name, cond in rules]
            or [pl.lit(None, dtype=pl.String)]
        )
        df, back = self.beside(batch, metrics)
        df = df.with_columns(reason.alias("__reason"))
        if self.config.remove_lines:
            df = df.with_columns(
                pl.when(pl.col("__reason").is_null()).then(kept_text).otherwise(pl.col("text")).alias("text")
            )
        if not self.config.keep_metrics:
            df = df.drop(metrics.columns).rename(back)
        rejected = df.filter(pl.col("__reason").is_not_null())
        kept = df.filter(pl.col("__reason").is_null()).drop("__reason")
        return StageOutput(kept, make_rejects(rejected, pl.col("__reason")).drop("__reason"), counters=counters)
