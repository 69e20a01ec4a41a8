"""``winnow run``: the main job end to end (curate -> train -> report), provenance and the per-source table."""

import json
from pathlib import Path

import pytest

from tests.pipelines.report_util import counterfactual_record
from winnow.pipelines.cli import main
from winnow.pipelines.provenance import manifest_sha256, provenance
from winnow.pipelines.report.training import TrainingRun, load_run
from winnow.pipelines.run import source_table

ROOT = Path(__file__).resolve().parents[2]


def _run_folder(tmp_path: Path, *, counterfactual: bool, attribution: bool = False) -> TrainingRun:
    records = [
        {
            "step": 10,
            "loss": 3.0,
            "per_source": {"code": {"tokens": 600, "mean_loss": 2.5}, "prose": {"tokens": 400, "mean_loss": 3.5}},
        },
        {"step": 10, "eval": {"loss": 3.1, "per_source": {"code": 2.6, "prose": 3.7}}},
    ]
    if attribution:
        records.append(
            {
                "step": 10,
                "attribution": {
                    "sources": ["code", "prose"],
                    "matrix": [[-0.2, 0.01], [-0.03, -0.4]],
                    "steps": [1, 10],
                    "unattributed": [0.02, -0.01],
                    "measured": [-0.22, -0.41],
                    "residual": [-0.01, -0.01],
                },
            }
        )
    if counterfactual:  # code lowers its own held-out loss by 0.2 per unit of log share; prose barely matters to code
        records.append(
            counterfactual_record(10, ["code", "prose"], [[-0.2, 0.01], [0.02, -0.4]], error=0.01, factors=(0.0, 2.0))
        )
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return load_run(tmp_path)


def test_source_table_lists_tokens_losses_and_what_leaving_each_source_out_would_do(tmp_path):
    table = source_table(_run_folder(tmp_path, counterfactual=True))
    assert "Leaving out" in table  # the sentences lead
    rows = {line.split()[0]: line.split() for line in table.splitlines() if line.startswith(("code", "prose"))}
    # f_0.5(0) = -2: leaving code out raises its own held-out loss by 2 x 0.2 = 0.4 nats
    assert rows["code"][:4] == ["code", "600", "2.500", "2.600"]
    assert rows["code"][4] == "+0.400" and rows["prose"][4] == "+0.800"
    assert "without: own" in table


def test_source_table_puts_the_decomposition_after_the_counterfactual(tmp_path):
    table = source_table(_run_folder(tmp_path, counterfactual=True, attribution=True))
    assert table.index("Leaving out") < table.index("(decomposition), steps 1-10")
    code = [line for line in table.splitlines() if line.startswith("code")][-1].split()
    # measured, the sources' part, other, residual, attributed share
    assert code == ["code", "-0.2200", "-0.2300", "+0.0200", "-0.0100", "105%"]


def test_source_table_without_attribution_has_no_prediction_columns(tmp_path):
    table = source_table(_run_folder(tmp_path, counterfactual=False)).splitlines()
    assert table[0].split() == ["source", "tokens", "train", "loss", "held-out"]
    assert table[1].split() == ["code", "600", "2.500", "2.600"]


def test_provenance_pins_job_data_and_code(tmp_path):
    data = tmp_path / "job"
    data.mkdir()
    (data / "manifest.json").write_text('{"shards": []}')
    job = tmp_path / "job.toml"
    job.write_text('[job]\nname = "x"\n')
    record = provenance(job_file=job, data=[data])
    assert record["job_file"]["text"] == '[job]\nname = "x"\n'
    assert record["data"][0]["manifest_sha256"] == manifest_sha256(data)
    assert "torch" in record["packages"] and "python" in record["packages"]
    (data / "manifest.json").write_text('{"shards": [1]}')
    assert manifest_sha256(data) != record["data"][0]["manifest_sha256"]


@pytest.mark.slow
def test_winnow_run_demo_end_to_end(tmp_path, monkeypatch, capsys, one_thread):
    monkeypatch.chdir(ROOT)  # the demo job's input paths are relative to the repository root
    assert main(["-q", "run", "pipelines/demo.toml", "--output", str(tmp_path / "demo"), "--steps", "2"]) == 0
    out = capsys.readouterr().out
    run_dir = tmp_path / "demo" / "train"
    report = run_dir / "report.html"
    assert f"report: {report}" in out
    assert report.stat().st_size > 10_000 and "Curation: job demo" in report.read_text()
    for source in ("docs", "code", "legal", "changelog"):
        assert any(line.startswith(source) for line in out.splitlines()), source
    record = json.loads((run_dir / "provenance.json").read_text())
    assert record["data"][0]["manifest_sha256"] == manifest_sha256(tmp_path / "demo")
    assert (run_dir / "job.toml").read_text() == (ROOT / "pipelines" / "demo.toml").read_text()
    assert load_run(run_dir).evals, "the run ends with a held-out evaluation"
