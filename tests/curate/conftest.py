"""Fixtures for curation tests: tiny job runner and the nothing-is-lost check."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest

SAMPLES = Path(__file__).resolve().parents[2] / "data_samples"


def sample_rows(path: Path, source: str, n: int) -> pl.DataFrame:
    """The first ``n`` records of a sample JSONL file as a batch of the row schema (no meta)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        recs = [json.loads(line) for _, line in zip(range(n), f)]
    return pl.DataFrame(
        {
            "id": [r["id"] for r in recs],
            "source": [source] * len(recs),
            "text": [r["text"] for r in recs],
            "meta": [None] * len(recs),
        },
        schema=dict.fromkeys(("id", "source", "text", "meta"), pl.String),
    )


@pytest.fixture(scope="session")
def pool() -> list[pl.DataFrame]:
    """Two scoring batches of real text: 300 docs (the reference) and 300 changelog entries (the noise)."""
    return [
        sample_rows(SAMPLES / "docs/part-00000.jsonl.gz", "docs", 300),
        sample_rows(SAMPLES / "changelog/part-00000.jsonl", "changelog", 300),
    ]


def check_nothing_lost(out: Path, input_ids: set[str] | None = None) -> dict:
    """Assert DESIGN.md contract 2 on a finished job folder; returns the manifest."""
    manifest = json.loads((out / "manifest.json").read_text())
    for st in manifest["stages"]:
        assert st["rows_in"] + st["repeats"] == st["rows_out"] + st["rows_rejected"], st["id"]
    t = manifest["totals"]
    assert t["rows_read"] + t["repeats"] == t["rows_written"] + t["rows_rejected"]
    parquet = [out / s["path"] for s in manifest["shards"] if s["format"] == "parquet"]
    kept = (
        pl.concat([pl.read_parquet(p, columns=["id"], glob=False) for p in parquet])["id"]
        if parquet
        else pl.Series([], dtype=pl.String)
    )
    reject_files = sorted((out / "rejects").glob("*.parquet"))
    columns = ["id", "reason", "duplicate_of"]
    all_rejects = (
        pl.concat([pl.read_parquet(p, columns=columns, glob=False) for p in reject_files])
        if reject_files
        else pl.DataFrame(schema=dict.fromkeys(columns, pl.String))
    )
    assert kept.len() == t["rows_written"]
    assert all_rejects.height == t["rows_rejected"]
    # A later copy of an id is rejected as read:duplicate_id and points at the id it repeats;
    # over the other rows, every id is in the output or in the rejects, never both.
    copies = all_rejects.filter(pl.col("reason") == "read:duplicate_id")
    rejected = all_rejects.filter(pl.col("reason") != "read:duplicate_id")["id"]
    kept_ids, rejected_ids = set(kept.to_list()), set(rejected.to_list())
    assert kept.n_unique() == kept.len() or "repeat" in pl.read_parquet_schema(parquet[0]), "ids repeat in the output"
    assert not kept_ids & rejected_ids, sorted(kept_ids & rejected_ids)[:5]
    assert copies["duplicate_of"].to_list() == copies["id"].to_list()
    assert set(copies["id"].to_list()) <= kept_ids | rejected_ids
    if input_ids is not None:
        assert kept_ids | rejected_ids == input_ids
    return manifest


@pytest.fixture
def nothing_lost():
    return check_nothing_lost


@pytest.fixture
def write_job(tmp_path):
    """Write a job file whose [job] output points into tmp_path; returns its path."""

    def write(body: str, name: str = "t") -> Path:
        path = tmp_path / f"{name}.toml"
        path.write_text(f'[job]\nname = "{name}"\noutput = "{tmp_path / "out" / name}"\n' + body)
        return path

    return write
