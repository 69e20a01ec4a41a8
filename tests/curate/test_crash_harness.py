"""The curation crash harness: SIGKILL a job at points chosen from its own progress.

A tiny job (three inputs with a bad line each and an id given twice — so the optimistic
run switches to the id barrier midway — a filter, a validation split gathered across
tasks, both shard formats) runs once with
``WINNOW_CRASH_AT=count:<file>`` to list its crash points — every durable write, before and
after its rename (``curate.crashpoints``). Then, for at least 20 of them spread over the
whole run, a fresh ``winnow curate`` process is SIGKILLed at that point, the same command
is re-run (in this process: only the killed run needs its own), and every shard, every
rejects file and the manifest (less its timings and folder) must be byte-identical to an
uninterrupted run's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from winnow.pipelines.cli import main

REPO = Path(__file__).resolve().parents[2]
MIN_POINTS = 20

JOB = """[job]
name = "crash"
output = "{out}"
batch_rows = 8

[[inputs]]
source = "web"
path = "{data}/web-*.jsonl"

[[inputs]]
source = "books"
path = "{data}/books.jsonl"

[[stages]]
kind = "filter.length"
min_words = 2

[[stages]]
kind = "split"
val_fraction = 0.2

[output]
shard_rows = 7
"""


def write_inputs(data: Path) -> None:
    data.mkdir()
    for f in range(2):
        recs = [{"id": f"w{f}-{i}", "text": f"web page {i % 9} about things" if i % 5 else "x"} for i in range(20)]
        (data / f"web-{f}.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs) + b"{broken\n")
    recs = [{"id": f"b{i}", "text": f"a book chapter number {i}"} for i in range(15)] + [
        {"id": "w0-3", "text": "an id again"}
    ]
    (data / "books.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))


def curate(job: Path, crash: str | None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
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


def _no_timings(value):
    if isinstance(value, dict):
        return {k: _no_timings(v) for k, v in value.items() if k not in ("seconds", "job_file")}
    if isinstance(value, list):
        return [_no_timings(v) for v in value]
    return value


def snapshot(out: Path) -> dict[str, object]:
    """Every output file's bytes (shards, rejects), and the manifest without its timings."""
    files: dict[str, object] = {
        str(p.relative_to(out)): p.read_bytes()
        for folder in ("shards", "rejects")
        for p in sorted((out / folder).rglob("*"))
        if p.is_file()
    }
    manifest = (out / "manifest.json").read_text().replace(str(out), "<out>")  # each run has its own folder
    files["manifest.json"] = _no_timings(json.loads(manifest))
    files["_work left behind"] = (out / "_work").exists()
    return files


def job_file(tmp_path: Path, name: str, data: Path) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(JOB.format(out=tmp_path / name, data=data))
    return path


def choose(points: int, n: int) -> list[str]:
    """``n`` crash points spread evenly over ``points`` writes, alternating before/after the rename."""
    picks = sorted({1 + round(i * (points - 1) / max(n - 1, 1)) for i in range(n)})
    return [f"{'before' if i % 2 == 0 else 'after'}:{k}" for i, k in enumerate(picks)]


@pytest.mark.slow
def test_sigkill_at_twenty_progress_points_then_rerun_gives_identical_outputs(tmp_path, capsys):
    data = tmp_path / "data"
    write_inputs(data)
    count_file = tmp_path / "points.txt"
    ref = curate(job_file(tmp_path, "ref", data), f"count:{count_file}")
    assert ref.returncode == 0, ref.stderr
    labels = [line.split("\t")[1] for line in count_file.read_text().splitlines()]
    assert len(labels) >= MIN_POINTS // 2, labels  # each write gives a before and an after point
    expected = snapshot(tmp_path / "ref")
    assert any(k.startswith("shards/webdataset/val") for k in expected) and any(
        k.startswith("rejects/") for k in expected
    )

    crashes = choose(len(labels), MIN_POINTS)
    assert len(crashes) >= MIN_POINTS
    for i, crash in enumerate(crashes):
        job = job_file(tmp_path, f"run{i}", data)
        killed = curate(job, crash)
        assert killed.returncode == -signal.SIGKILL, (crash, killed.returncode, killed.stderr)
        assert main(["-q", "curate", str(job)]) == 0, crash
        got = snapshot(tmp_path / f"run{i}")
        point = labels[int(crash.split(":")[1]) - 1]
        assert got.keys() == expected.keys(), (crash, point, sorted(set(got) ^ set(expected)))
        different = [k for k in expected if got[k] != expected[k]]
        assert not different, (crash, point, different)
