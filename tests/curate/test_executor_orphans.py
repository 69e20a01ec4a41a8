"""A killed job takes its pool workers with it: none keeps running its task for nobody. Ctrl-C stops the
job's process and its workers at once, with one line and no worker tracebacks."""

from __future__ import annotations

import contextlib
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

def hello(folder):
    Path(folder, f"{os.getpid()}.pid").write_text("")
    while len(list(Path(folder).glob("*.pid"))) < 2:  # each worker takes one: both have started
        time.sleep(0.05)

def task(folder):
    Path(folder, f"started-{time.monotonic_ns()}").write_text("")
    time.sleep(300)

if __name__ == "__main__":
    folder, interrupt = sys.argv[1], sys.argv[2]
    tasks = 1 if interrupt == "terminate" else 6  # forward: two run, the rest wait in the pool's queue
    try:
        with Executor(workers=2, interrupt=interrupt) as executor:
            list(executor.run(hello, [folder] * 2))
            list(executor.run(task, [folder] * tasks))  # terminate: one worker busy, the other idle
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
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
    driver = subprocess.Popen([sys.executable, str(script), str(tmp_path), "terminate"], env=env)
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


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads process states from /proc")
@pytest.mark.parametrize(("interrupt", "to"), [("terminate", "group"), ("forward", "group"), ("forward", "workers")])
def test_ctrl_c_stops_the_job_and_its_workers_without_tracebacks(tmp_path, interrupt, to):
    """Ctrl-C reaches the terminal's whole process group: the workers must not raise, busy (a KeyboardInterrupt
    inside a compiled kernel comes back as a SystemError traceback) or idle (multiprocessing prints its traceback);
    the job's process stops them and exits with its own message. ``forward`` (tasks that stop themselves, as
    a trainer does): the workers receive it, and the tasks already queued in the pool never start, even where
    the job's process hears of it only through their results (``workers``: the signal reaches them alone)."""
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    driver = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path), interrupt],
        env=env,
        start_new_session=True,  # its own process group, as a terminal's foreground job has
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # even where this test's runner ignores it
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        running = 1 if interrupt == "terminate" else 2
        assert _wait(lambda: len(list(tmp_path.glob("started-*"))) == running, 120), "the workers did not start"
        workers = [int(p.stem) for p in tmp_path.glob("*.pid")]
        if to == "group":
            os.killpg(driver.pid, signal.SIGINT)
        else:
            for pid in workers:
                os.kill(pid, signal.SIGINT)
        _, err = driver.communicate(timeout=60)  # the tasks sleep 300 s: nobody waits for them
        assert driver.returncode == 130, err
        if interrupt == "terminate":
            assert err.strip() == "interrupted", err
        assert len(list(tmp_path.glob("started-*"))) == running  # no queued task started
        assert _wait(lambda: not any(_alive(pid) for pid in workers), 20), [p for p in workers if _alive(p)]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
        for p in tmp_path.glob("*.pid"):
            if _alive(int(p.stem)):
                os.kill(int(p.stem), signal.SIGKILL)
