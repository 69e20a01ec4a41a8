"""The runner: counts, nothing-is-lost, round trips, peers reading the outputs, errors and resume."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import polars as pl
import pytest

from winnow.curate.errors import InputError, StageError
from winnow.curate.pipeline import run_job
from winnow.curate.stages.filters.length import LengthFilter
from winnow.pipelines.jobfile import load_job

REPO = Path(__file__).resolve().parents[2]


def make_inputs(tmp_path: Path, n_files: int = 3, per_file: int = 40) -> set[str]:
    ids = set()
    for f in range(n_files):
        lines = []
        for i in range(per_file):
            doc_id = f"f{f}-{i}"
            ids.add(doc_id)
            lines.append(orjson.dumps({"id": doc_id, "text": " ".join(["word"] * (i % 12)), "k": i}))
        (tmp_path / f"part{f}.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return ids


JOB = """
workers = {workers}
batch_rows = 16
group_bytes = 0  # a task per input file: these tests crash, resume and spread tasks

[[inputs]]
source = "web"
path = "{path}"

[[stages]]
kind = "filter.length"
min_words = 3

[output]
shard_rows = 25
"""


def test_job_counts_every_row_and_loses_none(tmp_path, write_job, nothing_lost):
    ids = make_inputs(tmp_path)
    job = load_job(write_job(JOB.format(workers=1, path=tmp_path / "*.jsonl")))
    manifest = run_job(job, progress=False)
    nothing_lost(job.output_dir, ids)
    assert [st["id"] for st in manifest["stages"]] == ["00.read", "00.ids", "01.filter.length"]
    length = manifest["stages"][2]
    assert length["rejected"] == {"filter:length_min_words": 3 * 12}  # i % 12 < 3: 12 of each file's 40 docs
    assert manifest["by_source"]["web"]["read"] == 120
    assert manifest["config"]["resolved"]["stages"][0]["min_words"] == 3
    assert {"polars", "pyarrow", "python"} <= set(manifest["packages"])
    assert len(manifest["inputs"][0]["files"]) == 3 and manifest["inputs"][0]["files"][0]["bytes"] > 0


def test_outputs_load_with_datasets_polars_and_webdataset(tmp_path, write_job):
    import datasets
    import webdataset as wds

    make_inputs(tmp_path)
    job = load_job(write_job(JOB.format(workers=1, path=tmp_path / "*.jsonl")))
    manifest = run_job(job, progress=False)
    parquet = [str(job.output_dir / s["path"]) for s in manifest["shards"] if s["format"] == "parquet"]
    tars = [str(job.output_dir / s["path"]) for s in manifest["shards"] if s["format"] == "webdataset"]
    n = manifest["totals"]["rows_written"]
    assert datasets.load_dataset("parquet", data_files=parquet, split="train").num_rows == n
    assert pl.scan_parquet(parquet).select(pl.len()).collect().item() == n
    assert sum(1 for _ in wds.WebDataset(tars, shardshuffle=False)) == n


@pytest.mark.parametrize("fmt", ["parquet", "webdataset"])
def test_round_trip_read_write_read_gives_same_rows(tmp_path, write_job, fmt):
    make_inputs(tmp_path)
    first = load_job(write_job(JOB.format(workers=1, path=tmp_path / "*.jsonl"), name="first"))
    m1 = run_job(first, progress=False)
    ext = "parquet" if fmt == "parquet" else "tar"
    body = f"""
[[inputs]]
source_field = "source"
path = "{first.output_dir}/shards/{fmt}/train/*.{ext}"
format = "{fmt}"
"""
    second = load_job(write_job(body, name="second"))
    m2 = run_job(second, progress=False)

    def read(job, m):
        return pl.concat([pl.read_parquet(job.output_dir / s["path"]) for s in m["shards"] if s["format"] == "parquet"])

    assert read(first, m1).equals(read(second, m2))


def test_multi_worker_run_matches_single_worker(tmp_path, write_job):
    make_inputs(tmp_path, n_files=4)
    one = run_job(load_job(write_job(JOB.format(workers=1, path=tmp_path / "*.jsonl"), name="one")), progress=False)
    two = run_job(load_job(write_job(JOB.format(workers=2, path=tmp_path / "*.jsonl"), name="two")), progress=False)
    assert [s["sha256"] for s in one["shards"]] == [s["sha256"] for s in two["shards"]]


def test_stage_that_loses_rows_is_caught(tmp_path, write_job, monkeypatch):
    make_inputs(tmp_path, n_files=1)
    original = LengthFilter.apply

    def lossy(self, batch):
        out = original(self, batch)
        out.kept = out.kept.head(max(out.kept.height - 1, 0))
        return out

    monkeypatch.setattr(LengthFilter, "apply", lossy)
    with pytest.raises(StageError, match="01.filter.length lost rows"):
        run_job(load_job(write_job(JOB.format(workers=1, path=tmp_path / "*.jsonl"))), progress=False)


def test_undeclared_reason_is_caught(tmp_path, write_job, monkeypatch):
    make_inputs(tmp_path, n_files=1)
    original = LengthFilter.apply

    def rogue(self, batch):
        out = original(self, batch)
        out.rejected = out.rejected.with_columns(pl.lit("filter:made_up").alias("reason"))
        return out

    monkeypatch.setattr(LengthFilter, "apply", rogue)
    with pytest.raises(StageError, match="filter:made_up"):
        run_job(load_job(write_job(JOB.format(workers=1, path=tmp_path / "*.jsonl"))), progress=False)


def test_unopenable_input_is_an_error_or_skipped(tmp_path, write_job):
    (tmp_path / "notadataset").mkdir()
    (tmp_path / "notadataset" / "x.bin").write_bytes(b"junk")
    body = f'on_error = "{{}}"\n[[inputs]]\nsource = "s"\npath = "{tmp_path / "notadataset"}"\nformat = "hf"\n'
    with pytest.raises(InputError, match="notadataset"):
        run_job(load_job(write_job(body.format("raise"), name="r")), progress=False)
    manifest = run_job(load_job(write_job(body.format("skip"), name="s")), progress=False)
    assert len(manifest["skipped_files"]) == 1 and "notadataset" in manifest["skipped_files"][0]["task"]
    assert manifest["totals"]["rows_read"] == 0


def test_crash_inside_a_task_then_rerun_gives_identical_shards(tmp_path, write_job, monkeypatch):
    make_inputs(tmp_path, n_files=4)
    reference = run_job(
        load_job(write_job(JOB.format(workers=1, path=tmp_path / "*.jsonl"), name="ref")), progress=False
    )
    job = load_job(write_job(JOB.format(workers=1, path=tmp_path / "*.jsonl"), name="crash"))
    original, calls = LengthFilter.apply, {"n": 0}

    def crash_on_third_batch(self, batch):
        calls["n"] += 1
        if calls["n"] == 7:
            raise RuntimeError("simulated crash")
        return original(self, batch)

    monkeypatch.setattr(LengthFilter, "apply", crash_on_third_batch)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_job(job, progress=False)
    done = sorted(p.name for p in (job.output_dir / "_work" / "phase-0").iterdir())
    # the finished task kept; the crashed one neither in place nor left half-written (its files removed)
    assert "task-00000" in done and not {"task-00002", ".task-00002.tmp"} & set(done)
    monkeypatch.setattr(LengthFilter, "apply", original)
    resumed = run_job(job, progress=False)
    assert [s["sha256"] for s in resumed["shards"]] == [s["sha256"] for s in reference["shards"]]
    assert resumed["totals"] == {**reference["totals"], "seconds": resumed["totals"]["seconds"]}


def test_work_from_a_stage_whose_artifacts_changed_is_started_afresh_not_resumed(
    tmp_path, write_job, monkeypatch, caplog
):
    """A stage that raises ``artifacts`` (its keys or plans mean something else now) changes the job's
    fingerprint: an interrupted run's work from before is not resumed."""
    from winnow.curate.pipeline import job_fingerprint
    from winnow.curate.stages.clean import Clean

    make_inputs(tmp_path, n_files=4)
    text = JOB.format(workers=1, path=tmp_path / "*.jsonl").replace(
        '[[stages]]\nkind = "filter.length"',
        '[[stages]]\nkind = "clean"\nboilerplate_min_docs = 1000\n\n[[stages]]\nkind = "filter.length"',
    )
    reference = run_job(load_job(write_job(text, name="ref")), progress=False)
    job = load_job(write_job(text, name="crash"))
    original = LengthFilter.apply

    def crash(self, batch):  # in the phase after clean's plan: the work folder holds that plan
        raise RuntimeError("simulated crash")

    monkeypatch.setattr(LengthFilter, "apply", crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_job(job, progress=False)
    monkeypatch.setattr(LengthFilter, "apply", original)
    before = job_fingerprint(job)
    monkeypatch.setattr(Clean, "artifacts", Clean.artifacts + 1)
    assert job_fingerprint(job) != before
    with caplog.at_level("INFO", logger="winnow.curate"):
        rerun = run_job(job, progress=False)
    assert not [r for r in caplog.records if r.getMessage().startswith("resuming")]
    assert [s["sha256"] for s in rerun["shards"]] == [s["sha256"] for s in reference["shards"]]


@pytest.mark.slow
def test_killed_worker_process_then_rerun_gives_identical_shards(tmp_path, write_job):
    """SIGKILL the whole `winnow curate` process mid-job, re-run, compare with a clean run."""
    for f in range(8):
        lines = [orjson.dumps({"id": f"{f}-{i}", "text": "some words here " * (i % 9)}) for i in range(1500)]
        (tmp_path / f"p{f:02d}.jsonl").write_bytes(b"\n".join(lines))
    body = (
        JOB.format(workers=2, path=tmp_path / "*.jsonl")
        .replace("batch_rows = 16", "batch_rows = 500")
        .replace("shard_rows = 25", "shard_rows = 1000")
    )
    ref = run_job(load_job(write_job(body, name="ref")), progress=False)
    job_file = write_job(body, name="killed")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "winnow.pipelines.cli", "-q", "curate", str(job_file)],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    work = tmp_path / "out" / "killed" / "_work" / "phase-0"
    deadline = time.time() + 120
    while time.time() < deadline and not (work.exists() and any(p.name.startswith("task-") for p in work.iterdir())):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    out = subprocess.run(
        [sys.executable, "-m", "winnow.pipelines.cli", "-q", "curate", str(job_file)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    manifest = json.loads((tmp_path / "out" / "killed" / "manifest.json").read_text())
    assert [s["sha256"] for s in manifest["shards"]] == [s["sha256"] for s in ref["shards"]]
    for s in manifest["shards"]:
        assert hashlib.sha256((tmp_path / "out" / "killed" / s["path"]).read_bytes()).hexdigest() == s["sha256"]


def test_stage_scoped_to_sources_passes_other_sources_untouched(tmp_path, write_job, nothing_lost):
    ids = make_inputs(tmp_path, n_files=2)
    body = (
        JOB.format(workers=1, path=tmp_path / "part0.jsonl").replace(
            "min_words = 3", 'min_words = 3\nsources = ["web"]'
        )
        + f'\n[[inputs]]\nsource = "books"\npath = "{tmp_path / "part1.jsonl"}"\n'
    )
    manifest = run_job(load_job(write_job(body)), progress=False)
    nothing_lost(tmp_path / "out" / "t", ids)
    by_source = manifest["stages"][2]["by_source"]
    assert by_source["web"]["rejected"] == {"filter:length_min_words": 12}
    assert by_source["books"] == {"in": 40, "out": 40, "rejected": {}}


def test_job_where_an_early_stage_rejects_everything(tmp_path, write_job, nothing_lost):
    ids = make_inputs(tmp_path, n_files=1)
    body = JOB.format(workers=1, path=tmp_path / "*.jsonl").replace("min_words = 3", "min_words = 1000")
    body += '\n[[stages]]\nkind = "filter.length"\nmax_chars = 5\n'
    manifest = run_job(load_job(write_job(body)), progress=False)
    nothing_lost(tmp_path / "out" / "t", ids)
    assert manifest["totals"]["rows_written"] == 0 and manifest["stages"][3]["rows_in"] == 0


def test_barriers_no_row_reaches_are_not_planned_and_nothing_is_lost(tmp_path, write_job, nothing_lost):
    """All rows filtered before the score barriers, and a scope with no rows: the job still runs."""
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"id": f"a{i}", "text": "short"}) + "\n" for i in range(5)))
    (tmp_path / "b.jsonl").write_text(
        "".join(json.dumps({"id": f"b{i}", "text": f"word {i} " * 30}) + "\n" for i in range(5))
    )
    body = (
        f'[[inputs]]\nsource = "a"\npath = "{tmp_path / "a.jsonl"}"\n'
        f'[[inputs]]\nsource = "b"\npath = "{tmp_path / "b.jsonl"}"\n'
        '[[stages]]\nkind = "filter.length"\nmin_words = 5\nsources = ["a"]\n'
        '[[stages]]\nkind = "score.difficulty"\nsources = ["a"]\n'
        '[[stages]]\nkind = "filter.length"\nmin_words = 1000\n'
        '[[stages]]\nkind = "score.difficulty"\ncolumn = "difficulty_all"\n[[stages]]\nkind = "dedup.minhash"\n'
    )
    job = load_job(write_job(body))
    manifest = run_job(job, progress=False)
    assert manifest["totals"]["rows_written"] == 0 and manifest["totals"]["rows_rejected"] == 10
    nothing_lost(job.output_dir, {f"{s}{i}" for s in "ab" for i in range(5)})


def test_a_later_phase_reads_long_documents_in_smaller_batches(tmp_path, monkeypatch):
    """batch_rows rows of 1 MB documents held gigabytes at once: batches hold about _BATCH_BYTES of rows."""
    from winnow.curate import tasks

    path = tmp_path / "rows.parquet"
    pl.DataFrame({"id": [str(i) for i in range(40)], "text": ["x" * (1000 + i) for i in range(40)]}).write_parquet(path)
    assert [b.height for b in tasks.read_batches(path, 16)] == [16, 16, 8]  # short rows: batch_rows each
    monkeypatch.setattr(tasks, "_BATCH_BYTES", 10_000)
    batches = list(tasks.read_batches(path, 16))
    assert {b.height for b in batches[:-1]} == {9} and pl.concat(batches)["id"].to_list() == [str(i) for i in range(40)]


def test_a_stage_naming_a_source_no_row_had_is_said_when_sources_come_from_a_column(tmp_path, write_job, caplog):
    """With `source_field`, a stage's `sources = ["web"]` over rows of source `Web` filtered nothing, silently."""
    (tmp_path / "in.jsonl").write_text(
        "".join(f'{{"id": "d{i}", "text": "a few words", "src": "Web"}}\n' for i in range(5))
    )
    body = (
        f'[[inputs]]\nsource_field = "src"\npath = "{tmp_path / "in.jsonl"}"\n\n'
        '[[stages]]\nkind = "filter.length"\nsources = ["web"]\nmin_words = 10\n'
    )
    with caplog.at_level("WARNING", logger="winnow.curate.pipeline"):
        manifest = run_job(load_job(write_job(body)), progress=False)
    assert manifest["totals"]["rows_written"] == 5
    assert "key 'sources' names source 'web', which no row had (did you mean 'Web'?)" in caplog.text
