"""The output folder: what winnow writes there, and what it never touches.

A fresh run keeps the user's own ``shards/my.parquet`` in ``--output`` (it refuses instead of
deleting it); ``--output s3://b/x`` is a URL, never a local folder ``s3:``; an output path that is a
file is an error naming it; ``manifest.json`` follows the umask as the shards do.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import orjson
import pytest

from winnow.curate.outdir import MARKER
from winnow.pipelines.cli import main


def job_file(tmp_path: Path, body: str = "") -> Path:
    data = tmp_path / "a.jsonl"
    data.write_bytes(b"".join(orjson.dumps({"id": f"d{i}", "text": f"doc {i}"}) + b"\n" for i in range(5)))
    path = tmp_path / "job.toml"
    path.write_text(
        f'[job]\nname = "o"\noutput = "{tmp_path / "unused"}"\n[[inputs]]\nsource = "s"\npath = "{data}"\n{body}'
    )
    return path


def curate(job: Path, output: Path | str, capsys, *args: str) -> tuple[int, str]:
    rc = main(["-q", "curate", str(job), "--output", str(output), *args])
    return rc, capsys.readouterr().err


def test_foreign_data_in_the_output_folder_is_refused_not_deleted(tmp_path, capsys):
    out = tmp_path / "mine"
    (out / "shards").mkdir(parents=True)
    (out / "shards" / "my.parquet").write_bytes(b"the user's own data")
    rc, err = curate(job_file(tmp_path), out, capsys)
    assert rc == 2 and "winnow curate: error:" in err and "did not write" in err and "shards" in err
    assert (out / "shards" / "my.parquet").read_bytes() == b"the user's own data"
    assert sorted(p.name for p in out.iterdir()) == ["shards"]


def test_a_folder_winnow_made_is_cleared_for_another_job(tmp_path, capsys):
    out = tmp_path / "out"
    assert curate(job_file(tmp_path), out, capsys)[0] == 0
    assert (out / MARKER).is_file()
    before = sorted(p.relative_to(out) for p in (out / "shards").rglob("*.parquet"))
    job = job_file(tmp_path, '[output]\nformats = ["parquet"]\n')  # another configuration: refused unless meant
    assert curate(job, out, capsys)[0] == 2
    # a file named as a shard that the finished run's manifest does not list is not winnow's: never cleared
    stray = out / "shards" / "parquet" / "train" / "part-99999-00000.parquet"
    stray.write_bytes(b"put here by hand")
    assert curate(job, out, capsys, "--overwrite")[0] == 2 and stray.read_bytes() == b"put here by hand"
    stray.unlink()
    assert curate(job, out, capsys, "--overwrite")[0] == 0
    assert sorted(p.relative_to(out) for p in (out / "shards").rglob("*.parquet")) == before
    assert not (out / "shards" / "webdataset").exists()  # the first job's other format is gone


@pytest.mark.parametrize("marker", [b"", b"garbage", b"[]", b'{"fingerprint": "x"}'])
def test_a_damaged_marker_refuses_another_job_as_an_intact_one_does(tmp_path, capsys, marker):
    """An empty, garbage or `[]` marker read as "no owner": another job replaced a finished job's outputs."""
    out = tmp_path / "out"
    assert curate(job_file(tmp_path), out, capsys)[0] == 0
    (out / MARKER).write_bytes(marker)
    other = job_file(tmp_path).read_text().replace('name = "o"', 'name = "other"')
    (tmp_path / "other.toml").write_text(other)
    rc, err = curate(tmp_path / "other.toml", out, capsys)
    assert rc == 2 and f"holds a damaged marker {MARKER}" in err and "--overwrite" in err
    assert (out / MARKER).read_bytes() == marker and (out / "manifest.json").is_file()
    assert curate(tmp_path / "other.toml", out, capsys, "--overwrite")[0] == 0


@pytest.mark.parametrize("rerun", ["inputs changed", "--overwrite"])
def test_files_of_the_user_inside_shards_or_rejects_are_refused_not_deleted(tmp_path, capsys, rerun):
    """A rerun that clears shards/ and rejects/ (a changed input: the tasks it touches are redone; or
    --overwrite) refuses while they hold a file winnow would not have written, and removes nothing."""
    job = job_file(tmp_path)
    out = tmp_path / "out"
    assert curate(job, out, capsys)[0] == 0
    mine = [out / "shards" / "parquet" / "train" / "NOTES.md", out / "shards" / "extra" / "keep.txt",
            out / "rejects" / "triage.csv", out / "_work" / "notes.txt",
            # named as winnow names its files, but not in the finished run's manifest: not winnow's either
            out / "shards" / "parquet" / "train" / "part-00099-00000.parquet", out / "rejects" / "p1-t00099.parquet",
            ]  # fmt: skip
    for path in mine:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("the user's")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    if rerun == "inputs changed":
        with (tmp_path / "a.jsonl").open("ab") as fh:
            fh.write(b'{"id": "d9", "text": "one more"}\n')
    rc, err = curate(job, out, capsys, *([rerun] if rerun.startswith("--") else []))
    assert rc == 2 and "not written by winnow" in err and "shards/extra/keep.txt" in err, err
    assert "6 file(s)" in err and "part-00099-00000.parquet" in err, err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    for path in mine:
        path.unlink()
    assert curate(job, out, capsys, *([rerun] if rerun.startswith("--") else []))[0] == 0


def test_a_job_inside_what_another_job_clears_is_refused(tmp_path, capsys):
    """A job's output inside another job's ``_work/`` or ``shards/`` (which that job clears when it runs again) is
    refused before anything is made there; the other job's next run goes on."""
    job = job_file(tmp_path)
    out = tmp_path / "out"
    assert curate(job, out, capsys)[0] == 0
    for inner in (out / "_work" / "b", out / "shards" / "b"):
        rc, err = curate(job, inner, capsys)
        assert rc == 2 and f"lies inside {inner.parent}, which the job of {out} clears" in err, err
        assert not inner.exists()
    assert curate(job, out, capsys, "--overwrite")[0] == 0


@pytest.mark.parametrize("what", ["a lock file", "a lock folder", "a marker folder", "a marker link"])
def test_a_users_entry_under_winnows_own_names_is_refused_not_replaced(tmp_path, capsys, what):
    """``.winnow-lock`` and ``.winnow-output`` are names winnow writes; a file, folder or link of the user's under
    one is refused naming it, kept, and nothing is made beside it."""
    out = tmp_path / "out"
    out.mkdir()
    name = ".winnow-lock" if "lock" in what else MARKER
    if what.endswith("file"):
        (out / name).write_text("the user's")
    elif what.endswith("folder"):
        (out / name).mkdir()
        (out / name / "x").write_text("the user's")
    else:
        (out / name).symlink_to(tmp_path)
    rc, err = curate(job_file(tmp_path), out, capsys)
    assert rc == 2 and f"{name} there is a" in err and "winnow did not" in err, err
    assert sorted(p.name for p in out.iterdir()) == [name]
    assert (
        what.endswith("link")
        or (out / name / "x" if what.endswith("folder") else out / name).read_text() == "the user's"
    )


def test_an_output_through_a_symbolic_link_loop_is_an_error_naming_it(tmp_path, capsys):
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    rc, err = curate(job_file(tmp_path), tmp_path / "loop1", capsys)
    assert rc == 2 and "a symbolic link loop" in err and "loop1" in err and "Traceback" not in err


def test_output_that_is_a_file_is_an_error_naming_it(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    rc, err = curate(job_file(tmp_path), tmp_path / "afile", capsys)
    assert rc == 2 and f"output {tmp_path / 'afile'} is a file" in err
    rc, err = curate(job_file(tmp_path), tmp_path / "afile" / "sub", capsys)
    assert rc == 2 and "cannot write the output folder" in err and "afile/sub" in err
    assert "Traceback" not in err


def test_output_that_cannot_be_written_is_an_error_naming_it(tmp_path, capsys):
    # /sys refuses new entries even to root (tests run as root, so chmod cannot make a folder unwritable)
    rc, err = curate(job_file(tmp_path), "/sys/winnow-test-output", capsys)
    assert rc == 2 and "cannot write the output folder /sys/winnow-test-output" in err and "permissions" in err


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def modes(out: Path) -> dict[str, int]:
    return {str(p.relative_to(out)): stat.S_IMODE(p.stat().st_mode) for p in out.rglob("*")}


def test_manifest_follows_the_umask_like_the_shards(tmp_path, capsys, umask_022):
    out = tmp_path / "out"
    assert curate(job_file(tmp_path), out, capsys)[0] == 0
    files = {k: v for k, v in modes(out).items() if (out / k).is_file()}
    assert files["manifest.json"] == 0o644
    assert set(files.values()) == {0o644}, files


def test_output_mode_restricts_every_file_and_folder(tmp_path, capsys, umask_022):
    out = tmp_path / "out"
    assert curate(job_file(tmp_path, "[output]\nmode = 0o640\n"), out, capsys)[0] == 0
    got = modes(out)
    assert {v for k, v in got.items() if (out / k).is_file()} == {0o640}
    assert {v for k, v in got.items() if (out / k).is_dir()} == {0o750}
    assert stat.S_IMODE(out.stat().st_mode) == 0o750


def test_output_mode_must_let_the_owner_read_and_write(tmp_path, capsys):
    rc, err = curate(job_file(tmp_path, "[output]\nmode = 0o444\n"), tmp_path / "out", capsys)
    assert rc == 2 and "[output]" in err and "mode" in err and "0o444" in err


@pytest.mark.parametrize("where", ["the input folder", "inside it"])
def test_an_output_that_holds_the_inputs_or_lies_in_an_input_folder_is_refused_before_anything_is_written(
    tmp_path, capsys, where
):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.jsonl").write_bytes(orjson.dumps({"id": "a", "text": "hello"}) + b"\n")
    job = tmp_path / "job.toml"
    job.write_text(f'[job]\nname = "o"\noutput = "{tmp_path / "x"}"\n[[inputs]]\nsource = "s"\npath = "{data}"\n')
    output = data if where == "the input folder" else data / "out"
    rc, err = curate(job, output, capsys)
    assert rc == 2 and "choose an output outside" in err
    assert sorted(p.name for p in data.iterdir()) == ["a.jsonl"]
    # a glob whose files lie in the output folder: the same refusal, naming the file
    job.write_text(
        f'[job]\nname = "o"\noutput = "{tmp_path / "x"}"\n[[inputs]]\nsource = "s"\npath = "{data}/*.jsonl"\n'
    )
    rc, err = curate(job, data, capsys)
    assert rc == 2 and f"input file {data / 'a.jsonl'} is inside the job's output folder" in err


@pytest.mark.parametrize(
    ("pattern", "refused"),
    [("**/*.parquet", True), ("**", True), ("*/*.json*", True), ("*/*.jsonl", False), ("in/a.*", False)],
)
def test_a_glob_that_would_reach_the_output_folders_files_is_refused_on_the_first_run(
    tmp_path, capsys, pattern, refused
):
    """`path = "g/**/*.parquet"` with `output = "g/out"` curated once, then refused every later run (its glob now
    matched its own shards), --overwrite and resume too; a glob that cannot reach the output's files runs."""
    data = tmp_path / "g"
    (data / "in").mkdir(parents=True)
    (data / "in" / "a.jsonl").write_bytes(orjson.dumps({"id": "a", "text": "hello"}) + b"\n")
    pq_rows = data / "in" / "b.parquet"
    import polars as pl

    pl.DataFrame({"id": ["b"], "text": ["hi"]}).write_parquet(pq_rows)
    fmt = "parquet" if pattern.endswith("parquet") else "jsonl"
    job = tmp_path / "job.toml"
    job.write_text(f'[job]\nname = "o"\n[[inputs]]\nsource = "s"\nformat = "{fmt}"\npath = "{data}/{pattern}"\n')
    rc, err = curate(job, data / "out", capsys)
    if refused:
        assert rc == 2 and f"matches files winnow writes in the job's output folder {data / 'out'}" in err
        assert not (data / "out").exists()
    else:
        assert (rc, curate(job, data / "out", capsys)[0]) == (0, 0)  # and again


@pytest.mark.parametrize(
    "what",
    ["rejects is a link", "manifest.json is a link", "a link inside shards", "rejects is a file",
     "manifest.json is not winnow's", "a file of the user's in artifacts"],
)  # fmt: skip
def test_overwrite_never_replaces_a_path_winnow_did_not_write(tmp_path, capsys, what):
    """--overwrite clears winnow's own entries only where they hold what winnow wrote: a link (the entry or inside
    it), a file for a folder, another manifest, a stray file is refused, named, and left as it was."""
    job = job_file(tmp_path)
    out = tmp_path / "out"
    assert curate(job, out, capsys)[0] == 0
    mine = tmp_path / "mine"  # a folder of the user's, empty: no name in it tells it from winnow's
    mine.mkdir()
    (tmp_path / "keep.txt").write_text("the user's")
    named, path = {
        "rejects is a link": ("rejects", out / "rejects"),
        "manifest.json is a link": ("manifest.json", out / "manifest.json"),
        "a link inside shards": ("shards/parquet/train/linked", out / "shards" / "parquet" / "train" / "linked"),
        "rejects is a file": ("rejects", out / "rejects"),
        "manifest.json is not winnow's": ("manifest.json", out / "manifest.json"),
        "a file of the user's in artifacts": ("artifacts/notes.txt", out / "artifacts" / "notes.txt"),
    }[what]
    if path.is_file():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    if "link" in what:
        path.symlink_to(tmp_path / "keep.txt" if path.name == "manifest.json" else mine)
    else:
        path.write_text('{"mine": true}')
    rc, err = curate(job, out, capsys, "--overwrite")
    assert rc == 2 and named in err and ("not winnow's" in err or "not written by winnow" in err), err
    assert path.is_symlink() == ("link" in what) and (tmp_path / "keep.txt").read_text() == "the user's"
    if not path.is_symlink():
        assert path.read_text() == '{"mine": true}'


def test_clearing_a_finished_jobs_outputs_removes_its_manifest_first(tmp_path, monkeypatch):
    """A run killed while it cleared (`--overwrite`) left the manifest of shards already deleted: `winnow report`
    showed that curation, and a re-run of the first job took the folder as finished."""
    import shutil

    from winnow.curate.outdir import OWN_ENTRIES, clear_own_entries

    for name in ("shards/parquet/train", "rejects", "_work"):
        (tmp_path / name).mkdir(parents=True)
    (tmp_path / "manifest.json").write_text("{}")

    def killed(path, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        clear_own_entries(tmp_path, only=OWN_ENTRIES)
    assert not (tmp_path / "manifest.json").exists() and (tmp_path / "shards").is_dir()


def test_a_temporary_manifest_a_killed_run_left_is_removed_when_the_job_ends(tmp_path, write_job):
    from winnow.curate.pipeline import run_job
    from winnow.pipelines.jobfile import load_job

    (tmp_path / "in.jsonl").write_text('{"id": "a", "text": "some words of text"}\n')
    job = load_job(write_job(f'[[inputs]]\nsource = "s"\npath = "{tmp_path / "in.jsonl"}"\n'))
    run_job(job, progress=False)
    (job.output_dir / ".manifest.json.9c1157517304.tmp").write_text("{")  # a kill inside write_json_atomic
    (job.output_dir / ".notes.9c1157517304.tmp").write_text("the user's")
    run_job(job, progress=False, overwrite=True)
    assert not (job.output_dir / ".manifest.json.9c1157517304.tmp").exists()
    assert (job.output_dir / ".notes.9c1157517304.tmp").read_text() == "the user's"
