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
import queue
from collections.abc import Iterator
from dataclasses import dataclass

from train.data.pieces import Piece, ShardDone, shard_pieces
from train.data.shards import ShardSet
from train.errors import TrainError

log = logging.getLogger(__name__)


@dataclass(slots=True)
class EpochEnd:
    """Every shard of ``epoch`` has been delivered."""

    epoch: int


@dataclass(slots=True)
class _Failed:
    error: BaseException


def _visits(p0: int, stop: int | None, worker: int, n_workers: int) -> Iterator[int]:
    return iter(range(p0 + worker, stop, n_workers)) if stop is not None else itertools.count(p0 + worker, n_workers)


def _worker_main(worker, n_workers, p0, stop, shards, kwargs, out, halt) -> None:
    n_shards = len(shards.shards)
    try:
        shards.reopen()
        for p in _visits(p0, stop, worker, n_workers):
            epoch, index = divmod(p, n_shards)
            for msg in shard_pieces(shards, index, epoch, **kwargs):
                while not halt.is_set():
                    try:
                        out.put(msg, timeout=0.2)
                        break
                    except queue.Full:
                        continue
                if halt.is_set():
                    out.cancel_join_thread()  # the consumer is gone: don't block exit on a full pipe
                    return
    except BaseException as err:  # noqa: BLE001 - forwarded to the consumer, which re-raises it
        out.put(_Failed(err))


class PieceStream:
    """Pieces of every shard visit from ``(epoch, shard)`` on, in order; ``epochs`` bounds the pass."""

    def __init__(self, shards: ShardSet, *, start_epoch: int, start_shard: int, epochs: int | None,
                 num_workers: int, prefetch: int, start_method: str, **kwargs) -> None:
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
                proc = ctx.Process(target=_worker_main, name=f"winnow-loader-{w}", daemon=True,
                                   args=(w, num_workers, self.p0, self.stop, shards, kwargs, q, self._halt))
                proc.start()
                self._procs.append(proc)
                self._queues.append(q)

    def _get(self, worker: int):
        q, proc = self._queues[worker], self._procs[worker]
        while True:
            try:
                msg = q.get(timeout=1.0)
            except queue.Empty:
                if not proc.is_alive():
                    raise TrainError(f"loader worker {worker} died (exit code {proc.exitcode}); see its log above") from None
                continue
            if isinstance(msg, _Failed):
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
        for proc in self._procs:
            proc.join(timeout=2.0)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=1.0)
        for q in self._queues:
            q.close()
            q.cancel_join_thread()
        self._procs, self._queues = [], []
