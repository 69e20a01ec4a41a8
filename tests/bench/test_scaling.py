"""bench/scaling.py on 2 gloo processes: a row per layout with the trainer's own comm_pct; refused layouts say why."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_scaling_prints_efficiency_and_the_trainers_comm_share_for_a_data_parallel_layout():
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "scaling.py"),
            "--layouts",
            "ddp",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--repeat",
            "1",
            "--dim",
            "32",
            "--seq",
            "32",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout
    row = re.search(r"^\s+ddp\s+2\s+(\d+)\s+([\d.]+)x\s+(\d+)%\s+([\d.]+)%$", out, re.M)
    assert row, out
    tokens_per_s, comm_pct = float(row.group(1)), float(row.group(4))
    assert tokens_per_s > 0 and 0 < comm_pct < 100  # gloo all-reduces take some of the step, not all of it
