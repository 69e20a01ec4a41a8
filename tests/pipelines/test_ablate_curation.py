"""``winnow ablate`` over the curation: stage drops, stage settings and orders, each variant re-curated and trained."""

import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from tests.pipelines.ablate_util import curation_study
from winnow.curate.errors import ConfigError
from winnow.curate.pipeline import run_job
from winnow.pipelines.ablate.config import AblateConfig
from winnow.pipelines.ablate.curation import load_curation_job
from winnow.pipelines.ablate.layout import StudyLayout
from winnow.pipelines.ablate.plan import curation_variants, variants
from winnow.pipelines.cli import main
from winnow.pipelines.jobfile import load_job, read_toml

ROOT = Path(__file__).resolve().parents[2]
ALL_KINDS = {
    "kind": '["drop", "settings", "order"]',
    "drop": '["filter.length"]',
    "settings": '{"dedup.minhash.threshold" = [0.7, 0.8]}',
}


def _job(path: Path):
    return load_curation_job(path, read_toml(path), None)


def _plan(tmp_path, **ablate) -> list[dict]:
    study = curation_study(tmp_path)
    return curation_variants(AblateConfig(**ablate), 0, _job(study))


def _shards(job_dir: Path) -> dict[str, str]:
    """sha256 of every shard and rejects file of a job folder."""
    return {
        p.relative_to(job_dir).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for folder in ("shards", "rejects")
        for p in sorted((job_dir / folder).rglob("*"))
        if p.is_file()
    }


def _rows(job_dir: Path, split: str) -> pl.DataFrame:
    manifest = json.loads((job_dir / "manifest.json").read_text())
    return pl.concat(
        [
            pl.read_parquet(job_dir / s["path"])
            for s in manifest["shards"]
            if s["split"] == split and s["format"] == "parquet"
        ]
    )


def test_curation_variants_are_planned_from_the_job(tmp_path):
    planned = _plan(
        tmp_path,
        kind=["drop", "settings", "order"],
        drop=[2, ["03.dedup.exact", "dedup.minhash"]],
        settings={"dedup.minhash.threshold": [0.7, 0.8, 0.9]},
    )
    assert [v["name"] for v in planned] == [
        "drop_filter.length",
        "drop_dedup.exact+dedup.minhash",
        "dedup.minhash.threshold_0.7",
        "dedup.minhash.threshold_0.9",
        "order_shuffled",
        "order_reversed",
    ]  # 0.8: the job's own, the baseline
    assert planned[1]["change"] == {"drop": ["03.dedup.exact", "04.dedup.minhash"]}
    assert planned[2]["change"] == {"set": {"stage": "04.dedup.minhash", "key": "threshold", "value": 0.7}}
    assert planned[2]["key"] == "ablate.settings.'dedup.minhash.threshold' = 0.7"
    assert planned[4]["change"] == {"order": "shuffled"} and "by = 'random'" in planned[4]["describe"]
    job = _job(tmp_path / "study.toml")
    shuffled = job.variant({"order": "shuffled"}, tmp_path / "x", key="k").stages[-1].config
    reversed_ = job.variant({"order": "reversed"}, tmp_path / "x", key="k").stages[-1].config
    assert (shuffled.by, shuffled.pacing, reversed_.by, reversed_.direction) == (
        "random",
        "sorted",
        "length",
        "hard_to_easy",
    )
    runs = variants(
        AblateConfig(kind="drop", drop=["filter.length"], noise_seeds=2, variant_seeds=2),
        {"code": 0.5, "prose": 0.5},
        0,
        job=job,
    )
    assert [(v["name"], v.get("group")) for v in runs] == [
        ("baseline", None),
        ("baseline_seed1", None),
        ("drop_filter.length", None),
        ("drop_filter.length_seed1", "drop_filter.length"),
    ]


@pytest.mark.parametrize(
    ("ablate", "message"),
    [
        (
            {"kind": "drop", "drop": ["filter.c4"]},
            (
                r"ablate.drop\[0\] = 'filter.c4' is not a stage of the job.*; allowed: a \[\[stages\]\] number, stage id or kind "
                r"of .*1 = '01.clean'"
            ),
        ),
        ({"kind": "drop", "drop": [7]}, r"ablate.drop\[0\] = 7 is not a stage of the job; allowed: .*6 = '06.order'"),
        ({"kind": "drop", "drop": ["filter.lenght"]}, r"is not a stage of the job \(did you mean 'filter.length'\?\)"),
        (
            {"kind": "settings", "settings": {"dedup.minhash.treshold": [0.7]}},
            (
                r"'treshold' is not a key of stage 04.dedup.minhash \(dedup.minhash\) \(did you mean 'threshold'\?\); "
                r"allowed: .*threshold"
            ),
        ),
        (
            {"kind": "settings", "settings": {"filter.c4.min_words": [3]}},
            r"does not start with a stage of the job; allowed",
        ),
        (
            {"kind": "settings", "settings": {"dedup.minhash.threshold.x": [3]}},
            r"'threshold' of stage 04.dedup.minhash is not a table",
        ),
        (
            {"kind": "settings", "settings": {"dedup.minhash.threshold": [1.5]}},
            (
                r"ablate.settings.'dedup.minhash.threshold' = 1.5: the job with this change is refused: .*threshold = 1.5 must "
                r"be in \(0, 1\)"
            ),
        ),
        (
            {"kind": "settings", "settings": {"order.direction": ["sideways"]}},
            r"'sideways' is not one of \['easy_to_hard', 'hard_to_easy'\]",
        ),
    ],
)
def test_a_stage_key_or_value_the_job_does_not_have_is_refused(tmp_path, ablate, message):
    with pytest.raises(ConfigError, match=message):
        _plan(tmp_path, **ablate)


def test_a_kind_of_stage_the_job_has_twice_must_be_named_by_id(tmp_path):
    study = curation_study(tmp_path)
    study.write_text(
        study.read_text().replace(
            '[[stages]]\nkind = "split"', '[[stages]]\nkind = "dedup.exact"\n[[stages]]\nkind = "split"'
        )
    )
    with pytest.raises(
        ConfigError, match=r"'dedup.exact' names 2 stages of the job \(03.dedup.exact, 05.dedup.exact\)"
    ):
        curation_variants(AblateConfig(kind="drop", drop=["dedup.exact"]), 0, _job(study))
    assert (
        curation_variants(AblateConfig(kind="drop", drop=["05.dedup.exact"]), 0, _job(study))[0]["name"]
        == "drop_05.dedup.exact"
    )


def test_order_variants_need_a_stratified_curriculum(tmp_path):
    study = curation_study(tmp_path)
    text = study.read_text()
    study.write_text(text.replace('[[stages]]\nkind = "order"\nby = "length"\nwindow = 8\n', ""))
    with pytest.raises(
        ConfigError,
        match=r"has no order stage, so it has no curriculum to compare; allowed: a job "
        r"with an \[\[stages\]\] kind = 'order' table",
    ):
        curation_variants(AblateConfig(kind="order"), 0, _job(study))
    study.write_text(text.replace("window = 8", "window = 8\nstratify = false"))
    with pytest.raises(ConfigError, match="stratify = false.*allowed: an order stage with stratify = true"):
        curation_variants(AblateConfig(kind="order"), 0, _job(study))
    study.write_text(text.replace('by = "length"', 'by = "random"'))
    with pytest.raises(ConfigError, match="already by = 'random'"):
        curation_variants(AblateConfig(kind="order"), 0, _job(study))


def test_the_ablate_table_names_what_a_curation_kind_needs():
    with pytest.raises(
        ConfigError,
        match=r"ablate.drop = \[\] is invalid; allowed: at least one entry when kind "
        r"includes 'drop'",
    ):
        AblateConfig(kind="drop")
    with pytest.raises(ConfigError, match=r"ablate.settings = .* allowed: empty unless kind includes 'settings'"):
        AblateConfig(settings={"dedup.minhash.threshold": [0.7]})
    with pytest.raises(ConfigError, match=r"ablate.orders = \['sorted'\] is invalid; allowed: 'shuffled' and/or"):
        AblateConfig(kind="order", orders=["sorted"])
    with pytest.raises(ConfigError, match="'replay' on its own"):
        AblateConfig(kind=["replay", "order"])
    with pytest.raises(
        ConfigError,
        match=r"'drop' re-curates the job, and the study names none; allowed: "
        r"\[ablate\] job",
    ):
        curation_variants(AblateConfig(kind="drop", drop=[1]), 0, None)


def test_a_bad_change_is_refused_before_anything_is_curated(tmp_path, capsys):
    study = curation_study(tmp_path, kind='"drop"', drop='["filter.c4"]')
    assert main(["ablate", str(study)]) == 2
    assert "ablate.drop[0] = 'filter.c4' is not a stage of the job" in capsys.readouterr().err
    assert not (tmp_path / "job").exists() and not (tmp_path / "study").exists()


def test_a_stage_drop_variant_equals_a_fresh_curation_without_that_stage(tmp_path):
    study = curation_study(tmp_path)
    job = _job(study)
    baseline = dataclasses.replace(job.job, job=dataclasses.replace(job.job.job, keep_work=True))
    run_job(baseline, progress=False)
    variant = job.variant({"drop": ["03.dedup.exact"]}, tmp_path / "variant", key="ablate.drop[0]")
    manifest = run_job(variant, progress=False, reuse_from=tmp_path / "job")
    # phase 0 (read → collect 01.clean) is the baseline's; phase 1 then collects for 03.dedup.minhash, not 03.dedup.exact
    assert manifest["reused"]["phases"] == [0] and manifest["reused"]["plans"] == ["01.clean"]

    fresh = tmp_path / "fresh.toml"  # the same job file with the stage's table taken out by hand
    fresh.write_text(
        study.read_text()
        .replace('[[stages]]\nkind = "dedup.exact"\n', "")
        .replace(f'output = "{tmp_path / "job"}"', f'output = "{tmp_path / "fresh"}"')
    )
    run_job(load_job(fresh), progress=False)
    assert _shards(tmp_path / "variant") == _shards(tmp_path / "fresh")
    assert _shards(tmp_path / "variant") != _shards(tmp_path / "job")
    assert [s["id"] for s in manifest["stages"]][2:] == [
        "01.clean",
        "02.filter.length",
        "03.dedup.minhash",
        "04.split",
        "05.order",
    ]


def test_a_variant_that_leaves_a_source_without_train_rows_is_refused(tmp_path, capsys):
    study = curation_study(
        tmp_path,
        kind='"settings"',
        settings='{"filter.length.min_words" = [20], "split.val_fraction_by_source" = [{code = 1.0}]}',
    )
    assert main(["ablate", str(study)]) == 2
    err = capsys.readouterr().err
    assert (
        "variant 'split.val_fraction_by_source_code-1' (ablate.settings.'split.val_fraction_by_source' = "
        "{'code': 1.0}) leaves source 'code' with no train rows"
    ) in err
    assert "allowed: changes that keep train rows in every source the baseline trains on" in err
    layout = StudyLayout(tmp_path / "study")
    assert not layout.result_path("baseline").exists()  # refused before anything trained
    assert layout.curation_marker("filter.length.min_words_20").is_file()  # the variant curated before it is kept


def test_a_variant_that_trains_on_held_out_rows_is_refused(tmp_path, capsys):
    study = curation_study(tmp_path, kind='"drop"', drop='["split"]')
    assert main(["ablate", str(study)]) == 2
    err = capsys.readouterr().err
    assert "variant 'drop_split' (ablate.drop[0]) trains on" in err and "of the baseline's held-out split" in err
    assert not StudyLayout(tmp_path / "study").result_path("baseline").exists()


def test_a_variant_whose_curation_fails_stops_the_study_and_the_finished_ones_are_kept(tmp_path, capsys, monkeypatch):
    """A curation that fails as it runs (here the order stage's plan of one variant, made to fail: a setting that
    cannot work is refused before anything is curated)."""
    from winnow.curate.errors import StageError
    from winnow.curate.stages.order import Order

    plan = Order.plan

    def failing(self, keys):
        if self.config.by == "random":
            raise StageError(f"{self.ctx.stage_id}: the plan failed")
        return plan(self, keys)

    monkeypatch.setattr(Order, "plan", failing)
    study = curation_study(
        tmp_path, kind='"settings"', settings='{"dedup.minhash.threshold" = [0.7], "order.by" = ["random"]}'
    )
    assert main(["ablate", str(study)]) == 2
    err = capsys.readouterr().err
    assert "curating variant 'order.by_random' (ablate.settings.'order.by' = 'random') failed" in err
    assert "order: the plan failed" in err
    layout = StudyLayout(tmp_path / "study")
    marker = layout.curation_marker("dedup.minhash.threshold_0.7")
    assert marker.is_file() and not layout.result_path("baseline").exists()
    before = marker.stat().st_mtime_ns
    study.write_text(study.read_text().replace('"order.by" = ["random"]', '"split.val_fraction" = [1.0]'))
    assert main(["-q", "ablate", str(study)]) == 2  # stops again, at the next variant, which keeps no train rows
    assert marker.stat().st_mtime_ns == before  # curated once: kept, not curated again


def test_effects_have_the_seed_noise_a_verdict_the_curve_and_the_curation_side():
    from winnow.pipelines.ablate.compare import effects

    def run(name, kind, seed, losses, group=None, **extra):
        curve = [{"step": 10 * (i + 1), "held_out": {"a": v, "b": v}} for i, v in enumerate(losses)]
        return {
            "name": name,
            "kind": kind,
            "seed": seed,
            "weights": {"a": 1.0},
            "steps": 30,
            "curve": curve,
            "held_out": {"a": losses[-1], "b": losses[-1]},
            **({"group": group} if group else {}),
            **extra,
        }

    results = [
        run("baseline", "baseline", 0, [3.0, 2.6, 2.40]),
        run("baseline_seed1", "noise", 1, [3.0, 2.6, 2.42]),
        run("baseline_seed2", "noise", 2, [3.0, 2.6, 2.44]),
        run("order_shuffled", "order", 0, [3.0, 2.8, 2.60], describe="shuffled"),
        run("order_shuffled_seed1", "order", 1, [3.0, 2.8, 2.62], group="order_shuffled"),
        run("drop_x", "drop", 0, [2.9, 2.41, 2.415], describe="without x"),
        run("mix_00", "random_mix", 0, [3.0, 2.4], steps=20),
    ]  # another length: not compared
    summary = {"rows": 100, "tokens": 1000, "unit": "tokens", "rejected": {"filter:x": 10, "dedup:minhash": 5}}
    curation = {
        "baseline": summary,
        "drop_x": {**summary, "rows": 110, "tokens": 1120, "rejected": {"dedup:minhash": 5}},
    }
    found = effects(results, ["a", "b"], curation)
    assert [e.variant for e in found] == ["baseline", "order_shuffled", "drop_x"]
    shuffled, drop = found[1], found[2]
    # the seeds' sd pooled over the baseline (2.40, 2.42, 2.44: squares 0.0008, 2 degrees of freedom) and the
    # shuffled variant's two seeds (2.60, 2.62: 0.0002, 1); drop_x's one seed adds nothing
    noise = 2 * (0.001 / 3) ** 0.5 * (1 / 2 + 1 / 3) ** 0.5
    assert shuffled.mean.value == pytest.approx(2.61 - 2.42) and shuffled.mean.noise == pytest.approx(noise)
    assert shuffled.delta["a"].verdict == "higher" and shuffled.seeds == 2
    assert drop.mean.value == pytest.approx(-0.005) and drop.mean.verdict == "can't tell"  # within 2 SE
    # the baseline's final mean loss is 2.42: drop_x is there at step 20, the baseline at 30, shuffled never
    assert (found[0].curve.first_step, drop.curve.first_step, shuffled.curve.first_step) == (30, 20, None)
    assert drop.curve.area.value == pytest.approx((26.55 + 24.125) / 20 - (28 + 25.1) / 20)
    assert (drop.curve.area.verdict, shuffled.curve.area.verdict) == ("lower", "higher")
    assert (drop.curation.rows_change, drop.curation.tokens_change) == (pytest.approx(0.1), pytest.approx(0.12))
    assert drop.curation.rejected_change == {"filter:x": -10}
    assert drop.sentence().startswith(
        "drop_x (without x, 1 seed(s)): kept +12.0% tokens and +10.0% rows "
        "(rejects filter:x -10); mean held-out loss -0.005 ± "
    )
    one_seed = effects([results[0], results[3]], ["a", "b"])
    assert one_seed[1].mean.noise is None and one_seed[1].mean.verdict == "no noise estimate"


# ---- whole studies (they train) ------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_curation_study_compares_every_variant_on_the_baselines_held_out_rows(tmp_path, one_thread):
    from winnow.train.data.sets import eval_sets

    study = curation_study(tmp_path, steps=4, noise_seeds=2, eval_every=2, **ALL_KINDS)
    assert main(["-q", "ablate", str(study)]) == 0
    layout = StudyLayout(tmp_path / "study")
    names = [
        "baseline",
        "baseline_seed1",
        "drop_filter.length",
        "dedup.minhash.threshold_0.7",
        "order_shuffled",
        "order_reversed",
    ]
    assert pl.read_csv(layout.table_csv)["variant"].to_list() == names

    # every run is measured on the baseline's val rows, though the variants' own val splits differ
    baseline_val = sorted(_rows(tmp_path / "job", "val")["id"].to_list())
    for name in names:
        config = json.loads((layout.run_dir(name) / "config.json").read_text())
        (held_out,) = eval_sets(config["eval"], [config["shards"]], None)
        assert sorted(_rows(Path(held_out), "val")["id"].to_list()) == baseline_val, name
    assert sorted(_rows(layout.curated_job("drop_filter.length"), "val")["id"].to_list()) != baseline_val

    # order variants: the same rows (repeats included), in another order
    def train_rows(job_dir):
        return _rows(job_dir, "train").select(
            "id", *(["repeat"] if "repeat" in _rows(job_dir, "train").columns else [])
        )

    base_rows = train_rows(tmp_path / "job")
    for name in ("order_shuffled", "order_reversed"):
        rows = train_rows(layout.curated_job(name))
        assert sorted(map(tuple, rows.rows())) == sorted(map(tuple, base_rows.rows())), name
        assert rows["id"].to_list() != base_rows["id"].to_list(), name

    effects = pl.read_csv(layout.effects_csv)
    assert effects["variant"].to_list() == ["baseline", *names[2:]]
    drop = effects.row(by_predicate=pl.col("variant") == "drop_filter.length", named=True)
    assert drop["train_rows"] > effects["train_rows"][0] and "filter:length_min_words" in drop["rejects_change"]
    assert drop["verdict"] in ("can't tell", "lower", "higher") and drop["mean_noise"] > 0
    assert effects["first_step_at_baseline_final"].null_count() < len(effects) and effects["area_noise"].min() > 0
    shuffled = effects.row(by_predicate=pl.col("variant") == "order_shuffled", named=True)
    assert shuffled["rows_change"] == 0 and shuffled["tokens_change"] == 0
    summary = json.loads(layout.effects_json.read_text())["summary"]
    assert summary[0].startswith("drop_filter.length (without 02.filter.length, 1 seed(s)): kept ")
    assert layout.curves_png.read_bytes()[:4] == b"\x89PNG"
    assert "Effect of each variant" in (layout.root / "report.html").read_text()
    results = {n: layout.result_path(n).stat().st_mtime_ns for n in names}
    markers = {n: layout.curation_marker(n).stat().st_mtime_ns for n in names[2:]}
    assert main(["-q", "ablate", str(study)]) == 0  # a finished study: nothing curated or trained again
    assert {n: layout.result_path(n).stat().st_mtime_ns for n in names} == results
    assert {n: layout.curation_marker(n).stat().st_mtime_ns for n in names[2:]} == markers


def _ablate_process(toml: Path, crash: str) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": str(ROOT), "WINNOW_CRASH_AT": crash}
    return subprocess.run(
        [sys.executable, "-m", "winnow.pipelines.cli", "-q", "ablate", str(toml)],
        env=env,
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.slow
def test_a_study_killed_while_curating_and_while_training_resumes(tmp_path, one_thread):
    study = curation_study(tmp_path, steps=2, **ALL_KINDS)
    layout = StudyLayout(tmp_path / "study")
    # killed as a variant's task folder is renamed into place: the baseline's phases 0-4 are points 1-5 of
    # task-00001, the first variant adopts phase 0 (6) and computes phase 1 (7) on
    assert _ablate_process(study, "before:7@task-00001").returncode == -signal.SIGKILL
    assert (tmp_path / "job" / "manifest.json").is_file()
    assert not layout.curation_marker("drop_filter.length").exists()
    assert (layout.curated_job("drop_filter.length") / "_work").is_dir()  # its work folder, to resume from
    # then killed just before the third run's result.json is renamed into place
    assert _ablate_process(study, "before:3@result.json").returncode == -signal.SIGKILL
    done = [n for n in ("baseline", "drop_filter.length", "dedup.minhash.threshold_0.7") if layout.read_result(n)]
    assert done == ["baseline", "drop_filter.length"]
    finished = {n: layout.result_path(n).stat().st_mtime_ns for n in done}
    assert main(["-q", "ablate", str(study)]) == 0
    assert {n: layout.result_path(n).stat().st_mtime_ns for n in done} == finished  # not trained again
    assert all(layout.read_result(n) for n in ("dedup.minhash.threshold_0.7", "order_shuffled", "order_reversed"))

    fresh = _job(study).variant({"drop": ["02.filter.length"]}, tmp_path / "fresh", key="k")
    run_job(fresh, progress=False)  # the resumed variant's shards are those of an uninterrupted curation
    assert _shards(layout.curated_job("drop_filter.length")) == _shards(tmp_path / "fresh")


def test_a_study_whose_job_was_edited_since_is_refused_before_anything_is_curated(tmp_path, capsys, one_thread):
    """The re-run stopped in the baseline's curation advising `--overwrite`, which `winnow ablate` does not take;
    after `winnow curate --overwrite` it stopped inside its own curated/<variant>/job, curated from the old job."""
    import shutil

    study = curation_study(tmp_path, kind='"drop"', drop='["dedup.exact"]')
    assert main(["-q", "ablate", str(study)]) == 0
    layout = StudyLayout(tmp_path / "study")
    marker = layout.curation_marker("drop_dedup.exact")
    before = marker.read_text()
    study.write_text(study.read_text().replace("window = 8", "window = 4"))  # the job the study varies, edited
    manifest = (tmp_path / "job" / "manifest.json").read_text()
    assert main(["-q", "ablate", str(study)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'job'} holds the finished shards of job 'tiny' as it was before its file changed" in err
    assert f"(`winnow curate {study} --overwrite`) or give it a new [job] output, and give the study a new" in err
    assert (tmp_path / "job" / "manifest.json").read_text() == manifest  # nothing curated
    assert main(["-q", "curate", str(study), "--overwrite"]) == 0
    assert main(["-q", "ablate", str(study)]) == 2
    err = capsys.readouterr().err
    assert f"variant 'baseline' in {layout.root} finished on shards curated as" in err
    assert "give the changed study a new [ablate] output (nothing has been curated)" in err
    assert marker.read_text() == before and "--overwrite" not in err
    # a new study folder holding a variant the study curated from the job as it was: curated again, not refused
    (tmp_path / "new").mkdir()
    shutil.copytree(layout.root / "curated", tmp_path / "new" / "curated")
    (tmp_path / "new" / ".winnow-run").write_text("")
    assert main(["-q", "ablate", str(study), "--output", str(tmp_path / "new")]) == 0
    assert StudyLayout(tmp_path / "new").curation_marker("drop_dedup.exact").read_text() != before
