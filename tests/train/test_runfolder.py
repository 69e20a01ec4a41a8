"""The run folder across restarts: metrics hold each step once after a resume; a fresh start archives an older run."""

import json
import os
import stat

import pytest

from tests.train.test_trainer_loop import SyntheticBatches, make_trainer, tiny_config
from winnow.train.checkpoint import STATE_FILE
from winnow.train.runfolder import truncate_jsonl


def _steps(path, kind="loss"):
    return [r["step"] for r in map(json.loads, path.read_text().splitlines()) if kind in r]


def _crash_at(step):
    def on_batch(position):
        if position == step:
            raise RuntimeError("injected crash")

    return on_batch


def test_resume_cuts_metrics_back_to_the_checkpoint(tmp_path):
    kw = dict(steps=7, metrics={"log_every": 1}, checkpoint={"every": 3})
    cfg = tiny_config(tmp_path, **kw)
    with pytest.raises(RuntimeError, match="injected"):
        make_trainer(cfg, SyntheticBatches(on_batch=_crash_at(6))).fit()  # steps 1-5 logged, checkpoint at 3
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "loss": 1.0, "per_sou')  # and a torn line, as a kill mid-write leaves
    make_trainer(cfg).fit()
    assert _steps(tmp_path / "metrics.jsonl") == [1, 2, 3, 4, 5, 6, 7]


def test_fresh_start_next_to_an_older_run_starts_new_metrics(tmp_path):
    old = make_trainer(tiny_config(tmp_path, steps=6, metrics={"log_every": 1}, checkpoint={"every": 2}))
    old.fit()
    for ckpt in old.checkpoints.checkpoints():
        (ckpt / STATE_FILE).write_bytes(b"garbage")  # every checkpoint corrupt: the restart is from scratch
    new = make_trainer(tiny_config(tmp_path, steps=2, metrics={"log_every": 1}, checkpoint={"every": 2}))
    summary = new.fit()
    assert summary["step"] == 2 and _steps(tmp_path / "metrics.jsonl") == [1, 2]
    archived = tmp_path / "previous-1"
    assert _steps(archived / "metrics.jsonl") == [1, 2, 3, 4, 5, 6]
    assert sorted(p.name for p in (archived / "checkpoints").iterdir()) == [
        "step-00000002",
        "step-00000004",
        "step-00000006",
    ]
    assert [p.name for p in new.checkpoints.checkpoints()] == ["step-00000002"]


def test_truncate_keeps_records_up_to_the_step_and_lines_without_one(tmp_path):
    path = tmp_path / "m.jsonl"
    lines = [{"step": 1, "loss": 1}, {"note": "x"}, {"step": 2, "eval": {}}, {"step": 3, "loss": 1}]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"step": 4, "lo')
    assert truncate_jsonl(path, 2) == 2
    assert [json.loads(line) for line in path.read_text().splitlines()] == lines[:3]
    assert truncate_jsonl(path, 2) == 0


def test_run_folder_files_follow_the_umask(tmp_path):
    previous = os.umask(0o027)
    try:
        run = tmp_path / "run"  # pytest makes tmp_path itself 0700
        make_trainer(tiny_config(run, steps=2, metrics={"log_every": 1}, checkpoint={"every": 1})).fit()
    finally:
        os.umask(previous)
    for path in [run, *run.rglob("*")]:
        assert stat.S_IMODE(path.stat().st_mode) == (0o750 if path.is_dir() else 0o640), path
