"""Tasks smaller than a file: every split of a file reads each record exactly once, with the same ids."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import orjson
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from winnow.curate.config import InputConfig, JobSection
from winnow.curate.errors import ConfigError
from winnow.curate.pipeline import run_job
from winnow.curate.readers import plan_read_tasks, read_task
from winnow.curate.readers.ranges import zstd_frames
from winnow.pipelines.jobfile import load_job

REPO = Path(__file__).resolve().parents[2]


def read(cfg: InputConfig, task_bytes: int) -> tuple[list, list, int]:
    """(id, text) of the rows, (id, reason, offset) of the rejects, and the number of tasks."""
    tasks = plan_read_tasks([cfg], task_bytes)
    rows, rejects = [], []
    for task in tasks:
        for batch in read_task(cfg, task, 7):
            rows += batch.rows.select("id", "text").rows()
            rejects += [
                (i, r, json.loads(m)["offset"]) for i, r, m in batch.rejects.select("id", "reason", "meta").rows()
            ]
    return rows, rejects, len(tasks)


def ragged_jsonl(n: int = 60) -> bytes:
    """Lines of very different lengths, blank lines, a bad line, and no newline at the end."""
    lines = []
    for i in range(n):
        if i % 17 == 5:
            lines.append(b"")
        elif i % 23 == 7:
            lines.append(b'{"text": broken')
        else:
            lines.append(orjson.dumps({"text": "w" * (i * 7 % 61) + f" doc {i}"}))
    return b"\n".join(lines)


@pytest.mark.slow  # ~10,000 tasks read
def test_jsonl_byte_ranges_read_every_line_once_whatever_the_cut(tmp_path):
    data = ragged_jsonl()
    (tmp_path / "a.jsonl").write_bytes(data)
    cfg = InputConfig(source="s", path=str(tmp_path / "a.jsonl"))
    whole = read(cfg, len(data))
    assert whole[2] == 1 and len(whole[0]) > 40 and len(whole[1]) == 3
    for task_bytes in [*range(1, 90), 101, 257, len(data) - 1]:  # cuts at, before and after every kind of byte
        rows, rejects, n_tasks = read(cfg, task_bytes)
        assert n_tasks == -(-len(data) // task_bytes)
        assert (rows, rejects) == whole[:2], task_bytes


def test_derived_ids_are_byte_offsets_of_the_line(tmp_path):
    data = ragged_jsonl(10)
    (tmp_path / "a.jsonl").write_bytes(data)
    rows, _, _ = read(InputConfig(source="s", path=str(tmp_path / "a.jsonl")), 16)
    for id_, text in rows:
        offset = int(id_.rsplit("@", 1)[1])
        assert orjson.loads(data[offset:].split(b"\n", 1)[0])["text"] == text


def frames(data: bytes, cuts: list[int], *, sizes: bool = True) -> bytes:
    """``data`` as one zstd frame per piece (cut mid-line on purpose), with or without their sizes."""
    out = io.BytesIO()
    edges = [0, *cuts, len(data)]
    for a, b in zip(edges, edges[1:]):
        out.write(zstandard.ZstdCompressor(write_content_size=sizes, write_checksum=a % 2 == 0).compress(data[a:b]))
        if a == 0:  # a skippable frame between data frames is stepped over
            out.write((0x184D2A50).to_bytes(4, "little") + (3).to_bytes(4, "little") + b"xyz")
    return out.getvalue()


def test_multi_frame_zstd_is_split_at_frames_with_the_uncompressed_offsets_as_ids(tmp_path):
    data = ragged_jsonl(200)
    cuts = list(range(97, len(data), 331))
    (tmp_path / "a.jsonl.zst").write_bytes(frames(data, cuts))
    (tmp_path / "a.jsonl").write_bytes(data)
    plain = read(InputConfig(source="s", path=str(tmp_path / "a.jsonl")), len(data))
    cfg = InputConfig(source="s", path=str(tmp_path / "a.jsonl.zst"))
    with open(tmp_path / "a.jsonl.zst", "rb") as fh:
        walked = zstd_frames(fh, (tmp_path / "a.jsonl.zst").stat().st_size)
    assert [size for _, size in walked] == [b - a for a, b in zip([0, *cuts], [*cuts, len(data)])]
    same_name = lambda rows: [(r[0].replace(".jsonl.zst@", ".jsonl@"), *r[1:]) for r in rows]  # noqa: E731
    for task_bytes in (1, 150, 400, 1000, 10**6):
        rows, rejects, n_tasks = read(cfg, task_bytes)
        assert (same_name(rows), same_name(rejects)) == plain[:2], task_bytes
        assert n_tasks > 1 or task_bytes == 10**6


def test_zstd_that_cannot_be_split_is_one_task(tmp_path):
    data = ragged_jsonl(100)
    (tmp_path / "single.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
    (tmp_path / "unsized.jsonl.zst").write_bytes(frames(data, [300, 900], sizes=False))
    (tmp_path / "a.jsonl.gz").write_bytes(__import__("gzip").compress(data))
    (tmp_path / "a.jsonl").write_bytes(data)
    plain = read(InputConfig(source="s", path=str(tmp_path / "a.jsonl")), len(data))
    for name in ("single.jsonl.zst", "unsized.jsonl.zst", "a.jsonl.gz"):
        rows, rejects, n_tasks = read(InputConfig(source="s", path=str(tmp_path / name)), 10)
        assert n_tasks == 1 and [r[1] for r in rows] == [r[1] for r in plain[0]], name


def test_parquet_is_split_by_row_groups_with_row_index_ids(tmp_path):
    texts = [f"document {i} " + "x" * (i % 13) for i in range(500)]
    pq.write_table(pa.table({"text": texts}), tmp_path / "a.parquet", row_group_size=37)
    cfg = InputConfig(source="s", path=str(tmp_path / "a.parquet"), format="parquet")
    whole = read(cfg, 10**9)
    assert whole[2] == 1 and [t for _, t in whole[0]] == texts
    for task_bytes in (1, 500, 2000):
        rows, rejects, n_tasks = read(cfg, task_bytes)
        assert n_tasks > 1 and (rows, rejects) == whole[:2]
    assert read(cfg, 1)[2] == -(-500 // 37)  # one task per row group at the smallest size


def tar_bytes(samples: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(samples):
            members = {"txt": f"sample {i} ".encode() * (1 + i % 9), "json": orjson.dumps({"n": i})}
            if i % 5 == 0:
                members["extra.bin"] = b"\0" * 700
            for ext, payload in members.items():
                info = tarfile.TarInfo(f"shard/{i:05d}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


def test_tar_is_split_by_members_keeping_each_sample_whole(tmp_path):
    (tmp_path / "a.tar").write_bytes(tar_bytes(80))
    cfg = InputConfig(source="s", path=str(tmp_path / "a.tar"), format="webdataset")
    whole = read(cfg, 10**9)
    assert whole[2] == 1 and len(whole[0]) == 80
    for task_bytes in (1, 1500, 4096, 20000):
        rows, rejects, n_tasks = read(cfg, task_bytes)
        assert n_tasks > 1 and (rows, rejects) == whole[:2], task_bytes


def test_task_bytes_below_one_mib_is_refused_by_key():
    with pytest.raises(ConfigError, match=r"job\.task_bytes = 1000 is invalid; allowed: an integer >= 1048576"):
        JobSection(name="x", task_bytes=1000)


JOB = """
task_bytes = {task_bytes}
workers = 2
batch_rows = 500

[[inputs]]
source = "docs"
path = "{docs}"

[[inputs]]
source = "legal"
path = "{legal}"
format = "parquet"

[[stages]]
kind = "clean"

[[stages]]
kind = "filter.length"
min_words = 20

[[stages]]
kind = "dedup.exact"

[[stages]]
kind = "dedup.minhash"
{order}
[output]
shard_rows = 700
formats = ["parquet"]
"""


def big_inputs(tmp_path: Path) -> tuple[Path, Path]:
    """A ~3 MB JSONL and a Parquet file of many row groups, from the sample data, with copies in them."""
    docs = sorted((REPO / "data_samples" / "docs").rglob("*"))
    texts = [p.read_text(errors="replace") for p in docs if p.is_file()]
    lines, i = [], 0
    while sum(map(len, lines)) < 2_200_000:
        text = texts[i % len(texts)]
        lines.append(orjson.dumps({"text": text if i < len(texts) else f"{text}\nedition {i // len(texts)}"}))
        i += 1
    (tmp_path / "docs.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    legal = [p.read_text(errors="replace") for p in sorted((REPO / "data_samples" / "legal").rglob("*.txt"))]
    pq.write_table(pa.table({"text": (legal * 4)[:1200]}), tmp_path / "legal.parquet", row_group_size=40)
    return tmp_path / "docs.jsonl", tmp_path / "legal.parquet"


def shard_rows(out: Path) -> pl.DataFrame:
    return pl.concat([pl.read_parquet(f) for f in sorted((out / "shards" / "parquet" / "train").glob("*.parquet"))])


@pytest.mark.slow
@pytest.mark.parametrize("order", ["", '\n[[stages]]\nkind = "order"\nby = "length"\n'])
def test_a_job_gives_the_same_ids_and_shards_whatever_task_bytes_is(tmp_path, write_job, order):
    docs, legal = big_inputs(tmp_path)
    outs = {}
    for task_bytes in (1 << 20, 256 << 20):
        job = load_job(
            write_job(JOB.format(task_bytes=task_bytes, docs=docs, legal=legal, order=order), name=f"t{task_bytes}")
        )
        manifest = run_job(job, progress=False)
        outs[task_bytes] = (job.output_dir, manifest)
    (small, m_small), (big, m_big) = outs[1 << 20], outs[256 << 20]
    assert len(m_small["inputs"]) == len(m_big["inputs"])
    counts = lambda m: {k: v for k, v in m["totals"].items() if k != "seconds"}  # noqa: E731
    assert counts(m_small) == counts(m_big)
    a, b = shard_rows(small), shard_rows(big)
    assert a.height > 200 and a["id"].to_list() == b["id"].to_list() and a.equals(b)

    def rejects(out):
        return pl.concat([pl.read_parquet(f) for f in sorted((out / "rejects").glob("*.parquet"))]).sort("id")

    assert (
        rejects(small)
        .select("id", "reason", "duplicate_of")
        .equals(rejects(big).select("id", "reason", "duplicate_of"))
    )
    if order:  # one ordered write: the very same shard files
        names = sorted(p.relative_to(small).as_posix() for p in small.rglob("*.parquet") if "rejects" not in p.parts)
        assert names == sorted(
            p.relative_to(big).as_posix() for p in big.rglob("*.parquet") if "rejects" not in p.parts
        )
        assert all((small / n).read_bytes() == (big / n).read_bytes() for n in names)


def test_ordered_train_shards_are_the_same_files_however_the_input_is_cut_into_tasks(tmp_path, write_job):
    """A task per file (`group_bytes = 0`, 6 tasks) or one task for all: the same ordered train shard files,
    byte for byte, each within `shard_bytes` give or take a row (no sliver shards)."""
    rng = np.random.default_rng(0)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    for f in range(6):
        lines = [{"id": f"f{f}-{i}", "text": " ".join(rng.choice(words, int(rng.integers(5, 60))))} for i in range(80)]
        (tmp_path / f"in{f}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    body = f"""{{group}}
[[inputs]]
source = "s"
path = "{tmp_path}/in*.jsonl"

[[stages]]
kind = "order"
by = "random"

[output]
formats = ["parquet"]
shard_bytes = 20000
"""
    outs = []
    for name, group in (("each", "group_bytes = 0\n"), ("grouped", "")):
        job = load_job(write_job(body.format(group=group), name=name))
        manifest = run_job(job, progress=False)
        train = [s for s in manifest["shards"] if s["split"] == "train"]
        outs.append({s["path"]: (job.output_dir / s["path"]).read_bytes() for s in train})
        assert all(s["row_bytes"] <= 20000 + 600 for s in train) and len(train) >= 5
        assert min(s["row_bytes"] for s in train) > 20000 / 3  # ranges of about 0.8 x shard_bytes, halved at most
    assert outs[0] == outs[1]


def test_tasks_start_largest_first_and_write_what_they_write_in_task_order(tmp_path, write_job, monkeypatch):
    """A big file listed last starts first (a large task started late keeps a phase waiting on it); the
    shards are the same files as the tasks' order would give."""
    import winnow.curate.pipeline as pipeline

    root = tmp_path / "in"
    root.mkdir()
    for name, n in (("a", 5), ("b", 40), ("c", 2), ("d", 300)):
        rows = [{"id": f"{name}{i}", "text": f"document {name} {i} " * 20} for i in range(n)]
        (root / f"{name}.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    started = []
    run_task = pipeline.run_task
    monkeypatch.setattr(pipeline, "run_task", lambda spec: started.append(spec.read.files[0].rel) or run_task(spec))
    job = load_job(
        write_job(
            f'group_bytes = 0\n\n[[inputs]]\nsource = "s"\npath = "{root}/*.jsonl"\n\n[output]\nshard_rows = 1000\n'
        )
    )
    manifest = run_job(job, progress=False)
    assert started == ["d.jsonl", "b.jsonl", "a.jsonl", "c.jsonl"]
    shards = [s for s in manifest["shards"] if s["format"] == "parquet"]
    assert [s["rows"] for s in shards] == [5, 40, 2, 300]  # a shard per task, in task (file) order


def test_a_span_of_row_groups_counts_as_its_share_of_the_file():
    from winnow.curate.readers import ReadTask, largest_first
    from winnow.curate.readers.files import InputFile
    from winnow.curate.readers.ranges import Span

    big = InputFile("big.parquet", "big.parquet", 10_000, None)
    gz = InputFile("one.jsonl.gz", "one.jsonl.gz", 3_000, None)
    tasks = [ReadTask(0, (big,), Span(i, i + 1, unit="row groups")) for i in range(5)] + [ReadTask(1, (gz,))]
    assert largest_first(tasks) == [5, 0, 1, 2, 3, 4]  # 3,000 bytes before five spans of 2,000


def test_the_files_of_an_input_are_read_in_one_order_however_its_paths_are_listed(tmp_path):
    for name in ("b.jsonl", "a.jsonl", "c.jsonl"):
        (tmp_path / name).write_text(json.dumps({"id": "x", "text": name}) + "\n")
    orders = []
    for paths in (["b.jsonl", "a.jsonl", "c.jsonl"], ["c.jsonl", "a.jsonl", "b.jsonl"]):
        cfg = InputConfig(source="s", path=[str(tmp_path / p) for p in paths])
        orders.append([f.rel for t in plan_read_tasks([cfg]) for f in t.files])
    assert orders[0] == orders[1] == ["a.jsonl", "b.jsonl", "c.jsonl"]
