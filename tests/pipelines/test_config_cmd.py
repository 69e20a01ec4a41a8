"""``winnow config show KIND`` and ``winnow config schema``."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from winnow.pipelines.cli import main

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
    assert main(["config", "show", "train.modle"]) == 2  # a table's name misspelt
    assert "unknown table 'train.modle' (did you mean 'train.model'?)" in capsys.readouterr().err


def test_schema_accepts_the_shipped_jobs_and_refuses_bad_keys(tmp_path, capsys):
    jsonschema = pytest.importorskip("jsonschema")
    assert main(["config", "schema", "-o", str(tmp_path / "winnow.schema.json")]) == 0
    schema = json.loads((tmp_path / "winnow.schema.json").read_text())
    for job in ("demo.toml", "ablation.toml"):
        jsonschema.validate(tomllib.loads((ROOT / "pipelines" / job).read_text()), schema)
    bad = [
        {"job": {"name": "x", "workres": 2}},
        {"job": {"name": "x"}, "stages": [{"kind": "dedup.minhash", "treshold": 0.8}]},
        {"job": {"name": "x"}, "stages": [{"kind": "filter.expr"}]},  # where is required
        {"job": {"name": "x"}, "train": {"metrics": {"trackers": "wandb"}}},
    ]
    for doc in bad:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(doc, schema)


def _configs(*, curation_only: bool = False):
    """(table, config class) of every table and stage kind a job file may hold."""
    from winnow.curate.stages import stage_class, stage_kinds
    from winnow.pipelines.config import tables

    known = [
        (name, cls)
        for name, cls in tables().items()
        if not curation_only or name.split(".")[0] in ("job", "inputs", "output")
    ]
    return [*known, *((f"[[stages]] {kind}", stage_class(kind).Config) for kind in stage_kinds())]


def test_descriptions_are_whole_plain_sentences_for_users():
    import sys

    from winnow.pipelines.config import field_docs

    bad = []
    for table, cls in _configs():
        constants = {k for k in vars(sys.modules[cls.__module__]) if k.isupper() and len(k) > 2}
        for key, doc in field_docs(cls).items():
            pointers = re.findall(r"\w+\.py\b|``|\b(?:curate|train|pipelines)\.[a-z_]+\.[a-z_]", doc)
            code = [word for word in re.findall(r"\b[A-Z][A-Z0-9_]+\b", doc) if word in constants]
            cut = doc.endswith((",", ";", ":", "(")) or doc.count("(") != doc.count(")")
            if pointers or code or cut:
                bad.append(f"{table} {key}: {doc}")
    assert bad == []


def test_a_comment_continued_below_its_field_and_one_above_a_field_are_whole():
    from winnow.curate.config import JobSection
    from winnow.pipelines.config import field_docs
    from winnow.train.config import TrainConfig

    assert field_docs(TrainConfig)["shards"].endswith("tables mixed at load time; None: the job's output")
    assert field_docs(JobSection)["task_bytes"].startswith(
        "A file larger than this (as stored) is read as several tasks"
    )


def test_every_curation_key_has_a_description():
    import dataclasses

    from winnow.pipelines.config import field_docs

    missing = [
        f"{table} {f.name}"
        for table, cls in _configs(curation_only=True)
        for f in dataclasses.fields(cls)
        if f.init and f.name not in field_docs(cls)
    ]
    assert missing == []


def test_schema_replaces_only_a_schema_it_wrote(tmp_path, capsys):
    job = tmp_path / "job.toml"
    job.write_text('[job]\nname = "mine"\n')
    assert main(["config", "schema", "-o", str(job)]) == 2
    assert "the file exists and is not a schema winnow wrote" in capsys.readouterr().err
    assert job.read_text() == '[job]\nname = "mine"\n'
    schema = tmp_path / "winnow.schema.json"
    assert main(["config", "schema", "-o", str(schema)]) == 0
    assert main(["config", "schema", "-o", str(schema)]) == 0  # its own file: written again
    assert json.loads(schema.read_text())["title"] == "winnow job file"


def test_a_stage_that_acts_on_the_whole_mixture_does_not_list_the_sources_it_refuses(capsys):
    """`config show mix` and `order` listed a `sources` key that the stages refuse ("sources cannot scope this
    stage"); the JSON schema and the reference page took it from the same fields."""
    from winnow.curate.stages import stage_class
    from winnow.pipelines.config import job_fields

    for kind in ("mix", "order"):
        assert "sources" not in {f.name for f in job_fields(stage_class(kind).Config)}
        assert main(["config", "show", kind]) == 0
        assert not any(line.startswith("sources ") for line in capsys.readouterr().out.splitlines())
    assert "sources" in {f.name for f in job_fields(stage_class("filter.length").Config)}
