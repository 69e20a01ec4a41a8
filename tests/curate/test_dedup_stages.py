"""dedup.exact and dedup.minhash as barriers: collect per task, plan globally, apply per task."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from winnow.curate.dedup.exact import ExactConfig, ExactDedup
from winnow.curate.dedup.minhash import MinHashConfig, MinHashDedup
from winnow.curate.errors import ConfigError
from winnow.curate.stages.base import StageContext


def _ctx(tmp_path, stage_id="01.dedup"):
    return StageContext(
        stage_id=stage_id, job_name="t", output_dir=tmp_path, plan_dir=tmp_path / "plan", sources=("a", "b")
    )


def _rows(ids, sources, texts, **extra):
    return pl.DataFrame({"id": ids, "source": sources, "text": texts, "meta": ["{}"] * len(ids), **extra})


def _run(stage, tasks):
    """collect on every task, plan once, apply each task's decision; returns (outputs, report)."""
    keys = [stage.collect(t).with_columns(pl.lit(i, pl.Int32).alias("_task")) for i, t in enumerate(tasks)]
    plan = stage.plan(pl.concat(keys).lazy())
    outs = [stage.apply(t, plan.decision.filter(pl.col("_task") == i).drop("_task")) for i, t in enumerate(tasks)]
    return outs, plan.report


def _words(seed, n=60):
    rng = np.random.default_rng(seed)
    return " ".join(f"w{j}" for j in rng.integers(0, 5000, size=n))


def test_exact_drops_identical_texts_across_tasks_and_sources(tmp_path):
    stage = ExactDedup(ExactConfig(), _ctx(tmp_path))
    t0 = _rows(["a/1", "a/2"], ["a", "a"], ["same text", "other"])
    t1 = _rows(["b/1", "b/2"], ["b", "b"], ["same   text ", "unique"])
    (o0, o1), report = _run(stage, [t0, t1])
    assert o0.kept["id"].to_list() == ["a/1", "a/2"]
    assert o1.kept["id"].to_list() == ["b/2"]
    assert o1.rejected.select("id", "reason", "duplicate_of").rows() == [("b/1", "dedup:exact", "a/1")]
    assert report["removed_per_source"] == {"b": 1} and report["cross_source_duplicates"] == {"a|b": 1}
    assert report["clusters"] == 1


def test_exact_normalization_none_keeps_whitespace_variants(tmp_path):
    stage = ExactDedup(ExactConfig(normalize="none"), _ctx(tmp_path))
    (out,), report = _run(stage, [_rows(["1", "2", "3"], ["a"] * 3, ["x y", "x  y", "x y"])])
    assert out.kept["id"].to_list() == ["1", "2"] and report["removed"] == 1


def test_exact_lower_folds_case(tmp_path):
    stage = ExactDedup(ExactConfig(normalize="lower"), _ctx(tmp_path))
    (out,), _ = _run(stage, [_rows(["1", "2"], ["a"] * 2, ["Hello World", "hello world"])])
    assert out.rejected["id"].to_list() == ["2"]


def test_exact_texts_normalization_empties_are_compared_as_they_are(tmp_path):
    """Under ``words`` emoji and symbols normalize to nothing: such texts are duplicates only of the same text,
    never of every other text without words."""
    texts = ["\U0001f600\U0001f603", "\U0001f389 \U0001f680", "!!! ???", "\u2211 \u222b", "!!! ???", "", ""]
    stage = ExactDedup(ExactConfig(normalize="words"), _ctx(tmp_path))
    (out,), _ = _run(stage, [_rows([f"{i}" for i in range(7)], ["a"] * 7, texts)])
    assert out.rejected.select("id", "duplicate_of").rows() == [("4", "2"), ("6", "5")]


@pytest.mark.parametrize(
    ("keep", "kept"),
    [("first", "k1"), ("longest", "k3"), ("quality", "k2")],
)
def test_keep_policies(tmp_path, keep, kept):
    stage = ExactDedup(ExactConfig(normalize="words", keep=keep), _ctx(tmp_path))
    rows = _rows(["k3", "k1", "k2"], ["a"] * 3, ["Same, text!!!", "same text", "SAME TEXT"], quality=[0.1, None, 0.9])
    (out,), _ = _run(stage, [rows])
    assert out.kept["id"].to_list() == [kept]
    assert set(out.rejected["duplicate_of"].to_list()) == {kept}


@pytest.mark.parametrize(
    "stage_class", [(ExactDedup, ExactConfig), (MinHashDedup, MinHashConfig)], ids=["exact", "minhash"]
)
def test_keep_quality_without_any_score_says_it_keeps_the_lowest_id(tmp_path, caplog, stage_class):
    """A score stage writing another column (or none) left keep = 'quality' choosing the lowest id without a word."""
    kind, config = stage_class
    stage = kind(config(keep="quality"), _ctx(tmp_path))
    text = _words(1)
    with caplog.at_level("WARNING"):
        (out,), _ = _run(stage, [_rows(["k2", "k1"], ["a"] * 2, [text, text])])
    assert out.kept["id"].to_list() == ["k1"]
    assert "keep = 'quality', but no row has a quality score, so each group keeps its lowest id" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        _run(
            kind(config(keep="quality"), _ctx(tmp_path / "s")),
            [_rows(["k2", "k1"], ["a"] * 2, [text, text], quality=[0.9, 0.1])],
        )
    assert "no row has a quality score" not in caplog.text


def test_apply_keeps_row_order_and_columns(tmp_path):
    stage = ExactDedup(ExactConfig(), _ctx(tmp_path))
    rows = _rows(["1", "2", "3", "4"], ["a"] * 4, ["x", "y", "x", "z"], quality=[1.0, 2.0, 3.0, 4.0])
    (out,), _ = _run(stage, [rows])
    assert out.kept.columns == rows.columns and out.kept["id"].to_list() == ["1", "2", "4"]
    assert out.rejected.columns == [*rows.columns, "reason", "duplicate_of"]


def test_minhash_drops_near_duplicates_across_sources(tmp_path):
    base = _words(1, 200)
    near = base.replace(base.split()[100], "changed", 1)
    t0 = _rows(["a/1", "a/2"], ["a", "a"], [base, _words(2)])
    t1 = _rows(["b/1", "b/2"], ["b", "b"], [near, _words(3)])
    stage = MinHashDedup(MinHashConfig(), _ctx(tmp_path))
    (o0, o1), report = _run(stage, [t0, t1])
    assert o0.rejected.height == 0
    assert o1.rejected.select("id", "reason", "duplicate_of").rows() == [("b/1", "dedup:minhash", "a/1")]
    assert report["cross_source_duplicates"] == {"a|b": 1}
    assert report["candidate_pairs"] >= report["verified_pairs"] == 1


def test_minhash_verification_rejects_false_candidates(tmp_path):
    # Jaccard 0.73: a candidate of the loose LSH, but not a duplicate at 0.8.
    words = _words(4, 200).split()
    other = " ".join(words[:170] + [f"x{i}" for i in range(30)])
    stage = MinHashDedup(MinHashConfig(), _ctx(tmp_path))
    (out,), report = _run(stage, [_rows(["1", "2"], ["a"] * 2, [" ".join(words), other])])
    assert out.rejected.height == 0
    assert report["candidate_pairs"] == 1 and report["verified_pairs"] == 0


def test_minhash_sampled_verification_reports_false_positive_rate(tmp_path):
    words = _words(4, 200).split()
    other = " ".join(words[:150] + [f"x{i}" for i in range(50)])
    config = MinHashConfig(verify="sample", bands=32, rows=4)
    (out,), report = _run(
        MinHashDedup(config, _ctx(tmp_path)), [_rows(["1", "2"], ["a"] * 2, [" ".join(words), other])]
    )
    assert report["sampled_pairs"] == 1 and report["estimated_false_positive_rate"] == 1.0
    assert out.rejected.height == 1  # sampled mode reports, it does not filter


def test_minhash_without_verification_spills_no_sets(tmp_path):
    stage = MinHashDedup(MinHashConfig(verify="none"), _ctx(tmp_path))
    keys = stage.collect(_rows(["1"], ["a"], ["some words here"]))
    assert "_shingles" not in keys.columns
    assert [c for c in keys.columns if c.startswith("_band_")] == [
        f"_band_{i}" for i in range(stage.config.lsh_shape()[0])
    ]


def test_plan_without_keys_drops_nothing(tmp_path):
    empty = pl.LazyFrame(schema={"id": pl.String, "_task": pl.Int32})
    for stage in (ExactDedup(ExactConfig(), _ctx(tmp_path)), MinHashDedup(MinHashConfig(), _ctx(tmp_path))):
        plan = stage.plan(empty)
        assert plan.decision.height == 0 and plan.report["removed"] == 0


def test_default_lsh_is_loose_when_verifying():
    from winnow.curate.dedup.lsh import candidate_probability

    bands, rows = MinHashConfig().lsh_shape()
    assert candidate_probability(0.8, bands, rows) > 0.999
    tight = MinHashConfig(verify="none").lsh_shape()
    assert candidate_probability(0.8, *tight) < 0.99


@pytest.mark.parametrize(
    ("config", "kwargs", "message"),
    [
        (MinHashConfig, {"threshold": 1.5}, "threshold = 1.5"),
        (MinHashConfig, {"bands": 4}, "give both or neither"),
        (MinHashConfig, {"bands": 20, "rows": 10}, "num_perm = 128"),
        (MinHashConfig, {"verify": "some"}, "verify = 'some'"),
        (MinHashConfig, {"ngram": 0}, "ngram = 0"),
        (ExactConfig, {"normalize": "nfkc"}, "normalize = 'nfkc'"),
        (ExactConfig, {"keep": "newest"}, "keep = 'newest'"),
    ],
)
def test_config_errors_name_key_and_value(config, kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("*", r"\*")):
        config(**kwargs)
