"""A phase's spill is deleted once the next phase has read it, and a resume still gives the same output.

Without it the work folder of a job with k phases held k copies of the surviving rows (4.5 KB per
0.9 KB document on the scale bench's demo job); now it holds about two.
"""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

import orjson
import polars as pl
import pytest

from winnow import curate
from winnow.curate.dedup.minhash import MinHashDedup
from winnow.curate.pipeline import run_job
from winnow.curate.workdir import RELEASED, SPILL
from winnow.pipelines.jobfile import load_job

BODY = """{keep}
group_bytes = 0  # a task per input file
[[inputs]]
source = "s"
path = "{path}"

[[stages]]
kind = "dedup.exact"

[[stages]]
kind = "dedup.minhash"
threshold = 0.7
"""


def write_inputs(folder: Path, edited: bool = False) -> None:
    """Three input files; ``edited``: rewrite only the first, with a changed document (any rewrite is a change)."""
    for f in [0] if edited else range(3):
        texts = [f"document {i} of file {f}: " + " ".join(f"w{(i * 7 + k) % 50}" for k in range(40)) for i in range(12)]
        texts[3] = texts[2]  # an exact copy, so both barriers remove something
        if edited and f == 0:
            texts[5] = "an edited document with words that no other document of these files has at all"
        (folder / f"p{f}.jsonl").write_bytes(
            b"".join(orjson.dumps({"id": f"{f}-{i}", "text": t}) + b"\n" for i, t in enumerate(texts))
        )
        os.utime(folder / f"p{f}.jsonl", ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))


def shard_rows(manifest: dict, out: Path) -> list[tuple[str, str]]:
    files = [out / s["path"] for s in manifest["shards"] if s["format"] == "parquet"]
    return sorted(pl.read_parquet(files).select("id", "text").iter_rows())


def fresh(tmp_path: Path, write_job, data: Path, name: str) -> list[tuple[str, str]]:
    job = load_job(write_job(BODY.format(keep="", path=data / "*.jsonl"), name=name))
    return shard_rows(run_job(job, progress=False), job.output_dir)


@pytest.fixture
def stopped_at_the_second_plan(tmp_path, write_job, monkeypatch):
    """The job run until MinHash's plan (phase 1 done, phase 0 read by it) fails; returns (job, data folder)."""
    data = tmp_path / "data"
    data.mkdir()
    write_inputs(data)
    job = load_job(write_job(BODY.format(keep="", path=data / "*.jsonl"), name="stopped"))
    original = MinHashDedup.plan

    def fail(self, keys):
        raise RuntimeError("simulated failure in the MinHash plan")

    monkeypatch.setattr(MinHashDedup, "plan", fail)
    with pytest.raises(RuntimeError, match="simulated failure"):
        run_job(job, progress=False)
    monkeypatch.setattr(MinHashDedup, "plan", original)
    return job, data


def test_a_read_phase_keeps_only_its_stats(stopped_at_the_second_plan):
    job, _ = stopped_at_the_second_plan
    work = job.output_dir / "_work"
    phase0 = sorted((work / "phase-0").glob("task-*"))
    assert len(phase0) == 3
    for folder in phase0:
        assert (folder / RELEASED).exists() and (folder / "stats.json").exists()
        assert not any((folder / name).exists() for name in SPILL)
    for folder in sorted((work / "phase-1").glob("task-*")):  # the plan that failed still needs these
        assert (folder / "rows.parquet").exists() and (folder / "keys.parquet").exists()
        assert not (folder / RELEASED).exists()


def test_resume_after_release_gives_the_fresh_output(stopped_at_the_second_plan, tmp_path, write_job):
    job, data = stopped_at_the_second_plan
    resumed = run_job(job, progress=False)
    assert shard_rows(resumed, job.output_dir) == fresh(tmp_path, write_job, data, "fresh")
    assert not (job.output_dir / "_work").exists()


def test_an_input_edited_after_release_is_reread_with_every_released_task(
    stopped_at_the_second_plan, tmp_path, write_job, caplog
):
    job, data = stopped_at_the_second_plan
    write_inputs(data, edited=True)
    with caplog.at_level("WARNING", logger="winnow.curate.pipeline"):
        resumed = run_job(job, progress=False)
    assert "redoing 1 read task(s)" in " ".join(r.getMessage() for r in caplog.records)
    rows = shard_rows(resumed, job.output_dir)
    assert ("0-5", "an edited document with words that no other document of these files has at all") in rows
    assert rows == fresh(tmp_path, write_job, data, "fresh-edited")  # the released, unchanged tasks were redone too


def test_keep_work_keeps_every_phase(tmp_path, write_job):
    data = tmp_path / "data"
    data.mkdir()
    write_inputs(data)
    job = load_job(write_job(BODY.format(keep="keep_work = true\n", path=data / "*.jsonl"), name="kept"))
    run_job(job, progress=False)
    for phase in ("phase-0", "phase-1"):
        folders = sorted((job.output_dir / "_work" / phase).glob("task-*"))
        assert folders and all((f / "rows.parquet").exists() and not (f / RELEASED).exists() for f in folders)


def _spill_codecs(out: Path) -> set[str]:
    """The compression of every column chunk of the kept spills (rows, keys) under ``out``'s work folder."""
    import pyarrow.parquet as pq

    found = set()
    for path in [*(out / "_work").rglob("rows.parquet"), *(out / "_work").rglob("keys.parquet")]:
        meta = pq.ParquetFile(path).metadata
        found |= {
            meta.row_group(g).column(c).compression for g in range(meta.num_row_groups) for c in range(meta.num_columns)
        }
    return found


@pytest.mark.parametrize("free", [10**15, 10**3], ids=["roomy disk", "full disk"])
def test_spills_are_compressed_unless_the_job_is_small_against_the_free_disk(tmp_path, write_job, monkeypatch, free):
    data = tmp_path / "data"
    data.mkdir()
    write_inputs(data)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(curate.tasks.shutil, "disk_usage", lambda path: usage._replace(free=free))
    job = load_job(write_job(BODY.format(keep="keep_work = true\n", path=data / "*.jsonl"), name="kept"))
    rows = shard_rows(run_job(job, progress=False), job.output_dir)
    assert _spill_codecs(job.output_dir) == ({"UNCOMPRESSED"} if free > 10**9 else {"LZ4"})
    assert rows == fresh(tmp_path, write_job, data, "fresh")  # the outputs do not depend on it


def test_spill_codec_counts_compressed_inputs_five_times_and_stores_compress(tmp_path, monkeypatch):
    from winnow.curate.config import InputConfig
    from winnow.curate.readers import plan_read_tasks
    from winnow.curate.tasks import spill_codec
    from winnow.curate.workdir import WorkDir

    (tmp_path / "a.jsonl").write_bytes(b'{"text": "x"}\n' * 1000)  # 14 kB
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(b'{"text": "y"}\n' * 1000))
    inputs = [
        InputConfig(source="a", path=str(tmp_path / "a.jsonl")),
        InputConfig(source="b", path=str(tmp_path / "b.jsonl.gz")),
    ]
    tasks = plan_read_tasks(inputs)
    text = (tmp_path / "a.jsonl").stat().st_size + 5 * (tmp_path / "b.jsonl.gz").stat().st_size
    work = WorkDir(str(tmp_path / "out"))  # not made yet: the free space is its disk's
    real = shutil.disk_usage
    for free, codec in ((100 * text, "none"), (100 * text - 1, "lz4")):
        monkeypatch.setattr(curate.tasks.shutil, "disk_usage", lambda path, _f=free: real(path)._replace(free=_f))
        assert spill_codec(inputs, tasks, work) == codec
        assert spill_codec(inputs, tasks + tasks, work) == codec  # a file in several tasks (spans) counts once
    assert spill_codec(inputs, tasks, WorkDir("s3://bucket/job")) == "lz4"


def test_resume_with_the_other_spill_codec_gives_the_fresh_output(
    stopped_at_the_second_plan, tmp_path, write_job, monkeypatch
):
    job, data = stopped_at_the_second_plan  # its spills were written uncompressed (this disk is roomy)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(curate.tasks.shutil, "disk_usage", lambda path: usage._replace(free=0))
    resumed = run_job(job, progress=False)  # the phases still to run spill with lz4, and read the others' files
    assert shard_rows(resumed, job.output_dir) == fresh(tmp_path, write_job, data, "fresh")
