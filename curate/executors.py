"""Executors: run the same task functions in this process, on a local process pool, or on Ray.

One executor lives for a whole job, so worker processes (and their imported modules and
compiled kernels) are reused across phases instead of being started once per phase.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Executor as _PoolExecutor, ProcessPoolExecutor, wait
from typing import Any, TypeVar

from curate.errors import require

log = logging.getLogger(__name__)
T = TypeVar("T")


class Executor:
    """Runs task functions with ``workers`` local processes (``kind="local"``) or on Ray."""

    def __init__(self, *, workers: int, kind: str = "local", initializer: Callable[..., None] | None = None,
                 initargs: tuple = (), gpus_per_task: float = 0.0) -> None:
        self.workers = workers
        self.kind = kind
        # local pool: run once in each worker process before its first task (e.g. to claim a GPU)
        self.initializer, self.initargs = initializer, initargs
        self.gpus_per_task = gpus_per_task  # Ray: GPUs each task reserves, where the cluster has any
        self._pool: _PoolExecutor | None = None
        self._ray: Any = None

    def run(self, fn: Callable[[T], Any], specs: Iterable[T]) -> Iterator[Any]:
        """Run ``fn`` over ``specs``, yielding results as tasks finish (order not guaranteed)."""
        specs = list(specs)
        if self.kind == "ray":
            yield from self._run_ray(fn, specs)
        elif self.workers <= 1 or len(specs) <= 1:
            for spec in specs:
                yield fn(spec)
        else:
            yield from self._run_pool(fn, specs)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run_pool(self, fn: Callable[[T], Any], specs: list[T]) -> Iterator[Any]:
        if self._pool is None:
            # spawn, not fork: polars and pyarrow keep thread pools that a fork copies in a bad state.
            self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=mp.get_context("spawn"),
                                             initializer=self.initializer, initargs=self.initargs)
        pending = {self._pool.submit(fn, s) for s in specs}
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    yield fut.result()  # re-raises a task's exception here
        except BaseException:
            for fut in pending:
                fut.cancel()
            raise

    def _run_ray(self, fn: Callable[[T], Any], specs: list[T]) -> Iterator[Any]:
        if self._ray is None:
            self._ray = require("ray", extra="ray", feature="executor = 'ray'")
            if not self._ray.is_initialized():
                self._ray.init(address=os.environ.get("RAY_ADDRESS"), log_to_driver=False)
        ray = self._ray
        gpus = self.gpus_per_task if ray.cluster_resources().get("GPU", 0) > 0 else 0
        remote = ray.remote(num_gpus=gpus)(fn) if gpus else ray.remote(fn)  # Ray sets CUDA_VISIBLE_DEVICES
        pending = [remote.remote(s) for s in specs]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            yield ray.get(done[0])
