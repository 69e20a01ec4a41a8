"""Early stopping inside ``Trainer.fit``: it stops at the right evaluation, checkpoints, and writes why."""

import dataclasses
import json

import pytest

from tests.train.test_trainer_loop import make_trainer, tiny_config
from winnow.train.attribution import AttributionConfig
from winnow.train.errors import ConfigError
from winnow.train.metrics import MetricsConfig
from winnow.train.stopping import StopConfig


def test_fit_stops_at_the_right_eval_and_writes_its_reason(tmp_path, caplog):
    cfg = dataclasses.replace(
        tiny_config(tmp_path, steps=40, checkpoint={"every": 0}, metrics={"log_every": 10}),
        eval_every=4,
        stop=StopConfig(patience=2, min_delta=0.05),
    )
    trainer = make_trainer(cfg)
    script = iter([3.0, 2.5, 2.48, 2.6, 2.0])  # evals at steps 4, 8, 12, 16: no 0.05 gain at 12 and 16 -> stop at 16

    def evaluate():
        record = {"step": trainer.step, "eval": {"loss": next(script), "per_source": {}}}
        trainer.metrics.write(record)
        return record

    trainer.evaluate = evaluate  # the scripted held-out losses stand in for a val split
    summary = trainer.fit()
    assert summary["step"] == 16 and "not improved by more than min_delta=0.05" in summary["stopped"]
    assert summary["checkpoint"].endswith("step-00000016")  # the run ends with a final checkpoint
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    stops = [r for r in records if "stop" in r]
    assert stops == [{"step": 16, "stop": {"reason": summary["stopped"]}}]
    assert [r["step"] for r in records if "eval" in r] == [4, 8, 12, 16]  # no extra final evaluation
    assert any(r.get("step") == 16 and "loss" in r for r in records)  # the last interval's training figures

    recorded = []  # a re-run finds the stopped checkpoint, does not train on, and records no evaluation again
    resumed = make_trainer(cfg)
    resumed.evaluate = lambda record=True, **_: recorded.append(record)
    with caplog.at_level("WARNING", logger="winnow.train.trainer"):
        assert resumed.fit()["step"] == 16
    assert not any(recorded)  # each re-run wrote the final evaluation again
    assert "the run stopped early at step 16" in caplog.text and "resume = false" in caplog.text


@pytest.mark.parametrize(
    ("build", "key"),
    [
        (lambda: StopConfig(sources=["web", "web"]), "train.stop.sources"),
        (lambda: AttributionConfig(held_out=["a", "a"]), "train.attribution.held_out"),
        (lambda: MetricsConfig(trackers=["mlflow", "mlflow"]), "train.metrics.trackers"),
    ],
)
def test_a_name_listed_twice_is_refused_naming_the_key(build, key):
    with pytest.raises(ConfigError, match=rf"{key} = .* each once"):
        build()


def test_a_continued_runs_step_0_evaluation_sets_the_best_to_improve_on(tmp_path):
    """``init_from``: the step-0 evaluation measures the starting model, so patience counts from it; a run whose
    periodic evaluations never beat it by more than min_delta stops after ``patience`` of them."""
    from winnow.train.init import load_init

    base_cfg = tiny_config(tmp_path / "base", steps=3, checkpoint={"every": 0})
    make_trainer(base_cfg).fit()
    cfg = dataclasses.replace(
        tiny_config(tmp_path / "run", steps=40, checkpoint={"every": 0}, metrics={"log_every": 10}),
        eval_every=4,
        init_from=str(tmp_path / "base"),
        stop=StopConfig(patience=2, min_delta=0.05),
    )
    trainer = make_trainer(cfg, init=load_init(cfg.init_from))
    script = iter([2.0, 2.5, 2.4, 1.0])  # step 0 is the best: steps 4 and 8 do not beat it -> stop at 8

    def evaluate(record=True):
        result = {"step": trainer.step, "eval": {"loss": next(script), "per_source": {}}}
        trainer.metrics.write(result)
        return result

    trainer.evaluate = evaluate
    summary = trainer.fit()
    assert summary["step"] == 8 and "over its best 2.0000 (step 0) for 2 evaluations" in summary["stopped"]
