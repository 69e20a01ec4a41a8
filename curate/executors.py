"""Executors: run the same task functions in this process, on a local process pool, or on Ray.

One executor lives for a whole job, so worker processes (and their imported modules and
compiled kernels) are reused across phases instead of being started once per phase.

Ctrl-C reaches every process of the terminal's process group. By default local pool workers
never see it: they start with SIGINT blocked, the job's process alone is interrupted, and it
terminates the workers, whose outputs are abandoned as after a crash (every output is published
by rename or marker: ``curate.atomic``), so a rerun resumes. ``interrupt="forward"`` lets the
workers receive it instead, for tasks that stop themselves gracefully (a trainer saves a checkpoint).

A local run may also take ``threads=True`` for a phase whose work runs outside the GIL
(compiled kernels, polars, Arrow: ``curate.pipeline`` decides). Its tasks then run as
``workers`` threads of this process: no worker process is started, so the job pays for one
interpreter, one set of imports and one load of the compiled kernels (about 1.5 s of CPU and
150 MB each), where a process pool pays for ``workers + 1``.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, ThreadPoolExecutor, wait
from concurrent.futures import Executor as _PoolExecutor
from typing import Any, Literal, TypeVar

from winnow.curate.crashpoints import CRASH_ENV, ONCE_ENV
from winnow.curate.errors import ConfigError, require

log = logging.getLogger(__name__)
T = TypeVar("T")


class Executor:
    """Runs task functions with ``workers`` local processes (``kind="local"``) or on Ray."""

    def __init__(
        self,
        *,
        workers: int,
        kind: str = "local",
        initializer: Callable[..., None] | None = None,
        initargs: tuple = (),
        gpus_per_task: float = 0.0,
        address: str = "",
        max_retries: int = 3,
        interrupt: Literal["terminate", "forward"] = "terminate",
    ) -> None:
        self.workers = workers
        self.kind = kind
        self.address = address  # Ray: the cluster to join ([job] ray_address); "" = RAY_ADDRESS, else a local Ray
        self.max_retries = max_retries  # Ray: re-runs of a task whose worker died ([job] ray_max_retries)
        # local pool: run once in each worker process before its first task (e.g. to claim a GPU)
        self.initializer, self.initargs = initializer, initargs
        self.gpus_per_task = gpus_per_task  # Ray: GPUs each task reserves, where the cluster has any
        self.interrupt = interrupt  # local pool, on Ctrl-C: "terminate" the workers, or "forward" it to them
        self._pool: _PoolExecutor | None = None
        self._stopped: Any = None  # the pool's Event: set, its workers start no further task
        self._threads: ThreadPoolExecutor | None = None
        self._ray: Any = None

    def run(
        self,
        fn: Callable[[T], Any],
        specs: Iterable[T],
        *,
        threads: bool = False,
        meanwhile: Callable[[], None] | None = None,
    ) -> Iterator[Any]:
        """Run ``fn`` over ``specs``, yielding results as tasks finish (order not guaranteed).

        ``threads``: a local run uses ``workers`` threads of this process instead of worker
        processes (for tasks that release the GIL; ignored on Ray and with an initializer).
        ``meanwhile``: work of this process that the tasks will need, done by this thread once
        the task threads have started (it would only wait for them); not called otherwise.
        """
        specs = list(specs)
        if self.kind == "ray":
            yield from self._run_ray(fn, specs)
        elif self.workers <= 1 or len(specs) <= 1:
            for spec in specs:
                yield fn(spec)
        elif threads and self.initializer is None:
            if self._threads is None:
                self._threads = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="winnow-task")
            futures = {self._threads.submit(fn, s) for s in specs}
            yield from _wait_all(self._threads, futures, meanwhile)
        else:
            yield from self._run_pool(fn, specs)

    def close(self, *, interrupted: bool = False) -> None:
        """Shut the pools down once their running tasks end; ``interrupted`` (Ctrl-C): the worker processes are
        terminated first, unless they were left to stop themselves (``interrupt="forward"``)."""
        if interrupted and self._pool is not None:
            # Tasks already handed to the pool's queue cannot be cancelled: the workers see this and skip them.
            self._stopped.set()
            if self.interrupt == "terminate":
                _terminate_workers(self._pool)
        for pool in (self._pool, self._threads):
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        self._pool = self._threads = None

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.close(interrupted=exc_type is not None and issubclass(exc_type, KeyboardInterrupt))

    def _run_pool(self, fn: Callable[[T], Any], specs: list[T]) -> Iterator[Any]:
        if self._pool is None:
            # spawn, not fork: polars and pyarrow keep thread pools that a fork copies in a bad state.
            context = mp.get_context("spawn")
            self._stopped = context.Event()
            self._pool = ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=context,
                initializer=_worker_start,
                initargs=(os.getpid(), self._stopped, self.initializer, self.initargs),
            )
        # Workers start on the first submits; with SIGINT blocked there they keep it blocked for good.
        with _sigint_blocked() if self.interrupt == "terminate" else contextlib.nullcontext():
            pending = {self._pool.submit(_unless_stopped, fn, s) for s in specs}
        yield from _wait_all(self._pool, pending)

    def _run_ray(self, fn: Callable[[T], Any], specs: list[T]) -> Iterator[Any]:
        if self._ray is None:
            self._ray = _connect(self.address)
        ray = self._ray
        gpus = self.gpus_per_task if ray.cluster_resources().get("GPU", 0) > 0 else 0
        options: dict[str, Any] = {"max_retries": self.max_retries}
        if gpus:
            options["num_gpus"] = gpus  # Ray sets CUDA_VISIBLE_DEVICES
        crash = {k: os.environ[k] for k in (CRASH_ENV, ONCE_ENV) if os.environ.get(k)}
        if crash:  # the crash harness reaches the workers too (curate.crashpoints)
            options["runtime_env"] = {"env_vars": crash}
        remote = ray.remote(fn).options(**options)
        pending = [remote.remote(s) for s in specs]
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                yield ray.get(done[0])  # re-raises a task's exception (or its worker's death) here
        except BaseException:
            # Stop the job's other tasks too, so none is still writing when this run returns or is re-run.
            for ref in pending:
                ray.cancel(ref, force=True)
            ray.wait(pending, num_returns=len(pending), timeout=60)
            raise

    def start(self) -> None:
        """Connect now (Ray), so a cluster that cannot be joined is reported before any output is written."""
        if self.kind == "ray" and self._ray is None:
            self._ray = _connect(self.address)


_STOPPED: Any = None  # in a pool worker: its Executor's Event, set once the job is interrupted


def _worker_start(parent: int, stopped: Any, initializer: Callable[..., None] | None, initargs: tuple) -> None:
    """A pool worker's first step: exit when the job's process is gone, then the caller's initializer.

    A driver killed outright (SIGKILL, or SIGTERM, whose default action skips the pool's shutdown)
    would otherwise leave its workers running their tasks for nobody, holding CPU and memory. What a
    worker wrote is safe to abandon: every output is published by rename or marker (``curate.atomic``).
    """
    global _STOPPED
    _STOPPED = stopped
    threading.Thread(target=_exit_with, args=(parent,), name="winnow-parent-watch", daemon=True).start()
    if initializer is not None:
        initializer(*initargs)


def _unless_stopped(fn: Callable[[T], Any], spec: T) -> Any:
    """``fn(spec)`` in a pool worker, unless the job was interrupted since the task was queued.

    A task that stops on Ctrl-C sets the stop itself: the job's process may learn of the interrupt only
    when this task's result reaches it, after this worker has taken its next task from the queue.
    """
    if _STOPPED is not None and _STOPPED.is_set():
        raise KeyboardInterrupt("the job was interrupted before this task started")
    try:
        return fn(spec)
    except KeyboardInterrupt:
        if _STOPPED is not None:
            _STOPPED.set()
        raise


def _exit_with(parent: int, every: float = 1.0) -> None:
    while os.getppid() == parent:
        time.sleep(every)
    log.warning("worker %d: the job's process %d is gone; exiting", os.getpid(), parent)
    os._exit(1)


@contextlib.contextmanager
def _sigint_blocked() -> Iterator[None]:
    """SIGINT blocked in this thread within the block: a process started here inherits the mask across exec, so
    Ctrl-C never interrupts it; one that arrives here meanwhile is delivered when the block ends."""
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no signal masks
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _terminate_workers(pool: ProcessPoolExecutor) -> None:
    """SIGTERM to every worker process of ``pool``: its running tasks are abandoned.

    ``ProcessPoolExecutor.terminate_workers`` does this from Python 3.14; before it, the pool's own
    table of processes is the only handle on them.
    """
    terminate = getattr(pool, "terminate_workers", None)
    if terminate is not None:
        terminate()
        return
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        with contextlib.suppress(OSError, ValueError):  # already gone, or closed
            process.terminate()


def _wait_all(pool: _PoolExecutor, pending: set, meanwhile: Callable[[], None] | None = None) -> Iterator[Any]:
    """Yield the results of the ``pending`` futures of ``pool`` as they finish, after calling ``meanwhile``; a
    failure (or Ctrl-C) cancels what has not started."""
    try:
        if meanwhile is not None:
            meanwhile()
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                yield fut.result()  # re-raises a task's exception here
    except BaseException:
        for fut in pending:
            fut.cancel()
        if isinstance(pool, ThreadPoolExecutor):  # threads cannot be killed: let the running tasks end first
            wait(pending)
        raise


def _connect(address: str) -> Any:
    """Import Ray and join the cluster at ``address`` (or RAY_ADDRESS, or start a local one); errors name the key."""
    ray = require("ray", extra="ray", feature="executor = 'ray'")
    key, address = ("job.ray_address", address) if address else ("RAY_ADDRESS", os.environ.get("RAY_ADDRESS", ""))
    if address and address != "auto":
        _check_reachable(key, address)
    if ray.is_initialized():
        return ray
    try:
        ray.init(address=address or None, log_to_driver=False)
    except (ConnectionError, TimeoutError) as err:
        raise ConfigError(
            f"{key} = {address!r}: no Ray cluster could be joined ({err}); start one (`ray start "
            f"--head`) and give its address, or leave {key} unset to start a local Ray"
        ) from err
    return ray


def _check_reachable(key: str, address: str, timeout: float = 5.0) -> None:
    """A Ray address (``host:port`` or ``ray://host:port``) must accept a connection; fail fast instead of Ray's retries."""
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"{key} = {address!r} is invalid; allowed: host:port, ray://host:port or auto")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as err:
        raise ConfigError(
            f"{key} = {address!r} cannot be reached ({err.strerror or err}); start the cluster "
            f"(`ray start --head --port {port}`), fix the address, or leave {key} unset to start a "
            f"local Ray (pip install 'winnow[ray]')"
        ) from err


_LIBC: Any = None


def release_memory() -> None:
    """Give freed memory back to the OS after a task (glibc's and Arrow's allocators keep it otherwise).

    glibc keeps freed blocks in per-thread arenas, so a worker that ran a few tasks holds its
    high-water mark; trimming makes its RSS what the next task needs. Costs a few milliseconds.
    """
    global _LIBC
    if _LIBC is None:
        import ctypes

        try:  # the C library already loaded (ctypes.util.find_library would fork a subprocess)
            _LIBC = ctypes.CDLL(None)
            _LIBC.malloc_trim  # noqa: B018 - glibc only
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC:
        _LIBC.malloc_trim(0)
    pa = sys.modules.get("pyarrow")
    if pa is not None:
        pa.default_memory_pool().release_unused()


def worker_info() -> dict[str, Any]:
    """Where the calling task runs: host and pid, and under Ray its task, worker and node ids (for its marker)."""
    info: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid()}
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ctx = ray.get_runtime_context()
        task_id = ctx.get_task_id()
        if task_id is not None:  # None in the driver: the task runs in this process, not in a Ray worker
            info["ray"] = {
                "task_id": task_id,
                "worker_id": ctx.get_worker_id(),
                "node_id": ctx.get_node_id(),
                "job_id": ctx.get_job_id(),
            }
    return info
