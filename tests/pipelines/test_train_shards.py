"""``winnow train --shards DIR``: a curated folder from ``curate --output``, or any folder of Parquet files."""

from __future__ import annotations

import json

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.pipelines.tiny import TINY_MODEL
from winnow.pipelines.cli import main

TRAIN = (
    """
[train]
steps = 2
eval_every = 2
[train.metrics]
log_every = 1
"""
    + TINY_MODEL
)


def test_train_on_a_foreign_parquet_folder(tmp_path, monkeypatch, capsys, one_thread):
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "corpus"
    data.mkdir()
    pq.write_table(
        pa.table(
            {
                "text": [f"some text number {i} " * 3 for i in range(40)],
                "source": ["news", "forum"] * 20,
                "lang_score": [0.9] * 40,
            }
        ),
        data / "train-0.parquet",
    )
    pq.write_table(
        pa.table({"text": ["held out text " * 4] * 6, "source": ["news", "forum"] * 3}), data / "validation-0.parquet"
    )
    (tmp_path / "job.toml").write_text(TRAIN)
    assert main(["-q", "train", "job.toml", "--shards", str(data)]) == 0
    out = capsys.readouterr().out
    assert "no manifest.json, so winnow made its view of the folder: 1 Parquet file(s), 40 rows" in out
    run = tmp_path / "out" / "corpus" / "train"  # never inside the user's data folder
    assert sorted(p.name for p in data.iterdir()) == ["train-0.parquet", "validation-0.parquet"]
    view = json.loads((run / "data_view.json").read_text())
    assert view[0]["sources"] == ["news", "forum"] and view[0]["shards"][0]["path"] == "train-0.parquet"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert {"news", "forum"} <= set(next(r for r in records if "per_source" in r)["per_source"])
    assert any("eval" in r for r in records)  # validation-*.parquet was found as the held-out split
    assert json.loads((run / "provenance.json").read_text())["data"][0]["manifest_sha256"] is None


def test_curate_output_then_train_shards_just_works(tmp_path, monkeypatch, capsys, one_thread):
    monkeypatch.chdir(tmp_path)
    lines = [orjson.dumps({"id": str(i), "text": f"document {i} with several words in it"}) for i in range(60)]
    (tmp_path / "in.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    (tmp_path / "job.toml").write_text(
        f'[job]\nname = "j"\n[[inputs]]\nsource = "web"\npath = "{tmp_path / "in.jsonl"}"\n'
        '[[stages]]\nkind = "split"\nval_fraction = 0.2\n' + TRAIN
    )
    elsewhere = tmp_path / "elsewhere"
    assert main(["-q", "curate", "job.toml", "--output", str(elsewhere)]) == 0
    assert main(["-q", "train", "job.toml", "--shards", str(elsewhere)]) == 0
    out = capsys.readouterr().out
    assert "made its view" not in out  # read through the manifest
    assert (elsewhere / "train" / "metrics.jsonl").is_file()  # a curated folder keeps its run beside the shards


def test_train_without_shards_names_the_override(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.toml").write_text('[job]\nname = "j"\noutput = "nowhere"\n' + TRAIN)
    assert main(["-q", "train", "job.toml"]) != 0
    err = capsys.readouterr().err
    assert "--shards" in err and "`data`" not in err


@pytest.mark.slow
def test_run_with_shards_skips_curation_and_reports(tmp_path, monkeypatch, capsys, one_thread):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus").mkdir()
    pq.write_table(
        pa.table({"text": [f"words of document {i} " * 3 for i in range(30)]}), tmp_path / "corpus" / "part-0.parquet"
    )
    (tmp_path / "job.toml").write_text(TRAIN)  # no [job] and no [[inputs]]: nothing to curate
    assert main(["-q", "run", "job.toml", "--shards", "corpus", "--output", "study"]) == 0
    out = capsys.readouterr().out
    assert "[1/3] curate: skipped" in out and "report: study/train/report.html" in out
    assert any(line.startswith("corpus") for line in out.splitlines())  # the one source, named after the folder
    (tmp_path / "curate_only.toml").write_text('[job]\nname = "x"\n')
    assert main(["-q", "run", "curate_only.toml", "--shards", "corpus"]) == 2
    assert "needs a [train] table" in capsys.readouterr().err
