"""Curation inputs on S3: a real S3-compatible server (moto) on 127.0.0.1, read through fsspec."""

from __future__ import annotations

import gzip

import orjson
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from winnow.curate.pipeline import run_job
from winnow.pipelines.jobfile import load_job


def test_jobs_read_jsonl_and_parquet_from_s3_globs(s3_server, tmp_path, write_job, nothing_lost):
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    fs.mkdir("winnow-inputs")
    ids = set()
    for part in range(2):
        records = [{"id": f"w{part}-{i}", "text": f"web page {part} {i} " * 5} for i in range(30)]
        ids |= {r["id"] for r in records}
        with fs.open(f"winnow-inputs/web/part-{part}.jsonl.gz", "wb") as fh:
            fh.write(gzip.compress(b"\n".join(orjson.dumps(r) for r in records), mtime=0))
    table = pa.table({"id": [f"b{i}" for i in range(20)], "text": [f"book {i} " * 8 for i in range(20)]})
    ids |= set(table["id"].to_pylist())
    with fs.open("winnow-inputs/books/a.parquet", "wb") as fh:
        pq.write_table(table, fh)
    body = (
        '[[inputs]]\nsource = "web"\npath = "s3://winnow-inputs/web/*.jsonl.gz"\n'
        '[[inputs]]\nsource = "books"\npath = "s3://winnow-inputs/books"\nformat = "parquet"\n'
    )
    job = load_job(write_job(body))
    manifest = run_job(job, progress=False)
    nothing_lost(job.output_dir, ids)
    assert manifest["by_source"]["web"]["written"] == 60 and manifest["by_source"]["books"]["written"] == 20
    assert [f["path"] for f in manifest["inputs"][0]["files"]] == [
        "s3://winnow-inputs/web/part-0.jsonl.gz",
        "s3://winnow-inputs/web/part-1.jsonl.gz",
    ]
    rows = pl.read_parquet([job.output_dir / s["path"] for s in manifest["shards"] if s["format"] == "parquet"])
    assert rows.filter(pl.col("id") == "w1-3")["text"][0] == "web page 1 3 " * 5


def test_store_keys_a_file_system_shows_as_folders(s3_server, tmp_path, write_job, nothing_lost):
    """A console's folder marker (``docs/folder/``, no bytes) is no document; a key that is both an object and a
    folder (``x.jsonl`` and ``x.jsonl/inner.jsonl``), or a ``/``-ended key with bytes, which s3fs reads as an empty
    folder, is refused naming it, whichever path reaches it (the key itself, its folder, a recursive glob)."""
    import boto3
    import pytest

    from winnow.curate.errors import InputError

    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="winnow-keys")
    line = b'{"id": "%s", "text": "a document of a few words"}\n'
    for key, body in [("t/a.txt", b"a real document"), ("t/folder/", b""), ("t/folder/inner.txt", b"inner document"),
                      ("d/x.jsonl", line % b"x"), ("d/x.jsonl/inner.jsonl", line % b"inner"), ("d/x.jsonl-2", b""), ("d/y.jsonl", line % b"y"),
                      ("b/withbody/", b"31 bytes of text in a slash key"), ("b/a.txt", b"text")]:  # fmt: skip
        s3.put_object(Bucket="winnow-keys", Key=key, Body=body)
    job = load_job(write_job('[[inputs]]\nsource = "t"\npath = "s3://winnow-keys/t"\nformat = "text"\n'))
    run_job(job, progress=False)
    nothing_lost(job.output_dir, {"t/a.txt", "t/folder/inner.txt"})
    for i, path in enumerate(["s3://winnow-keys/d/x.jsonl", "s3://winnow-keys/d", "s3://winnow-keys/d/**/*.jsonl"]):
        job = load_job(write_job(f'[[inputs]]\nsource = "d"\npath = "{path}"\n', name=f"d{i}"))
        with pytest.raises(InputError, match=r"'s3://winnow-keys/d/x.jsonl' is both an object and a folder"):
            run_job(job, progress=False)
    job = load_job(write_job('[[inputs]]\nsource = "b"\npath = "s3://winnow-keys/b"\nformat = "text"\n', name="b"))
    with pytest.raises(InputError, match=r"'s3://winnow-keys/b/withbody/' holds 31 bytes under a key that ends in '/'"):
        run_job(job, progress=False)
