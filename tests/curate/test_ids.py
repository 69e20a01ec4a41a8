"""The job-wide id check: later copies of a given id are ``read:duplicate_id`` rejects.

Before it, two rows with one id were both kept (or both dropped by an id-keyed dedup), and
"every input id is in the output or in rejects, never both" could not be checked.
"""

from __future__ import annotations

import orjson
import polars as pl

from winnow.curate.pipeline import run_job
from winnow.pipelines.jobfile import load_job


def jsonl(path, records) -> None:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))


def rejects(out) -> pl.DataFrame:
    return pl.concat([pl.read_parquet(p) for p in sorted((out / "rejects").glob("*.parquet"))])


def kept(manifest, out) -> pl.DataFrame:
    return pl.read_parquet([out / s["path"] for s in manifest["shards"] if s["format"] == "parquet"])


def test_the_first_copy_wins_before_any_stage_sees_the_rows(tmp_path, write_job, nothing_lost):
    # The first copy is too short for the filter, the later one would pass it: the later one is
    # still the duplicate, so the id is rejected twice (once per copy) and never kept.
    jsonl(
        tmp_path / "a.jsonl",
        [{"id": "x", "text": "short"}, {"id": "y", "text": "one two three"}, {"id": "y", "text": "same id, same file"}],
    )
    jsonl(tmp_path / "b.jsonl", [{"id": "x", "text": "a long enough text here"}, {"id": "z", "text": "one two three"}])
    body = (
        f'[[inputs]]\nsource = "a"\npath = "{tmp_path / "a.jsonl"}"\n'
        f'[[inputs]]\nsource = "b"\npath = "{tmp_path / "b.jsonl"}"\n'
        '[[stages]]\nkind = "filter.length"\nmin_words = 2\n'
    )
    job = load_job(write_job(body))
    manifest = run_job(job, progress=False)
    nothing_lost(job.output_dir, {"x", "y", "z"})
    assert sorted(kept(manifest, job.output_dir)["id"].to_list()) == ["y", "z"]
    got = rejects(job.output_dir).sort("reason", "source")
    assert got.select("id", "source", "reason", "duplicate_of").rows() == [
        ("x", "a", "filter:length_min_words", None),
        ("y", "a", "read:duplicate_id", "y"),
        ("x", "b", "read:duplicate_id", "x"),
    ]
    assert kept(manifest, job.output_dir).filter(pl.col("id") == "y")["text"].to_list() == ["one two three"]
    ids = next(st for st in manifest["stages"] if st["id"] == "00.ids")
    assert ids["report"] == {"rows": 5, "ids_with_copies": 2, "removed": 2}


def test_allow_skips_the_check_and_its_phase(tmp_path, write_job):
    jsonl(tmp_path / "a.jsonl", [{"id": "x", "text": "one"}, {"id": "x", "text": "two"}])
    job = load_job(write_job(f'duplicate_ids = "allow"\n[[inputs]]\nsource = "a"\npath = "{tmp_path / "a.jsonl"}"\n'))
    manifest = run_job(job, progress=False)
    assert [st["id"] for st in manifest["stages"]] == ["00.read"]
    assert sorted(kept(manifest, job.output_dir)["text"].to_list()) == ["one", "two"]


def test_a_job_without_stages_checks_ids_in_its_one_pass_and_redoes_it_when_one_repeats(
    tmp_path, write_job, nothing_lost
):
    jsonl(tmp_path / "a.jsonl", [{"id": "x", "text": "one"}, {"id": "y", "text": "two"}])
    jsonl(tmp_path / "b.jsonl", [{"id": "z", "text": "three"}])
    body = f'keep_work = true\n[[inputs]]\nsource = "a"\npath = "{tmp_path / "*.jsonl"}"\n'
    unique = load_job(write_job(body, name="unique"))
    manifest = run_job(unique, progress=False)
    assert not (unique.output_dir / "_work" / "phase-1").exists()  # one pass: no phase for the check
    assert next(st for st in manifest["stages"] if st["id"] == "00.ids")["report"]["removed"] == 0

    jsonl(tmp_path / "b.jsonl", [{"id": "z", "text": "three"}, {"id": "x", "text": "again"}])
    repeated = load_job(write_job(body, name="repeated"))
    manifest = run_job(repeated, progress=False)
    nothing_lost(repeated.output_dir, {"x", "y", "z"})
    assert (repeated.output_dir / "_work" / "ids-exact").exists()
    assert sorted(kept(manifest, repeated.output_dir)["text"].to_list()) == ["one", "three", "two"]
    assert rejects(repeated.output_dir).select("id", "reason").rows() == [("x", "read:duplicate_id")]
