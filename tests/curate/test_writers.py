"""Shard writers: rotation, determinism, both formats holding the same rows, readable by peers."""

from __future__ import annotations

import hashlib
import json

import polars as pl
import pytest

from winnow.curate.config import OutputConfig
from winnow.curate.writers.shards import ShardWriter, safe_keys


def rows(n: int, start: int = 0) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "id": [f"src/file.jsonl/{i}" for i in range(start, start + n)],
            "source": ["a" if i % 3 else "b" for i in range(start, start + n)],
            "text": [f"text {i} " * (i % 7 + 1) for i in range(start, start + n)],
            "meta": [json.dumps({"i": i}) for i in range(start, start + n)],
            "quality": [i / 100 for i in range(start, start + n)],
        }
    )


def write(folder, df, **out) -> list[dict]:
    w = ShardWriter(folder, "part-00000", OutputConfig(**out), split="train")
    for chunk in df.iter_slices(7):
        w.write(chunk)
    return w.close()


def test_rotates_by_rows_and_records_counts(tmp_path):
    entries = write(tmp_path, rows(25), shard_rows=10)
    parquet = [e for e in entries if e["format"] == "parquet"]
    assert [e["rows"] for e in parquet] == [10, 10, 5]
    assert sum(sum(e["sources"].values()) for e in parquet) == 25
    assert parquet[0]["means"]["quality"] == pytest.approx(sum(i / 100 for i in range(10)) / 10)
    for e in entries:
        assert e["sha256"] == hashlib.sha256(e["path"].read_bytes()).hexdigest()
        assert e["bytes"] == e["path"].stat().st_size
    assert not list(tmp_path.glob(".*.tmp"))


def test_means_are_of_finite_values_and_json(tmp_path):
    """NaN and infinities in a score column have no mean; the manifest holds the finite values' (bare NaN is no
    JSON: a strict reader refused the whole manifest)."""
    df = rows(4).with_columns(quality=pl.Series([float("nan"), 1.0, float("inf"), 3.0]), bad=pl.lit(float("nan")))
    (entry,) = [e for e in write(tmp_path, df) if e["format"] == "parquet"]
    assert entry["means"] == {"quality": 2.0}
    json.dumps(entry["means"], allow_nan=False)


def test_rotates_by_text_bytes(tmp_path):
    df = rows(30)
    limit = 200
    entries = [e for e in write(tmp_path, df, shard_rows=1000, shard_bytes=limit) if e["format"] == "parquet"]
    assert sum(e["rows"] for e in entries) == 30 and len(entries) > 1
    for e in entries:
        got = pl.read_parquet(e["path"])
        assert got["text"].str.len_bytes().sum() <= limit or got.height == 1


def test_same_rows_give_identical_bytes(tmp_path):
    a = write(tmp_path / "a", rows(40), shard_rows=15)
    b = write(tmp_path / "b", rows(40), shard_rows=15)
    assert [e["sha256"] for e in a] == [e["sha256"] for e in b]


def test_parquet_and_tar_hold_the_same_rows_in_order(tmp_path):
    import webdataset as wds

    entries = write(tmp_path, rows(12), shard_rows=5)
    for pq_entry, tar_entry in zip(*[[e for e in entries if e["format"] == f] for f in ("parquet", "webdataset")]):
        df = pl.read_parquet(pq_entry["path"])
        samples = list(wds.WebDataset(str(tar_entry["path"]), shardshuffle=False))
        assert [json.loads(s["json"])["id"] for s in samples] == df["id"].to_list()
        assert [s["txt"].decode() for s in samples] == df["text"].to_list()
        assert json.loads(samples[0]["json"])["quality"] == df["quality"][0]


def test_safe_keys_are_injective_and_mark_repeats():
    df = pl.DataFrame(
        {"id": ["a/b.c", "a%2Fb.c", "x~1", "x"], "repeat": [0, 0, 0, 2]}, schema_overrides={"repeat": pl.Int32}
    )
    keys = safe_keys(df).to_list()
    assert len(set(keys)) == 4
    assert all("/" not in k and "." not in k for k in keys)
    assert keys[3] == "x~2"


def _reference_tar(members: list[tuple[str, bytes]]) -> bytes:
    """The archive member by member, as ``tarfile`` builds headers: ustar for names of at most 100 bytes
    (mode 0644, uid/gid 0, mtime 0, devmajor/devminor written as zeros), PAX headers past that."""
    import tarfile

    out = bytearray()
    for name, payload in members:
        encoded = name.encode()
        if len(encoded) <= 100:
            h = bytearray(512)
            h[0 : len(encoded)] = encoded
            for offset, value in ((100, b"0000644\0"), (108, b"0000000\0"), (116, b"0000000\0"),
                                  (124, b"%011o\0" % len(payload)), (136, b"00000000000\0"), (148, b" " * 8),
                                  (156, b"0"), (257, b"ustar\x0000"), (329, b"0000000\0"), (337, b"0000000\0")):  # fmt: skip
                h[offset : offset + len(value)] = value
            h[148:156] = b"%06o\0 " % sum(h)
            out += h
        else:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(payload), 0o644, 0
            out += info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
        out += payload + bytes(-len(payload) % 512)
    out += bytes(1024 + (-(len(out) + 1024) % (20 * 512)))
    return bytes(out)


@pytest.mark.parametrize("seed", range(4))
def test_tar_bytes_equal_tarfiles_headers_for_any_name_and_payload(tmp_path, monkeypatch, seed):
    """Names around ustar's 100 bytes, non-ASCII ones (PAX record lengths crossing a digit), payloads
    around the 512-byte block, batches assembled in chunks of rows or bytes: the columnar writer's bytes
    are the member-by-member reference's, and ``tarfile`` reads every name and payload back."""
    import random
    import tarfile

    from winnow.curate.writers import tar as tar_module
    from winnow.curate.writers.tar import TarWriter

    if seed % 2:
        monkeypatch.setattr(tar_module, "_CHUNK_ROWS", 2)
        monkeypatch.setattr(tar_module, "_CHUNK_BYTES", 1500)

    rng = random.Random(seed)
    alphabet = "ab%~-_0" + "é漢\U0001f600"
    keys = ["".join(rng.choice(alphabet) for _ in range(rng.choice([0, 1, 45, 94, 95, 96, 97, 100, 101, 300, 990])))
            for _ in range(60)]  # fmt: skip
    texts = ["".join(rng.choice("x é\n") for _ in range(rng.choice([0, 1, 511, 512, 513, 3000]))) for _ in keys]
    metas = [json.dumps({"n": i, "k": k}, ensure_ascii=False) for i, k in enumerate(keys)]
    path = tmp_path / "a.tar"
    writer = TarWriter(path.open("wb"))
    for start in range(0, len(keys), 7):
        end = start + 7
        writer.add(pl.Series(keys[start:end], dtype=pl.String),
                   [(".txt", pl.Series(texts[start:end])), (".json", pl.Series(metas[start:end]))])  # fmt: skip
    writer.close()
    members = [
        (k + suffix, v.encode()) for k, t, m in zip(keys, texts, metas) for suffix, v in ((".txt", t), (".json", m))
    ]
    assert path.read_bytes() == _reference_tar(members)
    with tarfile.open(path) as tar:
        assert [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()] == members


def test_tar_samples_are_uniquely_named_and_their_json_valid_whatever_the_ids_and_meta(tmp_path):
    """Ids a job lets repeat (``duplicate_ids = "allow"``), across batches, and long ones with newlines; a ``meta``
    that only looks like a JSON object: every sample keeps its own name, every .json member parses, and
    webdataset, tarfile and the trainer's reader give back the Parquet shard's rows."""
    import tarfile

    import webdataset as wds

    from winnow.train.data.tarshard import read_tar

    ids = ["dup", "dup", "long\nnl" + "x" * 120, "dup~1", "a"]
    metas = ['{"k": 1}', "{oops}", '{"a":1}\n}', '{"k": }', None]
    df = pl.DataFrame({"id": ids, "source": ["s"] * 5, "text": [f"text {i}" for i in range(5)], "meta": metas})
    writer = ShardWriter(tmp_path, "part-00000", OutputConfig(shard_rows=100), split="train", repeated_ids=True)
    writer.write(df.head(3))
    writer.write(df.slice(3))
    writer.write(df.head(1))  # a third "dup" in a later batch
    (tar_entry,) = [e for e in writer.close() if e["format"] == "webdataset"]
    with tarfile.open(tar_entry["path"]) as tar:
        names = tar.getnames()
        metas_back = [json.loads(tar.extractfile(n).read())["meta"] for n in names if n.endswith(".json")]
    assert len(names) == len(set(names)) == 12
    assert metas_back == [{"k": 1}, "{oops}", '{"a":1}\n}', '{"k": }', None, {"k": 1}]
    samples = list(wds.WebDataset(str(tar_entry["path"]), shardshuffle=False))
    assert [s["txt"].decode() for s in samples] == [f"text {i}" for i in (0, 1, 2, 3, 4, 0)]
    rows = read_tar(tar_entry["path"].read_bytes(), "t")
    assert rows["id"].to_pylist() == [*ids, "dup"] and rows["text"].to_pylist()[2] == "text 2"


def test_a_job_that_lets_ids_repeat_writes_each_copy_as_its_own_sample(tmp_path, write_job):
    import webdataset as wds

    from winnow.curate.pipeline import run_job
    from winnow.pipelines.jobfile import load_job

    (tmp_path / "in.jsonl").write_text(
        "".join(json.dumps({"id": "dup", "text": t}) + "\n" for t in ("a b", "c d", "e f"))
    )
    job = load_job(
        write_job(
            f'duplicate_ids = "allow"\n\n[[inputs]]\nsource = "s"\npath = "{tmp_path}/in.jsonl"\n\n'
            '[output]\nformats = ["parquet", "webdataset"]\n'
        )
    )
    manifest = run_job(job, progress=False)
    (tar,) = [s["path"] for s in manifest["shards"] if s["format"] == "webdataset"]
    samples = list(wds.WebDataset(str(job.output_dir / tar), shardshuffle=False))
    assert [(s["__key__"], s["txt"]) for s in samples] == [("dup", b"a b"), ("dup~~1", b"c d"), ("dup~~2", b"e f")]


def test_a_job_whose_ids_are_checked_names_its_samples_without_counting_keys(tmp_path, write_job, monkeypatch):
    """The per-shard key count is for jobs that let ids repeat; a default job (its ids checked, optimistically)
    writes its tars column-wise only."""
    from winnow.curate.pipeline import run_job
    from winnow.curate.writers import shards
    from winnow.pipelines.jobfile import load_job

    def counted(self, keys):
        raise AssertionError("keys counted in a job whose ids are unique")

    monkeypatch.setattr(shards._Keys, "unique", counted)
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"id": f"i{n}", "text": "a b"}) + "\n" for n in range(3)))
    job = load_job(
        write_job(f'[[inputs]]\nsource = "s"\npath = "{tmp_path}/in.jsonl"\n\n[output]\nformats = ["webdataset"]\n')
    )
    assert run_job(job, progress=False)["totals"]["rows_written"] == 3


def test_a_tar_member_the_format_cannot_hold_is_an_error_not_a_silent_loss(tmp_path, monkeypatch):
    """A null value would drop its member (Arrow's join gives null); a payload past the size field's 11 octal
    digits would write a corrupt header."""
    from winnow.curate.errors import OutputError
    from winnow.curate.writers import tar as tar_module
    from winnow.curate.writers.tar import TarWriter

    writer = TarWriter((tmp_path / "a.tar").open("wb"))
    with pytest.raises(OutputError, match="null"):
        writer.add(pl.Series(["a", "b"]), [(".txt", pl.Series(["x", None]))])
    monkeypatch.setattr(tar_module, "_MAX_SIZE", 4)
    with pytest.raises(OutputError, match=r"member of 5 bytes is past the tar header's limit \(3 bytes\)"):
        writer.add(pl.Series(["a"]), [(".txt", pl.Series(["12345"]))])


@pytest.mark.parametrize("stage", ['kind = "dedup.exact"', 'kind = "order"\nby = "length"', 'kind = "mix"'])
def test_ids_that_repeat_in_a_job_allowing_them_stop_a_stage_that_decides_by_id(tmp_path, write_job, stage):
    """With the id check skipped, rows sharing an id would all go with one decision (a unique text rejected as
    another's copy) or break the stage's count: the stage stops first, naming the id and the setting."""
    from winnow.curate.errors import StageError
    from winnow.curate.pipeline import run_job
    from winnow.pipelines.jobfile import load_job

    rows = [("b", "alpha one two three four five six"), ("b", "gamma one two three four five six"), ("a", "gamma")]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in rows))
    job = load_job(
        write_job(
            f'duplicate_ids = "allow"\n\n[[inputs]]\nsource = "s"\npath = "{tmp_path}/in.jsonl"\n\n[[stages]]\n{stage}\n'
        )
    )
    with pytest.raises(StageError, match=r"two rows share the id 'b'.*duplicate_ids = \"reject\""):
        run_job(job, progress=False)
