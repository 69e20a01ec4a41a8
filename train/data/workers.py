"""Reading and tokenizing in worker processes, delivered in the global shard order.

Shard visits are numbered ``p = epoch * n_shards + shard`` from the resume point ``p0``;
worker ``w`` of ``n`` handles the visits with ``(p - p0) % n == w`` and puts its pieces on
its *own* bounded queue. The consumer reads the queue of the worker that owns the next visit,
so pieces arrive in the global order without a reorder buffer, each worker runs at most
``prefetch`` pieces ahead, and a slow shard only stalls its own worker's queue.
With ``num_workers = 0`` the same generator runs inline.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
import os
import pickle
import queue
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass

from winnow.train.data.pieces import Piece, ShardDone, shard_pieces
from winnow.train.data.shards import ShardSet
from winnow.train.errors import Interrupted, TrainError
from winnow.train.shutdown import WORKER_PREFIX, parent_alive, stop_processes, stop_requested, worker_init

# After a stop signal, how long to keep waiting for a worker's next piece before giving up
# (the step cannot finish, so there is nothing consistent to checkpoint; the last checkpoint stands).
STOP_WAIT_S = 5.0

log = logging.getLogger(__name__)


@dataclass(slots=True)
class EpochEnd:
    """Every shard of ``epoch`` has been delivered."""

    epoch: int


@dataclass(slots=True)
class _Failed:
    """A worker's exception, with its traceback as text (tracebacks do not pickle)."""

    error: BaseException | None  # None when the exception itself cannot be pickled
    message: str
    trace: str


def _failure(err: BaseException) -> _Failed:
    trace = "".join(traceback.format_exception(err))
    try:
        pickle.dumps(err)  # Queue pickles in a feeder thread, where a failure would just drop the message
    except Exception:  # noqa: BLE001 - any pickling failure: send the text only
        return _Failed(None, f"{type(err).__name__}: {err}", trace)
    return _Failed(err, f"{type(err).__name__}: {err}", trace)


def _visits(p0: int, stop: int | None, worker: int, n_workers: int) -> Iterator[int]:
    return iter(range(p0 + worker, stop, n_workers)) if stop is not None else itertools.count(p0 + worker, n_workers)


def _send(out, msg, halt, parent: int) -> bool:
    """Put ``msg`` on the bounded queue; False once the consumer is gone (halted, or the parent died)."""
    while not halt.is_set() and parent_alive(parent):
        try:
            out.put(msg, timeout=0.2)
            return True
        except queue.Full:
            continue
    out.cancel_join_thread()  # no one will read: don't block exit on a full pipe
    return False


def _worker_main(worker, n_workers, p0, stop, shards, kwargs, out, halt, expected_parent, kernel_watch) -> None:
    parent = worker_init(expected_parent, kernel_watch=kernel_watch)
    n_shards = len(shards.shards)
    try:
        shards.reopen()
        for p in _visits(p0, stop, worker, n_workers):
            epoch, index = divmod(p, n_shards)
            for msg in shard_pieces(shards, index, epoch, **kwargs):
                if not _send(out, msg, halt, parent):
                    return
    except BaseException as err:  # noqa: BLE001 - forwarded to the consumer, which re-raises it
        _send(out, _failure(err), halt, parent)


class PieceStream:
    """Pieces of every shard visit from ``(epoch, shard)`` on, in order; ``epochs`` bounds the pass."""

    def __init__(
        self,
        shards: ShardSet,
        *,
        start_epoch: int,
        start_shard: int,
        epochs: int | None,
        num_workers: int,
        prefetch: int,
        start_method: str,
        **kwargs,
    ) -> None:
        self.shards, self.kwargs = shards, kwargs
        n = len(shards.shards)
        self.p0 = start_epoch * n + start_shard
        self.stop = (start_epoch + epochs) * n if epochs is not None else None
        self.num_workers = num_workers
        self._procs: list = []
        self._queues: list = []
        if num_workers:
            ctx = mp.get_context(start_method)
            self._halt = ctx.Event()
            for w in range(num_workers):
                q = ctx.Queue(maxsize=prefetch)
                proc = ctx.Process(
                    target=_worker_main,
                    name=f"{WORKER_PREFIX}-{w}",
                    daemon=True,
                    args=(
                        w,
                        num_workers,
                        self.p0,
                        self.stop,
                        shards,
                        kwargs,
                        q,
                        self._halt,
                        None if start_method == "forkserver" else os.getpid(),
                        threading.current_thread() is threading.main_thread(),
                    ),
                )
                proc.start()
                self._procs.append(proc)
                self._queues.append(q)

    def _get(self, worker: int):
        q, proc = self._queues[worker], self._procs[worker]
        stop_seen = None
        while True:
            try:
                msg = q.get(timeout=1.0)
            except queue.Empty:
                if not proc.is_alive():
                    raise TrainError(
                        f"loader worker {worker} died (exit code {proc.exitcode}); see its log above"
                    ) from None
                if stop_requested() is not None:
                    stop_seen = stop_seen or time.monotonic()
                    if time.monotonic() - stop_seen > STOP_WAIT_S:
                        raise Interrupted(
                            f"stopped by signal {stop_requested()} while waiting for loader worker {worker}; "
                            "the step could not finish, so the last checkpoint stands"
                        ) from None
                continue
            if isinstance(msg, _Failed):
                if msg.error is None:
                    raise TrainError(f"loader worker {worker} failed: {msg.message}\n{msg.trace}")
                msg.error.add_note(f"raised in loader worker {worker}:\n{msg.trace}")
                raise msg.error
            return msg

    def _visit(self, p: int) -> Iterator[Piece | ShardDone]:
        epoch, index = divmod(p, len(self.shards.shards))
        if not self.num_workers:
            yield from shard_pieces(self.shards, index, epoch, **self.kwargs)
            return
        w = (p - self.p0) % self.num_workers
        while True:
            msg = self._get(w)
            yield msg
            if isinstance(msg, ShardDone):
                return

    def __iter__(self) -> Iterator[Piece | ShardDone | EpochEnd]:
        n = len(self.shards.shards)
        for p in range(self.p0, self.stop) if self.stop is not None else itertools.count(self.p0):
            yield from self._visit(p)
            if p % n == n - 1:
                yield EpochEnd(p // n)

    def close(self) -> None:
        """Stop the workers; safe to call twice."""
        if not self._procs:
            return
        # Workers see the halt at their next put and exit without flushing (cancel_join_thread).
        # Nothing is read here: a message cut short by a worker's exit would block a reader forever.
        self._halt.set()
        stop_processes(self._procs, grace=2.0)
        for q in self._queues:
            q.close()
            q.cancel_join_thread()
        self._procs, self._queues = [], []
