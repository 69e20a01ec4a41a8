"""Progress: a bar on a terminal; plain log lines (no carriage returns, no escape codes) in a log file; ``-q`` silences both."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pipelines.tiny import TINY_MODEL
from winnow.train.progress import TrainProgress

ROOT = Path(__file__).resolve().parents[2]
JOB = (
    """
[job]
name = "tiny"
output = "out"
[[inputs]]
source = "a"
path = "a.jsonl"
[[inputs]]
source = "b"
path = "b.jsonl"
[[stages]]
kind = "split"
val_fraction = 0.2
[train]
steps = 6
eval_every = 3
[train.metrics]
log_every = 2
"""
    + TINY_MODEL
)
ESCAPES = re.compile(r"\r|\x1b")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_bar_reaches_100_percent_with_loss_and_tokens_per_second(monkeypatch):
    screen = _Terminal()
    monkeypatch.setattr(sys, "stderr", screen)
    progress = TrainProgress(total=6, every=2)
    progress.open(0, 0)
    for step in range(1, 7):
        progress.step(step, 100 * step, 2.5)
        if step == 3:
            list(progress.evaluating(range(2), total=2))
    progress.close()
    frames = screen.getvalue().replace("\r", "\n").splitlines()
    last = [f for f in frames if f.startswith("train:")][-1]
    assert "100%" in last and "6/6" in last and "loss=2.5000" in last and "tok/s=" in last
    assert any(f.startswith("eval:") for f in frames)


def test_off_a_terminal_an_evaluation_a_stop_abandoned_logs_no_line_of_its_time(monkeypatch, caplog):
    """It logged "eval at step N: k batches in s" right after the trainer said the evaluation was abandoned."""
    import winnow.train.progress as progress_module

    monkeypatch.setattr(sys, "stderr", io.StringIO())  # not a terminal: plain log lines
    progress = TrainProgress(total=6, every=2)
    progress.open(0, 0)
    progress.step(3, 300, 2.5)
    with caplog.at_level("INFO", logger="winnow.train.progress"):
        list(progress.evaluating(range(2), total=2))
        assert "eval at step 3: 2 held-out batch(es)" in caplog.text
        caplog.clear()
        monkeypatch.setattr(progress_module, "stop_requested", lambda: 15)
        list(progress.evaluating(range(2), total=2))
    progress.close()
    assert "eval at step" not in caplog.text


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    with open(tmp_path / "stderr.log", "w") as err:  # a file, as on a cluster: not a terminal
        proc = subprocess.run(
            [sys.executable, "-m", "winnow.pipelines.cli", "run", "job.toml", *args],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            timeout=1800,
        )
    return proc, (tmp_path / "stderr.log").read_text()


@pytest.mark.slow
def test_a_log_file_gets_plain_step_lines_and_quiet_after_the_command_silences_them(tmp_path):
    for source in "ab":
        (tmp_path / f"{source}.jsonl").write_text(
            "".join(json.dumps({"text": f"{source} text {i} " * 8}) + "\n" for i in range(40))
        )
    (tmp_path / "job.toml").write_text(JOB)
    proc, log = _run(tmp_path)
    assert proc.returncode == 0, log
    assert not ESCAPES.search(log), repr(log[:2000])
    steps = re.findall(r"train\.progress: step (\d+)/6 \(\d+%\) loss [\d.]+ tokens/s [\d,]+ elapsed \S+ eta \S+", log)
    assert steps == ["2", "4", "6"]  # every log_every steps, to the last
    assert "eval at step 3: " in log
    assert re.search(r"curate\.progress: phase 1/\d: read .* done, 2 task\(s\)", log)
    assert "total: 80 read" in proc.stdout  # the curation summary, as `winnow curate` prints it
    assert "MFU basis" in proc.stdout and "(this CPU, measured: " in proc.stdout
    quiet, log = _run(tmp_path, "--output", "quiet", "-q")
    assert quiet.returncode == 0, log
    assert "progress" not in log and not ESCAPES.search(log)
    assert (tmp_path / "quiet" / "train" / "metrics.jsonl").is_file()
