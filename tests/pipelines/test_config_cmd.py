"""``winnow config show KIND`` and ``winnow config schema``."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from pipelines.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_show_a_stage_lists_keys_defaults_and_docs(capsys):
    assert main(["config", "show", "dedup.minhash"]) == 0
    out = capsys.readouterr().out
    line = next(l for l in out.splitlines() if l.startswith("threshold "))
    assert line.split()[:3] == ["threshold", "float", "0.8"] and "Jaccard similarity" in line
    assert main(["config", "show", "filter.expr"]) == 0
    assert "(required)" in next(l for l in capsys.readouterr().out.splitlines() if l.startswith("where "))


def test_show_a_table_and_the_list(capsys):
    assert main(["config", "show", "train.metrics"]) == 0
    out = capsys.readouterr().out
    assert any(l.startswith("trackers ") and '"mlflow"' in l for l in out.splitlines())
    assert main(["config", "show"]) == 0
    listing = capsys.readouterr().out
    assert "filter.expr" in listing and "train.model" in listing and "output" in listing


def test_show_unknown_kind_names_both_lists(capsys):
    assert main(["config", "show", "dedup.minhsh"]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'dedup.minhash'" in err and "tables: job" in err


def test_schema_accepts_the_shipped_jobs_and_refuses_bad_keys(tmp_path, capsys):
    jsonschema = pytest.importorskip("jsonschema")
    assert main(["config", "schema", "-o", str(tmp_path / "winnow.schema.json")]) == 0
    schema = json.loads((tmp_path / "winnow.schema.json").read_text())
    for job in ("demo.toml", "ablation.toml"):
        jsonschema.validate(tomllib.loads((ROOT / "pipelines" / job).read_text()), schema)
    bad = [{"job": {"name": "x", "workres": 2}},
           {"job": {"name": "x"}, "stages": [{"kind": "dedup.minhash", "treshold": 0.8}]},
           {"job": {"name": "x"}, "stages": [{"kind": "filter.expr"}]},  # where is required
           {"job": {"name": "x"}, "train": {"metrics": {"trackers": "wandb"}}}]
    for doc in bad:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(doc, schema)
