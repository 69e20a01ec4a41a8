"""score.heuristic: monotone on constructed examples, bounded, configurable, robust to bad input."""

from __future__ import annotations

import polars as pl
import pytest

from winnow.curate.errors import ConfigError
from winnow.curate.stages.base import StageContext
from winnow.curate.stages.scores.heuristic import COMPONENTS, HeuristicScore, HeuristicScoreConfig
from winnow.curate.text.quality import PROSE_STOP_WORDS

PROSE = (
    "The committee met on Tuesday to discuss the budget. Members agreed that the proposal needed more work, "
    "and they asked the staff to prepare a revised plan with clearer estimates of the costs involved.\n"
    "The revised plan will be presented at the next meeting, which is scheduled for the end of the month. "
    "Until then, the current budget remains in effect for all of the departments."
)
MASH = "asdf jkl qwer uiop zxcv bnm hjkl fdsa rewq poiu vcxz mnb lkjh " * 6
SOUP = "#$%^ &*() #### @@!! ~~~ ... ### {{}} [[]] <<>> ;;; " * 8
REPEATED = "\n".join(["Click here to subscribe to the newsletter."] * 20)


def rows(*texts: str) -> pl.DataFrame:
    n = len(texts)
    return pl.DataFrame(
        {"id": [f"d{i}" for i in range(n)], "source": ["s"] * n, "text": list(texts), "meta": [None] * n},
        schema=dict.fromkeys(("id", "source", "text", "meta"), pl.String),
    )


def stage(tmp_path, **kw) -> HeuristicScore:
    ctx = StageContext(
        stage_id="01.score.heuristic", job_name="t", output_dir=tmp_path, plan_dir=tmp_path / "plan", sources=("s",)
    )
    return HeuristicScore(HeuristicScoreConfig(**kw), ctx)


def test_clean_prose_scores_above_mash_soup_and_repeated_lines(tmp_path):
    q = stage(tmp_path).apply(rows(PROSE, MASH, SOUP, REPEATED)).kept["quality"].to_list()
    assert q[0] == pytest.approx(1.0)
    assert q[0] > q[1] and q[0] > q[2] and q[0] > q[3]
    assert q[2] < q[1]  # symbol soup is worse than pronounceable mash


def test_score_is_in_unit_interval_and_float64(tmp_path):
    out = stage(tmp_path).apply(rows(PROSE, MASH, SOUP, REPEATED, "x", "... ### ...")).kept
    assert out.schema["quality"] == pl.Float64
    assert out["quality"].is_between(0.0, 1.0).all()


def test_bad_input_never_crashes_and_nothing_is_dropped(tmp_path):
    texts = ("", "   \n\t ", "中文文本没有空格" * 100, "x" * 5_000_000, "a\u0301\u200b b")
    out = stage(tmp_path).apply(rows(*texts))
    assert out.kept.height == len(texts) and out.rejected.height == 0
    assert out.kept["quality"][0] == 0.0 and out.kept["quality"][1] == 0.0
    assert out.kept["quality"].is_not_null().all()


def test_min_quality_rejects_with_its_reason(tmp_path):
    out = stage(tmp_path, min_quality=0.9).apply(rows(PROSE, MASH))
    assert out.kept["id"].to_list() == ["d0"]
    assert out.rejected["id"].to_list() == ["d1"]
    assert out.rejected["reason"].to_list() == ["score:heuristic_min_quality"]
    assert set(out.rejected["reason"]) <= set(HeuristicScore.reasons)


def test_keep_metrics_and_column_options(tmp_path):
    out = stage(tmp_path, keep_metrics=True, column="hq").apply(rows(PROSE)).kept
    assert {f"heuristic_{c}" for c in COMPONENTS} | {"hq"} <= set(out.columns)
    assert "quality" not in out.columns


def test_weights_select_components(tmp_path):
    only_dup = stage(tmp_path, weights={"dup_lines": 1.0}).apply(rows(MASH, REPEATED)).kept["quality"].to_list()
    assert only_dup == [1.0, 0.0]


@pytest.mark.parametrize(
    "kw",
    [
        {"weights": {"nope": 1.0}},
        {"weights": {"length": 0.0}},
        {"min_quality": 1.5},
        {"column": "text"},
        {"column": "split"},
    ],
)
def test_bad_config_names_the_key(kw):
    with pytest.raises(ConfigError, match=next(iter(kw))):
        HeuristicScoreConfig(**kw)


def _expression_metrics(text: pl.Series) -> pl.DataFrame:
    """The metrics as regular expressions over the text state them: what ``metrics``' compiled pass must equal."""
    t = pl.col("text").fill_null("")
    lines = (
        t.str.split("\n").list.eval(pl.element().str.strip_chars()).list.eval(pl.element().filter(pl.element() != ""))
    )
    stop_words = r"(?i)\b(?:" + "|".join(PROSE_STOP_WORDS) + r")\b"
    return (
        pl.DataFrame({"text": text})
        .select(
            t.str.count_matches(r"\S+").alias("_m_words"),
            (t.str.len_chars() - t.str.count_matches(r"\s")).alias("_m_non_space"),
            t.str.count_matches(r"\p{L}").alias("_m_letters"),
            (t.str.count_matches("#") + t.str.count_matches(r"\.\.\.|…")).alias("_m_symbols"),
            t.str.count_matches(stop_words).alias("_m_stop_words"),
            lines.list.len().alias("_m_lines"),
            lines.list.eval(pl.element().str.contains(r"[.!?\"'”’)]$")).list.sum().alias("_m_punct_lines"),
            lines.list.n_unique().alias("_m_unique_lines"),
        )
        .cast(pl.Float64)
    )


def test_compiled_metrics_equal_the_expressions():
    """Adversarial text (stop words in every case and next to word characters, dot runs, blank and repeated
    lines, non-ASCII whitespace, letters and punctuation) and the sample data."""
    import random
    from pathlib import Path

    from winnow.curate.stages.scores.heuristic import metrics

    rng = random.Random(8)
    alphabet = [*PROSE_STOP_WORDS, "THE", "ThAt", "With", "be_", "_to", "tox", "of1", "havé", "and\u0301"]
    alphabet += [" ", " ", "\n", "\n", "\t", "\u00a0", "\u2003", "\u3000", "\u200b", "\u180e", ".", "..", "#"]
    alphabet += ["\u2026", "!", "?", '"', "'", "\u201d", "\u2019", ")", "(", "a", "\u00e9", "\u4e2d", "\U0001f642"]
    alphabet += ["same line\n", "\u212a", "\u017f"]
    texts = ["".join(rng.choices(alphabet, k=rng.randrange(0, 40))) for _ in range(4000)] + ["", None]
    samples = Path(__file__).resolve().parents[2] / "data_samples"
    for path in sorted(samples.rglob("*.jsonl"))[:4]:
        texts += pl.read_ndjson(path)["text"].cast(pl.String).head(200).to_list()
    column = pl.Series(texts, dtype=pl.String)
    for part in (column, column.slice(13)):
        assert metrics(part).equals(_expression_metrics(part))


def test_only_ascii_letters_fold_to_the_stop_words_letters():
    """The compiled pass matches stop words as ASCII letters in any case: the regex engine folds no other
    character to one of their letters."""
    letters = sorted(set("".join(PROSE_STOP_WORDS)))
    chars = pl.Series([chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000], dtype=pl.String)
    folding = pl.DataFrame({"c": chars}).filter(pl.col("c").str.contains(f"^(?i:[{''.join(letters)}])$"))["c"]
    assert sorted(folding.to_list()) == sorted(letters + [x.upper() for x in letters])


def test_a_row_field_named_like_a_metric_is_left_alone(tmp_path):
    batch = rows(PROSE, MASH).with_columns(pl.Series("_m_words", ["kept", "as is"]))
    out = stage(tmp_path).apply(batch)
    assert out.kept["_m_words"].to_list() == ["kept", "as is"]
    assert out.kept["quality"].to_list() == stage(tmp_path).apply(rows(PROSE, MASH)).kept["quality"].to_list()


def test_weights_whose_sum_overflows_are_refused():
    """Weights are relative: 1e308 each summed to inf, and every row's score became 0 (all rejected by a minimum)."""
    from winnow.curate.stages.scores.difficulty import DifficultyScoreConfig

    with pytest.raises(ConfigError, match="score.heuristic.weights = .* positive, finite sum"):
        HeuristicScoreConfig(weights={"length": 1e308, "alpha": 1e308})
    with pytest.raises(ConfigError, match="score.difficulty.weights = .* positive, finite sum"):
        DifficultyScoreConfig(weights={"length": 1e308, "rare_words": 1e308})
