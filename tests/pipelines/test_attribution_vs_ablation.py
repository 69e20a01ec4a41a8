"""The attribution agrees with a real leave-one-out ablation on the demo data: own-source signs, and ranks.

The study is the shipped one's leave-one-out half (``pipelines/ablation.toml``: the demo's model,
200-step runs, attribution in stretches of 10 after step 30, averaged over two baseline seeds) with
fewer seeds: three baseline seeds and two per left-out source (11 runs). For each source whose
removal changes its own held-out loss by more than the run-to-run noise (two standard errors of a
delta), the baseline's attribution entry for that source (training on it → its own held-out loss)
must have the matching sign: removing a source that helped itself (negative entry) raises its
held-out loss. Over all 16 cells the prediction must rank like the measured deltas (Spearman ≥ 0.8)
and agree in sign on ≥ 90% of the cells above the noise: the targets this test asserts.
"""

import json
from pathlib import Path

import polars as pl
import pytest

from pipelines.ablate.layout import StudyLayout
from pipelines.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_attribution_sign_matches_leave_one_out_above_noise(tmp_path, monkeypatch, one_thread):
    monkeypatch.chdir(ROOT)  # the demo job's input paths are relative to the repository root
    job = tmp_path / "demo"
    assert main(["-q", "curate", "pipelines/demo.toml", "--output", str(job)]) == 0
    study = tmp_path / "study.toml"
    study.write_text(f"""[job]
output = "{job}"
[train]
steps = 200
seed = 0
[train.model]
dim = 128
n_layers = 4
n_experts = 8
top_k = 2
[train.data]
batch_size = 8
seq_len = 128
num_workers = 0
[train.attribution]
start = 30
[ablate]
kind = "leave_one_out"
output = "{tmp_path / 'study'}"
noise_seeds = 3
variant_seeds = 2
attribution_every = 10
attribution_seeds = 2
parallel = 2
""")
    assert main(["-q", "ablate", str(study)]) == 0
    cells = pl.read_csv(StudyLayout(tmp_path / "study").cells_csv)
    own = cells.filter(pl.col("variant") == pl.format("without_{}", pl.col("source")))
    assert own.height == 4, own
    records = [json.loads(line) for line in (tmp_path / "study" / "metrics.jsonl").read_text().splitlines()]
    attribution = [r["attribution"] for r in records if "attribution" in r][-1]
    entry = {s: attribution["matrix"][i][i] for i, s in enumerate(attribution["sources"])}
    strong = own.filter(pl.col("above_noise"))
    assert strong.height >= 2, f"too few sources above the noise to compare: {own}"
    for source, measured in strong.select("source", "measured").iter_rows():
        assert (measured > 0) == (entry[source] < 0), (source, measured, entry[source])
    # measured here: Spearman 0.847 over the 16 cells, signs on 12 of 12 cells above the noise (the same runs
    # with the shipped study's four baseline and three variant seeds: 0.856, 11 of 11)
    summary = json.loads(StudyLayout(tmp_path / "study").correlation_json.read_text())
    assert summary["n_cells"] == 16 and summary["variant_seeds"] == 2 and summary["seeds"] == 3, summary
    assert summary["spearman"] >= 0.8, summary
    assert summary["sign_agree"] >= 0.9 * summary["above_noise"], summary
    assert summary["noise_ok"], summary
