"""The report's forgetting/gain table of a continued run and the per-source flattening slope."""

import json

import numpy as np
import pytest

from winnow.pipelines.report import continued
from winnow.pipelines.report.page import write_report
from winnow.pipelines.report.training import load_run


def _write_run(folder, evals, stop=None):
    folder.mkdir(parents=True, exist_ok=True)
    records = [{"step": 10, "loss": 2.0, "lr": 1e-3, "per_source": {"old": {"tokens": 0}, "new": {"tokens": 500}}}]
    records += [{"step": s, "eval": {"loss": sum(v.values()) / 2, "per_source": v}} for s, v in evals]
    if stop:
        records.append({"step": evals[-1][0], "stop": {"reason": stop}})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def test_slope_interval_matches_least_squares():
    steps = np.array([100, 200, 300, 400, 500])
    losses = np.array([2.0, 1.9, 1.85, 1.7, 1.65])
    slope, lo, hi = continued.slope_interval(steps, losses)
    assert slope == pytest.approx(np.polyfit(steps / 100, losses, 1)[0])
    assert lo < slope < hi < 0  # still falling, measurably
    flat, flat_lo, flat_hi = continued.slope_interval(steps, np.array([1.5, 1.52, 1.49, 1.51, 1.5]))
    assert flat_lo < 0 < flat_hi
    assert continued.slope_interval(steps[:2], losses[:2]) is None  # two points give no interval


def test_forgetting_and_gain_per_source_from_step_zero(tmp_path):
    evals = [(0, {"old": 1.5, "new": 3.0})] + [
        (s, {"old": 1.5 + 0.02 * k + 0.001 * (-1) ** k, "new": 3.0 - 0.3 * k})
        for k, s in enumerate((10, 20, 30, 40, 50), start=1)
    ]
    run = load_run(_write_run(tmp_path / "run", evals, stop="held-out loss of new is 1.5 at step 50"))
    rows = {r.source: r for r in continued.source_changes(run)}
    assert (
        rows["old"].start == 1.5
        and rows["old"].change == pytest.approx(0.1 - 0.001)
        and rows["old"].verdict == "forgot"
    )
    assert rows["new"].change == pytest.approx(-1.5) and rows["new"].verdict == "gained"
    assert rows["new"].trained_tokens == 500 and rows["old"].trained_tokens == 0
    assert rows["new"].flattened is False and rows["new"].slope == pytest.approx(-3.0)  # per 100 steps
    page = write_report(tmp_path / "run").read_text()
    assert "Forgetting and gain" in page and "Stopped early" in page and "at step 50" in page


def test_a_run_without_a_step_zero_eval_has_no_table(tmp_path):
    run = load_run(_write_run(tmp_path / "run", [(10, {"old": 1.0, "new": 2.0}), (20, {"old": 0.9, "new": 1.9})]))
    assert continued.source_changes(run) == []
