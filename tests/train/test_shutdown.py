"""A failure or a signal anywhere in a training run ends it, loader workers included, and leaves a usable checkpoint.

Each test runs ``shutdown_child`` (a tiny real run: shards, one loader worker, evaluation and
checkpoints) in a subprocess with one fault injected, and asserts that it exits on its own
with a clear error (or a checkpoint, for signals) and that no loader worker outlives it.
Before train/shutdown.py these hung until killed: workers inherited the trainer's SIGTERM
handler, so multiprocessing's exit-time join never returned.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
LIMIT_S = 120  # the whole child run, imports included, on a loaded 2-core machine; a hang never ends


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _assert_no_orphans(folder: Path) -> None:
    pids = [int(p) for p in (folder / "pids").read_text().split()] if (folder / "pids").exists() else []
    assert pids, "the run started no loader worker: the scenario did not exercise it"
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in pids if _alive(p)], "loader workers outlived the run"


def _start(scenario: str, folder: Path, *args: str, module: str = "tests.train.shutdown_child") -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", module, scenario, str(folder), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _finish(proc: subprocess.Popen, folder: Path) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        for pid in (folder / "pids").read_text().split() if (folder / "pids").exists() else []:
            try:  # first: an orphaned worker holds the output pipe open
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        out, _ = proc.communicate()
        pytest.fail(f"the run did not exit within {LIMIT_S} s (hung):\n{out[-3000:]}")
    _assert_no_orphans(folder)
    return proc.returncode, out


def _steps_checkpointed(folder: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in (folder / "run" / "checkpoints").glob("step-*"))


@pytest.mark.parametrize(
    "scenario, message",
    [
        ("worker-error", "injected failure in a loader worker"),
        ("main-error", "injected failure in the training loop"),
        ("eval-error", "injected failure during evaluation"),
        ("save-error", "No space left on device"),
    ],
)
def test_an_exception_anywhere_ends_the_run_and_its_workers(tmp_path, scenario, message):
    code, out = _finish(_start(scenario, tmp_path), tmp_path)
    assert code == 1 and message in out, out[-3000:]
    if scenario == "worker-error":
        assert "raised in loader worker 0" in out  # the worker's own traceback comes along
    if scenario == "save-error":
        assert "cannot write checkpoint" in out


@pytest.mark.parametrize("scenario, checkpoint", [("sigterm-step", 3), ("sigterm-eval", 2), ("sigterm-save", 2)])
def test_sigterm_at_any_point_checkpoints_and_exits(tmp_path, scenario, checkpoint):
    code, out = _finish(_start(scenario, tmp_path), tmp_path)
    assert code == 0, out[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["preempted"] and summary["step"] == checkpoint
    assert _steps_checkpointed(tmp_path)[-1] == checkpoint
    metrics = tmp_path / "run" / "metrics.jsonl"  # logged every 10 steps: only evaluation records by step 3
    evals = (
        [r["step"] for r in map(json.loads, metrics.read_text().splitlines()) if "eval" in r]
        if metrics.exists()
        else []
    )
    assert evals == ([] if scenario == "sigterm-eval" else [2])  # an interrupted evaluation writes no record


def test_sigterm_while_a_worker_stalls_ends_the_run(tmp_path):
    proc = _start("sigterm-wait", tmp_path)
    deadline = time.monotonic() + LIMIT_S
    while not (tmp_path / "stalled").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    code, out = _finish(proc, tmp_path)
    assert code == 1 and "while waiting for loader worker 0" in out, out[-3000:]


def test_sigkill_of_the_main_process_takes_the_workers_with_it(tmp_path):
    code, _ = _finish(_start("sigkill-main", tmp_path), tmp_path)
    assert code == -signal.SIGKILL


def test_train_on_a_manifest_without_sources_is_a_clear_error(tmp_path):
    from tests.train.shutdown_child import write_shards

    write_shards(tmp_path)
    manifest = json.loads((tmp_path / "job" / "manifest.json").read_text())
    del manifest["sources"]
    for entry in manifest["shards"]:
        del entry["sources"]
    (tmp_path / "job" / "manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "job.toml").write_text(f"""
[train]
shards = "{tmp_path / "job"}"
output = "{tmp_path / "run"}"
steps = 4
[train.model]
dim = 32
n_layers = 2
n_heads = 2
ffn_hidden = 32
n_experts = 4
top_k = 2
max_seq_len = 64
[train.data]
batch_size = 2
seq_len = 32
num_workers = 1
""")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "winnow.pipelines.cli", "train", str(tmp_path / "job.toml")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "winnow train: error:" in proc.stderr and "lists no sources" in proc.stderr
    assert "Traceback" not in proc.stderr
