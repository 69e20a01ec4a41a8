"""Outputs on an object store: a job writes to s3:// on a real S3 server (moto, 127.0.0.1).

The same job runs to a local folder and to an ``s3://`` prefix; every shard, rejects file and
the manifest's checksums must be byte-identical. A run killed at a durable write on the store
leaves no half-written object where a later phase or a reader looks, and the re-run finishes
with the same bytes. Bad URLs and foreign data under a prefix are errors that say what to do.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from winnow.curate.errors import ConfigError, OutputError
from winnow.curate.pipeline import run_job
from winnow.pipelines.cli import main
from winnow.pipelines.jobfile import load_job

REPO = Path(__file__).resolve().parents[2]
BUCKET = "winnow-out"

# Every kind of durable write: a barrier with a plan artifact (clean's boilerplate list), exact
# and MinHash dedup, a validation split gathered across tasks, ordered train shards (the write phase), and
# all three shard formats.
JOB = """[job]
name = "{name}"
output = "{out}"
workers = {workers}
batch_rows = 16
group_bytes = 0  # a task per input file

[[inputs]]
source = "web"
path = "{data}/web-*.jsonl"

[[inputs]]
source = "books"
path = "{data}/books.jsonl"

[[stages]]
kind = "clean"
boilerplate_min_docs = 3

[[stages]]
kind = "dedup.exact"

[[stages]]
kind = "dedup.minhash"

[[stages]]
kind = "score.heuristic"

[[stages]]
kind = "split"
val_fraction = 0.2

[[stages]]
kind = "order"
by = "quality"

[output]
formats = ["parquet", "webdataset", "tokens"]
shard_rows = 9
"""


def write_inputs(data: Path) -> set[str]:
    data.mkdir(exist_ok=True)
    ids = set()
    for f in range(2):
        recs = [
            {"id": f"w{f}-{i}", "text": f"web page {i % 7} about things number {i}\nsubscribe now"} for i in range(25)
        ]
        ids |= {r["id"] for r in recs}
        (data / f"web-{f}.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs) + b"{broken\n")
    recs = [{"id": f"b{i}", "text": f"a book chapter number {i % 11} of many"} for i in range(20)]
    ids |= {r["id"] for r in recs}
    (data / "books.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))
    return ids


def job_file(tmp_path: Path, name: str, out: str, workers: int = 1) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(JOB.format(name=name, out=out, workers=workers, data=tmp_path / "data"))
    return path


@pytest.fixture
def s3(s3_server):
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False)
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    return fs


def local_outputs(out: Path) -> dict[str, str]:
    """sha256 of every shard and rejects file of a local job folder, by relative path."""
    return {
        p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for folder in ("shards", "rejects")
        for p in sorted((out / folder).rglob("*"))
        if p.is_file()
    }


def store_outputs(fs, prefix: str) -> dict[str, str]:
    found = {}
    for folder in ("shards", "rejects"):
        for key in fs.find(f"{prefix}/{folder}"):
            found[key[len(prefix) + 1 :]] = hashlib.sha256(fs.cat_file(key)).hexdigest()
    return found


def no_timings(manifest: dict) -> dict:
    drop = ("seconds", "job_file", "output", "name", "tokens_per_second", "docs_per_second", "tokenize_seconds")

    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in drop}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return strip({k: v for k, v in manifest.items() if k not in ("config", "packages")})


@pytest.fixture
def local_run(tmp_path):
    write_inputs(tmp_path / "data")
    out = tmp_path / "local"
    manifest = run_job(load_job(job_file(tmp_path, "job", str(out))), progress=False)
    return out, manifest


@pytest.mark.slow
def test_a_job_on_s3_writes_the_same_bytes_as_a_local_run(tmp_path, s3, local_run, nothing_lost, monkeypatch, capsys):
    out, local = local_run
    nothing_lost(out)
    prefix = f"{BUCKET}/same"
    manifest = run_job(load_job(job_file(tmp_path, "job", f"s3://{prefix}", workers=2)), progress=False)
    expected = local_outputs(out)
    assert len([p for p in expected if p.startswith("shards/")]) >= 6 and any(
        p.startswith("rejects/") for p in expected
    )
    assert store_outputs(s3, prefix) == expected  # every shard and rejects file, byte for byte
    assert [(s["path"], s["sha256"]) for s in manifest["shards"]] == [(s["path"], s["sha256"]) for s in local["shards"]]
    stored = json.loads(s3.cat_file(f"{prefix}/manifest.json"))
    assert no_timings(stored) == no_timings(json.loads((out / "manifest.json").read_text()))
    names = [k.rsplit("/", 1)[-1] for k in s3.find(prefix)]
    assert not [n for n in names if n.endswith(".tmp")], "temporary keys left behind"
    assert (
        not s3.exists(f"{prefix}/_work") and s3.exists(f"{prefix}/.winnow-output") and s3.exists(f"{prefix}/README.md")
    )
    # the report reads the manifest and the shards' score columns in place, and goes next to them
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    assert main(["-q", "report", f"s3://{prefix}"]) == 0
    assert f"report: s3://{prefix}/report.html" in capsys.readouterr().out
    page = s3.cat_file(f"{prefix}/report.html").decode()
    assert "winnow report: job" in page and "score histograms" in page
    assert list(cwd.iterdir()) == []  # no local folder named after the URL
    assert main(["-q", "report", f"s3://{prefix}"]) == 0  # its own page: replaced
    s3.pipe_file(f"{prefix}/report.html", b"<html>my own page</html>")  # the user's: never replaced
    assert main(["-q", "report", f"s3://{prefix}"]) == 2
    assert "is not a page winnow report wrote" in capsys.readouterr().err
    assert s3.cat_file(f"{prefix}/report.html") == b"<html>my own page</html>"
    s3.rm_file(f"{prefix}/report.html")
    # a re-run of the finished job starts afresh in the prefix winnow owns, and writes the same bytes again
    run_job(load_job(job_file(tmp_path, "job", f"s3://{prefix}")), progress=False)
    assert store_outputs(s3, prefix) == expected


def _curate(job: Path, crash: str | None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # the moto endpoint and credentials are in os.environ
    env.pop("WINNOW_CRASH_AT", None)
    if crash:
        env["WINNOW_CRASH_AT"] = crash
    return subprocess.run(
        [sys.executable, "-m", "winnow.pipelines.cli", "-q", "curate", str(job)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_a_run_killed_while_publishing_to_s3_leaves_nothing_half_written_and_resumes(tmp_path, s3, local_run):
    out, _ = local_run
    expected = local_outputs(out)
    count = tmp_path / "points.txt"
    job = job_file(tmp_path, "job", f"s3://{BUCKET}/count")
    assert _curate(job, f"count:{count}").returncode == 0
    points = [line.split("\t") for line in count.read_text().splitlines()]
    labels = {label for _, label in points}
    assert {"store:stats.json", "store:_SUCCESS", "store:manifest.json"} <= labels
    # the store's copy of a task's marker, a plan's marker, a shard, a write marker, before and after it
    wanted = ["store:stats.json", "store:_SUCCESS", "store:part-00000-00000.tar", "store:task-00000.json"]
    chosen = [next(n for n, label in points if label == w) for w in wanted]
    for i, n in enumerate(chosen):
        when = "before" if i % 2 == 0 else "after"
        prefix = f"{BUCKET}/crash-{i}"
        job = job_file(tmp_path, "job", f"s3://{prefix}")
        killed = _curate(job, f"{when}:{n}")
        assert killed.returncode == -9, (n, killed.stderr[-2000:])
        # what the killed run left: every object under a final name is whole (it equals the finished run's)
        left = store_outputs(s3, prefix)
        partial = {k: v for k, v in left.items() if not k.rsplit("/", 1)[-1].startswith(".")}
        assert all(expected.get(k) == v for k, v in partial.items()), (n, when, sorted(set(partial) - set(expected)))
        if when == "before" and wanted[i].endswith(".tar"):  # uploaded under a temporary key, not yet copied
            assert any(k.endswith(".tmp") for k in left) and wanted[i].split(":")[1] not in {
                k.rsplit("/", 1)[-1] for k in partial
            }
        # the re-run, in this process (only the killed run needs a process of its own)
        assert main(["-q", "curate", str(job)]) == 0, (n, when)
        assert store_outputs(s3, prefix) == expected, (n, when)


def test_an_unmarked_task_folder_on_the_store_is_not_trusted(tmp_path, s3):
    """A killed worker's uploads without their marker are invisible to later phases and re-done."""
    from winnow.curate.workdir import WorkDir

    work = WorkDir(f"s3://{BUCKET}/unmarked")
    folder = work.task(0, 1)
    folder.mkdir(parents=True)
    (folder / "rows.parquet").write_bytes(b"half")
    (folder / "stats.json").write_text("{}")
    s3.pipe(f"{work.url(folder)}/rows.parquet", b"half")  # uploaded, marker never written
    assert not work.task_done(0, 1) and work.task_files(0, "rows.parquet") == []
    work.publish_folder(folder, marker="stats.json")
    assert work.task_done(0, 1) and [Path(p).name for p in work.task_files(0, "rows.parquet")] == ["rows.parquet"]
    assert not [k for k in s3.find(f"{BUCKET}/unmarked") if k.endswith(".tmp")]


def test_foreign_objects_under_the_prefix_are_refused_not_deleted(tmp_path, s3, capsys):
    write_inputs(tmp_path / "data")
    s3.pipe(f"{BUCKET}/theirs/shards/my.parquet", b"the user's own data")
    rc = main(["-q", "curate", str(job_file(tmp_path, "job", "s3://unused")), "--output", f"s3://{BUCKET}/theirs"])
    err = capsys.readouterr().err
    assert rc == 2 and "holds objects winnow did not write (shards)" in err and "--output" in err
    assert s3.cat_file(f"{BUCKET}/theirs/shards/my.parquet") == b"the user's own data"


def test_a_url_scheme_without_a_driver_names_the_key_and_the_package(tmp_path):
    write_inputs(tmp_path / "data")
    with pytest.raises(ConfigError, match=r"job\.output = 'nosuchscheme://b/x': no fsspec driver for nosuchscheme:// "):
        load_job(job_file(tmp_path, "job", "nosuchscheme://b/x"))
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match=r"job\.output = 'gs://b/x'.*install gcsfs \(pip install gcsfs\)"):
            load_job(job_file(tmp_path, "job", "gs://b/x"))


def test_output_mode_on_a_store_is_an_error_naming_the_key(tmp_path, s3):
    write_inputs(tmp_path / "data")
    path = job_file(tmp_path, "job", f"s3://{BUCKET}/mode")
    path.write_text(path.read_text().replace("shard_rows = 9", "shard_rows = 9\nmode = 0o640"))
    with pytest.raises(ConfigError, match=r"output\.mode = 0o640 applies to local folders"):
        load_job(path)


def test_a_store_that_refuses_access_is_an_output_error_naming_the_url(tmp_path, s3, monkeypatch):
    write_inputs(tmp_path / "data")
    job = load_job(job_file(tmp_path, "job", "s3://no-such-bucket-here/x"))
    with pytest.raises(OutputError, match=r"job\.output = 's3://no-such-bucket-here/x'"):
        run_job(job, progress=False)


@pytest.mark.slow
def test_an_input_edited_since_the_work_began_redoes_only_its_task_on_s3(tmp_path, s3):
    write_inputs(tmp_path / "data")
    prefix = f"{BUCKET}/edited"
    path = job_file(tmp_path, "job", f"s3://{prefix}")
    path.write_text(path.read_text().replace("batch_rows = 16", "batch_rows = 16\nkeep_work = true", 1))
    run_job(load_job(path), progress=False)

    def phase0() -> dict[str, object]:  # when each phase-0 marker was written
        return {
            k.split("/")[-2]: s3.info(k)["LastModified"] for k in s3.glob(f"{prefix}/_work/phase-0/task-*/stats.json")
        }

    before = phase0()
    books = tmp_path / "data" / "books.jsonl"
    books.write_bytes(books.read_bytes().replace(b"a book chapter", b"an edited chapter"))
    run_job(load_job(path), progress=False)
    after = phase0()
    assert sorted(after) == sorted(before) == ["task-00000", "task-00001", "task-00002"]
    assert after["task-00000"] == before["task-00000"] and after["task-00001"] == before["task-00001"]  # kept
    assert after["task-00002"] > before["task-00002"]  # redone: books is the third read task
    fresh = tmp_path / "fresh"
    run_job(load_job(job_file(tmp_path, "fresh", str(fresh))), progress=False)
    assert store_outputs(s3, prefix) == local_outputs(fresh)
