"""Diagnosis rules on constructed metrics: each fires on its problem, names the evidence and the setting."""

import pytest

from tests.pipelines.report_util import (
    alert,
    counterfactual_record,
    eval_record,
    healthy_records,
    log_record,
    write_run,
)
from winnow.curate.errors import ConfigError
from winnow.pipelines.report import DiagnoseConfig, diagnose, format_findings
from winnow.pipelines.report.training import load_run


def rules(tmp_path, records, **kw):
    return {
        f.rule: f
        for f in diagnose(load_run(write_run(tmp_path / "run", records, **kw)), DiagnoseConfig(memory_limit_gib=16.0))
    }


def test_healthy_run_has_no_findings(tmp_path):
    assert rules(tmp_path, healthy_records()) == {}
    assert "nothing found" in format_findings([])


def test_a_run_without_training_records_is_not_called_healthy(tmp_path):
    """An empty metrics.jsonl, or one of evaluations only, read "nothing found (... look normal)"."""
    for records in ([], [{"step": 10, "eval": {"loss": 2.0, "per_source": {"a": 2.0}}}]):
        findings = diagnose(load_run(write_run(tmp_path / f"run{len(records)}", records)))
        assert [f.rule for f in findings] == ["no_records"]
        assert "nothing to diagnose: metrics.jsonl holds no training records" in format_findings(findings)


def test_loss_spikes_name_sources_shards_and_precision(tmp_path):
    origins = [["/job/shards/train/part-00003-00000.parquet", 7], ["/job/shards/train/part-00001-00000.parquet", 2]]
    alerts = [
        alert("loss_spike", 20, loss=9.0, sources=["code", "prose"], origins=origins),
        alert("loss_spike", 35, loss=8.0, sources=["code"], origins=origins[:1]),
    ]
    found = rules(tmp_path, healthy_records(), alerts=alerts, config={"precision": "fp16"})["loss_spike"]
    text = " ".join(found.evidence)
    assert "step 20, 35" in text and "'code' was in 2 of 2" in text and "'prose' was in 1 of 2" in text
    assert "part-00003-00000.parquet (2)" in text
    assert any("train.precision = 'fp16'" in s for s in found.settings)
    assert any("'code' is in every spiking batch" in s for s in found.settings)


def test_nonfinite_steps_are_critical(tmp_path):
    found = rules(tmp_path, healthy_records(), alerts=[alert("nan", 12, loss="nan", sources=["prose"], origins=[])])
    assert found["loss_spike"].severity == "critical"


def test_intervals_that_trained_nothing_are_critical_without_alerts(tmp_path):
    """The trainer writes `"loss": null` for an interval whose every step it skipped: the report dropped those
    records as malformed, and with alerts.jsonl missing the diagnosis said the loss looked normal."""
    records = healthy_records()
    for r in records:
        if "loss" in r and r["step"] in (20, 30):
            r["loss"] = None
    run = load_run(write_run(tmp_path / "run", records))
    assert run.bad_lines == 0 and [r["step"] for r in run.logs if r.get("loss", 0) is None] == [20, 30]
    found = {f.rule: f for f in diagnose(run, DiagnoseConfig(memory_limit_gib=16.0))}["loss_spike"]
    assert found.severity == "critical" and "2 log interval(s) in which every step was skipped" in found.evidence[0]


def test_high_data_wait_points_at_the_loader(tmp_path):
    records = [log_record(s, loss=3.0, data_wait_pct=60.0) for s in range(5, 55, 5)]
    found = rules(tmp_path, records, config={"data": {"num_workers": 1}})
    assert set(found) == {"data_wait"}
    assert "mean data wait 60%" in found["data_wait"].evidence[0]
    assert found["data_wait"].settings[0].startswith("train.data.num_workers = 1")


def test_start_up_wait_alone_is_not_a_loader_problem(tmp_path):
    records = [log_record(s, loss=3.0, data_wait_pct=90.0 if s == 5 else 1.0) for s in range(5, 55, 5)]
    assert "data_wait" not in rules(tmp_path, records)


def test_high_communication_points_at_the_parallel_layout(tmp_path):
    records = [{**log_record(s, loss=3.0), "comm_pct": 45.0} for s in range(5, 55, 5)]
    found = rules(tmp_path, records)["communication"]
    assert "45%" in found.evidence[0] and "parallel layout" in found.title


def test_memory_near_the_limit(tmp_path):
    records = [log_record(s, loss=3.0, memory={"allocated_gib": 10.0, "peak_gib": 15.2}) for s in range(5, 30, 5)]
    found = rules(tmp_path, records, config={"precision": "fp32", "activation_checkpointing": False})["memory"]
    assert "15.20 GiB = 95% of 16.00 GiB" in found.evidence[0]
    assert found.settings[0] == "train.activation_checkpointing = False: recompute activations in the backward pass"


def test_memory_limit_logged_by_the_run_wins(tmp_path):
    records = [log_record(s, loss=3.0, memory={"peak_gib": 15.2, "limit_gib": 80.0}) for s in range(5, 30, 5)]
    assert "memory" not in rules(tmp_path, records)


def test_expert_imbalance_names_layer_expert_and_source(tmp_path):
    load = [[0.25] * 4, [0.7, 0.1, 0.1, 0.1]]
    routing = {"prose": [[64] * 4, [200, 20, 20, 16]], "code": [[64] * 4, [60, 60, 60, 76]]}
    records = [log_record(s, loss=3.0, expert_load=load, routing=routing) for s in range(5, 30, 5)]
    found = rules(tmp_path, records, config={"model": {"aux_loss_coef": 0.001}})["expert_imbalance"]
    assert len(found.evidence) == 1
    assert "layer 1: expert 0 carries 2.8x" in found.evidence[0] and "'prose' sends 78%" in found.evidence[0]
    assert found.settings[0].startswith("train.model.aux_loss_coef = 0.001")


def test_imbalance_right_after_initialisation_is_ignored(tmp_path):
    records = [
        log_record(s, loss=3.0, expert_load=[[0.25] * 4, [0.9, 0.0, 0.05, 0.05] if s == 5 else [0.25] * 4])
        for s in range(5, 30, 5)
    ]
    assert "expert_imbalance" not in rules(tmp_path, records)


def test_source_whose_held_out_loss_rises_while_others_fall(tmp_path):
    records = [log_record(s, loss=3.0) for s in range(10, 50, 10)]
    records += [
        eval_record(10, {"prose": 3.0, "code": 3.0}),
        eval_record(20, {"prose": 2.6, "code": 2.8}),
        eval_record(30, {"prose": 2.3, "code": 2.9}),
        eval_record(40, {"prose": 2.1, "code": 3.1}),
    ]
    # training on prose raises code's held-out loss: slope +0.3 per unit of log share, so leaving prose out
    # (f_0.5(0) = -2) is predicted to lower it by 0.6 nats
    records.append(counterfactual_record(40, ["prose", "code"], [[-0.5, 0.3], [0.0, -0.1]], error=0.02))
    found = rules(tmp_path, records)["source_regression"]
    assert "'code'" in found.title
    assert "rose +0.300 nats from its best 2.800 to 3.100" in found.evidence[0]
    assert any("leaving out 'prose' would lower it by 0.6 ± 0.08 nats" in e for e in found.evidence)
    assert any("lower 'prose'" in s for s in found.settings)


def test_a_source_regression_without_a_clear_culprit_names_none(tmp_path):
    records = [log_record(s, loss=3.0) for s in range(10, 50, 10)]
    records += [eval_record(10, {"prose": 3.0, "code": 3.0}), eval_record(40, {"prose": 2.1, "code": 3.1})]
    # prose's effect on code is within its interval
    records.append(counterfactual_record(40, ["prose", "code"], [[-0.5, 0.01], [0.0, -0.1]], error=0.02))
    found = rules(tmp_path, records)["source_regression"]
    assert not any("leaving out" in e for e in found.evidence) and not any("lower 'prose'" in s for s in found.settings)


def test_all_sources_rising_is_not_a_source_regression(tmp_path):
    records = [
        log_record(10, loss=3.0),
        eval_record(10, {"prose": 2.0, "code": 2.0}),
        eval_record(20, {"prose": 2.5, "code": 2.5}),
    ]
    assert "source_regression" not in rules(tmp_path, records)


@pytest.mark.parametrize(
    "key,value",
    [
        ("data_wait_pct", 0),
        ("memory_fraction", 1.5),
        ("imbalance", 1.0),
        ("memory_limit_gib", -1.0),
        ("memory_limit_gib", float("nan")),  # printed "nan% of nan GiB"
        ("skip_first", -1),
        ("regression_nats", 0),
    ],
)
def test_bad_thresholds_name_the_key(key, value):
    with pytest.raises(ConfigError, match=f"report.{key} = "):
        DiagnoseConfig(**{key: value})


@pytest.mark.parametrize("loss", [float("nan"), float("inf")])
def test_intervals_of_non_finite_loss_are_critical_as_null_ones_are(tmp_path, loss):
    """Older writers (and Python's json) write `NaN` for such an interval: the diagnosis called the run normal."""
    records = healthy_records()
    for r in records:
        if "loss" in r and r["step"] in (20, 30):
            r["loss"] = loss
    found = rules(tmp_path, records)["loss_spike"]
    assert found.severity == "critical" and "2 log interval(s) in which every step was skipped" in found.evidence[0]
