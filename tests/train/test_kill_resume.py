"""Training SIGKILLed at random steps and halfway through a checkpoint write resumes on the exact loss trajectory.

A reference run trains ``HARNESS`` steps in this process; the same run in a child process is
killed at points drawn (with a fixed seed) from its own progress, each time re-run in the same
folder until it finishes. Its ``metrics.jsonl`` must then hold every step exactly once, with
exactly the reference's losses, and every checkpoint left must verify.
"""

from __future__ import annotations

import json
import random

import pytest

from tests.train.shutdown_child import HARNESS, harness_config, write_shards
from tests.train.test_shutdown import _finish, _start
from winnow.pipelines.train import build_trainer
from winnow.train.checkpoint import CheckpointManager

pytestmark = pytest.mark.slow


def _losses(run_dir) -> tuple[dict[int, float], list[int], list[int]]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    logs = [r for r in records if "step_loss" in r]
    return (
        {r["step"]: r["step_loss"] for r in logs},
        [r["step"] for r in logs],
        [r["step"] for r in records if "eval" in r],
    )


def test_sigkill_anywhere_resumes_the_same_trajectory_with_each_step_logged_once(tmp_path):
    reference = tmp_path / "reference"
    write_shards(reference)
    build_trainer(harness_config(reference)).fit()
    expected, _, expected_evals = _losses(reference / "run")

    every, steps = HARNESS["checkpoint"]["every"], HARNESS["steps"]
    rng = random.Random(14)
    first, last = rng.randint(2, 2 * every - 1), rng.randint(2 * every + 2, steps)
    plan = [f"kill-at:{first}", f"kill-in-save:{2 * every}", f"kill-at:{last}", "clean"]
    folder = tmp_path / "killed"
    for scenario in plan:
        code, out = _finish(_start(scenario, folder), folder)
        assert code == (0 if scenario == "clean" else -9), f"{scenario}: {out[-3000:]}"

    losses, logged, evals = _losses(folder / "run")
    assert logged == list(range(1, steps + 1)), f"plan {plan}: steps logged {logged}"
    assert evals == expected_evals
    assert losses == expected, f"plan {plan}"  # exact: fp32 on CPU, model, optimizer, RNG and data position restored
    manager = CheckpointManager(folder / "run" / "checkpoints")
    assert all(manager.load(p) for p in manager.checkpoints())
    assert not list((folder / "run" / "checkpoints").glob(".tmp-*"))
