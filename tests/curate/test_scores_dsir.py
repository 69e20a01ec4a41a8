"""score.dsir: target source gets higher importance weights, both models saved, per-token option."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from winnow.curate.errors import ConfigError, StageError
from winnow.curate.stages.base import StageContext
from winnow.curate.stages.scores.dsir import MODEL_FILES, DsirScore, DsirScoreConfig
from winnow.curate.stages.scores.tokens import hash_tokens


def run(tmp_path: Path, batches: list[pl.DataFrame], **kw) -> tuple[DsirScore, dict, pl.DataFrame]:
    ctx = StageContext(
        stage_id="06.score.dsir",
        job_name="t",
        output_dir=tmp_path,
        plan_dir=tmp_path / "plan",
        sources=("docs", "changelog"),
    )
    cfg = DsirScoreConfig(**{"target_source": "docs", **kw})
    st = DsirScore(cfg, ctx)
    keys = pl.concat(
        [st.collect(b).with_columns(pl.lit(i, dtype=pl.Int64).alias("_task")) for i, b in enumerate(batches)]
    )
    assert "text" not in keys.columns
    report = st.plan(keys.lazy()).report
    fresh = DsirScore(cfg, ctx)
    return fresh, report, pl.concat([fresh.apply(b).kept for b in batches])


@pytest.mark.parametrize("per_token", [False, True])
def test_target_source_gets_higher_weights_than_the_noisy_one(tmp_path, pool, per_token):
    _, report, out = run(tmp_path, pool, per_token=per_token)
    w = out.group_by("source").agg(pl.col("dsir_weight").median()).sort("source")["dsir_weight"].to_list()
    assert w[1] > w[0]  # docs (target) above changelog
    assert out.schema["dsir_weight"] == pl.Float64 and out["dsir_weight"].is_finite().all()
    assert report["docs"] == {"target": 300, "raw": 600} and report["kl_target_raw"] > 0


def test_both_models_are_saved_as_artifacts(tmp_path, pool):
    run(tmp_path, pool)
    for file in MODEL_FILES.values():
        with np.load(tmp_path / "artifacts" / "06.score.dsir" / file) as z:
            assert z["counts"].shape == (10_000,) and z["counts"].sum() > 0


def test_per_token_divides_by_the_number_of_ngrams(tmp_path, pool):
    st, _, _ = run(tmp_path, pool)
    one = pool[0].head(1)["text"]
    per_doc = st.weights(one)[0]
    per_tok = DsirScore(DsirScoreConfig(target_source="docs", per_token=True), st.ctx).weights(one)[0]
    n_tok = hash_tokens(one).uni.shape[0]
    assert per_doc == pytest.approx(per_tok * (2 * n_tok - 1))  # n unigrams + n - 1 bigrams


def test_bad_input_scores_zero_for_empty_text_and_finite_otherwise(tmp_path, pool):
    st, _, _ = run(tmp_path, pool)
    odd = pool[0].head(3).with_columns(pl.Series("text", ["", "中文文本" * 100, "z" * 2_000_000]))
    out = st.apply(odd).kept
    assert out["dsir_weight"][0] == 0.0 and out["dsir_weight"].is_finite().all()


def test_min_weight_rejects_with_its_reason(tmp_path, pool):
    st, _, _ = run(tmp_path, pool, min_weight=0.0)
    out = st.apply(pool[1])
    assert out.rejected.height > 150 and set(out.rejected["reason"]) == {"score:dsir_min_weight"}


def test_unknown_target_is_a_named_error(tmp_path, pool):
    with pytest.raises(StageError, match="nope"):
        run(tmp_path, pool, target_source="nope")
    with pytest.raises(ConfigError, match="target_source"):
        DsirScoreConfig()
