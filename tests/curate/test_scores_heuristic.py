"""score.heuristic: monotone on constructed examples, bounded, configurable, robust to bad input."""

from __future__ import annotations

import polars as pl
import pytest

from winnow.curate.errors import ConfigError
from winnow.curate.stages.base import StageContext
from winnow.curate.stages.scores.heuristic import COMPONENTS, HeuristicScore, HeuristicScoreConfig

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
