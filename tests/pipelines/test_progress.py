"""``winnow train`` shows a progress bar that reaches 100% (and an evaluation bar); ``-q`` silences it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.pipelines.tiny import TINY_MODEL

ROOT = Path(__file__).resolve().parents[2]
JOB = """
[train]
steps = 6
eval_every = 3
[train.metrics]
log_every = 2
trackers = ["tensorboard"]
""" + TINY_MODEL


def _train(tmp_path: Path, *flags: str, output: str = "run") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *flags, "train", "job.toml", "--shards", "corpus",
                           "--output", output],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_progress_bar_reaches_100_percent_and_quiet_silences_it(tmp_path):
    (tmp_path / "corpus").mkdir()
    pq.write_table(pa.table({"text": [f"text {i} " * 8 for i in range(60)], "source": ["a", "b"] * 30}),
                   tmp_path / "corpus" / "train-0.parquet")
    pq.write_table(pa.table({"text": ["held out " * 8] * 6, "source": ["a", "b"] * 3}), tmp_path / "corpus" / "val-0.parquet")
    (tmp_path / "job.toml").write_text(JOB)
    shown = _train(tmp_path, "-v")
    assert shown.returncode == 0, shown.stderr
    frames = shown.stderr.replace("\r", "\n").splitlines()
    last = [f for f in frames if f.startswith("train:")][-1]
    assert "100%" in last and "6/6" in last and "loss=" in last and "tok/s=" in last
    assert any(f.startswith("eval:") for f in frames)  # each evaluation shows its own bar
    assert any("step 6 loss" in f for f in frames)  # -v log lines print beside the bar, not through it
    assert any((tmp_path / "run" / "tensorboard").iterdir())
    quiet = _train(tmp_path, "-q", output="quiet")
    assert quiet.returncode == 0 and (tmp_path / "quiet" / "metrics.jsonl").is_file()
    assert "train:" not in quiet.stderr and "eval:" not in quiet.stderr and "%|" not in quiet.stderr
