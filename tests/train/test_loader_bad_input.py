"""Bad shards: a ShardError naming the shard and the problem, or, with skip_bad_shards, a warning and a counter."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.train.shards_util import make_docs, write_job
from winnow.train.data import Loader, LoaderConfig
from winnow.train.errors import ShardError

SHARD = "shards/train/part-00000-00001"


@pytest.fixture
def folder(tmp_path):
    docs = make_docs(30)
    return write_job(tmp_path, [docs[:10], docs[10:20], docs[20:]])


def replace_shard(folder, path, data: bytes, *, keep_manifest_sha: bool = False) -> None:
    (folder / path).write_bytes(data)
    if keep_manifest_sha:
        return
    manifest = json.loads((folder / "manifest.json").read_text())
    for entry in manifest["shards"]:
        if entry["path"] == path:  # a manifest written for the new file: the damage is found in reading it
            entry["sha256"], entry["bytes"] = hashlib.sha256(data).hexdigest(), len(data)
    (folder / "manifest.json").write_text(json.dumps(manifest))


def first_batches(folder, fmt="parquet", n=40, **kw):
    loader = Loader(LoaderConfig(batch_size=2, seq_len=32, num_workers=0, format=fmt, **kw), folder)
    return loader, [next(loader) for _ in range(n)]


def corrupt_parquet(folder):
    data = (folder / f"{SHARD}.parquet").read_bytes()
    replace_shard(folder, f"{SHARD}.parquet", data[:100] + b"\x00" * 50 + data[150:])


def truncate_tar(folder):
    data = (folder / f"{SHARD}.tar").read_bytes()
    replace_shard(folder, f"{SHARD}.tar", data[: len(data) // 2 + 7])


def wrong_columns(folder):
    sink = io.BytesIO()
    pq.write_table(pa.table({"id": ["a"], "text": ["hello"]}), sink)
    replace_shard(folder, f"{SHARD}.parquet", sink.getvalue())


def checksum_mismatch(folder):
    data = bytearray((folder / f"{SHARD}.parquet").read_bytes())
    data[-20] ^= 1
    replace_shard(folder, f"{SHARD}.parquet", bytes(data), keep_manifest_sha=True)


def missing(folder):
    (folder / f"{SHARD}.parquet").unlink()


CASES = [
    (corrupt_parquet, "parquet", "not a readable Parquet file"),
    (truncate_tar, "webdataset", "truncated tar"),
    (wrong_columns, "parquet", "wrong columns: lacks \\['source'\\]"),
    (checksum_mismatch, "parquet", "checksum mismatch"),
    (missing, "parquet", "missing"),
]


@pytest.mark.parametrize(("damage", "fmt", "problem"), CASES, ids=[c[0].__name__ for c in CASES])
def test_bad_shard_raises_shard_error_naming_shard_and_problem(folder, damage, fmt, problem):
    damage(folder)
    with pytest.raises(ShardError, match=f"part-00000-00001.*{problem}"):
        first_batches(folder, fmt)


@pytest.mark.parametrize(("damage", "fmt", "problem"), CASES, ids=[c[0].__name__ for c in CASES])
def test_skip_bad_shards_warns_counts_and_goes_on(folder, damage, fmt, problem, caplog):
    damage(folder)
    with caplog.at_level(logging.WARNING, logger="winnow.train.data.stream"):
        loader, batches = first_batches(folder, fmt, skip_bad_shards=True)
    assert loader.stats()["bad_shards"] >= 1
    assert any("part-00000-00001" in r.getMessage() for r in caplog.records)
    text = b"".join(b.targets[b.loss_mask].numpy().astype("uint8").tobytes() for b in batches)
    ids = {int(doc.split(b">")[0].split(b":")[1]) for doc in text.split(b"\0")[:-1]}
    assert ids >= set(range(10)) | set(range(20, 30)) and not ids & set(range(10, 20))


def test_checksums_are_only_checked_when_asked(folder):
    checksum_mismatch(folder)
    first_batches(folder, verify_checksums=False, n=2)


def test_missing_manifest_is_a_shard_error(tmp_path):
    with pytest.raises(ShardError, match="no manifest"):
        Loader(LoaderConfig(), tmp_path)


def test_every_shard_bad_is_an_error_even_when_skipping(tmp_path):
    folder = write_job(tmp_path, [make_docs(3)])
    (folder / "shards/train/part-00000-00000.parquet").unlink()
    with pytest.raises(ShardError, match="no documents"):
        first_batches(folder, skip_bad_shards=True, n=1)


def test_resume_into_a_shard_that_turned_bad_starts_the_next_shard_whole(folder):
    loader = Loader(LoaderConfig(batch_size=1, seq_len=16, num_workers=0, skip_bad_shards=True), folder)
    while loader.state_dict()["sets"][0]["shard"] != 1 or loader.state_dict()["sets"][0]["offset"] == 0:
        next(loader)
    state = loader.state_dict()
    checksum_mismatch(folder)  # same manifest, damaged file
    resumed = Loader(LoaderConfig(batch_size=1, seq_len=16, num_workers=0, skip_bad_shards=True), folder)
    resumed.load_state_dict(state)
    first = next(resumed).tokens[0].numpy()
    assert first[0] == 256 and first[1:].astype("uint8").tobytes().startswith(b"<books:20>")


def test_a_tar_with_two_samples_of_one_name_is_refused_naming_it():
    """webdataset refuses such a tar; reading it as dict entries would give every copy the last one's text."""
    import tarfile

    from winnow.train.data.tarshard import read_tar

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for text in (b"first", b"second"):
            for name, data in (("dup.txt", text), ("dup.json", json.dumps({"id": "dup", "source": "s"}).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    with pytest.raises(ShardError, match="two samples are named 'dup'"):
        read_tar(buf.getvalue(), "t.tar")


@pytest.mark.parametrize(
    ("meta", "message"),
    [({"id": "a", "source": 5}, "'source' is int 5; a source is a name"),
     ({"id": "a", "source": ["w"]}, "'source' is list ['w']; a source is a name"),
     ({"id": 7, "source": "w"}, "'id' is int 7; an id is a string")],
)  # fmt: skip
def test_a_tar_sample_whose_source_or_id_is_not_a_string_names_it(meta, message):
    import tarfile

    from winnow.train.data.tarshard import read_tar

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in (("s1.txt", b"text"), ("s1.json", json.dumps(meta).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(ShardError, match=rf"t\.tar: sample 's1': its \.json member's {re.escape(message)}"):
        read_tar(buf.getvalue(), "t.tar")


@pytest.mark.parametrize("spelling", ["shards/train/part-00000-00000.parquet", "shards/train/./part-00000-00000.parquet",
                                      "shards//train/part-00000-00000.parquet"])  # fmt: skip
def test_a_manifest_listing_a_shard_twice_is_refused(folder, spelling):
    """A shard listed twice in a hand-edited manifest, under one spelling or two, was read twice per epoch: other
    data than the job curated."""
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["shards"][0]["path"] == "shards/train/part-00000-00000.parquet"
    manifest["shards"].append({**manifest["shards"][0], "path": spelling})
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match=r"lists the shard shards/train/part-00000-00000\.parquet twice"):
        Loader(LoaderConfig(), folder)


@pytest.mark.parametrize("fmt", ["parquet", "tokens"])
def test_a_manifest_listing_a_val_shard_under_train_too_is_refused(tmp_path, fmt):
    """The same shard under both splits was trained on and measured as held out, with no word: every held-out loss
    was then a training loss."""
    from tests.train.shards_util import write_token_job

    docs = make_docs(30)
    write = write_token_job if fmt == "tokens" else write_job
    folder = write(tmp_path, [docs[:20]], val=[docs[20:]])
    manifest = json.loads((folder / "manifest.json").read_text())
    fmt_name = "tokens" if fmt == "tokens" else "parquet"
    val = [e for e in manifest["shards"] if e.get("split") == "val" and e["format"] == fmt_name]
    manifest["shards"] += [{**e, "split": "train"} for e in val]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    for split in ("train", "val"):
        with pytest.raises(ShardError, match=rf"lists the shard {re.escape(val[0]['path'])} under two splits"):
            Loader(LoaderConfig(batch_size=2, seq_len=32, num_workers=0, format=fmt), folder, split=split)


def test_tars_joined_by_cat_are_read_whole_and_a_cut_one_is_refused():
    """The loader stopped at the first end-of-archive marker: the second archive of ``cat a.tar b.tar`` was dropped
    without a word (``tar -i`` and curation's reader read both)."""
    import tarfile

    from winnow.train.data.tarshard import read_tar

    def tar(keys) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as out:
            for key in keys:
                for ext, data in (
                    ("txt", f"document {key}".encode()),
                    ("json", json.dumps({"id": key, "source": "web"}).encode()),
                ):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    out.addfile(info, io.BytesIO(data))
        return buf.getvalue()

    joined = tar(["a0", "a1"]) + tar(["b0", "b1", "b2"])
    assert read_tar(joined, "t.tar").column("id").to_pylist() == ["a0", "a1", "b0", "b1", "b2"]
    first = tar(["a0", "a1"])
    cut = first + tar(["b0"])[: 512 * 3]  # the second archive's members, no end marker after them
    with pytest.raises(ShardError, match="truncated tar"):
        read_tar(cut, "t.tar")
