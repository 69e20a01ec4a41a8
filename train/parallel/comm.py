"""Time and bytes spent in collectives, for the scaling report and the PowerSGD savings line.

Blocking collectives are timed around the call. DDP's bucket all-reduces run asynchronously
while backward continues, so for them the timer keeps the union of ``[launch, completion]``
intervals: the wall time during which some gradient communication was in flight. FSDP2's
all-gathers and reduce-scatters are timed the same way (``TimedAllGather``/``TimedReduceScatter``
in ``data_parallel``). ``total_seconds`` never resets, so the step timer can take differences
of it (``Throughput``'s ``comm_pct``) whatever the resets in between.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import torch
import torch.distributed as dist


class CommTimer:
    """Seconds and bytes of communication since the last ``reset``; safe to call from gloo's callback thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.total_seconds = 0.0  # since construction; not reset, not checkpointed (a process-local clock)
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.seconds = 0.0
            self.bytes_sent = 0
            self.bytes_uncompressed = 0  # what plain all-reduce would have sent (PowerSGD report)
            self._busy_until = 0.0

    @contextmanager
    def blocking(self, nbytes: int = 0):
        """Time a collective that returns when it is done."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add_interval(start, time.perf_counter(), nbytes, nbytes)

    def all_reduce(self, tensor: torch.Tensor, group=None, op=None) -> torch.Tensor:
        """``dist.all_reduce`` of ``tensor`` in place (a sum unless ``op``), timed as a blocking collective."""
        with self.blocking(tensor.numel() * tensor.element_size()):
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM if op is None else op, group=group)
        return tensor

    def add_interval(self, start: float, end: float, nbytes: int, uncompressed: int) -> None:
        """Count ``[start, end]`` once even where it overlaps an interval already counted."""
        with self._lock:
            added = max(0.0, end - max(start, self._busy_until))
            self.seconds += added
            self.total_seconds += added
            self._busy_until = max(self._busy_until, end)
            self.bytes_sent += nbytes
            self.bytes_uncompressed += uncompressed

    def state_dict(self) -> dict:
        return {"seconds": self.seconds, "bytes_sent": self.bytes_sent, "bytes_uncompressed": self.bytes_uncompressed}

    def load_state_dict(self, state: dict) -> None:
        with self._lock:
            self.seconds = float(state["seconds"])
            self.bytes_sent = int(state["bytes_sent"])
            self.bytes_uncompressed = int(state["bytes_uncompressed"])
