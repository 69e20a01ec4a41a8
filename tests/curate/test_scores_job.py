"""The four score stages through a TOML job on the sample data: columns written, nothing lost, reports in the manifest."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from winnow.curate.pipeline import run_job
from winnow.pipelines.jobfile import load_job

SAMPLES = Path(__file__).resolve().parents[2] / "data_samples"

JOB = f"""
[[inputs]]
source = "docs"
path = "{SAMPLES}/docs/part-00000.jsonl.gz"
format = "jsonl"

[[inputs]]
source = "changelog"
path = "{SAMPLES}/changelog/part-00000.jsonl"
format = "jsonl"

[[stages]]
kind = "score.heuristic"
column = "heuristic"

[[stages]]
kind = "score.classifier"
positive_source = "docs"
epochs = 2

[[stages]]
kind = "score.dsir"
target_source = "docs"
per_token = true

[[stages]]
kind = "score.difficulty"

[output]
formats = ["parquet"]
"""


@pytest.mark.slow
def test_score_stages_run_in_a_job(tmp_path, write_job, nothing_lost):
    manifest = run_job(load_job(write_job(JOB, name="scores")), progress=False)
    out = tmp_path / "out" / "scores"
    nothing_lost(out)
    rows = pl.concat([pl.read_parquet(p) for p in sorted((out / "shards").rglob("*.parquet"))])
    for col in ("heuristic", "quality", "dsir_weight", "difficulty"):
        assert rows[col].is_not_null().all(), col
    means = rows.group_by("source").agg(pl.col("quality", "dsir_weight").mean()).sort("source")
    assert means["quality"][1] > means["quality"][0] and means["dsir_weight"][1] > means["dsir_weight"][0]
    assert list((out / "artifacts").rglob("classifier.npz")) and list((out / "artifacts").rglob("dsir_raw.npz"))
    assert "cv_auc" in str(manifest)
