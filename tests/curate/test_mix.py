"""mix: token-share targets, epoch cap, per-source seeding, quality-aware selection, apply."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from winnow.curate.errors import ConfigError, StageError
from winnow.curate.stages.base import Plan, StageContext
from winnow.curate.stages.mix import Mix, MixConfig


def rows(counts: dict[str, int], *, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    ids, sources = [], []
    for source, n in counts.items():
        ids += [f"{source}/doc{i}" for i in range(n)]
        sources += [source] * n
    lengths = rng.integers(20, 400, len(ids))
    return pl.DataFrame(
        {
            "id": ids,
            "source": sources,
            "text": ["x" * int(k) for k in lengths],
            "meta": None,
            "quality": rng.random(len(ids)),
        },
        schema_overrides={"meta": pl.String},
    )


def stage(tmp_path: Path, **cfg) -> Mix:
    return Mix(
        MixConfig(**cfg),
        StageContext(stage_id="m", job_name="t", output_dir=tmp_path, plan_dir=tmp_path / "p", sources=()),
    )


def plan(df: pl.DataFrame, tmp_path: Path, **cfg):
    """The plan, with its per-task decisions gathered into ``decision`` (one task)."""
    mix = stage(tmp_path, **cfg)
    keys = mix.collect(df).with_columns(pl.lit(0, pl.Int32).alias("_task")).lazy()
    p = mix.plan(keys)
    return mix, Plan(p.gather(keys), p.report)


def counts_by_id(decision: pl.DataFrame) -> dict[str, int]:
    return dict(decision.select("id", "_count").iter_rows())


def test_explicit_weights_are_met_within_one_percent_under_the_epoch_cap(tmp_path):
    _, p = plan(
        rows({"big": 6000, "mid": 2000, "small": 300}),
        tmp_path,
        weights={"big": 0.5, "mid": 0.3, "small": 0.2},
        max_epochs=3,
    )
    sources = p.report["sources"]
    for name, want in {"big": 0.5, "mid": 0.3, "small": 0.2}.items():
        assert abs(sources[name]["realized_share"] - want) < 0.01, (name, sources[name])
        assert sources[name]["epochs"] <= 3 + 1e-9
    assert p.decision["_count"].max() <= 3
    assert sources["small"]["epochs"] == pytest.approx(3, rel=1e-3)  # the budget is set by the smallest source's cap
    assert sources["big"]["rows_dropped"] > 0 and sources["small"]["rows_repeated"] > 0


def test_a_total_budget_beyond_the_cap_caps_the_source_and_says_so(tmp_path):
    _, p = plan(rows({"a": 2000, "b": 100}), tmp_path, weights={"a": 0.5, "b": 0.5}, max_epochs=2, total_tokens=200_000)
    b = p.report["sources"]["b"]
    assert b["capped"] and b["max_copies"] == 2 and b["epochs"] <= 2
    assert p.decision.filter(pl.col("id").str.starts_with("b/"))["_count"].max() == 2


def test_unimax_is_uniform_up_to_the_epoch_cap(tmp_path):
    df = rows({"a": 3000, "b": 3000, "tiny": 50})
    _, p = plan(df, tmp_path, scheme="unimax", max_epochs=2, total_tokens=300_000)
    s = p.report["sources"]
    assert s["tiny"]["epochs"] == pytest.approx(2, rel=1e-3)
    assert abs(s["a"]["realized_tokens"] - s["b"]["realized_tokens"]) / s["a"]["realized_tokens"] < 0.01
    assert s["a"]["realized_tokens"] > s["tiny"]["realized_tokens"]


def test_temperature_one_with_defaults_keeps_every_row_once(tmp_path):
    _, p = plan(rows({"a": 500, "b": 80}), tmp_path)
    assert p.decision["_count"].to_list() == [1] * 580


def test_high_temperature_flattens_the_mixture(tmp_path):
    df = rows({"a": 4000, "b": 400})
    natural = plan(df, tmp_path / "1", temperature=1.0, max_epochs=4)[1].report["sources"]["b"]["target_share"]
    flat = plan(df, tmp_path / "2", temperature=5.0, max_epochs=4)[1].report["sources"]["b"]["target_share"]
    assert natural < 0.12 and flat > 0.3


def test_adding_a_source_does_not_reshuffle_the_others(tmp_path):
    two = {"a": 0.5, "b": 0.5}
    _, before = plan(rows({"a": 3000, "b": 1000}), tmp_path / "1", weights=two, total_tokens=200_000, max_epochs=2)
    df3 = pl.concat([rows({"a": 3000, "b": 1000}), rows({"c": 900}, seed=7)])
    _, after = plan(df3, tmp_path / "2", weights={"a": 0.25, "b": 0.25, "c": 0.5}, total_tokens=400_000, max_epochs=2)
    keep = pl.col("id").str.starts_with("c/").not_()
    assert counts_by_id(before.decision) == counts_by_id(after.decision.filter(keep))


def test_same_seed_same_plan_other_seed_other_plan(tmp_path):
    df = rows({"a": 2000, "b": 500})
    cfg = {"weights": {"a": 0.5, "b": 0.5}, "max_epochs": 3}
    first = plan(df, tmp_path / "1", seed=1, **cfg)[1].decision
    again = plan(df.sample(fraction=1.0, shuffle=True, seed=3), tmp_path / "2", seed=1, **cfg)[1].decision
    other = plan(df, tmp_path / "3", seed=2, **cfg)[1].decision
    assert counts_by_id(first) == counts_by_id(again)
    assert counts_by_id(first) != counts_by_id(other)


def test_top_selection_keeps_the_best_scored_rows(tmp_path):
    df = rows({"a": 1000})
    _, p = plan(df, tmp_path, weights={"a": 1.0}, total_tokens=50_000, select="top")
    kept = df.join(p.decision, on="id").filter(pl.col("_count") > 0)
    dropped = df.join(p.decision, on="id").filter(pl.col("_count") == 0)
    assert kept["quality"].min() >= dropped["quality"].max()


def test_top_selection_of_a_source_without_scores_says_so(tmp_path, caplog):
    """A score stage scoped to one source leaves the others' scores null: the mix keeps part of them at random,
    and names them."""
    df = rows({"a": 1000, "b": 1000}).with_columns(quality=pl.when(pl.col("source") == "a").then(pl.col("quality")))
    with caplog.at_level("WARNING"):
        plan(df, tmp_path / "1", weights={"a": 0.5, "b": 0.5}, total_tokens=100_000, select="top")
    assert "keeps part of sources ['b'], but none of their rows has a 'quality' score" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        plan(rows({"a": 1000, "b": 1000}), tmp_path / "2", weights={"a": 0.5, "b": 0.5}, total_tokens=100_000,
             select="top")  # fmt: skip
    assert "score" not in caplog.text


def test_importance_selection_prefers_high_weights_without_excluding_low_ones(tmp_path):
    df = rows({"a": 4000}).with_columns(dsir_weight=pl.col("quality") * 4.0)
    _, p = plan(df, tmp_path, weights={"a": 1.0}, total_tokens=150_000, select="importance")
    joined = df.join(p.decision, on="id")
    kept, dropped = joined.filter(pl.col("_count") > 0), joined.filter(pl.col("_count") == 0)
    assert kept["dsir_weight"].mean() > dropped["dsir_weight"].mean() + 0.5
    assert kept["dsir_weight"].min() < dropped["dsir_weight"].max()  # sampled, not a hard cut


def test_apply_repeats_drops_and_passes_val_rows_through(tmp_path):
    df = rows({"a": 400, "b": 40}).with_columns(
        split=pl.when(pl.col("id").str.ends_with("7")).then(pl.lit("val")).otherwise(pl.lit("train"))
    )
    mix, p = plan(df, tmp_path, weights={"a": 0.5, "b": 0.5}, max_epochs=3)
    out = mix.apply(df, p.decision.drop("_task"))
    assert df.height + out.repeats == out.kept.height + out.rejected.height
    assert set(out.rejected["reason"]) == {"mix:not_selected"}
    val = df.filter(pl.col("split") == "val")
    assert out.kept.filter(pl.col("split") == "val").drop("repeat").equals(val)
    copies = out.kept.group_by("id").agg(pl.len(), pl.col("repeat").sort())
    assert all(r == list(range(n)) for n, r in copies.select("len", "repeat").iter_rows())
    assert out.kept.schema["repeat"] == pl.Int32 and out.counters[("copies_added", "b")] == out.repeats


def test_apply_refuses_training_rows_missing_from_the_plan(tmp_path):
    df = rows({"a": 10})
    mix, p = plan(df, tmp_path)
    with pytest.raises(StageError, match="not in the mix plan"):
        mix.apply(df, p.decision.head(5))


def test_tokenizer_counts_tokens_instead_of_bytes(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hi": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tok.json"))
    df = pl.DataFrame(
        {"id": ["1", "2"], "source": "a", "text": ["hi hi hi", "hello"], "meta": None},
        schema_overrides={"meta": pl.String},
    )
    keys = stage(tmp_path, tokenizer=str(tmp_path / "tok.json")).collect(df)
    assert keys["_tokens"].to_list() == [3, 1]


@pytest.mark.parametrize(
    "cfg, key",
    [
        ({"scheme": "explicit"}, "weights"),
        ({"temperature": 0}, "temperature"),
        ({"max_epochs": 0}, "max_epochs"),
        ({"weights": {"a": -1}}, "weights.a"),
        ({"tokenizer": "/nope.json"}, "tokenizer"),
        ({"total_tokens": 0}, "total_tokens"),
    ],
)
def test_bad_config_names_the_key(cfg, key):
    with pytest.raises(ConfigError, match=key):
        MixConfig(**cfg)


def test_rows_without_a_split_value_are_training_rows(tmp_path):
    df = rows({"a": 20}).with_columns(
        split=pl.when(pl.col("id") == "a/doc1").then(pl.lit("val")).otherwise(pl.lit(None, pl.String))
    )
    mix, p = plan(df, tmp_path)
    assert p.decision.height == 19
    assert mix.apply(df, p.decision).kept.height == 20


def test_plans_over_no_rows_are_empty(tmp_path):
    from winnow.curate.stages.order import Order, OrderConfig
    from winnow.curate.stages.split import Split, SplitConfig

    ctx = StageContext(stage_id="x", job_name="t", output_dir=tmp_path, plan_dir=tmp_path, sources=())
    nothing = pl.LazyFrame(schema={"id": pl.String, "_task": pl.Int32})  # what the runner scans when no task wrote keys
    for stage in (Mix(MixConfig(), ctx), Order(OrderConfig(), ctx), Split(SplitConfig(), ctx)):
        assert stage.plan(nothing).gather(nothing).height == 0
    empty = (
        rows({"a": 1}).clear().with_columns(difficulty=pl.lit(0.5))
    )  # keys with every column but no row (an empty task)
    for stage in (Mix(MixConfig(), ctx), Order(OrderConfig(), ctx)):
        keys = stage.collect(empty).with_columns(pl.lit(0, pl.Int32).alias("_task")).lazy()
        plan = stage.plan(keys)
        assert plan.gather(keys).height == 0 and plan.per_task(0, keys).height == 0


def test_many_sources_cut_the_same_in_one_key_range_and_in_many(tmp_path):
    """Sources from a field number 10^4-10^5: every source's cut-off is found at once (``mixing.cuts``), and a budget
    that splits the keys into many ranges (several crossings in one range, sources across ranges) changes nothing."""
    rng = np.random.default_rng(3)
    df = rows({f"site-{i:03d}": int(n) for i, n in enumerate(rng.integers(1, 40, 300))})
    cfg = {"scheme": "temperature", "temperature": 2.0, "max_epochs": 2.0}
    _, whole = plan(df, tmp_path / "whole", **cfg)
    mix = Mix(
        MixConfig(**cfg),
        StageContext(
            stage_id="m", job_name="t", output_dir=tmp_path, plan_dir=tmp_path / "tiny", sources=(), memory_gb=2e-5
        ),
    )
    keys = mix.collect(df).with_columns(pl.lit(0, pl.Int32).alias("_task")).lazy()
    tiny = mix.plan(keys)
    assert whole.report["key_ranges"] == 1 and tiny.report["key_ranges"] > 5
    assert counts_by_id(tiny.gather(keys)) == counts_by_id(whole.decision)
    assert {k: v for k, v in tiny.report.items() if k != "key_ranges"} == {
        k: v for k, v in whole.report.items() if k != "key_ranges"
    }
    longest = df.with_columns(n=pl.col("text").str.len_bytes()).group_by("source").agg(pl.col("n").max())
    for source, n in longest.iter_rows():  # a partial pass ends within one document of its target
        s = whole.report["sources"][source]
        if not s["capped"]:
            assert abs(s["realized_tokens"] - s["target_tokens"]) <= n + 1, (source, s)


def test_a_weight_for_a_source_with_no_rows_left_is_said_not_silently_rescaled(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="winnow.curate.stages.mix"):
        _, p = plan(rows({"a": 300, "b": 300}), tmp_path, weights={"a": 0.5, "b": 0.3, "gone": 0.2})
    assert p.report["weights_without_rows"] == ["gone"]
    assert any("['gone'] have a weight but no rows" in r.getMessage() for r in caplog.records)


def test_a_default_budget_that_leaves_out_most_of_a_source_names_the_source_that_set_it(tmp_path, caplog):
    """Weights 0.5 / 0.5 with one source of 3 rows keep about 3 rows' worth of the other: allowed (the
    weights hold exactly), but said, with the ways to keep more; the rest stay rejects."""
    with caplog.at_level("WARNING", logger="winnow.curate.stages.mixing.weights"):
        _, p = plan(rows({"big": 5000, "tiny": 3}), tmp_path, weights={"big": 0.5, "tiny": 0.5})
    assert p.report["budget_set_by"] == "tiny"
    assert p.report["sources"]["big"]["rows_dropped"] > 4900
    said = [r.getMessage() for r in caplog.records]
    assert any("`tiny` sets it" in m and "`big` keeps 0." in m and "total_tokens" in m for m in said), said
    caplog.clear()
    with caplog.at_level("WARNING", logger="winnow.curate.stages.mixing.weights"):
        _, p = plan(rows({"big": 5000, "tiny": 3}), tmp_path, weights={"big": 0.5, "tiny": 0.5}, total_tokens=10**6)
    assert p.report["budget_set_by"] is None and not any("sets it" in r.getMessage() for r in caplog.records)


def test_a_budget_too_small_for_any_row_of_a_source_says_so(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="winnow.curate.stages.mix"):
        _, p = plan(rows({"big": 500, "small": 50}), tmp_path, weights={"big": 0.5, "small": 0.5}, total_tokens=10)
    assert all(r["realized_tokens"] == 0 for r in p.report["sources"].values())
    said = [r.getMessage() for r in caplog.records]
    assert any("['big', 'small'] have a weight but no row fits" in m and "10 tokens" in m for m in said), said


def test_a_low_temperature_or_weights_near_the_float_maximum_give_shares_not_an_overflow():
    """tokens^(1/T) overflowed to inf for T = 0.01 (a traceback: argmin of an empty sequence, NaN to integer),
    and weights of 1e308 each summed to inf."""
    from winnow.curate.stages.mixing.weights import requested_weights

    available = np.array([4e9, 1e9, 0.0])
    cold = requested_weights(["a", "b", "c"], available, scheme="temperature", weights={}, temperature=0.01)
    assert np.allclose(cold, [1.0, 0.25**100, 0.0], rtol=1e-9, atol=0)  # (1/4)^100: the largest takes it all
    warm = requested_weights(["a", "b", "c"], available, scheme="temperature", weights={}, temperature=2.0)
    assert np.allclose(warm, [2 / 3, 1 / 3, 0.0])
    flat = requested_weights(["a", "b", "c"], available, scheme="temperature", weights={}, temperature=math.inf)
    assert flat.tolist() == [0.5, 0.5, 0.0]  # a source without data stays out
    huge = requested_weights(
        ["a", "b", "c"], available, scheme="explicit", weights=dict.fromkeys("abc", 1e308), temperature=1
    )
    assert huge.tolist() == [0.5, 0.5, 0.0]


def test_a_score_column_is_refused_with_random_selection_and_must_hold_numbers(tmp_path):
    """A String score column was a polars traceback; with select = 'random' the column is never read."""
    with pytest.raises(
        ConfigError, match=r"mix.score_column = 'quality' is read by select = 'top' or 'importance' only"
    ):
        MixConfig(select="random", score_column="quality")
    df = rows({"a": 50}).with_columns(pl.lit("en").alias("lang"))
    with pytest.raises(StageError, match="ranks rows by score_column 'lang', which holds String values"):
        plan(df, tmp_path, select="top", score_column="lang", weights={"a": 1}, total_tokens=100)


def test_weights_with_a_scheme_that_sets_the_shares_itself_are_refused():
    """scheme = 'temperature' or 'unimax' ignored the weights given beside it, without a word."""
    for scheme in ("temperature", "unimax"):
        with pytest.raises(
            ConfigError, match=rf"mix.weights are read by scheme = 'explicit' only, and scheme = '{scheme}'"
        ):
            MixConfig(scheme=scheme, weights={"a": 1.0})
