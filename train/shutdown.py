"""Ending a training process promptly: stop requests from signals, and loader workers that never outlive it.

A run stops in three ways, and each must end every process it started within seconds:

* SIGTERM/SIGINT (preemption, Ctrl-C, ``timeout``): the first one asks the trainer to
  checkpoint after the current step and exit (``stop_requested``); evaluation and waits
  for data give up early once it is set. A second signal stops at once (``KeyboardInterrupt``;
  checkpoints are atomic, so this never leaves a half-written one).
* An exception in the trainer or a loader worker: it propagates out of the main process,
  and ``reap_workers`` (at exit) ends any worker still running, SIGKILL after a grace period.
* The main process dies outright (SIGKILL, OOM killer): each worker asked the kernel to
  SIGKILL it when its parent goes (``PR_SET_PDEATHSIG``) and also checks its parent id.

Workers are forked from the main process, so without ``worker_init`` they would inherit the
trainer's handler and answer SIGTERM by setting a flag no one reads, and a crashed run would
hang until ``kill -9``.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from multiprocessing import util as _mp_util  # registers its exit handler now, so ours (below) runs before it

log = logging.getLogger(__name__)

WORKER_PREFIX = "winnow-loader"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_PR_SET_PDEATHSIG = 1
_stop: dict[str, int | None] = {"signum": None}


def stop_requested() -> int | None:
    """The signal that asked this process to stop, if one has (while ``on_stop_signals`` is active)."""
    return _stop["signum"]


@contextlib.contextmanager
def on_stop_signals(callback: Callable[[int], None]) -> Iterator[None]:
    """Within the block, the first SIGTERM/SIGINT calls ``callback(signum)``; a second one raises KeyboardInterrupt.

    Outside the main thread (where handlers cannot be installed) the block runs unchanged.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame) -> None:
        del frame
        if _stop["signum"] is not None:
            log.warning("received signal %d again: stopping now", signum)
            raise KeyboardInterrupt
        _stop["signum"] = signum
        callback(signum)

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        _stop["signum"] = None


def worker_init(expected_parent: int | None, *, kernel_watch: bool = True) -> int:
    """First thing in a loader worker: default SIGTERM, ignore SIGINT (the parent stops us), die with the parent.

    Returns the parent's pid for ``parent_alive``; ``expected_parent`` (the main process, for fork
    and spawn; None under forkserver, whose server is the parent) catches a parent that died first.
    ``kernel_watch``: ask for SIGKILL when the parent goes; the kernel sends it when the *thread*
    that started the worker ends, so only workers started from the main thread ask.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group; the trainer handles it
    _stop["signum"] = None
    if kernel_watch and sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # no prctl: parent_alive() still ends the worker at its next put
            pass
    parent = os.getppid()
    if expected_parent is not None and parent != expected_parent:  # it died before the request above took effect
        os._exit(1)
    return parent


def parent_alive(parent_pid: int) -> bool:
    return os.getppid() == parent_pid


def stop_processes(procs: Sequence, *, grace: float = 2.0) -> None:
    """Join ``procs``; whoever is still alive after ``grace`` seconds gets SIGTERM, then SIGKILL."""
    for proc in procs:
        proc.join(timeout=grace)
    for escalate in ("terminate", "kill"):
        alive = [p for p in procs if p.is_alive()]
        if not alive:
            return
        for proc in alive:
            getattr(proc, escalate)()
        for proc in alive:
            proc.join(timeout=1.0)
    for proc in procs:
        if proc.is_alive():
            log.error("loader worker %s (pid %s) did not exit even after SIGKILL", proc.name, proc.pid)


def reap_workers() -> None:
    """At interpreter exit: end loader workers still running (an exception left them), before multiprocessing joins them."""
    workers = [p for p in mp.active_children() if p.name.startswith(WORKER_PREFIX)]
    if workers:
        log.debug("stopping %d loader worker(s) at exit", len(workers))
        stop_processes(workers, grace=0.0)


# Registered after multiprocessing's own exit handler (imported above), so it runs first (atexit is
# LIFO): that handler joins every child without a timeout.
del _mp_util
atexit.register(reap_workers)
