"""Reading a job folder from S3: a real S3-compatible server (moto) on 127.0.0.1, not a client mock."""

from __future__ import annotations

import pytest

from tests.train.shards_util import make_docs, write_job
from winnow.train.data import Loader, LoaderConfig
from winnow.train.errors import ShardError


@pytest.fixture(scope="module")
def s3_job(s3_server, tmp_path_factory):
    import s3fs

    local = write_job(tmp_path_factory.mktemp("job"), [make_docs(12)[:6], make_docs(12)[6:]])
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    fs.mkdir("winnow-test")
    fs.put(str(local) + "/", "winnow-test/out/job", recursive=True)
    return local, "s3://winnow-test/out/job"


def batches(folder, n, **kw):
    with Loader(LoaderConfig(**{"batch_size": 2, "seq_len": 32, "num_workers": 0, **kw}), folder) as loader:
        return [next(loader) for _ in range(n)]


@pytest.mark.parametrize("fmt", ["parquet", "webdataset"])
def test_s3_gives_the_same_batches_as_local(s3_job, fmt):
    local, url = s3_job
    got, expected = batches(url, 12, format=fmt), batches(local, 12, format=fmt)
    assert all((a.tokens == b.tokens).all() and (a.source_ids == b.source_ids).all() for a, b in zip(got, expected))
    assert got[0].origins == expected[0].origins


@pytest.mark.slow
def test_s3_with_worker_processes(s3_job):
    local, url = s3_job
    got, expected = batches(url, 12, num_workers=2), batches(local, 12)
    assert all((a.targets == b.targets).all() for a, b in zip(got, expected))


def test_s3_missing_job_folder_is_a_shard_error(s3_job):
    with pytest.raises(ShardError, match="no manifest"):
        Loader(LoaderConfig(num_workers=0), "s3://winnow-test/out/absent")


def test_s3_parquet_folder_without_manifest(s3_server, tmp_path):
    """A folder of Parquet files on S3 that no winnow wrote trains through the loader's own view."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import s3fs

    pq.write_table(
        pa.table({"text": [f"doc {i}" for i in range(8)], "source": ["a", "b"] * 4}), tmp_path / "train-0.parquet"
    )
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    fs.mkdir("winnow-foreign")
    fs.put(str(tmp_path / "train-0.parquet"), "winnow-foreign/corpus/train-0.parquet")
    got, expected = batches("s3://winnow-foreign/corpus", 2), batches(tmp_path, 2)
    assert all((a.tokens == b.tokens).all() and (a.source_ids == b.source_ids).all() for a, b in zip(got, expected))


def test_s3_token_shards_unverified_are_checked_by_the_manifest_max_id(s3_server, tmp_path):
    """On a store, without checksums, a shard is not read whole at start: the writer's max_id stands for its ids."""
    import json

    import s3fs

    from tests.train.shards_util import write_token_job

    local = write_token_job(tmp_path / "job", [make_docs(8)[:4], make_docs(8)[4:]])
    manifest = json.loads((local / "manifest.json").read_text())
    tokens = [e for e in manifest["shards"] if e["format"] == "tokens"]
    assert all(0 <= e["max_id"] < 258 for e in tokens)  # the byte tokenizer's 258 ids
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    fs.mkdir("winnow-maxid")
    fs.put(str(local) + "/", "winnow-maxid/good", recursive=True)
    config = LoaderConfig(batch_size=2, seq_len=16, num_workers=0, format="tokens", verify_checksums=False)
    with Loader(config, "s3://winnow-maxid/good") as loader:
        assert next(loader).tokens.max() < 258
    tokens[1]["max_id"] = 300  # a shard written with a larger vocabulary, as its manifest says
    (local / "manifest.json").write_text(json.dumps(manifest))
    fs.put(str(local) + "/", "winnow-maxid/other", recursive=True)
    name = tokens[1]["path"].rsplit("/", 1)[-1]
    with pytest.raises(ShardError, match=rf"{name}: token id 300 \(the manifest's max_id\) is outside .* 258 ids"):
        Loader(config, "s3://winnow-maxid/other")  # at start, from the manifest, before any shard is read
