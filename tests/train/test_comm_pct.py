"""``comm_pct``: the share of a log interval's wall time spent in collectives, eval and checkpoint stretches left out."""

import pytest

import winnow.train.metrics as metrics
from winnow.train.metrics import Throughput
from winnow.train.parallel.comm import CommTimer


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_comm_pct_is_communication_over_the_intervals_wall_time_without_excluded_stretches(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(metrics.time, "perf_counter", clock)
    timer = CommTimer()
    timer.add_interval(0.0, 5.0, 8, 8)  # before the interval started: not counted
    speed = Throughput(timer)
    timer.add_interval(100.0, 101.0, 8, 8)
    timer.add_interval(100.5, 102.0, 8, 8)  # overlaps the first: counted once (union = 2 s)
    clock.now = 104.0
    mark = speed.mark()  # an evaluation: 6 s of wall time with 3 s of FSDP all-gathers in it
    timer.add_interval(104.0, 107.0, 8, 8)
    clock.now = 110.0
    speed.exclude_since(mark)
    timer.reset()  # the metrics record's per-interval report resets; comm_pct is unaffected
    clock.now = 112.0
    timer.add_interval(111.0, 112.0, 8, 8)
    # wall: 12 s - 6 s excluded = 6 s; communication: 2 s + 1 s = 3 s
    assert speed.summary(1.0, 1.0)["comm_pct"] == pytest.approx(50.0)
    speed.reset()
    clock.now = 113.0
    assert speed.summary(1.0, 1.0)["comm_pct"] == 0.0


def test_comm_pct_is_zero_without_a_comm_timer():
    assert Throughput().summary(1.0, 1.0)["comm_pct"] == 0.0
