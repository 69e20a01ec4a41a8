"""Stats keys are data: tuples in memory, nested JSON on disk, exact merges; old manifests still read."""

from __future__ import annotations

import polars as pl
import pytest

from winnow.curate.errors import InputError, StageError
from winnow.curate.manifest import FORMAT_VERSION, upgrade
from winnow.curate.stats import StageStats, flatten, merge_stats, nest


def _stats(sources: list[str], reasons: list[str]) -> StageStats:
    s = StageStats()
    rows = pl.DataFrame({"source": sources})
    rejected = pl.DataFrame({"source": sources, "reason": reasons})
    s.add_batch(rows, rows.head(0), rejected, 0)
    return s


def test_reject_keys_survive_tabs_and_slashes_in_names():
    s = _stats(["web/en", "a\tb"], ["filter:x", "dedup:minhash"])
    s.counters[("lines_removed", "web/en")] += 3
    s.counters["docs_seen"] += 2
    back = StageStats.from_json(s.to_json())
    assert back.source_rejected == {("web/en", "filter:x"): 1, ("a\tb", "dedup:minhash"): 1}
    assert back.counters == {("lines_removed", "web/en"): 3, "docs_seen": 2}
    assert s.summary()["by_source"]["web/en"]["rejected"] == {"filter:x": 1}
    assert s.summary()["counters"] == {"docs_seen": 2, "lines_removed": {"web/en": 3}}


def test_merge_adds_per_key_across_tasks():
    a, b = _stats(["x"], ["r"]), _stats(["x", "y"], ["r", "r"])
    a.counters[("copies_added", "x")] = 1.0
    b.counters[("copies_added", "x")] = 2.0
    total = merge_stats([{"s": a.to_json()}, {"s": b.to_json()}])["s"]
    assert total.source_rejected == {("x", "r"): 2, ("y", "r"): 1}
    assert total.counters == {("copies_added", "x"): 3.0}


def test_nest_and_flatten_are_inverse_and_refuse_a_name_used_both_ways():
    flat = {("a", "x"): 1, ("a", "y", "z"): 2, "b": 3}
    assert nest(flat) == {"a": {"x": 1, "y": {"z": 2}}, "b": 3}
    assert dict(flatten(nest(flat))) == {("a", "x"): 1, ("a", "y", "z"): 2, ("b",): 3}
    with pytest.raises(StageError, match="both a counter and a group"):
        nest({"a": 1, ("a", "x"): 2})


def test_old_manifest_counters_are_read_nested_and_newer_versions_refused():
    old = {"format_version": 2, "stages": [{"id": "01.clean", "counters": {"lines_removed/docs": 4.0, "n": 1.0}}]}
    assert upgrade(old)["stages"][0]["counters"] == {"lines_removed": {"docs": 4.0}, "n": 1.0}
    current = {"format_version": FORMAT_VERSION, "stages": [{"counters": {"lines_removed": {"a/b": 1.0}}}]}
    assert upgrade(current)["stages"][0]["counters"] == {"lines_removed": {"a/b": 1.0}}
    with pytest.raises(InputError, match="newer than this winnow reads"):
        upgrade({"format_version": FORMAT_VERSION + 1}, where="x/manifest.json")
