"""Shard writers: rotation, determinism, both formats holding the same rows, readable by peers."""

from __future__ import annotations

import hashlib
import json

import polars as pl
import pytest

from winnow.curate.config import OutputConfig
from winnow.curate.writers.shards import ShardWriter, safe_keys


def rows(n: int, start: int = 0) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "id": [f"src/file.jsonl/{i}" for i in range(start, start + n)],
            "source": ["a" if i % 3 else "b" for i in range(start, start + n)],
            "text": [f"text {i} " * (i % 7 + 1) for i in range(start, start + n)],
            "meta": [json.dumps({"i": i}) for i in range(start, start + n)],
            "quality": [i / 100 for i in range(start, start + n)],
        }
    )


def write(folder, df, **out) -> list[dict]:
    w = ShardWriter(folder, "part-00000", OutputConfig(**out), split="train")
    for chunk in df.iter_slices(7):
        w.write(chunk)
    return w.close()


def test_rotates_by_rows_and_records_counts(tmp_path):
    entries = write(tmp_path, rows(25), shard_rows=10)
    parquet = [e for e in entries if e["format"] == "parquet"]
    assert [e["rows"] for e in parquet] == [10, 10, 5]
    assert sum(sum(e["sources"].values()) for e in parquet) == 25
    assert parquet[0]["means"]["quality"] == pytest.approx(sum(i / 100 for i in range(10)) / 10)
    for e in entries:
        assert e["sha256"] == hashlib.sha256(e["path"].read_bytes()).hexdigest()
        assert e["bytes"] == e["path"].stat().st_size
    assert not list(tmp_path.glob(".*.tmp"))


def test_rotates_by_text_bytes(tmp_path):
    df = rows(30)
    limit = 200
    entries = [e for e in write(tmp_path, df, shard_rows=1000, shard_bytes=limit) if e["format"] == "parquet"]
    assert sum(e["rows"] for e in entries) == 30 and len(entries) > 1
    for e in entries:
        got = pl.read_parquet(e["path"])
        assert got["text"].str.len_bytes().sum() <= limit or got.height == 1


def test_same_rows_give_identical_bytes(tmp_path):
    a = write(tmp_path / "a", rows(40), shard_rows=15)
    b = write(tmp_path / "b", rows(40), shard_rows=15)
    assert [e["sha256"] for e in a] == [e["sha256"] for e in b]


def test_parquet_and_tar_hold_the_same_rows_in_order(tmp_path):
    import webdataset as wds

    entries = write(tmp_path, rows(12), shard_rows=5)
    for pq_entry, tar_entry in zip(*[[e for e in entries if e["format"] == f] for f in ("parquet", "webdataset")]):
        df = pl.read_parquet(pq_entry["path"])
        samples = list(wds.WebDataset(str(tar_entry["path"]), shardshuffle=False))
        assert [json.loads(s["json"])["id"] for s in samples] == df["id"].to_list()
        assert [s["txt"].decode() for s in samples] == df["text"].to_list()
        assert json.loads(samples[0]["json"])["quality"] == df["quality"][0]


def test_safe_keys_are_injective_and_mark_repeats():
    df = pl.DataFrame(
        {"id": ["a/b.c", "a%2Fb.c", "x~1", "x"], "repeat": [0, 0, 0, 2]}, schema_overrides={"repeat": pl.Int32}
    )
    keys = safe_keys(df).to_list()
    assert len(set(keys)) == 4
    assert all("/" not in k and "." not in k for k in keys)
    assert keys[3] == "x~2"
