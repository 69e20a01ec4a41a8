"""A run folder's records (config.json, the tokenizer's files) follow a resume only once the resume is accepted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.pipelines.tiny import TINY_MODEL
from tests.train.shards_util import make_docs, write_job
from winnow.pipelines.jobfile import build_config
from winnow.train.config import TrainConfig
from winnow.train.errors import CheckpointError


def cfg_for(shards: Path, run: Path, **train) -> TrainConfig:
    import tomllib

    table = {
        "shards": str(shards),
        "output": str(run),
        "steps": 4,
        "checkpoint": {"every": 2},
        **tomllib.loads(TINY_MODEL)["train"],
    }
    for key, value in train.items():
        table[key] = {**table.get(key, {}), **value} if isinstance(value, dict) else value
    return build_config(TrainConfig, table, "test [train]")


def fit(cfg: TrainConfig) -> dict:
    from winnow.pipelines.train import build_trainer

    with build_trainer(cfg) as trainer:
        return trainer.fit()


def records(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run.iterdir()) if p.is_file() and p.suffix == ".json"}


def test_a_refused_resume_leaves_the_runs_records_as_they_were(tmp_path, caplog):
    """Other shards (the loader's state cannot continue on them): refused before config.json or the tokenizer's
    files are rewritten (they named the new data and settings, and the finished run no longer exported).
    Changed settings are said; fewer steps than the run reached train nothing and keep the records."""
    job = write_job(tmp_path / "job", [make_docs(40)], val=[make_docs(8)])
    other = write_job(tmp_path / "other", [make_docs(30, prefix="o")], val=[make_docs(8, prefix="o")])
    run = tmp_path / "run"
    assert fit(cfg_for(job, run))["step"] == 4
    before = records(run)
    with pytest.raises(CheckpointError, match="resume needs the same shards") as refused:
        fit(cfg_for(other, run, steps=6))
    assert f"the shards of {other} are not the ones the run trained on" in str(refused.value)
    assert records(run) == before

    with caplog.at_level("WARNING", logger="winnow.pipelines.train"):
        assert fit(cfg_for(job, run, steps=2))["step"] == 4
    assert records(run) == before
    assert any(
        "train.steps = 2 is below the step the run's checkpoint reached (4)" in r.getMessage() for r in caplog.records
    )

    caplog.clear()
    with caplog.at_level("WARNING", logger="winnow.pipelines.train"):
        assert fit(cfg_for(job, run, steps=6, optim={"lr": 0.002}))["step"] == 6
    said = [r.getMessage() for r in caplog.records if "settings other than" in r.getMessage()]
    assert len(said) == 1 and "optim.lr (" in said[0] and "-> 0.002)" in said[0]
    assert "steps (4 -> 6; the learning-rate schedule follows the new length from here)" in said[0]
    assert json.loads((run / "config.json").read_text())["optim"]["lr"] == 0.002


def test_a_vocab_size_other_than_the_tokenizers_is_said_and_the_records_hold_the_models(tmp_path, caplog):
    job = write_job(tmp_path / "job", [make_docs(40)], val=[make_docs(8)])
    with caplog.at_level("WARNING", logger="winnow.train.build"):
        fit(cfg_for(job, tmp_path / "run", model={"vocab_size": 100}))
    assert any("vocab_size = 100 differs from the tokenizer's 258" in r.getMessage() for r in caplog.records)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["model"]["vocab_size"] == 258


def test_a_study_pointed_at_a_run_folder_is_refused_before_it_writes_there(tmp_path, capsys):
    """[ablate] output naming a finished `winnow train` run: the study's baseline would take it for its own; refused
    with the run folder as it was (the study's sources/ were written into it first)."""
    from winnow.pipelines.cli import main

    job = write_job(tmp_path / "job", [make_docs(40)], val=[make_docs(8)])
    run = tmp_path / "run"
    fit(cfg_for(job, run))
    before = sorted(p.name for p in run.iterdir())
    path = tmp_path / "study.toml"
    path.write_text(
        f'[train]\nshards = "{job}"\nsteps = 2\n' + TINY_MODEL + f'[ablate]\nkind = "weights"\noutput = "{run}"\n'
    )
    assert main(["ablate", str(path)]) == 2
    assert "holds a run of `winnow train`, not a study" in capsys.readouterr().err
    assert sorted(p.name for p in run.iterdir()) == before


def test_a_teacher_trained_with_another_tokenizer_is_refused(tmp_path):
    """Distilling from a run of another tokenizer (or vocabulary): its logits score other tokens than the student's
    ids name (it trained on, or crashed mid-step with an IndexError)."""
    from winnow.train.build import load_teacher
    from winnow.train.errors import ConfigError
    from winnow.train.tokenizer import ByteTokenizer, train_bpe

    job = write_job(tmp_path / "job", [make_docs(40)], val=[make_docs(8)])
    fit(cfg_for(job, tmp_path / "teacher"))
    bpe = train_bpe([[d["text"] for d in make_docs(60)]], vocab_size=300)
    with pytest.raises(ConfigError, match="train.distill.teacher.*that run used tokenizer 'byte-258'"):
        load_teacher(str(tmp_path / "teacher"), tokenizer=bpe)
    assert load_teacher(str(tmp_path / "teacher"), tokenizer=ByteTokenizer()) is not None


def test_a_source_named_mean_is_refused_where_mean_names_the_average(tmp_path):
    """Attribution and adaptive mixing key the average over the held-out sets `mean`: a source of that name read as
    the average (sentences, study cells shifted by a column); refused at the start, naming what to rename."""
    from winnow.train.errors import ConfigError

    job = write_job(tmp_path / "job", [make_docs(30, ("mean", "web"))], val=[make_docs(8, ("mean", "web"))])
    with pytest.raises(ConfigError, match="a training source is named 'mean'"):
        fit(cfg_for(job, tmp_path / "run", attribution={"every": 2, "start": 1}))
    fit(cfg_for(job, tmp_path / "plain"))  # without attribution the name is just a name


def test_a_training_set_naming_a_source_without_train_rows_is_refused_before_anything_is_split(tmp_path, capsys):
    """`[train] shards = [{path, sources = {nosuch = 1}}]`: refused by check and by train before the run folder gets
    the per-source split (train refused after writing it; check said ok)."""
    from winnow.pipelines.cli import main

    job = write_job(tmp_path / "job", [make_docs(30)], val=[make_docs(6)])
    path = tmp_path / "t.toml"
    path.write_text(
        f'[train]\nsteps = 2\noutput = "{tmp_path / "run"}"\n'
        f'shards = [{{path = "{job}", sources = {{web = 1.0, nosuch = 1.0}}}}]\n' + TINY_MODEL
    )
    for command in ("check", "train"):
        assert main([command, str(path)]) == 2
        assert "train.shards[0].sources: 'nosuch' has no train rows" in capsys.readouterr().err
    assert not (tmp_path / "run" / "sources").exists()


def test_a_fresh_start_moves_all_the_earlier_run_left_together(tmp_path):
    """resume = false over a finished run: its config, export and report went nowhere (the config was overwritten,
    the export of the earlier model stayed beside the new one)."""
    job = write_job(tmp_path / "job", [make_docs(40)], val=[make_docs(8)])
    run = tmp_path / "run"
    fit(cfg_for(job, run))
    (run / "export").mkdir()
    (run / "export" / "winnow-model.safetensors").write_bytes(b"the earlier model")
    (run / "report.html").write_text("the earlier run's page")
    earlier = json.loads((run / "config.json").read_text())
    fit(cfg_for(job, run, seed=7, checkpoint={"resume": False}))
    previous = run / "previous-1"
    assert json.loads((previous / "config.json").read_text()) == earlier
    assert (previous / "export" / "winnow-model.safetensors").read_bytes() == b"the earlier model"
    assert (previous / "report.html").is_file() and (previous / "checkpoints").is_dir()
    assert not (run / "export").exists() and not (run / "report.html").exists()
    assert json.loads((run / "config.json").read_text())["seed"] == 7
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()][0] >= 1
    assert not (run / "previous-2").exists()  # the trainer's own archive at step 0 found nothing more to move


@pytest.mark.parametrize("at", [2, 4])  # a periodic evaluation, and the final one
def test_an_evaluation_a_stop_abandoned_is_redone_by_the_resume(tmp_path, monkeypatch, at):
    """SIGTERM during an evaluation: the run checkpoints without its record, and the resume went on past it, so
    the run's metrics never held that evaluation (the final one never, however often it was re-run)."""
    import winnow.train.trainer as trainer_module
    from winnow.pipelines.train import build_trainer

    job = write_job(tmp_path / "job", [make_docs(40)], val=[make_docs(8)])

    def cfg(run):
        return cfg_for(job, run, steps=4, eval_every=2, checkpoint={"every": 2})

    fit(cfg(tmp_path / "reference"))
    requested = trainer_module.stop_requested
    with build_trainer(cfg(tmp_path / "run")) as trainer:
        evaluate = trainer.evaluate

        def stopped_at(**kw):
            if trainer.step != at:
                return evaluate(**kw)
            trainer._stop_signal = 15  # what the signal handler sets; the evaluation sees the stop request
            monkeypatch.setattr(trainer_module, "stop_requested", lambda: 15)
            try:
                return evaluate(**kw)
            finally:
                monkeypatch.setattr(trainer_module, "stop_requested", requested)

        trainer.evaluate = stopped_at
        summary = trainer.fit()
    assert summary["preempted"] and summary["step"] == at

    def evals(run):
        lines = (run / "metrics.jsonl").read_text().splitlines() if (run / "metrics.jsonl").exists() else []
        return [(r["step"], r["eval"]) for r in map(json.loads, lines) if "eval" in r]

    assert [s for s, _ in evals(tmp_path / "run")] == [2] * (at == 4)
    fit(cfg(tmp_path / "run"))
    assert evals(tmp_path / "run") == evals(tmp_path / "reference")


def test_held_out_shards_curated_again_during_a_run_stop_it_at_its_next_evaluation(tmp_path):
    """The run evaluated on the new val split, its losses compared with the old split's; now refused, naming it."""
    import shutil

    from winnow.pipelines.train import build_trainer
    from winnow.train.errors import ShardError

    job = write_job(tmp_path / "job", [make_docs(40)], val=[make_docs(8)])
    with build_trainer(cfg_for(job, tmp_path / "run")) as trainer:
        first = trainer.evaluate()
        assert trainer.evaluate()["eval"] == first["eval"]  # the same shards: the same held-out losses
        shutil.rmtree(job)
        write_job(job, [make_docs(40)], val=[make_docs(8, prefix="o")])
        with pytest.raises(ShardError, match=r"its held-out \(val\) shards changed while the run trained"):
            trainer.evaluate()


def test_an_evaluation_of_the_whole_val_split_costing_more_than_training_says_eval_batches_once(
    tmp_path, monkeypatch, caplog
):
    """On a real corpus the default reads thousands of held-out batches at each evaluation (31 s of a 50 s run)."""
    import winnow.train.trainer as trainer_module
    from winnow.pipelines.train import build_trainer

    job = write_job(tmp_path / "job", [make_docs(40)], val=[make_docs(8)])
    clock = iter([200.0, 300.0, 320.0])
    with build_trainer(cfg_for(job, tmp_path / "run")) as trainer:
        monkeypatch.setattr(trainer_module.time, "perf_counter", lambda: next(clock))
        trainer._last_eval, trainer.step = (0, 100.0), 10
        with caplog.at_level("WARNING", logger="winnow.train.trainer"):
            trainer._say_eval_cost(150.0)  # 50 s of evaluation against 50 s of training
            trainer.step = 20
            trainer._say_eval_cost(250.0)  # again as costly: said once
            trainer.step = 30
            trainer._say_eval_cost(319.0)
    said = [r.getMessage() for r in caplog.records if "eval_batches" in r.getMessage()]
    assert said == [
        "the evaluation at step 10 took 50.0 s against 50.0 s of training since step 0: each one reads the whole "
        "val split; set [train] eval_batches to cap it"
    ]


def test_a_resume_with_another_lr_betas_or_weight_decay_continues_with_them(tmp_path, caplog):
    """It said it continued with them and config.json recorded them, but the checkpoint's param groups and the
    schedule's base brought the old run's back: the resumed steps trained at the old lr."""
    from winnow.pipelines.train import build_trainer
    from winnow.train.optim import lr_factor

    job = write_job(tmp_path / "job", [make_docs(40)], val=[make_docs(8)])
    run = tmp_path / "run"
    fit(cfg_for(job, run, optim={"lr": 0.003, "warmup_steps": 2}))
    new = cfg_for(job, run, steps=6, optim={"lr": 0.01, "warmup_steps": 2, "betas": [0.8, 0.9], "weight_decay": 0.5})
    with build_trainer(new) as trainer:
        trainer.resume()
        assert trainer.step == 4
        groups = trainer.optimizer.param_groups
        assert trainer.scheduler.base_lrs == [0.01] * len(groups)
        assert all(g["lr"] == 0.01 * lr_factor(4, new.optim, 6) and g["betas"] == (0.8, 0.9) for g in groups)
        assert sorted({g["weight_decay"] for g in groups}) == [0.0, 0.5]  # norms and biases stay undecayed
        summary = trainer.fit()
    assert summary["step"] == 6


def test_a_checkpoint_whose_model_is_not_the_runs_is_refused_naming_the_keys(tmp_path):
    """With config.json edited to the new model, the resume reached torch's size-mismatch traceback."""
    import dataclasses

    from winnow.pipelines.train import build_trainer

    job = write_job(tmp_path / "job", [make_docs(40)], val=[make_docs(8)])
    run = tmp_path / "run"
    fit(cfg_for(job, run))
    wider = cfg_for(job, run, steps=6, model={"dim": 32})
    saved = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**saved, "model": dataclasses.asdict(wider.model)}))
    with pytest.raises(CheckpointError, match=r"differs from \[train.model\] in dim \(the checkpoint's 16"):
        with build_trainer(wider) as trainer:
            trainer.resume()
