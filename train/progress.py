"""The progress bar of a run: step / total, tokens/s, loss and ETA, plus a bar per evaluation.

One ``tqdm`` bar over training steps (starting at the resumed step, so the ETA is for what is
left) and, while the held-out set is evaluated, a second one under it counting batches. While
the bar is open, log records go through ``tqdm.contrib.logging.logging_redirect_tqdm`` so log
lines print above the bar instead of tearing it. Disabled (``winnow -q``, or ranks other than 0),
every method is a no-op.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterable, Iterator
from typing import Any


class TrainProgress:
    """Training and evaluation progress for one ``Trainer.fit``."""

    def __init__(self, *, total: int, enabled: bool = True, window: int = 20) -> None:
        self.total, self.enabled = total, enabled
        self._bar: Any = None
        self._redirect: Any = None
        self._recent: collections.deque = collections.deque(maxlen=window)  # (time, tokens_seen)
        self._rate = "-"

    def open(self, step: int, tokens_seen: int) -> None:
        if not self.enabled or self._bar is not None:
            return
        from tqdm.auto import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        self._redirect = logging_redirect_tqdm()
        self._redirect.__enter__()
        self._bar = tqdm(total=self.total, initial=step, desc="train", unit="step", dynamic_ncols=True,
                         bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]")
        self._recent.append((time.perf_counter(), tokens_seen))

    def step(self, step: int, tokens_seen: int, loss: float | None) -> None:
        """After each step: advance to ``step`` and show the loss and recent tokens/s."""
        if self._bar is None:
            return
        now = time.perf_counter()
        self._recent.append((now, tokens_seen))
        (t0, k0), (t1, k1) = self._recent[0], self._recent[-1]
        if t1 > t0:
            self._rate = f"{(k1 - k0) / (t1 - t0):,.0f}"
        postfix = {"loss": f"{loss:.4f}" if loss is not None else "-", "tok/s": self._rate}
        self._bar.set_postfix(postfix, refresh=False)
        self._bar.update(step - self._bar.n)

    def evaluating(self, batches: Iterable, *, total: int | None) -> Iterator:
        """``batches`` unchanged, counted on a second bar while the held-out set is evaluated."""
        if not self.enabled:
            yield from batches
            return
        from tqdm.auto import tqdm

        bar = tqdm(batches, total=total, desc="eval", unit="batch", leave=False, position=1 if self._bar else 0,
                   dynamic_ncols=True)
        try:
            yield from bar
        finally:
            bar.close()
            if self._recent:  # evaluation time is not training throughput: measure again from here
                tokens = self._recent[-1][1]
                self._recent.clear()
                self._recent.append((time.perf_counter(), tokens))

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._redirect is not None:
            self._redirect.__exit__(None, None, None)
            self._redirect = None
