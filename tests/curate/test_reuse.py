"""Reusing a baseline job's work: phases keyed by the job prefix they depend on, adopted only while it matches."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from winnow.curate.pipeline import run_job
from winnow.curate.workdir import REUSED, WorkDir
from winnow.pipelines.jobfile import load_job

JOB = """
[job]
name = "reuse"
output = "{out}"
batch_rows = 16
keep_work = true
group_bytes = 0  # a task per input file

[[inputs]]
source = "news"
path = "{root}/news/*.jsonl"

[[inputs]]
source = "blogs"
path = "{root}/blogs/*.jsonl"

[[stages]]
kind = "clean"

[[stages]]
kind = "filter.length"
min_words = {min_words}

[[stages]]
kind = "dedup.exact"

[[stages]]
kind = "dedup.minhash"
threshold = {threshold}

[[stages]]
kind = "split"
val_fraction = 0.2

[[stages]]
kind = "order"
by = "length"

[output]
formats = ["parquet"]
shard_rows = 20
"""


@pytest.fixture
def inputs(tmp_path) -> Path:
    """Two sources of 30 documents each; blogs 0-5 copy news exactly, blogs 6-11 with three words edited
    (Jaccard of their 5-word shingles about 0.75: duplicates at threshold 0.7, not at 0.8)."""
    root = tmp_path / "in"
    rng = np.random.default_rng(0)
    news = [" ".join(f"w{j}" for j in rng.integers(0, 10**5, size=100)) for _ in range(30)]
    blogs = [" ".join(f"v{j}" for j in rng.integers(0, 10**5, size=100 - i)) for i in range(30)]
    blogs[:6] = news[:6]
    for i in range(6, 12):
        words = news[i].split()
        for k in (20, 50, 80):
            words[k] = f"edited{k}"
        blogs[i] = " ".join(words)
    for name, prefix, texts in (("news", "n", news), ("blogs", "b", blogs)):
        (root / name).mkdir(parents=True)
        for part in range(2):
            lines = [json.dumps({"id": f"{prefix}{i:02d}", "text": t}) for i, t in enumerate(texts) if i % 2 == part]
            (root / name / f"{part}.jsonl").write_text("\n".join(lines) + "\n")
    return root


def _job(
    tmp_path: Path, inputs: Path, out: str, *, threshold: float = 0.8, min_words: int = 10, keep_work: bool = True
):
    path = tmp_path / f"{out}.toml"
    path.write_text(JOB.format(out=tmp_path / out, root=inputs, threshold=threshold, min_words=min_words))
    job = load_job(path)
    return dataclasses.replace(job, job=dataclasses.replace(job.job, keep_work=keep_work))


def _files(out: Path) -> dict[str, str]:
    """sha256 of every shard and rejects file of a job folder."""
    return {
        p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for folder in ("shards", "rejects")
        for p in sorted((out / folder).rglob("*"))
        if p.is_file()
    }


def test_a_threshold_variant_reuses_the_phases_before_dedup_and_equals_a_fresh_run(tmp_path, inputs):
    base = tmp_path / "base"
    run_job(_job(tmp_path, inputs, "base"), progress=False)
    variant = tmp_path / "variant"
    manifest = run_job(_job(tmp_path, inputs, "variant", threshold=0.7), progress=False, reuse_from=base)
    fresh = tmp_path / "fresh"
    run_job(_job(tmp_path, inputs, "fresh", threshold=0.7, keep_work=False), progress=False)

    # phase 0: read → collect 01.clean (boilerplate); phase 1: apply it → filter.length → collect 03.dedup.exact;
    # phase 2: apply that → collect 04.dedup.minhash, whose keys (LSH bands) depend on the threshold
    work, base_work = WorkDir(str(variant)), WorkDir(str(base))
    tasks = sorted(p.name for p in work.phase(0).glob("task-*"))
    assert len(tasks) == 4
    for phase in (0, 1):
        for name in tasks:
            marker = json.loads((work.phase(phase) / name / REUSED).read_text())
            assert marker == {"from": str(base), "prefix": work.phase_prefix(phase).read_text()}
            assert os.path.samefile(
                work.phase(phase) / name / "stats.json", base_work.phase(phase) / name / "stats.json"
            )
            assert (work.phase(phase) / name / "rows.parquet").is_file()  # kept: keep_work
    assert all((work.plan(sid) / REUSED).is_file() for sid in ("01.clean", "03.dedup.exact"))
    assert not any((work.phase(2) / name / REUSED).exists() for name in tasks)  # the threshold changed its key
    assert not (work.plan("04.dedup.minhash") / REUSED).exists()
    assert work.phase_prefix(2).read_text() != base_work.phase_prefix(2).read_text()
    assert manifest["reused"] == {"from": str(base), "phases": [0, 1], "plans": ["01.clean", "03.dedup.exact"]}

    assert _files(variant) == _files(fresh)  # byte for byte what the job computes from scratch
    assert _files(variant) != _files(base)
    rejected = {s["id"]: s["rows_rejected"] for s in json.loads((fresh / "manifest.json").read_text())["stages"]}
    assert (
        rejected["04.dedup.minhash"]
        > {s["id"]: s["rows_rejected"] for s in json.loads((base / "manifest.json").read_text())["stages"]}[
            "04.dedup.minhash"
        ]
    )  # 0.7 catches the edited copies


def test_a_change_before_a_phase_or_to_its_inputs_is_never_reused(tmp_path, inputs):
    base = tmp_path / "base"
    run_job(_job(tmp_path, inputs, "base"), progress=False)
    manifest = run_job(_job(tmp_path, inputs, "stricter", min_words=90), progress=False, reuse_from=base)
    assert manifest["reused"]["phases"] == [0]  # only the phase before the filter: every later one depends on it
    assert not list((tmp_path / "stricter" / "_work" / "phase-1").rglob(REUSED))

    edited = inputs / "news" / "1.jsonl"
    edited.write_text(edited.read_text().replace("w", "x", 1))
    manifest = run_job(_job(tmp_path, inputs, "edited", threshold=0.7), progress=False, reuse_from=base)
    assert "reused" not in manifest  # an input file changed since the baseline's phases ran
    run_job(_job(tmp_path, inputs, "edited-fresh", threshold=0.7, keep_work=False), progress=False)
    assert _files(tmp_path / "edited") == _files(tmp_path / "edited-fresh")
