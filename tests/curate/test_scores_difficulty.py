"""score.difficulty: [0, 1], monotone in each measure on constructed pools, model saved, robust."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from winnow.curate.errors import ConfigError
from winnow.curate.stages.base import StageContext
from winnow.curate.stages.scores.difficulty import MODEL_FILE, DifficultyScore, DifficultyScoreConfig

COMMON = "the cat sat on the mat and the dog sat on the rug"


def rows(texts: list[str]) -> pl.DataFrame:
    n = len(texts)
    return pl.DataFrame(
        {"id": [f"d{i}" for i in range(n)], "source": ["s"] * n, "text": texts, "meta": [None] * n},
        schema=dict.fromkeys(("id", "source", "text", "meta"), pl.String),
    )


def pool_texts() -> list[str]:
    rng = np.random.default_rng(0)
    words = COMMON.split()
    texts = [" ".join(rng.choice(words, size=rng.integers(10, 60))) for _ in range(200)]
    texts += [f"{COMMON} word{i} term{i}x" for i in range(50)]  # a long tail of rare words
    return texts


def fit(tmp_path, texts: list[str], **kw) -> tuple[DifficultyScore, dict]:
    ctx = StageContext(
        stage_id="07.score.difficulty", job_name="t", output_dir=tmp_path, plan_dir=tmp_path / "plan", sources=("s",)
    )
    cfg = DifficultyScoreConfig(**kw)
    st = DifficultyScore(cfg, ctx)
    batch = rows(texts)
    keys = st.collect(batch).with_columns(pl.lit(0, dtype=pl.Int64).alias("_task"))
    assert "text" not in keys.columns
    report = st.plan(keys.lazy()).report
    return DifficultyScore(cfg, ctx), report


def score(st: DifficultyScore, texts: list[str]) -> list[float]:
    return st.apply(rows(texts)).kept["difficulty"].to_list()


def test_rare_words_make_a_document_harder(tmp_path):
    st, _ = fit(tmp_path, pool_texts(), weights={"rare_words": 1.0})
    easy, hard = score(st, ["the cat sat on the mat", "quixotic zephyr sat on ineffable lexicon"])
    assert hard > easy


def test_unusual_word_order_raises_perplexity(tmp_path):
    st, _ = fit(tmp_path, [COMMON] * 100 + pool_texts(), weights={"perplexity": 1.0})
    fluent, shuffled = score(st, [COMMON, "rug the on sat dog the and mat the on sat cat the"])
    assert shuffled > fluent


def test_longer_documents_are_harder_on_length(tmp_path):
    st, _ = fit(tmp_path, pool_texts(), weights={"length": 1.0})
    short, long = score(st, ["the cat sat", " ".join([COMMON] * 20)])
    assert long > short


def test_blend_is_in_unit_interval_and_model_saved(tmp_path):
    st, report = fit(tmp_path, pool_texts())
    d = score(st, pool_texts()[:20] + ["", "中文文本没有空格" * 30, "q" * 3_000_000])
    assert all(0.0 <= x <= 1.0 for x in d)
    assert (tmp_path / "artifacts" / "07.score.difficulty" / MODEL_FILE).is_file()
    assert report["docs"] == 250 and report["common_words"] >= 1


def test_same_pool_same_difficulty(tmp_path):
    a, _ = fit(tmp_path / "a", pool_texts())
    b, _ = fit(tmp_path / "b", pool_texts())
    assert score(a, pool_texts()[:30]) == score(b, pool_texts()[:30])


@pytest.mark.parametrize(
    "kw", [{"weights": {"speed": 1.0}}, {"common_mass": 1.0}, {"bigram_weight": 0.0}, {"buckets": 1}]
)
def test_bad_config_names_the_key(kw):
    with pytest.raises(ConfigError, match=next(iter(kw))):
        DifficultyScoreConfig(**kw)
