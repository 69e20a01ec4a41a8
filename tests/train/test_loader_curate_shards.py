"""The loader reads what curate's shard writer writes (the shard format is the only contract between them)."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from winnow.train.data import Loader, LoaderConfig


@pytest.fixture
def curate_job(tmp_path):
    from winnow.curate.config import OutputConfig
    from winnow.curate.writers.shards import ShardWriter

    texts = [f"doc {i} " + "ü" * (i % 4) + "y" * (i * 13 % 70) for i in range(40)]
    df = pl.DataFrame(
        {
            "id": [f"s/{i}.x" for i in range(40)],
            "source": ["a", "b", "c", "a"] * 10,
            "text": texts,
            "meta": ['{"k": 1}'] * 40,
            "quality": np.linspace(0, 1, 40),
            "repeat": pl.Series([0] * 39 + [1], dtype=pl.Int32),
        }
    )
    writer = ShardWriter(tmp_path, "part-00000", OutputConfig(shard_rows=15), split="train")
    writer.write(df)
    entries = writer.close()
    for e in entries:
        e["path"] = str(e["path"].relative_to(tmp_path))
    (tmp_path / "manifest.json").write_text(
        json.dumps({"format_version": 1, "job": "t", "sources": ["a", "b", "c"], "shards": entries, "stages": []})
    )
    return tmp_path, df


@pytest.mark.parametrize("fmt", ["parquet", "webdataset"])
def test_loader_reads_curate_shards_in_both_formats(curate_job, fmt):
    folder, df = curate_job
    loader = Loader(LoaderConfig(batch_size=2, seq_len=64, num_workers=0, format=fmt), folder)
    batches = [next(loader) for _ in range(20)]
    toks = np.concatenate([b.targets[b.loss_mask].numpy() for b in batches])
    srcs = np.concatenate([b.source_ids[b.loss_mask].numpy() for b in batches])
    ends = np.flatnonzero(toks == 256)
    docs = [toks[s:e].astype(np.uint8).tobytes().decode() for s, e in zip(np.r_[0, ends[:-1] + 1], ends)]
    assert docs[:40] == df["text"].to_list()
    assert [loader.sources[i] for i in srcs[ends[:40]]] == df["source"].to_list()
