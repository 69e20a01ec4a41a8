"""dedup.exact + dedup.minhash through the runner: nothing lost, cross-source counts, resume, the sample data."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import numpy as np
import orjson
import polars as pl
import pytest

from winnow import curate
from winnow.curate.dedup.minhash import MinHashDedup
from winnow.curate.pipeline import Runner, run_job
from winnow.pipelines.jobfile import load_job

REPO = Path(__file__).resolve().parents[2]

JOB = """
workers = {workers}
batch_rows = 8
group_bytes = 0  # a task per input file: four tasks to spread

[[inputs]]
source = "news"
path = "{root}/news/*.jsonl"

[[inputs]]
source = "blogs"
path = "{root}/blogs/*.jsonl"

[[stages]]
kind = "dedup.exact"

[[stages]]
kind = "dedup.minhash"

[output]
formats = ["parquet"]
shard_rows = 50
"""


def _two_sources(root: Path) -> set[str]:
    """news and blogs, 40 docs each: blogs/b0-4 copy news exactly, blogs/b5-9 edit one word of news."""
    rng = np.random.default_rng(0)
    news = [" ".join(f"w{j}" for j in rng.integers(0, 10**5, size=120)) for _ in range(40)]
    blogs = [" ".join(f"v{j}" for j in rng.integers(0, 10**5, size=120)) for _ in range(40)]
    blogs[:5] = news[:5]
    for i in range(5, 10):
        words = news[i].split()
        words[60] = "edited"
        blogs[i] = " ".join(words)
    ids = set()
    for name, prefix, texts in (("news", "n", news), ("blogs", "b", blogs)):
        (root / name).mkdir(parents=True)
        for part in range(2):
            rows = [{"id": f"{prefix}{i:02d}", "text": t} for i, t in enumerate(texts) if i % 2 == part]
            (root / name / f"part{part}.jsonl").write_bytes(b"\n".join(orjson.dumps(r) for r in rows) + b"\n")
        ids |= {f"{prefix}{i:02d}" for i in range(40)}
    return ids


def _kept(job) -> list[str]:
    return sorted(pl.read_parquet(job.output_dir / "shards" / "parquet" / "train")["id"].to_list())


@pytest.mark.slow
def test_job_dedups_across_sources_and_loses_nothing(tmp_path, write_job, nothing_lost):
    ids = _two_sources(tmp_path / "in")
    job = load_job(write_job(JOB.format(workers=2, root=tmp_path / "in")))
    run_job(job, progress=False)
    manifest = nothing_lost(job.output_dir, ids)
    exact, near = (s for s in manifest["stages"] if s["id"].endswith(("dedup.exact", "dedup.minhash")))
    assert exact["rejected"] == {"dedup:exact": 5} and near["rejected"] == {"dedup:minhash": 5}
    assert exact["report"]["cross_source_duplicates"] == {"blogs|news": 5}
    assert near["report"]["cross_source_duplicates"] == {"blogs|news": 5}
    # "first" keeps the lowest id: b.. sorts before n.., so the news copies go.
    assert near["report"]["removed_per_source"] == {"news": 5}
    rejects = pl.read_parquet(job.output_dir / "rejects" / "*.parquet")
    assert sorted(rejects.filter(pl.col("reason") == "dedup:minhash")["duplicate_of"].to_list()) == [
        f"b{i:02d}" for i in range(5, 10)
    ]


@pytest.mark.slow
def test_a_dedup_job_runs_its_tasks_as_threads_and_writes_the_shards_worker_processes_write(
    tmp_path, write_job, monkeypatch
):
    root = tmp_path / "in"
    _two_sources(root)
    ran = []
    run_task = curate.pipeline.run_task

    def recorded(spec):
        ran.append((spec.phase.index, os.getpid(), threading.current_thread().name))
        return run_task(spec)

    monkeypatch.setattr(curate.pipeline, "run_task", recorded)
    both = JOB.format(workers=2, root=root).replace('formats = ["parquet"]', 'formats = ["parquet", "webdataset"]')
    threads = load_job(write_job(both, name="threads"))
    shards = run_job(threads, progress=False)["shards"]
    # Every task of the three phases ran in this process, on the executor's threads: no worker process started.
    assert len(ran) == 3 * 4 and {pid for _, pid, _ in ran} == {os.getpid()}
    assert all(name.startswith("winnow-task") for _, _, name in ran)

    monkeypatch.setattr(Runner, "threaded", lambda self, phase: False)
    processes = load_job(write_job(both, name="processes"))
    assert run_job(processes, progress=False)["shards"] == shards  # same paths, rows and sha256
    assert len(ran) == 3 * 4  # the process pool's tasks ran elsewhere
    assert _kept(threads) == _kept(processes) and len(_kept(threads)) == 70


def test_only_phases_that_release_the_gil_run_as_threads(tmp_path, write_job):
    root = tmp_path / "in"
    _two_sources(root)
    dedup = Runner(load_job(write_job(JOB.format(workers=2, root=root), name="dedup")))
    assert [dedup.threaded(p) for p in dedup.phases] == [True, True, True]
    webdataset = JOB.format(workers=2, root=root).replace(
        'formats = ["parquet"]', 'formats = ["parquet", "webdataset"]'
    )
    tar = Runner(load_job(write_job(webdataset, name="tar")))
    assert [tar.threaded(p) for p in tar.phases] == [True, True, True]  # tars are assembled by Arrow
    tokens = JOB.format(workers=2, root=root).replace('formats = ["parquet"]', 'formats = ["parquet", "tokens"]')
    tokenized = Runner(load_job(write_job(tokens, name="tokens")))
    assert [tokenized.threaded(p) for p in tokenized.phases] == [True, True, False]  # a tokenizer's Python per row
    cleaned = JOB.format(workers=2, root=root).replace(
        '[[stages]]\nkind = "dedup.exact"',
        '[[stages]]\nkind = "filter.length"\nmin_words = 2\n\n[[stages]]\nkind = "dedup.exact"',
    )
    filtered = Runner(load_job(write_job(cleaned, name="filtered")))
    assert [filtered.threaded(p) for p in filtered.phases] == [False, True, True]  # filters run per-row Python


@pytest.mark.slow
def test_crash_inside_the_global_phase_then_resume_gives_the_same_kept_set(tmp_path, write_job, monkeypatch):
    ids_root = tmp_path / "in"
    _two_sources(ids_root)
    clean = load_job(write_job(JOB.format(workers=1, root=ids_root), name="clean"))
    run_job(clean, progress=False)

    crashing = load_job(write_job(JOB.format(workers=1, root=ids_root), name="crash"))
    original = MinHashDedup.plan

    def crash_after_grouping(self, keys):
        original(self, keys)  # the work is done, the decision never written
        raise RuntimeError("killed in the middle of the global phase")

    monkeypatch.setattr(MinHashDedup, "plan", crash_after_grouping)
    with pytest.raises(RuntimeError, match="global phase"):
        run_job(crashing, progress=False)
    monkeypatch.setattr(MinHashDedup, "plan", original)
    run_job(crashing, progress=False)
    assert _kept(crashing) == _kept(clean) and len(_kept(clean)) == 70


@pytest.mark.slow
def test_sample_data_dedup_finds_planted_cross_source_copies(tmp_path, write_job):
    planted = json.loads((REPO / "data_samples" / "planted.json").read_text())
    inputs = []
    for name, spec in planted["sources"].items():
        fmt = {"parquet": "parquet", "text": "text"}.get(spec["format"], "jsonl")
        path = REPO / "data_samples" / name if fmt == "text" else REPO / "data_samples" / name / "*"
        inputs.append(f'[[inputs]]\nsource = "{name}"\npath = "{path}"\nformat = "{fmt}"\n')
    body = (
        "workers = 2\n\n"
        + "\n".join(inputs)
        + '\n[[stages]]\nkind = "dedup.exact"\n\n[[stages]]\nkind = "dedup.minhash"\n\n[output]\nformats = ["parquet"]\n'
    )
    job = load_job(write_job(body, name="samples"))
    manifest = run_job(job, progress=False)
    exact, near = (s for s in manifest["stages"] if s["id"].endswith(("dedup.exact", "dedup.minhash")))
    cross = {}
    for source, spec in planted["sources"].items():
        for other, n in spec["cross_source_duplicate"].items():
            pair = "|".join(sorted((source, other)))
            cross[pair] = cross.get(pair, 0) + n
    assert {k: v for k, v in cross.items() if v} == exact["report"]["cross_source_duplicates"]
    near_records = [r for r in planted["records"] if r["kind"] == "near_duplicate" and r["jaccard"] >= 0.8]
    removed = set(
        pl.read_parquet(job.output_dir / "rejects" / "*.parquet")
        .filter(pl.col("reason").str.starts_with("dedup:"))["id"]
        .to_list()
    )
    # The text reader names legal rows "legal/<file name>"; planted.json uses the bare file name.
    row_id = {"legal": "legal/{}".format}
    caught = sum(bool({row_id.get(r["source"], str)(r[k]) for k in ("id", "of")} & removed) for r in near_records)
    assert caught >= 0.98 * len(near_records) and near["report"]["removed"] > 0
