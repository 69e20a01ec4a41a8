"""A record past ``max_record_bytes`` is read past in bounded memory: a 3 MB ``.gz`` holding one 2 GiB line."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_2_gib_line_in_a_small_gzip_is_one_reject_in_bounded_memory(tmp_path):
    member = gzip.compress(b"x" * (64 << 20), compresslevel=9, mtime=0)  # 64 MiB of one line per gzip member
    good = b"".join(json.dumps({"id": f"g{i}", "text": f"good {i}"}).encode() + b"\n" for i in range(3))
    blob = (
        gzip.compress(good + b'{"id": "huge", "text": "', mtime=0)
        + member * 32
        + gzip.compress(b'"}\n' + good.replace(b'"g', b'"h'))
    )
    (tmp_path / "a.jsonl.gz").write_bytes(blob)
    assert len(blob) < 8 << 20
    job = tmp_path / "job.toml"
    job.write_text(
        f'[job]\nname = "big"\noutput = "{tmp_path / "out"}"\n[[inputs]]\nsource = "s"\n'
        f'path = "{tmp_path / "a.jsonl.gz"}"\n[output]\nformats = ["parquet"]\n'
    )
    # the peak of this process's own memory (VmHWM, KiB); ru_maxrss would also count the parent's peak (it survives
    # the exec of a vfork()ed child), so it reports the pytest worker's memory, not the job's
    code = (
        "import sys; from winnow.pipelines.cli import main; rc = main(['-q', 'curate', sys.argv[1]]); "
        "print(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1]); sys.exit(rc)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(job)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    peak_mib = int(done.stdout.split()[-1]) / 1024
    assert peak_mib < 1024, peak_mib  # the line is 2 GiB; the default limit holds 64 MiB of it at most
    rejects = pl.read_parquet(list((tmp_path / "out" / "rejects").glob("*.parquet")))
    assert rejects["reason"].to_list() == ["read:too_long"]
    assert json.loads(rejects["meta"][0])["bytes"] == len(b'{"id": "huge", "text": "') + (2 << 30) + len(b'"}')
    kept = pl.read_parquet(list((tmp_path / "out" / "shards").rglob("*.parquet")))
    assert sorted(kept["id"].to_list()) == ["g0", "g1", "g2", "h0", "h1", "h2"]
