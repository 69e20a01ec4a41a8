"""A killed job takes its pool workers with it: none keeps running its task for nobody."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

DRIVER = """
import os, sys, time
from pathlib import Path
from winnow.curate.executors import Executor

def task(folder):
    Path(folder, f"{os.getpid()}.pid").write_text("")
    time.sleep(300)

if __name__ == "__main__":
    with Executor(workers=2) as executor:
        list(executor.run(task, [sys.argv[1]] * 2))
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in state  # a zombie has exited, and waits only to be reaped


def _wait(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads process states from /proc")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_workers_exit_when_the_job_process_is_killed(tmp_path, sig):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    driver = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=env)
    try:
        assert _wait(lambda: len(list(tmp_path.glob("*.pid"))) == 2, 120), "the workers did not start"
        workers = [int(p.stem) for p in tmp_path.glob("*.pid")]
        driver.send_signal(sig)
        driver.wait(30)
        assert _wait(lambda: not any(_alive(pid) for pid in workers), 20), [p for p in workers if _alive(p)]
    finally:
        driver.kill()
        for p in tmp_path.glob("*.pid"):
            if _alive(int(p.stem)):
                os.kill(int(p.stem), signal.SIGKILL)
