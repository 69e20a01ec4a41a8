"""split: held-out rows chosen by id hash, per source, stable when sources change."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from winnow.curate.errors import ConfigError, StageError
from winnow.curate.stages.base import StageContext
from winnow.curate.stages.split import Split, SplitConfig


def rows(counts: dict[str, int]) -> pl.DataFrame:
    ids, sources = [], []
    for source, n in counts.items():
        ids += [f"{source}/doc{i}" for i in range(n)]
        sources += [source] * n
    return pl.DataFrame({"id": ids, "source": sources, "text": "t", "meta": None}, schema_overrides={"meta": pl.String})


def run_split(df: pl.DataFrame, tmp_path: Path, **cfg) -> pl.DataFrame:
    """collect per task (two tasks), plan once, apply per task, like the runner."""
    stage = Split(
        SplitConfig(**cfg),
        StageContext(stage_id="s", job_name="t", output_dir=tmp_path, plan_dir=tmp_path / "p", sources=()),
    )
    tasks = [df[: df.height // 2], df[df.height // 2 :]]
    keys = pl.concat([stage.collect(t).with_columns(pl.lit(i, pl.Int32).alias("_task")) for i, t in enumerate(tasks)])
    plan = stage.plan(keys.lazy())
    out = [stage.apply(t, plan.decision.filter(pl.col("_task") == i).drop("_task")).kept for i, t in enumerate(tasks)]
    return pl.concat(out)


def val_ids(df: pl.DataFrame, source: str) -> set[str]:
    return set(df.filter((pl.col("split") == "val") & (pl.col("source") == source))["id"])


def test_val_fraction_holds_out_about_that_share_per_source(tmp_path):
    out = run_split(rows({"a": 4000, "b": 2000}), tmp_path, val_fraction=0.1)
    assert 320 <= len(val_ids(out, "a")) <= 480
    assert 140 <= len(val_ids(out, "b")) <= 260
    assert set(out["split"].unique()) == {"train", "val"}


@pytest.mark.parametrize("cfg", [{"val_fraction": 0.05}, {"val_rows": 25}])
def test_held_out_rows_do_not_change_when_a_source_is_added(tmp_path, cfg):
    before = run_split(rows({"a": 500, "b": 300}), tmp_path / "1", **cfg)
    after = run_split(rows({"a": 500, "c": 700, "b": 300}), tmp_path / "2", **cfg)
    assert val_ids(before, "a") == val_ids(after, "a")
    assert val_ids(before, "b") == val_ids(after, "b")
    assert val_ids(after, "c")


def test_val_rows_holds_out_exactly_that_many_and_per_source_overrides_win(tmp_path):
    out = run_split(
        rows({"a": 300, "b": 300, "c": 10}),
        tmp_path,
        val_rows=20,
        val_rows_by_source={"b": 7},
        val_fraction_by_source={"c": 1.0},
    )
    assert (len(val_ids(out, "a")), len(val_ids(out, "b")), len(val_ids(out, "c"))) == (20, 7, 10)


def test_a_smaller_held_out_set_is_inside_a_larger_one(tmp_path):
    small = run_split(rows({"a": 1000}), tmp_path / "1", val_rows=10)
    large = run_split(rows({"a": 1000}), tmp_path / "2", val_fraction=0.2)
    assert val_ids(small, "a") < val_ids(large, "a")


def test_seed_changes_the_held_out_rows(tmp_path):
    df = rows({"a": 1000})
    assert val_ids(run_split(df, tmp_path / "1", val_rows=30, seed=0), "a") != val_ids(
        run_split(df, tmp_path / "2", val_rows=30, seed=1), "a"
    )


def test_apply_without_plan_uses_the_fraction_rule_and_refuses_counts(tmp_path):
    df = rows({"a": 800})
    ctx = StageContext(stage_id="s", job_name="t", output_dir=tmp_path, plan_dir=tmp_path / "p", sources=())
    planned = run_split(df, tmp_path, val_fraction=0.1)
    local = Split(SplitConfig(val_fraction=0.1), ctx).apply(df).kept
    assert val_ids(local, "a") == val_ids(planned, "a")
    with pytest.raises(StageError, match="val_rows"):
        Split(SplitConfig(val_rows=3), ctx).apply(df)


@pytest.mark.parametrize("cfg", [{"val_fraction": 1.5}, {"val_rows": -1}, {"val_fraction_by_source": {"a": -0.1}}])
def test_bad_config_names_the_key(cfg):
    with pytest.raises(ConfigError, match=next(iter(cfg))):
        SplitConfig(**cfg)


def test_a_val_fraction_of_one_that_leaves_no_training_rows_is_refused():
    with pytest.raises(ConfigError, match=r"split.val_fraction = 1.0 holds out every row.*val_fraction_by_source"):
        SplitConfig(val_fraction=1.0)
    SplitConfig(val_fraction=1.0, val_fraction_by_source={"web": 0.01})  # every source but one held out: meant


def test_a_job_whose_every_row_is_held_out_says_it_has_nothing_to_train_on(tmp_path, write_job, caplog):
    """val_fraction_by_source = 1.0 for every source (val_fraction = 1.0 alone is refused) wrote no train row."""
    from winnow.curate.pipeline import run_job
    from winnow.pipelines.jobfile import load_job

    (tmp_path / "a.jsonl").write_text("".join(f'{{"id": "d{i}", "text": "words {i}"}}\n' for i in range(20)))
    body = (
        f'[[inputs]]\nsource = "a"\npath = "{tmp_path / "a.jsonl"}"\n\n'
        '[[stages]]\nkind = "split"\nval_fraction_by_source = {a = 1.0}\n'
    )
    with caplog.at_level("WARNING", logger="winnow.curate.pipeline"):
        run_job(load_job(write_job(body)), progress=False)
    assert "every row written is held out (20 val rows, no train rows)" in caplog.text
