"""score.classifier: trained in plan on the reference source, CV reported, model saved, deterministic."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from winnow.curate.errors import ConfigError, StageError
from winnow.curate.stages.base import StageContext
from winnow.curate.stages.scores.classifier import MODEL_FILE, ClassifierScore, ClassifierScoreConfig
from winnow.curate.stages.scores.linear import roc_auc


def run(tmp_path: Path, batches: list[pl.DataFrame], seed: int = 0, **kw) -> tuple[ClassifierScore, dict, pl.DataFrame]:
    ctx = StageContext(
        stage_id="05.score.classifier",
        job_name="t",
        output_dir=tmp_path,
        plan_dir=tmp_path / "plan",
        sources=("docs", "changelog"),
        seed=seed,
    )
    cfg = ClassifierScoreConfig(**{"positive_source": "docs", "epochs": 3, **kw})
    st = ClassifierScore(cfg, ctx)
    keys = pl.concat(
        [st.collect(b).with_columns(pl.lit(i, dtype=pl.Int64).alias("_task")) for i, b in enumerate(batches)]
    )
    assert "text" not in keys.columns
    report = st.plan(keys.lazy()).report
    fresh = ClassifierScore(cfg, ctx)  # apply runs in another process: it must load the saved model
    return fresh, report, pl.concat([fresh.apply(b).kept for b in batches])


def test_reference_source_ranks_above_the_noisy_one(tmp_path, pool):
    _, report, out = run(tmp_path, pool)
    assert out["quality"].is_between(0.0, 1.0).all()
    y = (out["source"] == "docs").to_numpy()
    assert roc_auc(y, out["quality"].to_numpy()) > 0.95
    assert report["cv_auc"] > 0.9 and 0.0 <= report["cv_accuracy"] <= 1.0 and len(report["fold_auc"]) == 5
    assert report["train_docs"] == {"positive": 300, "negative": 300}


def test_model_is_saved_with_the_job_outputs(tmp_path, pool):
    run(tmp_path, pool)
    assert (tmp_path / "artifacts" / "05.score.classifier" / MODEL_FILE).is_file()


def test_same_seed_same_scores_and_train_cap_is_honoured(tmp_path, pool):
    _, r1, a = run(tmp_path / "a", pool, seed=3, max_train_docs=100)
    _, r2, b = run(tmp_path / "b", pool, seed=3, max_train_docs=100)
    assert np.array_equal(a["quality"].to_numpy(), b["quality"].to_numpy())
    assert r1 == {**r2, "model": r1["model"]} and r1["train_docs"] == {"positive": 100, "negative": 100}


def test_bad_input_is_scored_not_dropped(tmp_path, pool):
    st, _, _ = run(tmp_path, pool)
    odd = pool[0].head(4).with_columns(pl.Series("text", ["", "   ", "中文文本没有空格" * 50, "y" * 1_000_000]))
    out = st.apply(odd)
    assert out.kept.height == 4 and out.kept["quality"].is_finite().all()


def test_min_quality_rejects_with_its_reason(tmp_path, pool):
    st, _, _ = run(tmp_path, pool, min_quality=0.5)
    out = st.apply(pool[1])
    assert out.rejected.height > 250 and set(out.rejected["reason"]) == {"score:classifier_min_quality"}


def test_missing_positive_source_in_pool_is_a_named_error(tmp_path, pool):
    with pytest.raises(StageError, match="nope"):
        run(tmp_path, pool, positive_source="nope")


def test_config_requires_positive_source():
    with pytest.raises(ConfigError, match="positive_source"):
        ClassifierScoreConfig()
    with pytest.raises(ConfigError, match="folds"):
        ClassifierScoreConfig(positive_source="a", folds=1)
    with pytest.raises(ConfigError, match=r"positive_source = 'b' is not among the stage's sources \['a'\]"):
        ClassifierScoreConfig(positive_source="b", sources=["a"])  # it failed after every earlier phase
    from winnow.curate.stages.scores.dsir import DsirScoreConfig

    with pytest.raises(ConfigError, match=r"target_source = 'b' is not among the stage's sources"):
        DsirScoreConfig(target_source="b", sources=["a"])


def test_a_training_that_diverges_is_an_error_naming_the_learning_rate(tmp_path, pool):
    """learning_rate = 1e300 wrote NaN for every row's quality, and min_quality then kept them all (NaN < x is false)."""
    with pytest.raises(StageError, match=r"training diverged .* at learning_rate = 1e\+300; lower it"):
        run(tmp_path, pool, learning_rate=1e300, min_quality=0.5)
