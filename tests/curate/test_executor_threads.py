"""Tasks as threads: the submitting thread does the work the tasks will need (numba's one-time setup) while
they run, and only there; results and errors come back as from any executor."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from winnow.curate.executors import Executor


def _task(spec: tuple[threading.Event, int]) -> tuple[str, int]:
    started, value = spec
    started.set()
    return threading.current_thread().name, value * 2


@pytest.mark.parametrize("threads", [True, False])
def test_meanwhile_runs_once_on_the_submitting_thread_while_task_threads_run(threads):
    calls: list[tuple[str, bool]] = []
    started = [threading.Event() for _ in range(4)]

    def meanwhile() -> None:
        # the tasks were handed to the threads before: at least one of them starts while this thread waits
        calls.append((threading.current_thread().name, any(e.wait(10) for e in started[:1])))

    with Executor(workers=2) as ex:
        if threads:
            results = list(ex.run(_task, [(e, i) for i, e in enumerate(started)], threads=True, meanwhile=meanwhile))
        else:  # a single worker runs the tasks in this thread: nothing to do meanwhile, and it is not called
            ex.workers = 1
            results = list(ex.run(_task, [(e, i) for i, e in enumerate(started)], meanwhile=meanwhile))
    assert sorted(v for _, v in results) == [0, 2, 4, 6]
    if threads:
        assert calls == [(threading.current_thread().name, True)]
        assert all(name.startswith("winnow-task") for name, _ in results)
    else:
        assert calls == []


def test_numba_set_up_then_a_cached_kernel_call():
    """``set_up`` may run beside, before or after any kernel call; a process without numba loaded skips it."""
    code = (
        "import sys, threading, numpy as np\n"
        "from winnow.curate import pipeline\n"
        "pipeline._set_up_kernels()\n"
        "print('numba' in sys.modules)\n"  # nothing loaded numba: nothing done, nothing imported
        "from winnow.curate.dedup.kernels import PLAIN_SEP, count_shingles\n"
        "data = np.frombuffer(b'a b c d e f', dtype=np.uint8)\n"
        "t = threading.Thread(target=pipeline._set_up_kernels)\n"
        "t.start()\n"
        "print(count_shingles(np.array([0, 11]), data, 5, False, PLAIN_SEP).tolist())\n"
        "t.join()\n"
        "pipeline._set_up_kernels()\n"
        "print(count_shingles(np.array([0, 11]), data, 2, False, PLAIN_SEP).tolist())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[:3] == ["False", "[2]", "[5]"]


def test_a_failure_meanwhile_cancels_the_tasks_not_started():
    started = threading.Event()
    release = threading.Event()

    def task(i: int) -> int:
        started.set()
        release.wait(10)
        return i

    def meanwhile() -> None:
        started.wait(10)
        raise KeyboardInterrupt  # Ctrl-C while the driver sets up

    ran = []
    with Executor(workers=2) as ex:
        results = ex.run(lambda i: ran.append(i) or task(i), range(20), threads=True, meanwhile=meanwhile)
        threading.Timer(0.2, release.set).start()
        with pytest.raises(KeyboardInterrupt):
            list(results)
        time.sleep(0.5)  # the pool is still open: nothing queued may start now
        assert 1 <= len(ran) <= 2  # the two that had started ran to their end; the other 18 never started


def test_a_failed_numba_setup_costs_only_its_head_start(monkeypatch, caplog):
    from winnow.curate import pipeline
    from winnow.curate.dedup import jit

    monkeypatch.setattr(jit, "set_up", lambda: (_ for _ in ()).throw(AttributeError("numba moved a module")))
    with caplog.at_level("DEBUG", logger="winnow.curate.pipeline"):
        pipeline._set_up_kernels()
    assert "numba moved a module" in caplog.text
