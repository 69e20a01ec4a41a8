"""The report reads each step once even from a metrics file that holds a killed stretch and its redo."""

import json

from winnow.pipelines.report.training import load_run


def test_report_drops_steps_a_resumed_run_redid(tmp_path):
    def log(step):
        return {"step": step, "loss": float(step), "per_source": {}}

    records = [
        log(1),
        log(2),
        {"step": 2, "eval": {"loss": 2.0}},
        log(3),
        log(4),  # killed after step 4
        log(3),
        log(4),
        {"step": 4, "eval": {"loss": 4.0}},
        log(5),  # resumed from step 2
        log(1),
        log(2),
    ]  # restarted from scratch
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    run = load_run(tmp_path)
    assert [r["step"] for r in run.logs] == [1, 2]
    records = records[:9]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    run = load_run(tmp_path)
    assert [r["step"] for r in run.logs] == [1, 2, 3, 4, 5]
    assert [r["step"] for r in run.evals] == [2, 4]
