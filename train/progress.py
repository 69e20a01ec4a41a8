"""The progress of a run: a bar on a terminal, plain log lines anywhere else.

On a terminal, one ``tqdm`` bar over training steps (starting at the resumed step, so the ETA is
for what is left) shows step / total, tokens/s, loss and ETA, and a second bar under it counts
batches while the held-out set is evaluated. While the bar is open, log records go through
``tqdm.contrib.logging.logging_redirect_tqdm`` so log lines print above the bar instead of tearing it.

When stderr is not a terminal (a cluster's log file, ``> log 2>&1``), tqdm's own check
(``disable=None``) turns the bars off and the same figures become one line every ``every`` steps
(and at the last step) on the ``train.progress`` logger, with no carriage returns or escape codes:

    12:00:03 INFO train.progress: step 20/300 (7%) loss 5.1234 tokens/s 12,345 elapsed 0:21 eta 4:54

Disabled (``winnow -q``, or ranks other than 0), every method is a no-op.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Iterable, Iterator
from typing import Any

from winnow.train.shutdown import stop_requested

log = logging.getLogger(__name__)


def _interval(seconds: float) -> str:
    """``1:02:03`` / ``2:03``: the way tqdm writes elapsed time and ETA."""
    from tqdm import tqdm

    return tqdm.format_interval(max(seconds, 0.0))


class TrainProgress:
    """Training and evaluation progress for one ``Trainer.fit``."""

    def __init__(self, *, total: int, enabled: bool = True, every: int = 10, window: int = 20) -> None:
        self.total, self.enabled, self.every = total, enabled, max(1, every)
        self._bar: Any = None
        self._lines = False  # enabled, but stderr is not a terminal: log lines instead of the bar
        self._redirect: Any = None
        self._recent: collections.deque = collections.deque(maxlen=window)  # (time, step, tokens_seen)
        self._start = 0.0
        self._rate = "-"

    def open(self, step: int, tokens_seen: int) -> None:
        if not self.enabled or self._bar is not None or self._lines:
            return
        from tqdm.auto import tqdm

        bar = tqdm(
            total=self.total,
            initial=step,
            desc="train",
            unit="step",
            dynamic_ncols=True,
            disable=None,
            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]",
        )
        if bar.disable:
            self._lines = True
        else:
            from tqdm.contrib.logging import logging_redirect_tqdm

            self._bar = bar
            self._redirect = logging_redirect_tqdm()
            self._redirect.__enter__()
        self._start = time.perf_counter()
        self._recent.append((self._start, step, tokens_seen))

    def step(self, step: int, tokens_seen: int, loss: float | None) -> None:
        """After each step: advance to ``step`` and show the loss, recent tokens/s and the ETA."""
        if self._bar is None and not self._lines:
            return
        now = time.perf_counter()
        self._recent.append((now, step, tokens_seen))
        (t0, s0, k0), (t1, s1, k1) = self._recent[0], self._recent[-1]
        if t1 > t0:
            self._rate = f"{(k1 - k0) / (t1 - t0):,.0f}"
        loss_text = f"{loss:.4f}" if loss is not None else "-"
        if self._bar is not None:
            self._bar.set_postfix({"loss": loss_text, "tok/s": self._rate}, refresh=False)
            self._bar.update(step - self._bar.n)
        elif step % self.every == 0 or step >= self.total:
            steps_per_s = (s1 - s0) / (t1 - t0) if t1 > t0 and s1 > s0 else 0.0
            eta = _interval((self.total - step) / steps_per_s) if steps_per_s else "-"
            log.info(
                "step %d/%d (%d%%) loss %s tokens/s %s elapsed %s eta %s",
                step,
                self.total,
                100 * step // max(self.total, 1),
                loss_text,
                self._rate,
                _interval(now - self._start),
                eta,
            )

    def evaluating(self, batches: Iterable, *, total: int | None) -> Iterator:
        """``batches`` unchanged, counted on a second bar (or in one log line) while the held-out set is evaluated."""
        if not self.enabled:
            yield from batches
            return
        from tqdm.auto import tqdm

        bar = tqdm(
            batches,
            total=total,
            desc="eval",
            unit="batch",
            leave=False,
            position=1 if self._bar else 0,
            dynamic_ncols=True,
            disable=None,
        )
        start, count = time.perf_counter(), 0
        try:
            for batch in bar:
                count += 1
                yield batch
        finally:
            bar.close()
            if bar.disable and count and stop_requested() is None:  # a stopped pass is said abandoned by the trainer
                step = self._recent[-1][1] if self._recent else 0
                log.info("eval at step %d: %d held-out batch(es) in %.1f s", step, count, time.perf_counter() - start)
            if self._recent:  # evaluation time is not training throughput: measure again from here
                _, step, tokens = self._recent[-1]
                self._recent.clear()
                self._recent.append((time.perf_counter(), step, tokens))

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._redirect is not None:
            self._redirect.__exit__(None, None, None)
            self._redirect = None
        self._lines = False
