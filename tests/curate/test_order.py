"""order: curriculum ranks, pacing, stratified windows, window shuffle, determinism."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from winnow.curate.errors import ConfigError, StageError
from winnow.curate.stages.base import StageContext
from winnow.curate.stages.order import Order, OrderConfig


def rows(counts: dict[str, int], *, offset: dict[str, float] | None = None, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    frames = []
    for source, n in counts.items():
        frames.append(
            pl.DataFrame(
                {
                    "id": [f"{source}/doc{i}" for i in range(n)],
                    "source": source,
                    "text": ["x" * int(k) for k in rng.integers(1, 300, n)],
                    "meta": None,
                    "difficulty": rng.random(n) + (offset or {}).get(source, 0.0),
                },
                schema_overrides={"meta": pl.String},
            )
        )
    return pl.concat(frames)


def ordered(df: pl.DataFrame, tmp_path: Path, *, tasks: int = 2, **cfg) -> pl.DataFrame:
    """collect per task, plan once, apply per task (like the runner); rows sorted by order, val rows last."""
    stage = Order(
        OrderConfig(**cfg),
        StageContext(stage_id="o", job_name="t", output_dir=tmp_path, plan_dir=tmp_path / "p", sources=(), seed=0),
    )
    parts = [df[i * df.height // tasks : (i + 1) * df.height // tasks] for i in range(tasks)]
    keys = pl.concat([stage.collect(p).with_columns(pl.lit(i, pl.Int32).alias("_task")) for i, p in enumerate(parts)])
    plan = stage.plan(keys.lazy())
    decision = plan.gather(keys.lazy())
    out = [stage.apply(p, decision.filter(pl.col("_task") == i).drop("_task")).kept for i, p in enumerate(parts)]
    return pl.concat(out).sort("order", nulls_last=True)


def test_order_is_a_rank_over_training_rows_and_null_for_val_rows(tmp_path):
    df = rows({"a": 300, "b": 100}).with_columns(
        split=pl.when(pl.col("id").str.ends_with("3")).then(pl.lit("val")).otherwise(pl.lit("train"))
    )
    out = ordered(df, tmp_path)
    train = out.filter(pl.col("split") == "train")
    assert train["order"].to_list() == list(range(train.height))
    assert out.filter(pl.col("split") == "val")["order"].null_count() == 40


def test_stratified_windows_keep_source_shares_within_tolerance(tmp_path):
    df = rows({"a": 6000, "b": 3000, "c": 1000}, offset={"b": 5.0, "c": -3.0})
    out = ordered(df, tmp_path, window=200, shuffle_within_window=True)
    window = np.arange(out.height) // 200
    shares = out.with_columns(w=window).group_by("w", "source").len().with_columns(share=pl.col("len") / 200)
    want = {"a": 0.6, "b": 0.3, "c": 0.1}
    deviation = shares.with_columns(dev=(pl.col("share") - pl.col("source").replace_strict(want)).abs())["dev"].max()
    assert deviation <= 0.02
    assert shares.group_by("w").len()["len"].min() == 3  # every window has every source


def test_easy_to_hard_is_monotone_across_shards(tmp_path):
    df = rows({"a": 3000, "b": 1000}, offset={"b": 0.5})
    out = ordered(df, tmp_path, window=100)
    shard = pl.Series(np.arange(out.height) // 400)
    means = out.with_columns(shard=shard).group_by("shard").agg(pl.col("difficulty").mean()).sort("shard")["difficulty"]
    assert (means.diff().drop_nulls() > 0).all()
    for source in ("a", "b"):  # within a source the order is a plain sort
        assert out.filter(pl.col("source") == source)["difficulty"].is_sorted()


def test_hard_to_easy_reverses_the_curriculum(tmp_path):
    out = ordered(rows({"a": 500}), tmp_path, direction="hard_to_easy")
    assert out["difficulty"].is_sorted(descending=True)


def test_step_pacing_admits_one_quarter_per_stage_in_random_order(tmp_path):
    df = rows({"a": 2000})
    out = ordered(df, tmp_path, pacing="step", steps=4)
    quartile = (out["difficulty"].rank("ordinal") - 1) // 500
    assert (quartile.to_numpy() == np.arange(2000) // 500).all()
    assert not out["difficulty"].is_sorted()


@pytest.mark.parametrize("pacing", ["linear", "sqrt"])
def test_smooth_pacing_never_places_a_row_before_it_is_admitted(tmp_path, pacing):
    n, start = 2000, 0.1
    out = ordered(rows({"a": n}), tmp_path, pacing=pacing, start=start)
    rank = (out["difficulty"].rank("ordinal") - 1).to_numpy()
    t = np.arange(n) / n
    competence = start + (1 - start) * t if pacing == "linear" else np.sqrt(start**2 + (1 - start**2) * t)
    assert (rank < np.maximum(np.ceil(competence * n - 1e-9), np.arange(n) + 1)).all()
    halves = out["difficulty"].to_numpy().reshape(2, -1).mean(axis=1)
    assert halves[0] < halves[1] and not out["difficulty"].is_sorted()


def test_source_by_source_order_when_not_stratified(tmp_path):
    out = ordered(rows({"a": 100, "b": 50, "c": 70}), tmp_path, stratify=False, source_order=["c", "a"])
    sources = out["source"].to_list()
    assert sources == ["c"] * 70 + ["a"] * 100 + ["b"] * 50


def test_length_curriculum_puts_short_documents_first(tmp_path):
    out = ordered(rows({"a": 300, "b": 300}), tmp_path, by="length", stratify=False)
    for source in ("a", "b"):
        assert out.filter(pl.col("source") == source)["text"].str.len_bytes().is_sorted()


def test_random_order_shuffles_each_source_and_keeps_the_shares(tmp_path):
    df = rows({"a": 600, "b": 200}, offset={"b": 0.5})
    out = ordered(df, tmp_path, by="random", window=100)
    assert sorted(out["id"].to_list()) == sorted(df["id"].to_list())  # the same rows, every one once
    halves = out["difficulty"].to_numpy().reshape(2, -1).mean(axis=1)
    assert abs(halves[0] - halves[1]) < 0.1 and not out.filter(pl.col("source") == "a")["difficulty"].is_sorted()
    window = out.head(100)["source"].value_counts()
    assert dict(window.iter_rows()) == {"a": 75, "b": 25}  # stratified like any curriculum
    assert ordered(df, tmp_path / "again", by="random", window=100)["id"].equals(out["id"])  # seeded


def test_window_shuffle_moves_rows_only_inside_their_window(tmp_path):
    df = rows({"a": 1000})
    plain = ordered(df, tmp_path / "1", window=100)
    shuffled = ordered(df, tmp_path / "2", window=100, shuffle_within_window=True)
    assert plain["id"].to_list() != shuffled["id"].to_list()
    for w in range(10):
        assert set(plain["id"][w * 100 : (w + 1) * 100]) == set(shuffled["id"][w * 100 : (w + 1) * 100])


def test_repeated_copies_get_their_own_ranks(tmp_path):
    df = rows({"a": 50})
    df = pl.concat([df.with_columns(repeat=pl.lit(r, pl.Int32)) for r in range(3)])
    out = ordered(df, tmp_path, pacing="linear")
    assert out["order"].to_list() == list(range(150))
    assert out.select("id", "repeat").is_unique().all()


def test_same_seed_same_order_other_seed_other_order_whatever_the_input_order(tmp_path):
    df = rows({"a": 800, "b": 300})
    cfg = {"pacing": "sqrt", "shuffle_within_window": True, "window": 50}
    first = ordered(df, tmp_path / "1", seed=5, **cfg)["id"].to_list()
    again = ordered(df.sample(fraction=1.0, shuffle=True, seed=1), tmp_path / "2", tasks=3, seed=5, **cfg)[
        "id"
    ].to_list()
    other = ordered(df, tmp_path / "3", seed=6, **cfg)["id"].to_list()
    assert first == again and first != other


def test_report_gives_window_shares_and_the_curve(tmp_path):
    df = rows({"a": 900, "b": 300})
    stage = Order(
        OrderConfig(window=100),
        StageContext(stage_id="o", job_name="t", output_dir=tmp_path, plan_dir=tmp_path, sources=()),
    )
    report = stage.plan(stage.collect(df).with_columns(pl.lit(0).alias("_task")).lazy()).report
    assert report["windows"] == 12 and report["max_share_deviation"] <= 0.02 and report["windows_over_tolerance"] == 0
    assert [w["window"] for w in report["window_rows"]] == [0, 1, 2, 9, 10, 11]
    assert report["window_rows"][0]["a"] + report["window_rows"][0]["b"] == 100
    assert np.all(np.diff(report["curve"]) > 0)


def test_missing_ordering_column_is_an_error_that_names_it(tmp_path):
    stage = Order(
        OrderConfig(by="quality"),
        StageContext(stage_id="o", job_name="t", output_dir=tmp_path, plan_dir=tmp_path, sources=()),
    )
    with pytest.raises(StageError, match="quality"):
        stage.collect(rows({"a": 3}))


@pytest.mark.parametrize(
    "cfg, key",
    [
        ({"pacing": "fast"}, "pacing"),
        ({"window": 0}, "window"),
        ({"start": 2.0}, "start"),
        ({"steps": 0}, "steps"),
        ({"source_order": ["a"]}, "source_order"),
        ({"direction": "up"}, "direction"),
    ],
)
def test_bad_config_names_the_key(cfg, key):
    with pytest.raises(ConfigError, match=key):
        OrderConfig(**cfg)


def test_many_sources_merge_by_key_into_the_closed_forms_order(tmp_path, monkeypatch):
    """Past ``CLOSED_FORM_SOURCES`` sources the stratified places come from a merge key and a sort (O(rows log rows)
    whatever the source count), which must give exactly the closed form's order, ties included."""
    import winnow.curate.stages.order as order

    rng = np.random.default_rng(5)
    df = rows({f"site-{i:03d}": int(n) for i, n in enumerate(rng.integers(1, 30, 90))}, seed=1)
    merged = ordered(df, tmp_path / "merge", window=50)
    monkeypatch.setattr(order, "CLOSED_FORM_SOURCES", 10**9)
    closed = ordered(df, tmp_path / "closed", window=50)
    assert merged["id"].to_list() == closed["id"].to_list()
