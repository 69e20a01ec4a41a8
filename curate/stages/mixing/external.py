"""Key ranges: reading a plan's keys in a global sort order, one bounded piece at a time.

The mix and order plans need their rows in a global order (a source's preference order, its
curriculum). Within ``[job] memory_gb`` they read the keys in *key ranges*: an evenly spaced
sample of the keys gives the boundaries, a range is read with a filtered scan and sorted in
memory, and the ranges taken in turn are the whole sorted sequence. Every sort key ends in the
row's position in the scan (``ROW``), so keys are unique, any boundary splits cleanly, and the
sequence is that of one stable sort over the whole scan, whatever the number of ranges: the
budget changes how many scans a plan makes, never its result.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from winnow.curate.errors import ConfigError

ROW = "_row"  # a row's position in the scan of every task's keys (task order, then row order)
GB = 1e9
MAX_RANGES = 4096  # each range is a scan of the keys: beyond this the budget is unreasonable
_SAMPLE_PER_RANGE = 64  # sampled keys per range: ranges come out within a few percent of even
_SLACK = 2  # a range may hold this many times its share before it is split again


def rows_within(memory_gb: float, bytes_per_row: float, n_rows: int, *, what: str) -> int:
    """Rows one range may hold under ``memory_gb``; raises (naming ``job.memory_gb``) past ``MAX_RANGES`` ranges."""
    rows = max(1, int(memory_gb * GB / bytes_per_row / _SLACK))
    if math.ceil(n_rows / rows) > MAX_RANGES:
        least = n_rows * bytes_per_row * _SLACK / MAX_RANGES / GB
        raise ConfigError(
            f"job.memory_gb = {memory_gb} is too small for {what}: {n_rows} rows x {bytes_per_row:.0f} B would need "
            f"{math.ceil(n_rows / rows)} key ranges (at most {MAX_RANGES}); set job.memory_gb to at least {least:.3g}"
        )
    return rows


def _lex(by: Sequence[str], bound: tuple, strict: bool) -> pl.Expr:
    """``tuple(by) < bound`` (``strict``) or ``<=``, lexicographically."""
    expr = pl.col(by[-1]) < bound[-1] if strict else pl.col(by[-1]) <= bound[-1]
    for col, value in zip(reversed(by[:-1]), reversed(bound[:-1])):
        expr = (pl.col(col) < value) | ((pl.col(col) == value) & expr)
    return expr


def before(by: Sequence[str], bound: tuple, *, inclusive: bool = False) -> pl.Expr:
    """Rows whose key ``by`` sorts before ``bound`` (or equals it, with ``inclusive``)."""
    return _lex(by, bound, strict=not inclusive)


@dataclass(frozen=True, slots=True)
class KeyRanges:
    """Consecutive ranges of the unique key ``by``: range i holds ``bounds[i-1] <= key < bounds[i]``."""

    by: tuple[str, ...]
    bounds: tuple[tuple, ...]

    def __len__(self) -> int:
        return len(self.bounds) + 1

    def where(self, i: int) -> pl.Expr:
        lo = ~before(self.by, self.bounds[i - 1]) if i > 0 else pl.lit(True)
        return lo & before(self.by, self.bounds[i]) if i < len(self.bounds) else lo

    def index(self) -> pl.Expr:
        """Each row's range number."""
        return (
            pl.sum_horizontal([(~before(self.by, b)).cast(pl.UInt32) for b in self.bounds])
            if self.bounds
            else pl.lit(0, pl.UInt32)
        )

    def sorted(self, frame: pl.LazyFrame, columns: Sequence[str]) -> Iterator[pl.DataFrame]:
        """The rows of ``frame`` (``columns``, which include ``by``) range by range, each sorted by ``by``."""
        for i in range(len(self)):
            yield frame.filter(self.where(i)).select(columns).collect(engine="streaming").sort(list(self.by))


def key_ranges(frame: pl.LazyFrame, by: Sequence[str], n_rows: int, max_rows: int) -> KeyRanges:
    """Ranges of ``by`` (unique: it ends in ``ROW``) over ``frame``'s ``n_rows`` rows, none over ``max_rows``."""
    by = tuple(by)
    assert by[-1] == ROW, "a range key ends in the row position, so keys are unique"
    bounds = _split(frame, by, pl.lit(True), n_rows, max_rows)
    return KeyRanges(by, tuple(bounds))


def _split(frame: pl.LazyFrame, by: tuple[str, ...], where: pl.Expr, n_rows: int, max_rows: int) -> list[tuple]:
    """Boundaries inside the rows ``where`` selects, from a sample; ranges the sample got wrong are split again."""
    parts = math.ceil(n_rows / max_rows)
    if parts <= 1:
        return []
    step = max(1, n_rows // (parts * _SAMPLE_PER_RANGE))
    sample = frame.filter(where & (pl.col(ROW) % step == 0)).select(by).collect(engine="streaming").sort(list(by))
    picks = sorted({sample.row(len(sample) * i // parts) for i in range(1, parts)} if len(sample) else set())
    ranges = KeyRanges(by, tuple(picks))
    sizes = dict(
        frame.filter(where).group_by(ranges.index().alias("_range")).len().collect(engine="streaming").iter_rows()
    )
    bounds: list[tuple] = []
    for i in range(len(ranges)):
        if sizes.get(i, 0) > _SLACK * max_rows:  # the sample was uneven here: split this range on its own
            bounds += _split(frame, by, where & ranges.where(i), sizes[i], max_rows)
        if i < len(picks):
            bounds.append(picks[i])
    return bounds


def task_offsets(keys: pl.LazyFrame) -> dict[int, int]:
    """Each task's first ``ROW``: the keys are scanned in task order (the runner lists task files in order)."""
    counts = keys.group_by("_task").len().collect(engine="streaming").sort("_task")
    starts = [0, *np.cumsum(counts["len"].to_numpy()).tolist()[:-1]]
    return dict(zip(counts["_task"].to_list(), starts))
