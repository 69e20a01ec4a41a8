"""``winnow ablate`` as a whole: parallel and resumed studies match a serial one, random mixes, bad input."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tests.pipelines.ablate_util import SOURCES, study_toml, tiny_job
from winnow.curate.errors import ConfigError
from winnow.pipelines.ablate import runner
from winnow.pipelines.ablate.config import AblateConfig
from winnow.pipelines.ablate.layout import StudyLayout
from winnow.pipelines.ablate.mixes import fit_mixes, propose, summarize
from winnow.pipelines.ablate.plan import variants
from winnow.pipelines.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def job(tmp_path):
    return tiny_job(tmp_path / "job")


def _table(study) -> pl.DataFrame:
    return pl.read_csv(StudyLayout(study).table_csv)


def _ablate_process(toml, crash: str) -> subprocess.CompletedProcess:
    """``winnow ablate`` in its own process, with a crash point (curate/crashpoints.py) armed."""
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
def test_parallel_and_killed_then_resumed_studies_give_the_serial_table(job, tmp_path, one_thread):
    keys = {"noise_seeds": 2, "attribution_every": 1, "threads": 1}
    serial = study_toml(tmp_path / "serial.toml", job, tmp_path / "serial", **keys)
    points = tmp_path / "points.tsv"
    assert _ablate_process(serial, f"count:{points}").returncode == 0  # and list every durable write it made
    parallel = study_toml(tmp_path / "parallel.toml", job, tmp_path / "parallel", parallel=2, **keys)
    assert main(["-q", "ablate", str(parallel)]) == 0
    assert _table(tmp_path / "parallel").equals(_table(tmp_path / "serial"))

    # SIGKILL the same study just before the third variant's result.json is renamed into place
    markers = [
        int(n) for n, label in (line.split("\t") for line in points.read_text().splitlines()) if label == "result.json"
    ]
    resumed = study_toml(tmp_path / "resumed.toml", job, tmp_path / "resumed", **keys)
    assert _ablate_process(resumed, f"before:{markers[2]}").returncode == -signal.SIGKILL
    layout = StudyLayout(tmp_path / "resumed")
    done = [v for v in ("baseline", "baseline_seed1", "without_code", "without_prose") if layout.read_result(v)]
    assert done == ["baseline", "baseline_seed1"]  # the killed one left no marker, valid or not
    assert not layout.result_path("without_code").exists()
    finished = {v: layout.result_path(v).stat().st_mtime_ns for v in done}
    assert main(["-q", "ablate", str(resumed)]) == 0
    assert {v: layout.result_path(v).stat().st_mtime_ns for v in finished} == finished  # not run again
    assert _table(tmp_path / "resumed").equals(_table(tmp_path / "serial"))


def test_one_study_of_several_kinds_shares_its_baseline():
    base = {"code": 0.4, "prose": 0.6}
    runs = variants(AblateConfig(kind=["leave_one_out", "random_mixes"], n_mixes=3, noise_seeds=3), base, seed=0)
    assert [v["name"] for v in runs] == [
        "baseline",
        "baseline_seed1",
        "baseline_seed2",
        "without_code",
        "without_prose",
        "mix_00",
        "mix_01",
        "mix_02",
    ]
    assert all(sum(v["weights"].values()) == pytest.approx(1.0) for v in runs if v["kind"] == "random_mix")
    again = variants(AblateConfig(kind=["leave_one_out", "random_mixes"], n_mixes=3, noise_seeds=3), base, seed=0)
    assert again == runs  # seeded: a resumed study plans the same mixes
    with pytest.raises(Exception, match="ablate.kind"):
        AblateConfig(kind=["leave_one_out", "leave_one_out"])
    with pytest.raises(Exception, match="ablate.mixes.mix_00"):
        variants(AblateConfig(kind=["mixes", "random_mixes"], n_mixes=3, mixes={"mix_00": {"code": 1.0}}), base, seed=0)


def _synthetic(beta: np.ndarray, n: int = 12) -> tuple[list[dict], dict]:
    """Runs whose held-out losses are exactly linear in their mix shares: loss = w @ beta."""
    base = {"code": 0.4, "prose": 0.6}
    mixes = list(variants(AblateConfig(kind="random_mixes", n_mixes=n, noise_seeds=2), base, seed=0))
    results = []
    for v in mixes:
        w = np.array([v["weights"].get(s, 0.0) for s in SOURCES])
        loss = (w / w.sum()) @ beta + (0.003 if v["kind"] == "noise" else 0.0)
        results.append(v | {"held_out": dict(zip(SOURCES, loss.tolist())), "steps": 5})
    return results, base


def test_random_mixes_regression_recovers_the_mixing_law_and_proposes_better():
    beta = np.array([[2.0, 3.4], [2.6, 2.9]])  # rows: all code / all prose; columns: held-out code, prose
    results, base = _synthetic(beta)
    assert sum(r["kind"] == "random_mix" for r in results) == 12
    fit = fit_mixes(results, SOURCES, steps=5)
    assert np.asarray(fit["beta"]) == pytest.approx(beta, abs=0.01)
    assert min(fit["r2"].values()) > 0.99 and max(fit["cv_rmse"].values()) < 0.01
    for target, better in (("code", "code"), ("prose", "prose")):
        proposed = propose(fit, base, target=target, concentration=8.0, seed=0)
        assert sum(proposed.values()) == pytest.approx(1.0)
        assert proposed[better] > base[better]  # more of the source that lowers the target, within the region
    proposed = propose(fit, base, target="mean", concentration=8.0, seed=0)
    w = np.array([proposed[s] for s in SOURCES])
    measured = (w @ beta).tolist()
    summary = summarize(
        fit,
        results
        + [
            {
                "name": "proposed",
                "kind": "proposed",
                "seed": 0,
                "weights": proposed,
                "held_out": dict(zip(SOURCES, measured)),
                "steps": 5,
            }
        ],
        base,
        "mean",
    )
    assert summary["improvement"] > 0 and summary["noise"] == pytest.approx(0.003)
    assert summary["proposed"]["predicted"] == pytest.approx(summary["proposed"]["measured"], abs=0.01)


@pytest.mark.slow
def test_random_mixes_study_trains_the_proposal_next_to_the_baseline(job, tmp_path, one_thread):
    toml = study_toml(
        tmp_path / "study.toml",
        job,
        tmp_path / "study",
        kind='"random_mixes"',
        n_mixes=3,
        mix_steps=2,
        noise_seeds=2,
        attribution_every=0,
        target='"prose"',
    )
    assert main(["-q", "ablate", str(toml)]) == 0
    layout = StudyLayout(tmp_path / "study")
    table = _table(layout.root)
    assert table["variant"].to_list() == ["baseline", "baseline_seed1", "mix_00", "mix_01", "mix_02", "proposed"]
    mixes = json.loads(layout.mixes_json.read_text())
    assert mixes["fit"]["runs"] == ["mix_00", "mix_01", "mix_02"]  # 2-step runs; the 3-step baselines are not fitted
    assert mixes["proposed"]["weights"] == layout.read_result("proposed")["weights"]
    assert mixes["baseline"]["measured"] == pytest.approx(table["loss_prose"][0])
    assert "Proposed mix for target 'prose'" in (layout.table_md.read_text() + "".join(mixes["summary"]))
    assert layout.read_result("mix_00")["steps"] == 2 and layout.read_result("proposed")["steps"] == 3
    before = layout.result_path("proposed").stat().st_mtime_ns
    assert main(["-q", "ablate", str(toml)]) == 0  # nothing left to train: the proposal is reused
    assert layout.result_path("proposed").stat().st_mtime_ns == before


@pytest.mark.slow
def test_the_adaptive_run_trains_against_the_baseline_next_to_the_proposal(job, tmp_path, one_thread):
    toml = study_toml(
        tmp_path / "study.toml",
        job,
        tmp_path / "study",
        kind='"random_mixes"',
        n_mixes=3,
        noise_seeds=2,
        attribution_every=0,
        adaptive='"doremi"',
        adaptive_every=1,
    )
    assert main(["-q", "ablate", str(toml)]) == 0
    layout = StudyLayout(tmp_path / "study")
    assert _table(layout.root)["variant"].to_list()[-2:] == ["proposed", "doremi"]
    result = layout.read_result("doremi")
    config = json.loads((layout.run_dir("doremi") / "config.json").read_text())
    assert config["mixing"]["reference"] == str(layout.root) and config["mixing"]["adaptive"] == "doremi"
    assert json.loads((layout.root / "config.json").read_text())["mixing"]["adaptive"] == ""  # the baseline: fixed mix
    assert set(result["mixing"]["mix_weights_mean"]) == set(SOURCES)
    assert result["mixing"]["mix_weights_mean"] != pytest.approx(result["weights"])  # 3 updates moved it
    adaptive = json.loads(layout.adaptive_json.read_text())
    assert adaptive["measured"]["doremi"] == pytest.approx(float(np.mean([result["held_out"][s] for s in SOURCES])))
    assert set(adaptive["measured"]) == {"baseline", "proposed", "doremi"}
    assert adaptive["summary"][0].startswith("Adaptive mix (doremi, reference: the baseline run)")
    before = layout.result_path("doremi").stat().st_mtime_ns
    assert main(["-q", "ablate", str(toml)]) == 0  # finished: not trained again
    assert layout.result_path("doremi").stat().st_mtime_ns == before
    # a finished run's checkpoints are removed, the baseline's kept (the adaptive run read its model from them)
    assert any((layout.root / "checkpoints").iterdir())
    for name in ("baseline_seed1", "proposed", "doremi"):
        assert layout.read_result(name) and not (layout.run_dir(name) / "checkpoints").exists()


@pytest.mark.slow
def test_the_counterfactual_run_starts_at_the_mix_the_baselines_counterfactual_points_to(job, tmp_path, one_thread):
    """The shipped study's second round: ``adaptive = ["doremi", "counterfactual"]`` with the default
    ``counterfactual_step_size = 0`` trains a run at the mix the baseline's counterfactual favours."""
    from winnow.train.adaptive import proposal
    from winnow.train.attribution.counterfactual import read_record

    toml = study_toml(
        tmp_path / "study.toml",
        job,
        tmp_path / "study",
        steps=6,
        train="[train.attribution]\nstart = 1",
        kind='"random_mixes"',
        n_mixes=3,
        noise_seeds=2,
        attribution_every=2,
        adaptive='["doremi", "counterfactual"]',
        adaptive_every=1,
        counterfactual_max_factor=1.5,
    )
    assert main(["-q", "ablate", str(toml)]) == 0
    layout = StudyLayout(tmp_path / "study")
    assert _table(layout.root)["variant"].to_list()[-3:] == ["proposed", "doremi", "counterfactual"]
    config = json.loads((layout.run_dir("counterfactual") / "config.json").read_text())
    assert config["mixing"]["adaptive"] == "counterfactual" and config["mixing"]["step_size"] == 0.0
    assert config["mixing"]["max_factor"] == 1.5
    record = read_record(str(layout.root))
    base = layout.read_result("baseline")["weights"]
    start = proposal(record["slope"], record["held_out"], record["sources"], base, target="mean", max_factor=1.5)
    result = layout.read_result("counterfactual")
    assert result["mixing"]["mix_weights"] == pytest.approx(start)  # step_size 0: the start's mix throughout
    assert set(json.loads(layout.adaptive_json.read_text())["measured"]) >= {"baseline", "doremi", "counterfactual"}


def test_keep_checkpoints_keeps_every_runs_and_the_baseline_keeps_its_own(tmp_path):
    def task(name: str, keep: bool) -> runner.VariantTask:
        (tmp_path / name / "checkpoints" / "step-00000002").mkdir(parents=True)
        cfg = type("Cfg", (), {"output": str(tmp_path / name)})()
        return runner.VariantTask(cfg, {}, [], {"name": name}, "", str(tmp_path), keep_checkpoints=keep)

    for name, keep, left in (("a", True, True), ("baseline", False, True), ("b", False, False)):
        runner.drop_checkpoints(task(name, keep))
        assert (tmp_path / name / "checkpoints").is_dir() == left
        assert (tmp_path / name).is_dir()  # only the checkpoints go
    with pytest.raises(ConfigError, match="ablate.keep_checkpoints"):
        AblateConfig(keep_checkpoints="no")


# ---- bad input: refused before anything trains, naming the variant and the key ----------------------------
def _refused(tmp_path, capsys, job, **ablate) -> str:
    toml = study_toml(tmp_path / "bad.toml", job, tmp_path / "bad", **ablate)
    assert main(["ablate", str(toml)]) == 2
    assert not StudyLayout(tmp_path / "bad").result_path("baseline").exists()
    return capsys.readouterr().err


def test_a_source_without_train_rows_is_refused(tmp_path, capsys):
    job = tiny_job(tmp_path / "job", sources=["code", "prose", "web"])  # web: in the manifest, no rows
    err = _refused(tmp_path, capsys, job, sources='["web"]')
    assert "variant 'without_web' (ablate.sources)" in err and "no train rows" in err
    err = _refused(tmp_path, capsys, job, kind='"mixes"', mixes="{web_heavy = {web = 2.0, code = 1.0}}")
    assert "variant 'web_heavy' (ablate.mixes.web_heavy)" in err and "'web'" in err


def test_random_mixes_need_held_out_rows_of_every_source(tmp_path, capsys):
    """The regression fits each source's held-out loss: a source without held-out rows made it propose a mix ranked
    on NaN, train it, and fail at the end on every re-run; refused before anything trains."""
    from tests.pipelines.ablate_util import docs
    from tests.train.shards_util import write_job

    job = write_job(tmp_path / "job", [docs(6), docs(6, 6)], val=[[d for d in docs(4, 100) if d["source"] == "code"]])
    err = _refused(tmp_path, capsys, job, kind='"random_mixes"')
    assert "fits each source's held-out loss, and ['prose'] have no held-out rows" in err


def test_weights_that_sum_to_zero_are_refused():
    with pytest.raises(Exception, match=r"variant 'without_code' \(ablate.sources\) has mix weights that sum to 0"):
        variants(AblateConfig(), {"code": 1.0}, seed=0)
    # one source: any factor renormalises to the baseline's mix (the variants trained it again, "effects" and all)
    for factors in ([0.0], [0.5, 2.0]):
        with pytest.raises(Exception, match=r"ablate.kind = 'weights' .*one source with train rows \(\['code'\]\)"):
            variants(AblateConfig(kind="weights", factors=factors), {"code": 1.0}, seed=0)


def test_a_reference_run_on_other_sources_or_tokenizer_is_refused(job, tmp_path, capsys):
    from winnow.train.tokenizer import train_bpe

    other = tmp_path / "teacher"
    other.mkdir()
    (other / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 3.0, "per_source": {"web": {}}}) + "\n")
    err = _refused(tmp_path, capsys, job, train=f'[train.distill]\nteacher = "{other}"')
    assert "every variant (first: 'baseline'): train.distill.teacher" in err and "sources ['web']" in err
    (other / "metrics.jsonl").write_text(
        json.dumps({"step": 1, "loss": 3.0, "per_source": {"code": {}, "prose": {}}}) + "\n"
    )
    train_bpe([["some text to learn a few merges from", "more text"] * 20], vocab_size=270, min_frequency=1).save(other)
    err = _refused(tmp_path, capsys, job, train=f'[train.distill]\nteacher = "{other}"')
    assert "train.distill.teacher" in err and "another tokenizer" in err


def test_a_reference_anywhere_fsspec_reads_is_checked_and_a_missing_one_refused(job, tmp_path, capsys):
    import fsspec

    memory = fsspec.filesystem("memory")
    memory.pipe(
        "/teacher-run/metrics.jsonl", (json.dumps({"step": 1, "loss": 3.0, "per_source": {"web": {}}}) + "\n").encode()
    )
    memory.pipe("/teacher-run/checkpoints/step-00000001/state.pt", b"weights are not read by the check")
    try:
        for given in (
            "memory://teacher-run",
            "memory://teacher-run/checkpoints",
            "memory://teacher-run/checkpoints/step-00000001",
            "memory://teacher-run/checkpoints/step-00000001/state.pt",
        ):
            err = _refused(tmp_path, capsys, job, train=f'[train.distill]\nteacher = "{given}"')
            assert f"train.distill.teacher = {given!r}" in err and "sources ['web']" in err, err
    finally:
        memory.rm("/teacher-run", recursive=True)
    err = _refused(tmp_path, capsys, job, train=f'init_from = "{tmp_path / "no-such-run"}"')
    assert "every variant (first: 'baseline'): train.init_from" in err and "does not exist" in err, err


def test_a_finished_variant_with_other_settings_is_refused(job, tmp_path, capsys):
    layout = StudyLayout(tmp_path / "bad")
    layout.write_result(
        "baseline",
        {
            "name": "baseline",
            "kind": "baseline",
            "seed": 0,
            "weights": {"code": 0.9, "prose": 0.1},
            "held_out": {"code": 5.0, "prose": 5.0},
            "steps": 3,
        },
    )
    toml = study_toml(tmp_path / "bad.toml", job, layout.root)
    assert main(["ablate", str(toml)]) == 2
    err = capsys.readouterr().err
    assert "variant 'baseline'" in err and "mix weights" in err and "new [ablate] output folder" in err


def test_a_variant_trained_before_a_setting_was_added_or_removed_still_counts_as_finished(tmp_path):
    import dataclasses

    from winnow.pipelines.ablate.checks import finished

    @dataclasses.dataclass
    class Parallel:
        mode: str = "ddp"
        replicas: int = -1  # added after the run below was trained

    @dataclasses.dataclass
    class Train:
        output: str = "x"
        parallel: Parallel = dataclasses.field(default_factory=Parallel)

    layout = StudyLayout(tmp_path)
    variant = {"name": "without_code", "kind": "leave_one_out", "seed": 0, "weights": {"prose": 1.0}}
    layout.write_result("without_code", {**variant, "held_out": {"prose": 3.0}, "steps": 3})
    (layout.run_dir("without_code") / "config.json").write_text(
        json.dumps({"output": "x", "parallel": {"mode": "ddp", "experts": 1}})
    )  # "experts": removed since
    assert finished(layout, variant, Train())["held_out"] == {"prose": 3.0}
    with pytest.raises(ConfigError, match=r"train.parallel.replicas = None, the study now asks for 4"):
        finished(layout, variant, Train(parallel=Parallel(replicas=4)))  # a new setting away from its default
    with pytest.raises(ConfigError, match=r"train.parallel.mode = 'ddp', the study now asks for 'fsdp'"):
        finished(layout, variant, Train(parallel=Parallel(mode="fsdp")))


def test_local_workers_claim_one_gpu_each_and_ray_tasks_reserve_one(monkeypatch):
    seen = {}

    class Recorder:  # stands in for curate.executors.Executor: records how run_variants builds it
        def __init__(self, **kwargs):
            seen.update(kwargs)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def run(self, fn, specs):
            return iter([s.variant for s in specs])

    def tasks(*names):
        return [
            runner.VariantTask(cfg=None, folders={}, sources=[], variant={"name": n}, job_file="", study="")
            for n in names
        ]

    monkeypatch.setattr(runner, "Executor", Recorder)
    monkeypatch.setattr(runner, "_gpu_count", lambda: 2)
    assert [r["name"] for r in runner.run_variants(tasks("a", "b", "c"), AblateConfig(parallel=3))] == ["a", "b", "c"]
    queue, _ = seen["initargs"]
    assert seen["workers"] == 3 and seen["initializer"] is runner._claim_device
    assert [queue.get(timeout=5) for _ in range(3)] == [0, 1, 0]  # round-robin over the GPUs
    queue.put(1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    runner._claim_device(queue, 0)  # what each worker runs first
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    list(runner.run_variants(tasks("a"), AblateConfig(parallel=4, executor="ray")))
    assert seen["kind"] == "ray" and seen["gpus_per_task"] == 1.0 and seen["workers"] == 4


def test_a_started_variant_with_other_settings_is_not_resumed(job, tmp_path, capsys):
    layout = StudyLayout(tmp_path / "bad")
    layout.root.mkdir(parents=True)
    model = {"dim": 16, "n_layers": 1, "n_heads": 2, "n_experts": 2, "top_k": 1}
    started = {"steps": 99, "seed": 5, "model": model, "optim": {}, "data": {}, "output": str(layout.root)}  # no result
    (layout.run_dir("baseline") / "config.json").write_text(json.dumps(started))
    toml = study_toml(tmp_path / "bad.toml", job, layout.root)
    assert main(["ablate", str(toml)]) == 2
    err = capsys.readouterr().err
    assert "variant 'baseline'" in err and "was started (and would resume from its checkpoint)" in err


def test_finished_runs_of_an_earlier_plan_are_named_not_silently_left_out(tmp_path, capsys):
    from winnow.pipelines.ablate.study import _say_unplanned

    layout = StudyLayout(tmp_path / "study")
    for name in ("without_legal", "legal_x0.5"):
        layout.run_dir(name).mkdir(parents=True)
        layout.result_path(name).write_text(
            json.dumps({"name": name, "kind": "x", "held_out": {"legal": 2.0}, "weights": {"legal": 1.0}})
        )
    _say_unplanned(layout, ["baseline", "legal_x0.5"])
    out = capsys.readouterr().out
    assert "left out of its tables: without_legal" in out and "legal_x0.5" not in out
    _say_unplanned(layout, ["baseline", "legal_x0.5", "without_legal"])
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("command", ["check", "ablate"])
def test_a_study_into_another_studys_variant_folder_is_refused_before_it_writes(job, tmp_path, capsys, command):
    other = StudyLayout(tmp_path / "other")
    variant = other.run_dir("without_code")
    variant.mkdir(parents=True)
    (other.root / "ablation").mkdir()
    other.result_path("without_code").write_text(
        json.dumps({"name": "without_code", "kind": "x", "held_out": {"code": 2.0}, "weights": {"prose": 1.0}})
    )
    before = sorted(p.name for p in variant.iterdir())
    assert main([command, str(study_toml(tmp_path / "s.toml", job, variant))]) == 2
    assert "lies inside another study" in capsys.readouterr().err
    assert sorted(p.name for p in variant.iterdir()) == before  # no sources/ split into it


def test_a_study_whose_sources_folder_was_removed_rebuilds_it(job, tmp_path, one_thread):
    """It was taken for a `winnow train` run and refused ("holds a run of winnow train, not a study")."""
    import shutil

    path = study_toml(tmp_path / "s.toml", job, tmp_path / "study", noise_seeds=1, attribution_every=0)
    assert main(["-q", "ablate", str(path)]) == 0
    table = _table(tmp_path / "study")
    shutil.rmtree(tmp_path / "study" / "sources")
    assert main(["-q", "ablate", str(path)]) == 0
    assert (tmp_path / "study" / "sources").is_dir() and _table(tmp_path / "study").equals(table)


def test_a_study_over_shards_curated_again_is_refused_even_at_the_same_shares(job, tmp_path, capsys, one_thread):
    """Its results were measured on the held-out rows as they were: kept, they would be read as the new data's."""
    import shutil

    from tests.pipelines.ablate_util import docs
    from tests.train.shards_util import write_job

    path = study_toml(tmp_path / "s.toml", job, tmp_path / "study", noise_seeds=1, attribution_every=0)
    assert main(["-q", "ablate", str(path)]) == 0
    shutil.rmtree(job)  # curated again: the same train rows (so the same shares), other held-out rows
    write_job(job, [docs(6), docs(6, 6)], val=[docs(2, 300)[0::2], docs(2, 300)[1::2]])
    capsys.readouterr()
    assert main(["-q", "ablate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "variant 'baseline'" in err and "curated again" in err and "new folder" in err


def test_the_plan_prints_the_shares_each_run_trains_on(monkeypatch, tmp_path, capsys):
    """A weights variant's raw weights (legal x1.5: 0.2, 0.3, 0.4, 0.15) are not its shares; the plan prints those."""
    from winnow.pipelines.ablate import study

    monkeypatch.setattr(study, "variant_config", lambda *a: None)
    monkeypatch.setattr(study, "finished", lambda *a: None)
    monkeypatch.setattr(study, "run_variants", lambda todo, acfg: [])
    data = type("Data", (), {"shards": "x", "folders_for": lambda self, v: {}})()
    runs = [{"name": "legal_x1.5", "weights": {"changelog": 0.2, "code": 0.3, "docs": 0.4, "legal": 0.15}}]
    study._Study(AblateConfig(), None, StudyLayout(tmp_path), data, [], "job.toml").train(runs)
    assert "to train: legal_x1.5 (changelog=0.190, code=0.286, docs=0.381, legal=0.143)" in capsys.readouterr().out
