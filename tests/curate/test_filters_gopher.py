"""filter.gopher_quality: each rule trips on a small document made for it, and clean prose passes."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from winnow.curate.errors import ConfigError
from winnow.curate.stages.base import StageContext
from winnow.curate.stages.filters.gopher import GopherQualityConfig, GopherQualityFilter

SAMPLES = Path(__file__).resolve().parents[2] / "data_samples"

SENTENCE = "The quick brown fox jumps over the lazy dog and runs away with the bone."
GOOD = " ".join([SENTENCE] * 6)


def run(text: str, **cfg) -> str | None:
    """The reject reason of ``text`` (None when kept)."""
    ctx = StageContext(stage_id="t", job_name="t", output_dir=Path("."), plan_dir=Path("."), sources=("s",))
    stage = GopherQualityFilter(GopherQualityConfig(**cfg), ctx)
    batch = pl.DataFrame(
        {"id": ["d"], "source": ["s"], "text": [text], "meta": [None]}, schema_overrides={"meta": pl.String}
    )
    out = stage.apply(batch)
    assert out.kept.height + out.rejected.height == 1
    return out.rejected["reason"][0] if out.rejected.height else None


CASES = {
    "min_words": ("The cat and the dog.", {}),
    "max_words": (GOOD, {"max_words": 60}),
    "min_mean_word_length": (" ".join(["I am a b c d e f g h and the ok."] * 6), {}),
    "max_mean_word_length": ("the and " + " ".join(["internationalization characteristically"] * 30), {}),
    "hash_ratio": (GOOD + " #tag" * 15, {}),
    "ellipsis_ratio": (GOOD + " wait... then" * 25 + " " + SENTENCE, {}),
    "bullet_lines": ("\n".join(["- " + SENTENCE] * 10), {}),
    "ellipsis_lines": ("\n".join([SENTENCE[:-1] + "…"] * 10), {}),
    "alpha_words": (GOOD + " 123" * 40, {}),
    "stop_words": (" ".join(["Quick brown foxes jump over lazy dogs, running away quickly."] * 8), {}),
}
THRESHOLD_KEY = {
    "min_words": "min_words",
    "max_words": "max_words",
    "min_mean_word_length": "min_mean_word_length",
    "max_mean_word_length": "max_mean_word_length",
    "hash_ratio": "max_hash_ratio",
    "ellipsis_ratio": "max_ellipsis_ratio",
    "bullet_lines": "max_bullet_lines",
    "ellipsis_lines": "max_ellipsis_lines",
    "alpha_words": "min_alpha_words",
    "stop_words": "min_stop_words",
}


def test_clean_prose_passes():
    assert run(GOOD) is None


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_trips_exactly_its_rule(rule):
    text, cfg = CASES[rule]
    assert run(text, **cfg) == f"filter:gopher_{rule}"
    # Disabling that one rule lets the document through: no other rule fires on it.
    assert run(text, **{**cfg, THRESHOLD_KEY[rule]: None}) is None


def test_every_reason_is_declared():
    assert {f"filter:gopher_{r}" for r in CASES} == set(GopherQualityFilter.reasons)


def test_keep_metrics_keeps_columns():
    ctx = StageContext(stage_id="t", job_name="t", output_dir=Path("."), plan_dir=Path("."), sources=("s",))
    stage = GopherQualityFilter(GopherQualityConfig(keep_metrics=True), ctx)
    out = stage.apply(
        pl.DataFrame(
            {"id": ["d"], "source": ["s"], "text": [GOOD], "meta": [None]}, schema_overrides={"meta": pl.String}
        )
    )
    assert out.kept["gopher_stop_words"][0] == 3  # "the", "and", "with"; stop words are case-sensitive, as in Gopher
    assert out.kept["gopher_words"][0] == 15 * 6


def test_bad_threshold_names_key():
    with pytest.raises(ConfigError, match="min_alpha_words"):
        GopherQualityConfig(min_alpha_words=1.5)


def _reference_counts(text: pl.Series, stop_words) -> pl.DataFrame:
    """The token counts by the regular expressions: tokens, words (a letter, number or mark), their mean
    length, alphabetic tokens and distinct stop words per document."""
    from winnow.curate.text.words import WORD_CHAR, per_row, token_table

    tokens = token_table(text).with_columns(
        pl.col("tok").str.contains(WORD_CHAR).alias("word"),
        pl.col("tok").str.contains(r"\p{L}").alias("alpha"),
        pl.when(pl.col("tok").is_in(list(stop_words))).then(pl.col("tok")).alias("stop"),
    )
    per_doc = tokens.group_by("row").agg(
        pl.len().alias("tokens"),
        pl.col("word").sum().alias("gopher_words"),
        pl.col("chars").filter(pl.col("word")).mean().alias("gopher_mean_word_length"),
        pl.col("alpha").sum().alias("alpha"),
        pl.col("stop").drop_nulls().n_unique().alias("gopher_stop_words"),
    )
    return per_row(per_doc, len(text), {"tokens": 0, "gopher_words": 0, "alpha": 0, "gopher_stop_words": 0})


@pytest.mark.parametrize(
    "stop_words", [None, ("the", "the", "é", "中文", "a-b", "it's"), tuple(f"w{i}" for i in range(100))]
)
def test_compiled_counts_equal_the_expressions(stop_words):
    """Words, their mean length, the alphabetic ratio and the stop words as the regular expressions count them."""
    import random

    from winnow.curate.stages.filters.gopher import GOPHER_STOP_WORDS, gopher_quality_metrics

    stop_words = stop_words or GOPHER_STOP_WORDS
    rng = random.Random(2)
    alphabet = [
        *"the of and a b Z 9 _ - . ' # \n\t",
        *["é", "\u0301", "中", "文", "²", "Ⅻ", "٣", "🙂", "ſ", "\u200b", "w1", "w99", "it's", "a-b", "…"],
    ]
    texts = ["".join(rng.choices(alphabet, k=rng.randrange(0, 40))) for _ in range(1500)]
    texts += pl.read_ndjson(sorted(SAMPLES.glob("*/*.jsonl"))[0])["text"].cast(pl.String).head(100).to_list()
    column = pl.Series([*texts, None, ""], dtype=pl.String)
    got = gopher_quality_metrics(column, stop_words)
    want = _reference_counts(column, stop_words)
    tokens = want["tokens"].cast(pl.Float64).replace(0.0, None)
    assert got["gopher_words"].to_list() == want["gopher_words"].to_list()
    assert got["gopher_mean_word_length"].to_list() == want["gopher_mean_word_length"].to_list()
    assert got["gopher_alpha_words"].to_list() == (want["alpha"] / tokens).to_list()
    assert got["gopher_stop_words"].to_list() == want["gopher_stop_words"].to_list()


def _reference_layout(text: pl.Series) -> pl.DataFrame:
    """The line and character metrics as the polars expressions count them (what ``layout_counts`` replaces)."""
    from winnow.curate.text.words import count_lines, unify_line_breaks

    lines = unify_line_breaks(pl.col("text"))
    return pl.DataFrame({"text": text}).select(
        pl.col("text").str.count_matches("#", literal=True).alias("hashes"),
        (
            pl.col("text").str.count_matches("...", literal=True) + pl.col("text").str.count_matches("…", literal=True)
        ).alias("ellipses"),
        count_lines(pl.col("text")).alias("lines"),
        lines.str.count_matches(r"(?m)^[^\S\n]*[•\-]").alias("bullet_lines"),
        lines.str.count_matches(r"(?m)(?:\.\.\.|…)[^\S\n]*$").alias("ellipsis_lines"),
    )


def test_compiled_layout_counts_equal_the_expressions():
    """Hashes, ellipses, lines, bullet lines and ellipsis lines as the regular expressions count them, over every
    line break ``str.splitlines`` knows, Unicode blanks and characters that only look blank."""
    import random

    import numpy as np

    from winnow.curate.dedup.text import string_buffers
    from winnow.curate.text.codepoints import TABLE
    from winnow.curate.text.quality import LAYOUT_COUNTS, layout_counts

    rng = random.Random(5)
    alphabet = [
        *". . . . # - - • … a Z é 中 🙂",
        *["\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f", "\x85", "\u2028", "\u2029"],
        *["\t", " ", "\xa0", "\u1680", "\u2000", "\u200a", "\u200b", "\u202f", "\u205f", "\u3000", "\u180e", "\ufeff"],
        *["...", "....", "- ", "• ", "\n-", "\n\t•", "…\n", "... \n", "#"],
    ]
    texts = ["".join(rng.choices(alphabet, k=rng.randrange(0, 30))) for _ in range(4000)]
    texts += [
        "",
        ".",
        "..",
        "...",
        "......",
        ".......",
        "...\n",
        "\n",
        "\r\n",
        "\r\r\n",
        "-",
        "\n-",
        " \u3000•x",
        "a...  ",
    ]
    texts += pl.read_ndjson(sorted(SAMPLES.glob("*/*.jsonl"))[0])["text"].cast(pl.String).head(200).to_list()
    column = pl.Series(texts, dtype=pl.String)
    offsets, data = string_buffers(column)
    got = dict(zip(LAYOUT_COUNTS, layout_counts(offsets, data, TABLE.cover(offsets, data)[0])))
    want = _reference_layout(column)
    for name in LAYOUT_COUNTS:
        mismatch = np.flatnonzero(got[name] != want[name].to_numpy())
        assert not len(mismatch), (name, [texts[i] for i in mismatch[:5]], got[name][mismatch[:5]])
