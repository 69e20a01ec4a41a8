"""The progress of a curation phase: a bar on a terminal, two plain log lines anywhere else.

tqdm decides (``disable=None`` turns its bar off when stderr is not a terminal). Without a bar,
each phase logs one line when it starts and one when it ends on the ``curate.progress`` logger,
which ``winnow`` shows unless ``-q``: a cluster's log file gets no carriage returns or escape codes.
"""

from __future__ import annotations

import logging
import time
from types import TracebackType

from tqdm.auto import tqdm

log = logging.getLogger(__name__)


class PhaseProgress:
    """``with PhaseProgress(desc, total, enabled=...) as progress: ... progress.update()`` once per finished unit."""

    def __init__(self, desc: str, total: int, *, enabled: bool, unit: str = "task") -> None:
        self.desc, self.total, self.enabled, self.unit = desc, total, enabled, unit
        self.done = 0
        self._bar = None
        self._start = 0.0

    def __enter__(self) -> PhaseProgress:
        self._bar = tqdm(total=self.total, desc=self.desc, unit=self.unit, leave=False,
                         disable=None if self.enabled else True)
        self._start = time.perf_counter()
        if self.lines:
            log.info("%s: %d %s(s)", self.desc, self.total, self.unit)
        return self

    @property
    def lines(self) -> bool:
        """Progress is wanted but there is no bar (stderr is not a terminal): log lines instead."""
        return self.enabled and self._bar is not None and self._bar.disable

    def update(self, n: int = 1) -> None:
        self.done += n
        self._bar.update(n)

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        lines = self.lines
        self._bar.close()
        if lines and kind is None:
            log.info("%s: done, %d %s(s) in %.1f s", self.desc, self.done, self.unit, time.perf_counter() - self._start)
