"""A resumed job notices inputs that changed since its work began.

A job killed part way and re-run after an input was edited redoes the changed input's read task
and everything after phase 0, and only those: the unchanged inputs' finished phase-0 tasks are kept.
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from winnow.curate.pipeline import run_job
from winnow.curate.stages.filters.length import LengthFilter
from winnow.pipelines.jobfile import load_job

BODY = """keep_work = true
group_bytes = 0  # a task per input file: an edited file redoes its own task

[[inputs]]
source = "s"
path = "{path}"

[[stages]]
kind = "filter.length"
min_words = 2
"""


def write_inputs(folder: Path, edited: bool = False, *, middle: bool = False) -> None:
    """Three input files; ``edited``: rewrite only the first, with a same-size edit (any rewrite is a change)."""
    for f in [0] if edited else range(3):
        texts = [f"file {f} words number {i}" for i in range(6)]
        if middle and f == 0:  # 300 KiB: the edit below is far from the first and last 64 KiB
            texts = [f"file {f} words number {i} " + "filler " * 150 for i in range(300)]
        if edited and f == 0:
            at = 150 if middle else 2
            texts[at] = texts[at].replace("words", "WORDS")  # same size: only the content hash sees it
        (folder / f"p{f}.jsonl").write_bytes(
            b"".join(orjson.dumps({"id": f"{f}-{i}", "text": t}) + b"\n" for i, t in enumerate(texts))
        )
        os.utime(folder / f"p{f}.jsonl", ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))


def crashed_in_the_last_task(tmp_path: Path, write_job, monkeypatch, name: str, *, middle: bool = False):
    """Write the inputs, run the job until its stage crashes on the last file's rows; returns (job, data folder)."""
    data = tmp_path / "data"
    data.mkdir()
    write_inputs(data, middle=middle)
    job = load_job(write_job(BODY.format(path=data / "*.jsonl"), name=name))
    original = LengthFilter.apply

    def crash(self, batch):
        if batch["id"][0].startswith("2-"):
            raise RuntimeError("simulated crash in the last task")
        return original(self, batch)

    monkeypatch.setattr(LengthFilter, "apply", crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_job(job, progress=False)
    monkeypatch.setattr(LengthFilter, "apply", original)
    return job, data


def shard_texts(manifest: dict, out: Path) -> list[str]:
    import polars as pl

    files = [out / s["path"] for s in manifest["shards"] if s["format"] == "parquet"]
    return sorted(pl.read_parquet(files)["text"].to_list())


def test_edited_input_is_reread_on_resume_and_only_its_task_is_redone(tmp_path, write_job, monkeypatch, caplog):
    job, data = crashed_in_the_last_task(tmp_path, write_job, monkeypatch, "edit")
    phase0 = job.output_dir / "_work" / "phase-0"
    before = {p.name: (p / "stats.json").stat().st_mtime_ns for p in phase0.glob("task-*")}
    assert sorted(before) == ["task-00000", "task-00001"]

    write_inputs(data, edited=True)
    with caplog.at_level("WARNING", logger="winnow.curate.pipeline"):
        resumed = run_job(job, progress=False)
    said = " ".join(r.getMessage() for r in caplog.records)
    assert f"input {data / 'p0.jsonl'} changed (head_tail_sha256" in said and "redoing 1 read task(s)" in said
    assert any("WORDS" in t for t in shard_texts(resumed, job.output_dir))  # the edit is in the output
    after = {p.name: (p / "stats.json").stat().st_mtime_ns for p in phase0.glob("task-*")}
    assert after["task-00001"] == before["task-00001"] and after["task-00000"] != before["task-00000"]

    clean = run_job(load_job(write_job(BODY.format(path=data / "*.jsonl"), name="clean")), progress=False)
    assert [s["sha256"] for s in resumed["shards"]] == [s["sha256"] for s in clean["shards"]]
    assert resumed["totals"] == {**clean["totals"], "seconds": resumed["totals"]["seconds"]}


def test_a_file_added_to_a_glob_is_read_on_resume(tmp_path, write_job, monkeypatch, nothing_lost):
    job, data = crashed_in_the_last_task(tmp_path, write_job, monkeypatch, "add")
    (data / "p0a.jsonl").write_bytes(orjson.dumps({"id": "new", "text": "a new document here"}) + b"\n")
    resumed = run_job(job, progress=False)
    nothing_lost(job.output_dir, {f"{f}-{i}" for f in range(3) for i in range(6)} | {"new"})
    assert "a new document here" in shard_texts(resumed, job.output_dir)


def test_an_edit_in_the_middle_keeping_size_and_mtime_is_noticed(tmp_path, write_job, monkeypatch, caplog):
    """The README's claim: an edit "even to the same size and mtime" is noticed, here past the head and tail hashed."""
    job, data = crashed_in_the_last_task(tmp_path, write_job, monkeypatch, "middle", middle=True)
    size = (data / "p0.jsonl").stat().st_size
    write_inputs(data, edited=True, middle=True)  # same size, and write_inputs sets the mtime back
    assert (data / "p0.jsonl").stat().st_size == size and size > 4 * (64 << 10)
    with caplog.at_level("WARNING", logger="winnow.curate.pipeline"):
        resumed = run_job(job, progress=False)
    said = " ".join(r.getMessage() for r in caplog.records)
    assert f"input {data / 'p0.jsonl'} changed (" in said and "redoing 1 read task(s)" in said
    assert (
        "head_tail_sha256" not in said
    )  # the head and tail are the same: the change time and the sampled blocks saw it
    assert any("WORDS" in t for t in shard_texts(resumed, job.output_dir))


def test_where_the_storage_gives_no_identity_sampled_blocks_see_a_middle_edit(tmp_path, monkeypatch):
    """An HTTP or FTP input has no ETag or change time: 16 blocks between the head and the tail are hashed instead."""
    import winnow.curate.fingerprint as fingerprint

    monkeypatch.setattr(fingerprint, "_identity", lambda url, options: {})
    path = tmp_path / "big.jsonl"
    data = bytearray(b"x" * (1 << 20))
    path.write_bytes(data)
    before = fingerprint.file_fingerprint(str(path), len(data), 1.0, {})
    at = 64 * 1024 + (len(data) - 2 * 64 * 1024 - 4096) * 8 // 17  # inside the 8th sampled block
    data[at + 10] = ord("y")
    path.write_bytes(data)
    after = fingerprint.file_fingerprint(str(path), len(data), 1.0, {})
    assert after["head_tail_sha256"] == before["head_tail_sha256"] and after["blocks_sha256"] != before["blocks_sha256"]


def test_a_finished_job_run_again_on_the_same_inputs_curates_nothing(tmp_path, write_job, caplog):
    """It curated everything again (hours on a real corpus; `winnow run` after an interrupted training paid it
    too). --overwrite, an edited input and a removed shard curate again."""
    (tmp_path / "in").mkdir()
    write_inputs(tmp_path / "in")
    job = load_job(write_job(BODY.replace("keep_work = true\n", "").format(path=tmp_path / "in" / "*.jsonl")))
    out = tmp_path / "out" / "t"

    def curate(**kw) -> tuple[dict, bool]:
        caplog.clear()
        with caplog.at_level("INFO", logger="winnow.curate.progress"):
            manifest = run_job(job, progress=False, **kw)
        return manifest, "is up to date" in caplog.text

    first, skipped = curate()
    texts, stamp = shard_texts(first, out), (out / "manifest.json").stat().st_mtime_ns
    assert not skipped and curate() == (first, True) and (out / "manifest.json").stat().st_mtime_ns == stamp
    again, skipped = curate(overwrite=True)
    assert not skipped and shard_texts(again, out) == texts
    write_inputs(tmp_path / "in", edited=True)  # same size, same mtime: the read tasks' fingerprints see it
    edited, skipped = curate()
    assert not skipped and shard_texts(edited, out) != texts
    assert curate()[1]
    next(out.glob("shards/parquet/*/*.parquet")).unlink()
    assert not curate()[1]


def test_an_input_cut_or_grown_while_the_job_reads_it_is_said(tmp_path, write_job, monkeypatch, caplog):
    """The job exited 0 with the rows it happened to read and no word that the file had changed under it."""
    from winnow.curate.pipeline import Runner

    (tmp_path / "in").mkdir()
    write_inputs(tmp_path / "in")
    job = load_job(write_job(BODY.replace("keep_work = true\n", "").format(path=tmp_path / "in" / "*.jsonl")))
    run_phase = Runner._run_phase

    def grown_after_reading(self, phase, specs):
        results = run_phase(self, phase, specs)
        with open(tmp_path / "in" / "p1.jsonl", "ab") as f:  # another writer appends a record
            f.write(orjson.dumps({"id": "late", "text": "a late record of words"}) + b"\n")
        return results

    monkeypatch.setattr(Runner, "_run_phase", grown_after_reading)
    with caplog.at_level("WARNING", logger="winnow.curate.pipeline"):
        run_job(job, progress=False)
    assert "inputs changed while the job read them: input" in caplog.text and "p1.jsonl changed (" in caplog.text
    monkeypatch.setattr(Runner, "_run_phase", run_phase)
    caplog.clear()
    with caplog.at_level("INFO"):
        manifest = run_job(job, progress=False)  # not up to date: the late record is curated
    assert "is up to date" not in caplog.text and "a late record of words" in shard_texts(
        manifest, tmp_path / "out" / "t"
    )


def test_a_finished_job_curates_again_when_a_file_it_names_changes_or_a_token_file_is_gone(tmp_path, write_job, caplog):
    """The up-to-date check compared the inputs alone: a retrained tokenizer kept the old token shards."""
    from tests.curate.test_writers_tokens import gpt2_style_tokenizer

    (tmp_path / "in").mkdir()
    write_inputs(tmp_path / "in")
    tokenizer = tmp_path / "tokenizer.json"
    gpt2_style_tokenizer(tokenizer, "file words number " * 50)
    body = BODY.replace("keep_work = true\n", "").format(path=tmp_path / "in" / "*.jsonl")
    body += f'[output]\nformats = ["parquet", "tokens"]\n[output.tokens]\ntokenizer = "{tokenizer}"\n'
    job = load_job(write_job(body))
    out = tmp_path / "out" / "t"

    def skipped() -> bool:
        caplog.clear()
        with caplog.at_level("INFO", logger="winnow.curate.progress"):
            run_job(job, progress=False)
        return "is up to date" in caplog.text

    assert not skipped() and skipped()
    gpt2_style_tokenizer(tokenizer, "other words entirely " * 50)  # retrained: other ids for the same text
    assert not skipped() and skipped()
    next(out.glob("shards/tokens/*/*.idx")).unlink()  # the .bin alone does not make a token shard
    assert not skipped()


def test_a_saved_hugging_face_dataset_read_unchanged_is_not_said_to_have_changed(tmp_path, write_job, caplog):
    """A `save_to_disk` folder is sized by its files: its own stat size (4096) read as a change on every run."""
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"id": ["a", "b"], "text": ["first text", "second text"]}).save_to_disk(tmp_path / "ds")
    job = load_job(write_job(f'\n[[inputs]]\nsource = "s"\npath = "{tmp_path / "ds"}"\nformat = "hf"\n'))
    with caplog.at_level("WARNING", logger="winnow.curate.pipeline"):
        run_job(job, progress=False)
    assert "changed while the job read them" not in caplog.text
