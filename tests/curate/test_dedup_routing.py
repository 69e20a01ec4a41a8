"""Routing spilled values to verification buckets: one read per window of the spill, whatever the buckets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import winnow.curate.dedup.routing as routing
from winnow.curate.dedup.routing import Router

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def spill(tmp_path):
    """100 rows of a binary column, row ``i`` holding ``i`` repeated ``i % 7`` times (uint8), over two files."""
    values = [bytes([i]) * (i % 7) for i in range(100)]
    for k, (lo, hi) in enumerate(((0, 37), (37, 100))):
        pl.DataFrame({"v": values[lo:hi]}, schema={"v": pl.Binary}).write_parquet(tmp_path / f"k{k}.parquet")
    return pl.scan_parquet([tmp_path / "k0.parquet", tmp_path / "k1.parquet"]), values


@pytest.fixture
def reads(monkeypatch):
    """The window starts every read of the spill asked for."""
    seen = []
    real = routing.read_window

    def counted(keys, column, lo, window_rows, positions):
        seen.append(lo)
        return real(keys, column, lo, window_rows, positions)

    monkeypatch.setattr(routing, "read_window", counted)
    return seen


def _needs(buckets: int) -> list[np.ndarray]:
    rng = np.random.default_rng(buckets)
    return [np.unique(rng.integers(0, 100, size=30)).astype(np.uint32) for _ in range(buckets)]


@pytest.mark.parametrize("buckets", [1, 3, 8])
def test_each_bucket_gets_exactly_its_values(tmp_path, spill, reads, buckets):
    keys, values = spill
    needs = _needs(buckets)
    router = Router(tmp_path / "r", buckets)
    for q, docs in enumerate(needs):
        router.need(q, docs)
    assert router.route(keys, "v", window_rows=16, memory_gb=1.0) == 1
    for q, docs in enumerate(needs):
        routed = router.read(q)
        assert np.array_equal(routed.docs, docs)
        got = [routed.data[routed.offsets[i] : routed.offsets[i + 1]].tobytes() for i in range(len(docs))]
        assert got == [values[d] for d in docs]
    assert sorted(reads) == sorted(set(reads)) and len(reads) <= 7  # each 16-row window read at most once


def test_needs_over_the_budget_route_in_rounds_with_the_same_values(tmp_path, spill, reads):
    keys, values = spill
    needs = _needs(4)
    router = Router(tmp_path / "r", 4)
    for q, docs in enumerate(needs):
        router.need(q, docs)
    tiny = 40 * routing.NEED_BYTES / 1e9  # room for 40 needs: one bucket per round
    assert router.route(keys, "v", window_rows=16, memory_gb=tiny) == 4
    for q, docs in enumerate(needs):
        routed = router.read(q)
        assert [routed.data[routed.offsets[i] : routed.offsets[i + 1]].tobytes() for i in range(len(docs))] == [
            values[d] for d in docs
        ]
    assert len(reads) <= 4 * 7


def test_a_transform_applies_once_per_read_value(tmp_path, spill):
    keys, values = spill
    router = Router(tmp_path / "r", 2)
    router.need(0, np.array([3, 5, 90], dtype=np.uint32))
    router.need(1, np.array([5], dtype=np.uint32))

    def first_byte(offsets, data):
        starts = offsets[:-1][np.diff(offsets) > 0]
        lengths = (np.diff(offsets) > 0).astype(np.int64)
        return np.r_[0, np.cumsum(lengths)], data[starts]

    router.route(keys, "v", window_rows=16, memory_gb=1.0, transform=first_byte)
    zero, one = router.read(0), router.read(1)
    assert zero.data.tobytes() == bytes([3, 5, 90]) and one.data.tobytes() == bytes([5])
    assert np.array_equal(zero.positions(np.array([90, 3])), [2, 0])


def test_routing_does_not_import_pyarrow_compute(tmp_path):
    """Arrow's ``take`` would import ``pyarrow.compute``: ~20 MB per process, measured on the long-document bench."""
    script = f"""
import sys
import numpy as np, polars as pl
from winnow.curate.dedup.routing import Router
pl.DataFrame({{"v": [b"ab", b"c"]}}).write_parquet({str(tmp_path / "k.parquet")!r})
router = Router(__import__("pathlib").Path({str(tmp_path / "r")!r}), 2)
router.need(0, np.array([0, 1], dtype=np.uint32)); router.need(1, np.array([1], dtype=np.uint32))
router.route(pl.scan_parquet({str(tmp_path / "k.parquet")!r}), "v", window_rows=16, memory_gb=1.0)
assert router.read(1).data.tobytes() == b"c"
print("pyarrow.compute" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
