"""Alert kinds are one closed set (train.alerts.AlertKind): the report knows every kind the trainer emits."""

from __future__ import annotations

import logging

from tests.pipelines.report_util import healthy_records, write_run
from winnow.pipelines.report import plots
from winnow.pipelines.report.diagnose import diagnose
from winnow.pipelines.report.training import load_run
from winnow.train.alerts import SKIP_ALERT, AlertConfig, AlertKind, Alerts, SkipReason


def _emit_every_kind(run_dir) -> None:
    alerts = Alerts(AlertConfig(), run_dir)
    for step, kind in enumerate(AlertKind, start=3):
        alerts.emit(kind, step, f"a {kind} alert", sources=["prose"])


def test_every_kind_the_trainer_emits_is_known_to_the_report(tmp_path, caplog):
    run_dir = write_run(tmp_path / "run", healthy_records())
    _emit_every_kind(run_dir)
    with caplog.at_level(logging.WARNING, logger="winnow.pipelines.report.training"):
        run = load_run(run_dir)
    assert not [r for r in caplog.records if "unknown to this report" in r.getMessage()]
    assert {a["kind"] for a in run.alerts} == {k.value for k in AlertKind}
    assert set(plots.ALERT_COLORS) == set(AlertKind)  # a new kind needs its colour in the timeline
    assert plots.timeline(run)[:4] == b"\x89PNG"
    assert sorted(run.skipped_steps()) == sorted((3 + list(AlertKind).index(a), s) for s, a in SKIP_ALERT.items())
    assert set(SKIP_ALERT) == set(SkipReason)
    assert "loss_spike" in {f.rule for f in diagnose(run)}


def test_an_unknown_kind_is_reported_not_silently_drawn(tmp_path, caplog):
    run_dir = write_run(
        tmp_path / "run", healthy_records(), alerts=[{"time": 0.0, "step": 4, "kind": "gpu_on_fire", "message": "?"}]
    )
    with caplog.at_level(logging.WARNING, logger="winnow.pipelines.report.training"):
        run = load_run(run_dir)
    assert any("'gpu_on_fire'" in r.getMessage() and "unknown to this report" in r.getMessage() for r in caplog.records)
    assert run.skipped_steps() == []


def test_alerts_of_shapes_the_trainer_never_writes_are_skipped_and_counted_once(tmp_path, caplog, capsys):
    """An alert without a step (KeyError), with a step of "two" (ValueError) or null (TypeError in matplotlib), a
    kind that is a list (unhashable), sources or origins of other shapes: each stopped `winnow report`."""
    import argparse

    from winnow.pipelines.report.command import register

    odd = [
        {"kind": "nan", "message": "x"},
        {"kind": "nan", "step": "two"},
        {"kind": "loss_spike", "step": None},
        {"kind": "loss_spike", "step": True},
        {"kind": "loss_spike", "step": -1},
        {"kind": ["nan"], "step": 2},
        {"step": 2},
        {"kind": "loss_spike", "step": 2, "sources": 5},
        {"kind": "loss_spike", "step": 2, "sources": [["code"]]},
        {"kind": "loss_spike", "step": 2, "origins": [[]]},
        {"kind": "loss_spike", "step": 2, "origins": "a.parquet"},
    ]
    good = {"time": 0.0, "step": 25, "kind": "loss_spike", "message": "spike", "sources": ["code"], "origins": []}
    run_dir = write_run(tmp_path / "run", healthy_records(), alerts=[*odd, good])
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["report", str(run_dir), "--diagnose"])
    with caplog.at_level(logging.WARNING, logger="winnow.pipelines.report.training"):
        assert args.func(args) == 0
    said = [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()]
    assert said == [f"{run_dir / 'alerts.jsonl'}: 11 unreadable line(s) skipped (not JSON, or not of the shapes the trainer writes)"]  # fmt: skip
    assert "[warning] Loss spikes" in capsys.readouterr().out
    assert load_run(run_dir).alerts == [good]
