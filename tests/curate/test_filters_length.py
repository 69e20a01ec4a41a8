"""filter.length: the compiled word count equals the regex's, and only the bounded lengths are measured."""

from __future__ import annotations

import random
from pathlib import Path

import polars as pl
import pytest

from winnow.curate.stages.base import StageContext
from winnow.curate.stages.filters.length import LengthConfig, LengthFilter, count_words

# Whitespace the regex engine knows (U+0085, U+00A0, U+2003, U+3000, U+2028) and characters that look like it
# and are not (U+001C, U+180E, U+200B), combining marks, letters.
_ALPHABET = ["a", "bc", " ", "\t", "\n", "\r", "\x0b", "\x1c", "\x85", "\u00a0", "\u2003", "\u3000", "\u2028",
             "\u180e", "\u200b", "\u00e9", "x\u0301", "\U0001f642"]  # fmt: skip


def test_word_count_equals_the_regex():
    rng = random.Random(4)
    texts = ["".join(rng.choices(_ALPHABET, k=rng.randrange(0, 25))) for _ in range(5000)] + [""]
    samples = Path(__file__).resolve().parents[2] / "data_samples"
    for path in sorted(samples.rglob("*.jsonl"))[:4]:
        texts += pl.read_ndjson(path)["text"].cast(pl.String).head(200).to_list()
    column = pl.Series(texts, dtype=pl.String)
    for part in (column, column.slice(11)):
        want = pl.DataFrame({"t": part}).select(pl.col("t").str.count_matches(r"\S+"))["t"]
        assert count_words(part).tolist() == want.to_list()


def _stage(tmp_path, **cfg) -> LengthFilter:
    ctx = StageContext(
        stage_id="02.filter.length", job_name="t", output_dir=tmp_path, plan_dir=tmp_path, sources=("s",)
    )
    return LengthFilter(LengthConfig(**cfg), ctx)


def _batch(texts: list[str]) -> pl.DataFrame:
    return pl.DataFrame({"id": [str(i) for i in range(len(texts))], "source": ["s"] * len(texts), "text": texts})


@pytest.mark.parametrize("keep", [False, True])
def test_bounds_decide_and_metrics_are_kept_on_request(tmp_path, keep):
    texts = ["one two three", "one\u00a0two", "", "a\nb\nc\nd", "w " * 30]
    out = _stage(tmp_path, min_words=3, max_lines=3, keep_metrics=keep).apply(_batch(texts))
    assert out.kept["text"].to_list() == ["one two three", "w " * 30]
    assert dict(zip(out.rejected["text"], out.rejected["reason"])) == {
        "one\u00a0two": "filter:length_min_words",
        "": "filter:length_min_words",
        "a\nb\nc\nd": "filter:length_max_lines",
    }
    metrics = [c for c in out.kept.columns if c.startswith("length_")]
    assert metrics == (["length_chars", "length_words", "length_lines"] if keep else [])
    if keep:
        assert out.kept["length_words"].to_list() == [3, 30]
        assert out.kept["length_lines"].to_list() == [1, 1]


def test_only_the_bounded_lengths_are_measured(tmp_path):
    assert _stage(tmp_path, min_words=2).metrics(_batch(["a b"])).columns == ["length_words"]
    bounded = _stage(tmp_path, max_chars=9, min_lines=1).metrics(_batch(["a b"]))
    assert bounded.columns == ["length_chars", "length_lines"]
