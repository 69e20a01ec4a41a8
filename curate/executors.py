"""Executors: run the same task functions in this process, on a local process pool, or on Ray."""

from __future__ import annotations

import logging
import multiprocessing as mp
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from typing import Any, TypeVar

from curate.errors import require

log = logging.getLogger(__name__)
T = TypeVar("T")


def run_all(fn: Callable[[T], Any], specs: Iterable[T], *, workers: int, executor: str) -> Iterator[Any]:
    """Run ``fn`` over ``specs`` and yield results as tasks finish (order not guaranteed)."""
    specs = list(specs)
    if executor == "ray":
        yield from _run_ray(fn, specs)
    elif workers <= 1 or len(specs) <= 1:
        for spec in specs:
            yield fn(spec)
    else:
        yield from _run_pool(fn, specs, workers)


def _run_pool(fn: Callable[[T], Any], specs: list[T], workers: int) -> Iterator[Any]:
    # spawn, not fork: polars and pyarrow keep thread pools that a fork would copy in a bad state.
    with ProcessPoolExecutor(max_workers=min(workers, len(specs)), mp_context=mp.get_context("spawn")) as pool:
        pending = {pool.submit(fn, s) for s in specs}
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_EXCEPTION)
                for fut in done:
                    yield fut.result()  # re-raises a task's exception here
        except BaseException:
            for fut in pending:
                fut.cancel()
            raise


def _run_ray(fn: Callable[[T], Any], specs: list[T]) -> Iterator[Any]:
    ray = require("ray", package="ray", feature="executor = 'ray'")
    if not ray.is_initialized():
        ray.init(address="auto" if _has_cluster(ray) else None, log_to_driver=False)
    remote = ray.remote(fn)
    pending = [remote.remote(s) for s in specs]
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        yield ray.get(done[0])


def _has_cluster(ray: Any) -> bool:
    import os

    return bool(os.environ.get("RAY_ADDRESS"))
