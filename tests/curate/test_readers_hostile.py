"""Hostile input to the readers: invalid UTF-8 and tar link members.

Invalid bytes become ``read:bad_utf8`` rejects, never a polars ``PanicException`` or a shard that
polars and ``datasets`` cannot open; link members become ``read:link_member`` rejects, never vanish.
"""

from __future__ import annotations

import base64
import decimal
import io
import json
import math
import os
import random
import tarfile

import orjson
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.curate.test_readers import _tar as _member_tar
from winnow.curate.config import InputConfig
from winnow.curate.errors import InputError
from winnow.curate.pipeline import run_job
from winnow.curate.readers import plan_read_tasks, read_task
from winnow.pipelines.jobfile import load_job


def read_all(cfg: InputConfig) -> tuple[pl.DataFrame, pl.DataFrame]:
    batches = [b for t in plan_read_tasks([cfg]) for b in read_task(cfg, t, 1000)]
    return pl.concat([b.rows for b in batches]), pl.concat([b.rejects for b in batches])


def good_lines(n: int) -> bytes:
    return b"".join(orjson.dumps({"id": f"g{i}", "text": f"good text {i}"}) + b"\n" for i in range(n))


def test_invalid_byte_in_a_block_of_good_lines_is_a_bad_utf8_reject_with_its_byte_offset(tmp_path):
    head = good_lines(50)
    (tmp_path / "a.jsonl").write_bytes(head + b'{"id": "bad", "text": "caf\xe9"}\n' + good_lines(3))
    rows, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "a.jsonl")))
    assert rows.height == 53
    assert rejects["reason"].to_list() == ["read:bad_utf8"] and rejects["id"].to_list() == ["bad"]
    where = json.loads(rejects["meta"][0])
    assert where["file"].endswith("a.jsonl") and where["offset"] == len(head)
    assert where["byte"] == len(head) + len(b'{"id": "bad", "text": "caf')
    assert rejects["text"][0] == '{"id": "bad", "text": "caf\ufffd"}'  # shown with U+FFFD, kept exactly in meta
    assert base64.b64decode(where["raw_base64"]) == b'{"id": "bad", "text": "caf\xe9"}'


def test_escaped_lone_surrogate_is_a_bad_utf8_reject(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(good_lines(2) + b'{"id": "s", "text": "x\\ud800y"}\n')
    rows, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "a.jsonl")))
    assert rows.height == 2
    assert rejects["reason"].to_list() == ["read:bad_utf8"]
    assert "surrogate" in json.loads(rejects["meta"][0])["error"]


@pytest.mark.parametrize("blank_line", [False, True], ids=["block parser", "line by line"])
def test_meta_values_are_the_same_whichever_parser_reads_the_lines(tmp_path, blank_line):
    """Records whose keys agree go through Arrow's block parser, others (a blank line) line by line: the meta
    is what the lines hold either way (no 1 -> 1.0 in a list beside a float, no uint64 rounded, no date
    string turned timestamp, a null first in a list read), and NaN, which is no JSON, is a reject either way."""
    records = [
        b'{"id": "a", "text": "one", "h": [18446744073709551615, 3], "v": [1, 2.5], "d": ["2021-05-06 10:00:00Z"],'
        b' "s": [null, 0.5], "n": [[1, 2.5], [3]]}',
        b'{"id": "b", "text": "two", "h": [1, 2], "v": [3, 4.5], "d": ["2022-02-02"], "s": [0.1, 0.2], "n": [[4.5]]}',
    ]
    (tmp_path / "a.jsonl").write_bytes(b"\n".join(records) + (b"\n\n" if blank_line else b"\n"))
    (tmp_path / "b.jsonl").write_bytes(
        b'{"id": "c", "text": "three", "x": NaN}\n{"id": "e", "text": "four", "x": 0.5}\n'
    )
    rows, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "*.jsonl")))
    meta = dict(zip(rows["id"], rows["meta"], strict=True))
    assert orjson.loads(meta["a"]) == {
        "h": [18446744073709551615, 3], "v": [1, 2.5], "d": ["2021-05-06 10:00:00Z"], "s": [None, 0.5], "n": [[1, 2.5], [3]]
    }  # fmt: skip
    assert '"v":[1,2.5]' in meta["a"] and '"v":[3,4.5]' in meta["b"]
    assert rejects["reason"].to_list() == ["read:bad_json"] and rejects["id"].to_list() == ["s/b.jsonl@0"]
    assert sorted(meta) == ["a", "b", "e"]


def test_files_joined_with_their_byte_order_marks_are_read_whole(tmp_path):
    bom = b"\xef\xbb\xbf"
    (tmp_path / "a.jsonl").write_bytes(
        bom + good_lines(2) + bom + b'{"id": "b1", "text": "b"}\n' + bom + good_lines(1)[:-1]
    )
    rows, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "a.jsonl")))
    assert rejects.height == 0 and rows["id"].to_list() == ["g0", "g1", "b1", "g0"]


def test_parquet_string_column_with_invalid_bytes_rejects_only_that_row(tmp_path):
    raw = pa.array([b"fine", b"caf\xe9", b"also fine"], pa.binary())
    text = pa.Array.from_buffers(pa.string(), len(raw), raw.buffers())  # a writer that did not validate
    pq.write_table(pa.table({"id": ["a", "b", "c"], "text": text}), tmp_path / "a.parquet")
    rows, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "a.parquet"), format="parquet"))
    assert rows["id"].to_list() == ["a", "c"]
    assert rejects["reason"].to_list() == ["read:bad_utf8"] and rejects["id"].to_list() == ["b"]
    assert json.loads(rejects["meta"][0])["row"] == 1
    assert base64.b64decode(json.loads(rejects["meta"][0])["text_base64"]) == b"caf\xe9"  # the bytes, exactly


def test_job_with_invalid_utf8_writes_shards_polars_and_datasets_open(tmp_path, write_job, nothing_lost):
    import datasets

    (tmp_path / "a.jsonl").write_bytes(good_lines(20) + b'{"id": "bad", "text": "caf\xe9 au lait"}\n')
    job = load_job(
        write_job(f'[[inputs]]\nsource = "s"\npath = "{tmp_path / "a.jsonl"}"\n[output]\nformats = ["parquet"]\n')
    )
    manifest = run_job(job, progress=False)
    nothing_lost(job.output_dir, {f"g{i}" for i in range(20)} | {"bad"})
    assert manifest["by_source"]["s"]["rejected"] == {"read:bad_utf8": 1}
    files = [str(job.output_dir / s["path"]) for s in manifest["shards"]]
    assert pl.read_parquet(files).height == 20
    assert datasets.load_dataset("parquet", data_files=files, split="train").num_rows == 20


def tar_with_links(path) -> None:
    with tarfile.open(path, "w") as tar:
        for name, payload in (("a.txt", b"first sample"), ("b.txt", b"second sample")):
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
        sym = tarfile.TarInfo("c.txt")
        sym.type, sym.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(sym)
        hard = tarfile.TarInfo("d.txt")
        hard.type, hard.linkname = tarfile.LNKTYPE, "a.txt"
        tar.addfile(hard)
        fifo = tarfile.TarInfo("e.txt")
        fifo.type = tarfile.FIFOTYPE
        tar.addfile(fifo)


def test_tar_link_members_are_link_member_rejects(tmp_path):
    tar_with_links(tmp_path / "a.tar")
    rows, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "a.tar"), format="webdataset"))
    assert rows["text"].to_list() == ["first sample", "second sample"]
    assert rejects["reason"].to_list() == ["read:link_member", "read:link_member", "read:special_member"]
    assert rejects["id"].to_list() == ["s/a.tar/c.txt", "s/a.tar/d.txt", "s/a.tar/e.txt"]
    assert "/etc/passwd" in json.loads(rejects["meta"][0])["error"]


def test_tar_member_and_file_names_with_invalid_bytes_give_readable_ids(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    path = bytes(folder) + b"/caf\xe9.tar"
    with tarfile.open(path.decode("utf-8", "surrogateescape"), "w", encoding="utf-8", errors="surrogateescape") as tar:
        info = tarfile.TarInfo(b"k\xff.txt".decode("utf-8", "surrogateescape"))
        info.size = 4
        tar.addfile(info, io.BytesIO(b"text"))
    rows, rejects = read_all(InputConfig(source="s", path=str(folder), format="webdataset"))
    assert rows["id"].to_list() == ["s/caf\\xe9.tar/k\\xff"]
    assert rejects.height == 0


def test_a_read_that_fails_midway_keeps_the_lines_before_and_one_truncated_reject(tmp_path, monkeypatch):
    import errno

    import winnow.curate.readers.jsonl as jsonl

    (tmp_path / "a.jsonl").write_bytes(good_lines(3))

    class FailingDisk(io.BytesIO):
        def read(self, n=-1):
            if self.tell():
                raise OSError(errno.EIO, "Input/output error")
            return super().read(40)  # the first line (34 bytes) and part of the second

    monkeypatch.setattr(jsonl, "open_binary", lambda url, options, decompress: FailingDisk(good_lines(3)))
    rows, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "a.jsonl")))
    assert rows["id"].to_list() == ["g0"]
    assert rejects["reason"].to_list() == ["read:truncated"]
    assert "Input/output error" in json.loads(rejects["meta"][0])["error"]


def test_a_split_column_names_no_folder_but_train_or_val(tmp_path, write_job, nothing_lost):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "part-00000-00000.parquet").write_text("the user's file")
    rows = {"id": ["a", "b", "c", "d"], "source": ["s"] * 4, "text": ["w", "x", "y", "z"], "meta": ["{}"] * 4}
    rows["split"] = ["../../../../victim", "val", None, "test"]  # winnow's own layout, a split it never writes
    pq.write_table(pa.table(rows), tmp_path / "in.parquet")
    job = load_job(write_job(f'[[inputs]]\nsource = "s"\npath = "{tmp_path / "in.parquet"}"\nformat = "parquet"\n'))
    manifest = run_job(job, progress=False)
    assert (victim / "part-00000-00000.parquet").read_text() == "the user's file"
    assert sorted(p.name for p in (job.output_dir / "shards" / "parquet").iterdir()) == ["train", "val"]
    nothing_lost(job.output_dir, {"a", "b", "c", "d"})
    assert manifest["by_source"]["s"]["rejected"] == {"read:bad_schema": 2}
    errors = [json.loads(m)["error"] for m in pl.read_parquet(job.output_dir / "rejects")["meta"]]
    assert all("column 'split' holds" in e and "'train' or 'val'" in e for e in errors)


def test_winnow_columns_of_another_type_are_that_rows_reject(tmp_path):
    rows = {"id": ["a", "b", "c"], "source": ["s"] * 3, "text": ["x", "y", "z"], "meta": ["{}"] * 3}
    pq.write_table(pa.table({**rows, "quality": ["high", "0.5", None]}), tmp_path / "a.parquet")
    kept, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "a.parquet"), format="parquet"))
    assert kept["id"].to_list() == ["b", "c"] and kept["quality"].to_list() == [0.5, None]
    assert rejects["reason"].to_list() == ["read:bad_schema"] and rejects["id"].to_list() == ["a"]
    assert json.loads(rejects["meta"][0])["error"].startswith("column 'quality' holds high")


def test_parquet_null_ids_are_derived_and_an_input_row_column_is_meta(tmp_path):
    table = pa.table({"id": ["a", None, None], "text": ["same"] * 3, "__row": [7, 7, 7]})
    pq.write_table(table, tmp_path / "a.parquet")
    kept, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "a.parquet"), format="parquet"))
    assert rejects.is_empty()
    assert kept["id"].to_list() == ["a", "s/a.parquet/1", "s/a.parquet/2"]
    assert [json.loads(m) for m in kept["meta"]] == [{"__row": 7}] * 3


def test_compressed_text_documents_are_read_whole_or_are_truncated_rejects(tmp_path):
    import lzma

    import zstandard

    zstd = zstandard.ZstdCompressor()
    (tmp_path / "frames.txt.zst").write_bytes(zstd.compress(b"first half ") + zstd.compress(b"second half"))
    cut = zstd.compress(bytes(range(256)) * 400)
    (tmp_path / "cut.txt.zst").write_bytes(cut[: len(cut) // 2])
    (tmp_path / "plain.txt.zst").write_bytes(b"plain text, not zstd")
    (tmp_path / "plain.txt.xz").write_bytes(b"plain text, not xz")
    (tmp_path / "ok.txt.xz").write_bytes(lzma.compress(b"an xz document"))
    kept, rejects = read_all(InputConfig(source="s", path=str(tmp_path), format="text"))
    assert dict(zip(kept["id"], kept["text"])) == {
        "s/frames.txt.zst": "first half second half",
        "s/ok.txt.xz": "an xz document",
    }
    assert sorted(zip(rejects["id"], rejects["reason"])) == [
        (f"s/{name}", "read:truncated") for name in ("cut.txt.zst", "plain.txt.xz", "plain.txt.zst")
    ]


def test_a_tar_member_name_given_twice_keeps_the_first_copy_and_rejects_the_second(tmp_path):
    with tarfile.open(tmp_path / "a.tar", "w") as tar:
        for name, data in (("k.txt", b"first copy"), ("k.txt", b"second copy"), ("m.txt", b"other sample")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    kept, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "a.tar"), format="webdataset"))
    assert kept["text"].to_list() == ["first copy", "other sample"]
    assert rejects["reason"].to_list() == ["read:duplicate_member"] and rejects["text"].to_list() == ["second copy"]
    assert json.loads(rejects["meta"][0])["member"] == "k.txt"


def test_a_samples_other_members_go_to_meta_and_one_without_text_keeps_every_member(tmp_path):
    _member_tar(tmp_path / "a.tar", [
        ("s0.txt", b"zero"), ("s0.url", b"http://x/0"), ("s0.cls", b"\xff\x01"), ("s0.json", b'{"lang": "en", "url": "y"}'),
        ("s1.TXT", b"one, under another extension"), ("s1.json", b'{"id": "one"}'),
    ])  # fmt: skip
    kept, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "a.tar"), format="webdataset"))
    assert kept["text"].to_list() == ["zero"]
    assert json.loads(kept["meta"][0]) == {
        "lang": "en",
        "url": "y",
        "url.member": "http://x/0",
        "cls": {"base64": "/wE="},
    }
    assert rejects["reason"].to_list() == ["read:missing_text"] and rejects["id"].to_list() == ["one"]
    assert json.loads(rejects["text"][0]) == {"TXT": "one, under another extension", "json": '{"id": "one"}'}
    assert "no .txt member (it has: .TXT, .json); name the text member s1.txt" in rejects["meta"][0]


def test_a_tar_whose_samples_members_are_not_consecutive_is_refused_naming_the_sample(tmp_path):
    """`tar cf` of a folder stores members in the file system's order: a sample's .json before another sample's
    members and its .txt after them would be read as two samples (one without its id and meta)."""
    _member_tar(tmp_path / "a.tar", [("d3.json", b'{"id": "three"}'), ("d9.txt", b"nine"), ("d3.txt", b"three")])
    with pytest.raises(InputError, match=r"a.tar: member 'd3.txt' \(byte 2048\) belongs to sample 'd3'.*--sort=name"):
        read_all(InputConfig(source="s", path=str(tmp_path / "a.tar"), format="webdataset"))
    _member_tar(tmp_path / "b.tar", [("d3.txt", b"three"), ("d9.txt", b"nine"), ("d3.txt", b"three again")])
    kept, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "b.tar"), format="webdataset"))
    assert kept["text"].to_list() == ["three", "nine", "three again"]  # a copy of a sample (`cat a.tar a.tar`) is read


@pytest.mark.parametrize("task_bytes", [1 << 28, 1 << 20])
def test_a_tar_with_a_scattered_sample_is_refused_whatever_the_task_size(tmp_path, task_bytes):
    """Larger than task_bytes, such a tar was cut into spans between the sample's members, each read as a sample of
    its own: the text without its id and meta, the json a read:missing_text reject, without a word."""
    filler = [(f"f{i:03d}.txt", b"filler text %d " % i * 5000) for i in range(30)]  # ~75 KB each: 2.2 MB
    _member_tar(tmp_path / "a.tar", [("a.json", b'{"id": "A", "url": "http://x"}'), *filler, ("a.txt", b"text of A")])
    cfg = InputConfig(source="s", path=str(tmp_path / "a.tar"), format="webdataset")
    tasks = plan_read_tasks([cfg], task_bytes=task_bytes)
    assert [t.span for t in tasks] == [None]  # read whole: its reader sees every member
    with pytest.raises(InputError, match=r"a.tar: member 'a.txt' \(byte \d+\) belongs to sample 'a'.*--sort=name"):
        [b for t in tasks for b in read_task(cfg, t, 1000)]
    _member_tar(tmp_path / "b.tar", filler * 2)  # a copy of every sample (`cat b.tar b.tar`): read in spans, as copies
    cfg = InputConfig(source="s", path=str(tmp_path / "b.tar"), format="webdataset")
    tasks = plan_read_tasks([cfg], task_bytes=task_bytes)
    assert len(tasks) == (1 if task_bytes > (tmp_path / "b.tar").stat().st_size else 5)
    texts = [x for t in tasks for b in read_task(cfg, t, 1000) for x in b.rows["text"].to_list()]
    assert texts == [data.decode() for _, data in filler * 2]


def test_on_error_skip_leaves_out_a_tar_refused_after_some_of_its_samples_were_written(
    tmp_path, write_job, nothing_lost
):
    """The samples read before the refusal stayed in the shards (the rest of the file nowhere) while the manifest
    listed the file as skipped: a skipped file now gives the output nothing, and no shard of it stays behind."""
    (tmp_path / "in").mkdir()
    names = ["a.txt", "b.txt", "c.txt", "d.txt", "e.txt", "a.json"]  # a's json after four other samples
    _member_tar(tmp_path / "in" / "x.tar", [(n, b'{"id": "A"}' if n.endswith("json") else n.encode()) for n in names])
    _member_tar(tmp_path / "in" / "y.tar", [(f"{k}.txt", f"sample {k}".encode()) for k in "pqr"])
    body = (
        'on_error = "skip"\nbatch_rows = 2\n[output]\nshard_rows = 1\nformats = ["parquet", "webdataset"]\n'
        f'[[inputs]]\nsource = "s"\npath = "{tmp_path / "in"}"\nformat = "webdataset"\n'
    )
    job = load_job(write_job(body))
    manifest = run_job(job, progress=False)
    assert [s["task"] for s in manifest["skipped_files"]] == [str(tmp_path / "in" / "x.tar")]
    nothing_lost(job.output_dir, {"s/y.tar/p", "s/y.tar/q", "s/y.tar/r"})
    shards = sorted(p.relative_to(job.output_dir).as_posix() for p in (job.output_dir / "shards").rglob("*.*"))
    assert shards == sorted(s["path"] for s in manifest["shards"]) and len(shards) == 6  # 3 rows, 2 formats
    texts = pl.read_parquet(job.output_dir / "shards" / "parquet" / "train")["text"].to_list()
    assert sorted(texts) == ["sample p", "sample q", "sample r"]


def test_on_error_skip_leaves_out_only_the_text_file_it_cannot_open(tmp_path, write_job, nothing_lost):
    folder = tmp_path / "in"
    folder.mkdir()
    for name in ("a", "b", "c"):
        (folder / f"{name}.txt").write_text(f"document {name}")
    (folder / "more").symlink_to("/proc/self/mem")  # a file nobody can read as a stream, root either
    inputs = f'[[inputs]]\nsource = "s"\npath = "{folder}"\nformat = "text"\n'
    with pytest.raises(InputError, match="more"):
        run_job(load_job(write_job(inputs, name="strict")), progress=False)
    job_file = tmp_path / "skip.toml"
    job_file.write_text(f'[job]\nname = "skip"\noutput = "{tmp_path / "skip"}"\non_error = "skip"\n' + inputs)
    job = load_job(job_file)
    manifest = run_job(job, progress=False)
    nothing_lost(job.output_dir, {"s/a.txt", "s/b.txt", "s/c.txt"})
    assert [s["task"] for s in manifest["skipped_files"]] == [str(folder / "more")]


def test_an_empty_field_name_is_kept_in_meta_as_written(tmp_path):
    lines = b"".join(orjson.dumps({"id": f"r{i}", "text": "hello", "": i}) + b"\n" for i in range(3))
    (tmp_path / "a.jsonl").write_bytes(lines)
    pq.write_table(pa.table({"id": ["p"], "text": ["x"], "": [7]}), tmp_path / "b.parquet")
    kept, _ = read_all(InputConfig(source="s", path=str(tmp_path / "a.jsonl")))
    assert [json.loads(m) for m in kept["meta"]] == [{"": 0}, {"": 1}, {"": 2}]
    kept, _ = read_all(InputConfig(source="s", path=str(tmp_path / "b.parquet"), format="parquet"))
    assert [json.loads(m) for m in kept["meta"]] == [{"": 7}]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"text_field": ""}, "inputs.text_field = '' is invalid"),
        ({"id_field": ""}, "inputs.id_field = '' is invalid"),
        ({"source": None, "source_field": "text"}, "name one field twice"),
        ({"id_field": "text"}, "name one field twice"),
    ],
)
def test_field_names_that_are_empty_or_the_same_field_are_refused(fields, message):
    from winnow.curate.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        InputConfig(**{"source": "s", "path": "x.jsonl", **fields})


def test_a_kept_float_field_leaves_an_integer_a_float_would_round_in_meta():
    from winnow.curate.fields import extract_fields

    metas = ['{"n": 1.5}', '{"n": 9007199254740993}', '{"n": 4}', '{"n": 2e400}', "{}"]
    rows = pl.DataFrame({"id": list("abcde"), "source": ["s"] * 5, "text": ["t"] * 5, "meta": metas})
    out = extract_fields(rows.with_columns(pl.col("meta").replace('{"n": 2e400}', "{}")), {"n": "float64"})
    assert out["n"].to_list() == [1.5, None, 4.0, None, None]
    assert json.loads(out["meta"][1]) == {"n": 9007199254740993}
    past_64_bits = ['{"n": 1180591620717411303425, "m": [18446744073709551617]}', '{"n": 0.5}']
    rows = pl.DataFrame({"id": ["a", "b"], "source": "s", "text": "t", "meta": past_64_bits})
    out = extract_fields(rows, {"n": "float64", "m": "json"})  # orjson reads such integers as floats
    assert out["n"].to_list() == [None, 0.5] and out["m"].to_list() == ["[18446744073709551617]", None]
    assert out["meta"].to_list() == ['{"n":1180591620717411303425}', None]


def test_a_hugging_face_builder_that_cannot_parse_a_file_ends_it_in_one_reject(tmp_path):
    pytest.importorskip("datasets")
    (tmp_path / "a.jsonl").write_text('{"id": "a", "text": "one"}\nnot json\n')
    kept, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "a.jsonl"), format="hf", hf_builder="json"))
    assert kept.is_empty() and rejects["reason"].to_list() == ["read:truncated"]
    assert "the 'json' builder could not read on" in json.loads(rejects["meta"][0])["error"]


def test_a_text_document_starting_with_a_byte_order_mark_is_read_without_it(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"\xef\xbb\xbfhello")
    kept, _ = read_all(InputConfig(source="s", path=str(tmp_path), format="text"))
    assert kept["text"].to_list() == ["hello"]


def test_zero_padding_after_the_last_gzip_member_is_its_end_not_damage(tmp_path):
    import gzip

    members = gzip.compress(good_lines(2)) + gzip.compress(good_lines(3))
    (tmp_path / "a.jsonl.gz").write_bytes(members + b"\0" * 1024)  # as a padded tape or disk image holds it
    (tmp_path / "b.jsonl.gz").write_bytes(members + b"\0" * 4 + b"junk")  # anything else after it is damage
    kept, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "a.jsonl.gz")))
    assert kept.height == 5 and rejects.is_empty()
    kept, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "b.jsonl.gz")))
    assert kept.height == 5 and rejects["reason"].to_list() == ["read:truncated"]


@pytest.mark.parametrize("kind", ["xz", "bz2", "zstd"])
@pytest.mark.parametrize("fmt", ["jsonl", "text"])
def test_padding_between_and_after_streams_is_read_as_their_tools_read_it(tmp_path, kind, fmt):
    """xz's stream padding (null bytes between streams) lost every row after it, counted nowhere; zeros after the
    last bzip2 stream or zstd frame were a phantom read:truncated."""
    lines = good_lines(10)
    half = len(lines) // 2 + 7  # mid-line: the second stream starts inside a record
    pad = b"\0" * 8
    data = (
        _compressed(kind, lines[:half]) + pad + _compressed(kind, lines[half:]) + pad
        if kind == "xz"
        else _compressed(kind, lines) + pad * 2
    )
    name = f"a.{'jsonl' if fmt == 'jsonl' else 'txt'}.{ {'xz': 'xz', 'bz2': 'bz2', 'zstd': 'zst'}[kind] }"
    (tmp_path / name).write_bytes(data)
    kept, rejects = read_all(InputConfig(source="s", path=str(tmp_path / name), format=fmt))
    assert rejects.is_empty()
    texts = kept["text"].to_list()
    assert texts == ([json.loads(x)["text"] for x in lines.splitlines()] if fmt == "jsonl" else [lines.decode()])


def test_many_small_files_are_read_in_a_few_tasks_with_the_rows_of_one_per_file(tmp_path, write_job, nothing_lost):
    """300 one-row JSONL files and a larger file among them: the small files are grouped into tasks in
    order (the larger one alone, where it falls), so the job writes a few shards, not 300; the rows,
    their ids and their order equal those of a task per file (`group_bytes = 0`). With on_error = "skip"
    a file of a group that cannot be read is left out alone."""
    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(300):
        (folder / f"f{i:03d}.jsonl").write_bytes(orjson.dumps({"text": f"document number {i} " * 5}) + b"\n")
    big = b"".join(orjson.dumps({"text": f"row {k} of the larger file " * 20}) + b"\n" for k in range(2000))
    (folder / "f150b.jsonl").write_bytes(big)  # sorted between f150 and f151
    inputs = f'[[inputs]]\nsource = "s"\npath = "{folder}"\n'
    tasks = plan_read_tasks([InputConfig(source="s", path=str(folder))], group_bytes=2 * len(big) - 1)
    assert [len(t.files) for t in tasks] == [151, 1, 149]
    assert [f.rel for t in tasks for f in t.files] == sorted(p.name for p in folder.iterdir())

    def shard_rows(name: str, body: str) -> tuple[int, list[tuple[str, str]]]:
        job = load_job(write_job(body + inputs, name=name))
        manifest = run_job(job, progress=False)
        files = [job.output_dir / s["path"] for s in manifest["shards"] if s["format"] == "parquet"]
        return len(files), [r for f in files for r in pl.read_parquet(f).select("id", "text").iter_rows()]

    grouped, rows = shard_rows("grouped", "")
    each, rows_each = shard_rows("each", "group_bytes = 0\n")
    assert grouped == 1 and each == 301 and rows == rows_each and len(rows) == 2300
    nothing_lost(tmp_path / "out" / "grouped", {r[0] for r in rows})

    os.symlink("/proc/self/mem", folder / "f007x.jsonl")  # a file of the first group nobody can read
    with pytest.raises(InputError, match="f007x"):
        shard_rows("strict", "")
    job = load_job(write_job('on_error = "skip"\n' + inputs, name="skip"))
    manifest = run_job(job, progress=False)
    assert [s["task"] for s in manifest["skipped_files"]] == [str(folder / "f007x.jsonl")]
    nothing_lost(job.output_dir, {r[0] for r in rows})


@pytest.mark.parametrize("neighbour", [b'{"id": "n", "text": "plain"}\n', b'{"id": "n", "text": "plain", "x": 1}\n'])
def test_two_objects_on_one_line_are_one_bad_json_reject_whatever_the_lines_beside_them(tmp_path, neighbour):
    """Arrow's parser reads `{..}{..}` on one line as two rows; the lines path as one bad line. Which one ran
    depended on the block's other lines (2 rows, or 1 reject): the line is a reject either way."""
    (tmp_path / "a.jsonl").write_bytes(
        good_lines(20) + b'{"id": "t1", "text": "a"}{"id": "t2", "text": "b"}\n' + neighbour
    )
    rows, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "a.jsonl")))
    assert rows["id"].to_list() == [f"g{i}" for i in range(20)] + ["n"]
    assert rejects["reason"].to_list() == ["read:bad_json"]


def test_winnows_own_webdataset_shards_read_back_with_their_columns_as_the_parquet_shards_do(
    tmp_path, write_job, nothing_lost
):
    """Held-out rows read back from winnow's WebDataset shards stay held out, with split and quality as columns
    (they came back as training rows, with neither); a split no winnow shard holds is the row's bad_schema."""
    lines = b"".join(orjson.dumps({"id": f"r{i}", "text": f"row {i} " + "words " * 30}) + b"\n" for i in range(60))
    (tmp_path / "a.jsonl").write_bytes(lines)
    first = load_job(
        write_job(
            f'[[inputs]]\nsource = "a"\npath = "{tmp_path / "a.jsonl"}"\n[[stages]]\nkind = "score.heuristic"\n'
            '[[stages]]\nkind = "split"\nval_fraction = 0.3\n',
            name="first",
        )
    )
    run_job(first, progress=False)
    kinds = {}
    for fmt in ("webdataset", "parquet"):
        val = first.output_dir / "shards" / fmt / "val"
        again = load_job(write_job(f'[[inputs]]\nsource = "a"\npath = "{val}"\nformat = "{fmt}"\n', name=f"re-{fmt}"))
        manifest = run_job(again, progress=False)
        assert not (again.output_dir / "shards" / "parquet" / "train").exists()
        kinds[fmt] = pl.concat(
            [pl.read_parquet(again.output_dir / s["path"]) for s in manifest["shards"] if s["format"] == "parquet"]
        ).sort("id")
    assert kinds["webdataset"].height > 5 and set(kinds["webdataset"]["split"]) == {"val"}
    assert (
        kinds["webdataset"].select("id", "split", "quality").equals(kinds["parquet"].select("id", "split", "quality"))
    )

    tar = first.output_dir / "shards" / "webdataset" / "val"
    bad = tmp_path / "bad.tar"
    with tarfile.open(bad, "w") as out:
        for name, data in (("k.txt", b"some text"), ("k.json", b'{"meta": null, "source": "a", "split": "../x"}')):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    kept, rejects = read_all(InputConfig(source="s", path=str(bad), format="webdataset"))
    assert kept.height == 0 and rejects["reason"].to_list() == ["read:bad_schema"]
    assert "'../x'" in json.loads(rejects["meta"][0])["error"] and tar.exists()


def test_small_files_whose_columns_differ_are_read_without_mixing_schemas_in_a_task(tmp_path, write_job, nothing_lost):
    """Two small Parquet files in winnow's layout, one with a quality column; winnow's tars whose quality is null
    for a whole batch: each read batch of a task has its file's columns (a task mixing them failed to write)."""
    schema = pa.schema([("id", pa.string()), ("source", pa.string()), ("text", pa.string()), ("meta", pa.string())])
    pq.write_table(
        pa.table({"id": ["a1"], "source": ["s"], "text": ["one text"], "meta": [None], "quality": [0.5]}).cast(
            schema.append(pa.field("quality", pa.float64()))
        ),
        tmp_path / "a.parquet",
    )
    pq.write_table(
        pa.table({"id": ["b1"], "source": ["s"], "text": ["two text"], "meta": [None]}, schema), tmp_path / "b.parquet"
    )
    job = load_job(
        write_job(f'[[inputs]]\nsource = "p"\npath = "{tmp_path}/*.parquet"\nformat = "parquet"\n', name="pq")
    )
    run_job(job, progress=False)
    nothing_lost(job.output_dir, {"a1", "b1"})

    for name in "xy":
        rows = [orjson.dumps({"id": f"{name}{i}", "text": f"{name} text {i} " * 20}) + b"\n" for i in range(6)]
        (tmp_path / f"{name}.jsonl").write_bytes(b"".join(rows))
    inputs = "".join(f'[[inputs]]\nsource = "{n}"\npath = "{tmp_path / f"{n}.jsonl"}"\n' for n in "xy")
    first = load_job(
        write_job(
            inputs
            + '[[stages]]\nkind = "score.heuristic"\nsources = ["x"]\n[[stages]]\nkind = "order"\nby = "random"\n'
            'stratify = false\nsource_order = ["x", "y"]\n',
            name="scored",
        )
    )
    run_job(first, progress=False)  # one ordered shard: x's rows, then y's, whose quality is null
    tars = first.output_dir / "shards" / "webdataset" / "train"
    again = load_job(
        write_job(f'batch_rows = 2\n[[inputs]]\nsource = "w"\npath = "{tars}"\nformat = "webdataset"\n', name="again")
    )
    run_job(again, progress=False)
    nothing_lost(again.output_dir, {f"{n}{i}" for n in "xy" for i in range(6)})


def test_every_shard_has_the_columns_a_winnow_layout_parquet_input_brings(tmp_path, write_job, nothing_lost):
    """A Parquet input in winnow's own layout with a quality column beside a JSONL input: every shard has quality
    (null for the other rows), so the train folder opens as one dataset (scan_parquet failed on the missing
    column); an int column in one file and a float one in another meet at Float64."""
    schema = pa.schema([("id", pa.string()), ("source", pa.string()), ("text", pa.string()), ("meta", pa.string())])
    pq.write_table(
        pa.table(
            {"id": ["a1"], "source": ["p"], "text": ["one text"], "meta": [None], "quality": [0.5], "n": [1]}
        ).cast(schema.append(pa.field("quality", pa.float64())).append(pa.field("n", pa.int64()))),
        tmp_path / "a.parquet",
    )
    pq.write_table(
        pa.table({"id": ["b1"], "source": ["p"], "text": ["two text"], "meta": [None], "n": [2.5]}).cast(
            schema.append(pa.field("n", pa.float64()))
        ),
        tmp_path / "b.parquet",
    )
    (tmp_path / "c.jsonl").write_bytes(orjson.dumps({"id": "c1", "text": "three text"}) + b"\n")
    job = load_job(
        write_job(
            f'[[inputs]]\nsource = "p"\npath = "{tmp_path}/*.parquet"\nformat = "parquet"\n'
            f'[[inputs]]\nsource = "j"\npath = "{tmp_path / "c.jsonl"}"\n',
            name="mixed",
        )
    )
    run_job(job, progress=False)
    nothing_lost(job.output_dir, {"a1", "b1", "c1"})
    train = pl.scan_parquet(job.output_dir / "shards" / "parquet" / "train").collect().sort("id")
    assert train["quality"].to_list() == [0.5, None, None] and train["n"].to_list() == [1.0, 2.5, None]


def test_winnow_layout_parquet_in_any_string_encoding_gives_one_set_of_columns_and_binary_goes_to_meta(
    tmp_path, write_job, nothing_lost
):
    """Core columns as view or dictionary strings are still winnow's layout, so their extra columns are every
    shard's (they were one file's only, and scan_parquet failed); a binary extra column, which no JSON holds
    (a tar's .json, a reject's extra), sends the file's columns to meta, base64, as for any other Parquet."""

    def core(lo, kind=pa.string()):
        return {
            c: pa.array(v, kind)
            for c, v in {
                "id": [f"r{i}" for i in range(lo, lo + 2)],
                "source": ["s"] * 2,
                "text": [f"document {i} alpha beta" for i in range(lo, lo + 2)],
                "meta": ["{}"] * 2,
            }.items()
        }

    pq.write_table(pa.table({**core(0), "quality": [0.5] * 2}), tmp_path / "a.parquet")
    pq.write_table(pa.table({**core(2, pa.string_view()), "xtra": [1, 2]}), tmp_path / "b.parquet")
    dictionary = core(4)
    dictionary["text"] = dictionary["text"].dictionary_encode()
    pq.write_table(pa.table({**dictionary, "ytra": ["y"] * 2}), tmp_path / "c.parquet")
    blob = core(6)
    blob["text"] = pa.array(["document 0 alpha beta", "binary neighbour"])  # r6 copies r0: a reject with extra
    pq.write_table(pa.table({**blob, "blob": pa.array([b"\x00\xff"] * 2)}), tmp_path / "d.parquet")
    job = load_job(
        write_job(
            f'[[inputs]]\nsource = "s"\npath = "{tmp_path}/*.parquet"\nformat = "parquet"\n\n'
            '[[stages]]\nkind = "dedup.exact"\n\n[output]\nformats = ["parquet", "webdataset"]\n'
        )
    )
    run_job(job, progress=False)
    nothing_lost(job.output_dir, {f"r{i}" for i in range(8)})
    train = pl.scan_parquet(job.output_dir / "shards" / "parquet" / "train").collect().sort("id")
    assert {"quality", "xtra", "ytra"} <= set(train.columns) and "blob" not in train.columns
    assert train.filter(pl.col("id") == "r7")["meta"].item() == '{"source":"s","meta":"{}","blob":"AP8="}'


def test_winnow_layout_counts_and_ranks_that_are_not_whole_numbers_are_rejects_not_cut():
    from winnow.curate.readers.rows import rows_from_arrow

    table = pa.table(
        {
            "id": list("abcde"),
            "source": ["s"] * 5,
            "text": ["t"] * 5,
            "meta": ["{}"] * 5,
            "repeat": [1.5, -2.0, 2.0, None, 0.0],
        }
    )
    batch = rows_from_arrow(
        table, source="s", source_field=None, text_field="text", id_field="id", file_label="f.parquet", row_offset=0
    )
    assert batch.rows["id"].to_list() == ["c", "d", "e"] and batch.rows["repeat"].to_list() == [2, None, 0]
    assert batch.rejects["reason"].to_list() == ["read:bad_schema"] * 2
    assert "holds 1.5; allowed: a whole number >= 0" in batch.rejects["meta"][0]


def test_a_rejects_file_or_another_id_column_is_read_into_meta_and_read_rejects_keep_every_column():
    """A job's ``rejects/`` curated again keeps each row's reason (no stage replaces it), a winnow-layout file
    read with ``id_field`` naming another column keeps its ``id`` in meta, and a winnow-layout row that is a read
    reject keeps its other columns: nothing of the row is left out."""
    from winnow.curate.readers.rows import rows_from_arrow

    def read(table: pa.Table, id_field: str = "id"):
        return rows_from_arrow(
            table, source="s", source_field=None, text_field="text", id_field=id_field, file_label="f", row_offset=0
        )

    core = {"id": ["a", "b"], "source": ["s", "s"], "text": ["one", "two"], "meta": ["{}", None]}
    rejects = pa.table(
        {**core, "reason": ["dedup:exact", "filter:c4"], "duplicate_of": ["x", None], "stage": ["3", "2"]}
    )
    batch = read(rejects)
    assert "reason" not in batch.rows.columns
    assert [json.loads(m)["reason"] for m in batch.rows["meta"]] == ["dedup:exact", "filter:c4"]
    assert json.loads(batch.rows["meta"][0])["duplicate_of"] == "x"
    batch = read(pa.table({**core, "doc_id": ["d1", "d2"]}), id_field="doc_id")
    assert batch.rows["id"].to_list() == ["d1", "d2"]
    assert [json.loads(m)["id"] for m in batch.rows["meta"]] == ["a", "b"]
    bad = pa.table({**core, "text": [None, "two"], "url": ["u-a", "u-b"], "quality": [0.7, 0.9]})
    batch = read(bad)
    assert batch.rows["id"].to_list() == ["b"] and batch.rows["url"].to_list() == ["u-b"]
    assert json.loads(batch.rejects["meta"][0])["columns"] == {"url": "u-a", "quality": 0.7}


def test_parquet_columns_of_types_polars_cannot_take_are_read_into_meta_losing_nothing(tmp_path):
    """A decimal256, a map with integer keys, a struct naming a field twice, UUIDs (ids and meta): no
    traceback (polars panicked or could not write the JSON), every value in the row's meta or id."""
    import uuid

    first, second = uuid.UUID(int=1), uuid.UUID(int=2)
    table = pa.table(
        {
            "id": pa.array([first.bytes, second.bytes], pa.uuid()),
            "text": ["one", "two"],
            "price": pa.array([decimal.Decimal("12345678901234567890123456789.50"), None], pa.decimal256(40, 2)),
            "counts": pa.array([[(1, "x")], None], pa.map_(pa.int64(), pa.string())),
            "s": pa.StructArray.from_arrays([pa.array([1, 2]), pa.array([3, 4])], names=["a", "a"]),
            "ref": pa.ListArray.from_arrays([0, 1, 1], pa.array([second.bytes], pa.uuid())),
        }
    )
    pq.write_table(table, tmp_path / "a.parquet")
    rows, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "a.parquet"), format="parquet"))
    assert rejects.height == 0 and rows["id"].to_list() == [str(first), str(second)]
    assert [json.loads(m) for m in rows["meta"]] == [
        {"price": "12345678901234567890123456789.50", "counts": [{"key": 1, "value": "x"}], "s": {"a": 1, "a#1": 3},
         "ref": [str(second)]},
        {"price": None, "counts": None, "s": {"a": 2, "a#1": 4}, "ref": []},
    ]  # fmt: skip


def test_nan_and_infinities_in_a_parquet_float_column_are_kept_in_meta_and_in_a_kept_field(tmp_path):
    """JSON has no NaN: meta wrote null, a kept float field read null (a filter `v > 0` then dropped +inf rows)."""
    from winnow.curate.fields import extract_fields, infer_type

    values = [1.0, math.nan, math.inf, -math.inf, None]
    pq.write_table(pa.table({"id": list("abcde"), "text": ["t"] * 5, "v": values}), tmp_path / "a.parquet")
    rows, _ = read_all(InputConfig(source="s", path=str(tmp_path / "a.parquet"), format="parquet"))
    assert rows["meta"].to_list() == ['{"v":1.0}', '{"v":"NaN"}', '{"v":"Infinity"}', '{"v":"-Infinity"}', '{"v":null}']
    assert infer_type([json.loads(m)["v"] for m in rows["meta"]]) == "float64"
    kept = extract_fields(rows, {"v": "float64"})["v"].to_list()
    assert kept[0] == 1.0 and math.isnan(kept[1]) and kept[2:] == [math.inf, -math.inf, None]


def test_an_id_column_of_raw_digests_is_rejected_naming_the_column_and_the_way_out(tmp_path):
    digests = [bytes([0xFF, i]) * 8 for i in range(2)]
    pq.write_table(pa.table({"id": pa.array(digests, pa.binary(16)), "text": ["a", "b"]}), tmp_path / "a.parquet")
    rows, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "a.parquet"), format="parquet"))
    assert rows.height == 0 and rejects["reason"].to_list() == ["read:bad_utf8"] * 2
    error = json.loads(rejects["meta"][0])["error"]
    assert error.startswith("column(s) ['id'] hold bytes that are not valid UTF-8") and "write them as hex" in error


def _compressed(kind: str, data: bytes) -> bytes:
    import bz2
    import gzip
    import lzma

    import zstandard

    if kind == "lz4":  # a frame header is all the check reads: lz4 need not be installed
        return b"\x04\x22\x4d\x18\x64\x40\xa7" + data
    return {"gzip": gzip.compress, "zstd": zstandard.ZstdCompressor().compress, "bz2": bz2.compress,
            "xz": lzma.compress}[kind](data)  # fmt: skip


@pytest.mark.parametrize(("kind", "todo"), [("gzip", r"end in \.gz \(a\.jsonl\.gz\)"), ("zstd", r"end in \.zst"),
                                            ("bz2", r"end in \.bz2"), ("xz", r"end in \.xz"),
                                            ("lz4", r"decompress it first")])  # fmt: skip
def test_a_compressed_file_named_as_plain_json_lines_is_refused_naming_it(tmp_path, kind, todo):
    (tmp_path / "a.jsonl").write_bytes(_compressed(kind, good_lines(200)))
    with pytest.raises(InputError, match=rf"input s: .*a\.jsonl is {kind}-compressed .* name does not; .*{todo}"):
        read_all(InputConfig(source="s", path=str(tmp_path / "a.jsonl")))


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_large_compressed_file_named_plain_is_one_task_refused_whole(tmp_path, write_job, on_error):
    """Not cut into spans: a span after the first would read the compressed bytes as lines of binary rejects."""
    lines = b"".join(orjson.dumps({"text": os.urandom(48).hex()}) + b"\n" for _ in range(60_000))
    (tmp_path / "a.jsonl").write_bytes(_compressed("gzip", lines))  # ~3.5 MB: incompressible text
    (tmp_path / "b.jsonl").write_bytes(lines)
    cfg = InputConfig(source="s", path=str(tmp_path / "a.jsonl"))
    assert [t.span for t in plan_read_tasks([cfg], task_bytes=1 << 20)] == [None]
    plain = InputConfig(source="s", path=str(tmp_path / "b.jsonl"))
    assert len(plan_read_tasks([plain], task_bytes=1 << 20)) > 2
    job = load_job(
        write_job(
            f'task_bytes = {1 << 20}\non_error = "{on_error}"\n[[inputs]]\nsource = "s"\npath = "{tmp_path / "a.jsonl"}"\n'
        )
    )
    if on_error == "raise":
        with pytest.raises(InputError, match="gzip-compressed"):
            run_job(job, progress=False)
        return
    manifest = run_job(job, progress=False)
    assert [s["task"].endswith("a.jsonl") for s in manifest["skipped_files"]] == [True]
    assert manifest["totals"]["rows_read"] == 0 and manifest["totals"]["rows_rejected"] == 0


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_compressed_file_in_a_text_folder_under_a_plain_name_is_refused_naming_it(tmp_path, write_job, on_error):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "notes.txt").write_bytes(_compressed("gzip", b"a document\n" * 50))
    (tmp_path / "in" / "other.txt").write_bytes(b"another document\n")
    (tmp_path / "in" / "packed.txt.gz").write_bytes(_compressed("gzip", b"a third document\n"))
    cfg = InputConfig(source="s", path=str(tmp_path / "in"), format="text")
    if on_error == "raise":
        with pytest.raises(InputError, match=r"input s: .*notes\.txt is gzip-compressed .* end in \.gz"):
            read_all(cfg)
        return
    job = load_job(
        write_job(f'on_error = "skip"\n[[inputs]]\nsource = "s"\nformat = "text"\npath = "{tmp_path / "in"}"\n')
    )
    manifest = run_job(job, progress=False)
    assert [s["task"].endswith("notes.txt") for s in manifest["skipped_files"]] == [True]
    assert manifest["totals"]["rows_written"] == 2 and manifest["totals"]["rows_rejected"] == 0


def test_a_plain_file_whose_first_line_starts_like_a_magic_number_is_read(tmp_path):
    """``BZh`` alone is no bzip2 header (its block magic follows): the line is a bad JSON line, the rest is read."""
    (tmp_path / "a.jsonl").write_bytes(b"BZh that is not bzip2\n" + good_lines(3))
    rows, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "a.jsonl")))
    assert rows.height == 3 and rejects["reason"].to_list() == ["read:bad_json"]


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (json.dumps([{"id": "a", "text": "one"}, {"id": "b", "text": "two"}], indent=2).encode(), "pretty-printed"),
        (json.dumps({"records": [{"id": "a", "text": "one"}]}, indent=1).encode(), "pretty-printed"),
        (b'{"id": "a", "text": "one"}\r{"id": "b", "text": "two"}\r', "carriage return alone"),
        # seen past the first kilobyte: a first record longer than that
        (b"\r".join(json.dumps({"id": str(i), "text": "word " * 300}).encode() for i in range(50)), "carriage return"),
        (b"\xef\xbb\xbf" + json.dumps([{"id": "a", "text": "one"}], indent=2).encode(), "pretty-printed"),  # a BOM
    ],
    ids=["json array", "json object", "cr line ends", "cr after a long record", "json array after a bom"],
)
def test_a_json_document_over_lines_or_cr_line_ends_are_refused_with_the_conversion(tmp_path, content, said):
    """Read as JSON Lines, every line of a pretty-printed document was a bad_json reject of records that are
    not there; with CR line ends the whole file was one."""
    (tmp_path / "data.json").write_bytes(content)
    with pytest.raises(InputError, match=f"data.json is .*{said}.*not JSON Lines; "):
        read_all(InputConfig(source="s", path=str(tmp_path / "data.json")))
    (tmp_path / "ok.jsonl").write_bytes(b'[{"id": "a", "text": "one"}]\n' + good_lines(1))  # a one-line array is a line
    rows, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "ok.jsonl")))
    assert rows.height == 1 and rejects["reason"].to_list() == ["read:not_an_object"]


def test_on_error_skip_leaves_out_a_compressed_file_named_plain_and_reads_the_rest(tmp_path, write_job):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_bytes(_compressed("zstd", good_lines(5)))
    (tmp_path / "in" / "b.jsonl").write_bytes(b"\xef\xbb\xbf  " + good_lines(5))  # a mark and spaces: plain JSON Lines
    job = load_job(
        write_job(f'on_error = "skip"\ngroup_bytes = 0\n[[inputs]]\nsource = "s"\npath = "{tmp_path / "in"}"\n')
    )
    manifest = run_job(job, progress=False)
    assert [s["task"].endswith("a.jsonl") for s in manifest["skipped_files"]] == [True]
    assert "zstd-compressed" in manifest["skipped_files"][0]["error"] and manifest["totals"]["rows_written"] == 5


def test_an_input_url_nothing_answers_is_one_error_naming_it_not_a_traceback(tmp_path):
    """A store or server's own errors (aiohttp's ClientConnectorError, botocore's NoCredentialsError) escaped as
    tracebacks from the listing; the output side already said them in one line."""
    import socket

    from winnow.curate.readers import list_files

    with socket.socket() as s:  # a port nothing listens on once it is closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/x.jsonl"
    with pytest.raises(InputError, match=rf"input s: cannot list '{url}' \(ClientConnectorError.*credentials"):
        list_files(InputConfig(source="s", path=url))


def _tar(keys: range) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for i in keys:
            data = f"sample {i} ".encode() * 300
            info = tarfile.TarInfo(f"k{i:05d}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.mark.parametrize("task_bytes", [1 << 28, 1 << 16])
def test_concatenated_and_compressed_tars_named_tar_are_read_whole_whatever_the_task_size(tmp_path, task_bytes):
    """`cat a.tar b.tar` lost the second archive without a word (reading stopped at the first end marker); a gzip
    tar named .tar was read in one task but one read:truncated reject once the file was cut into spans."""
    import bz2
    import gzip
    import lzma

    import zstandard

    (tmp_path / "cat.tar").write_bytes(_tar(range(0, 100)) + _tar(range(100, 200)))
    (tmp_path / "gz.tar").write_bytes(gzip.compress(_tar(range(200))))
    (tmp_path / "zst.tar").write_bytes(zstandard.ZstdCompressor().compress(_tar(range(200))))
    (tmp_path / "xz.tar").write_bytes(lzma.compress(_tar(range(200))))
    (tmp_path / "bz2.tar").write_bytes(bz2.compress(_tar(range(200))))
    (tmp_path / "cat_gz.tar").write_bytes(gzip.compress(_tar(range(100))) + gzip.compress(_tar(range(100, 200))))
    for name in ("cat.tar", "gz.tar", "zst.tar", "xz.tar", "bz2.tar", "cat_gz.tar"):
        cfg = InputConfig(source="s", path=str(tmp_path / name), format="webdataset")
        tasks = plan_read_tasks([cfg], task_bytes=task_bytes)
        batches = [b for t in tasks for b in read_task(cfg, t, 1000)]
        texts = [x for b in batches for x in b.rows["text"].to_list()]
        assert texts == [f"sample {i} " * 300 for i in range(200)], name
        assert all(b.rejects is None or b.rejects.is_empty() for b in batches), name


def test_a_small_zstd_tar_named_tar_is_read_not_a_truncated_reject(tmp_path):
    """tarfile's `r|*` reads no zstd: a small one was one false read:truncated, a larger one refused as "zstd-compressed
    data that holds no tar"."""
    import zstandard

    (tmp_path / "a.tar").write_bytes(zstandard.ZstdCompressor().compress(_tar(range(3))))
    kept, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "a.tar"), format="webdataset"))
    assert kept["text"].to_list() == [f"sample {i} " * 300 for i in range(3)] and rejects.is_empty()


def test_every_stream_of_a_compressed_tar_is_read_past_xz_padding(tmp_path):
    """An xz tar of two streams with padding between them (as `xz` writes and reads them) lost its second stream
    without a word, counted nowhere."""
    import lzma

    data = lzma.compress(_tar(range(100))) + bytes(8) + lzma.compress(_tar(range(100, 200)))
    (tmp_path / "a.tar.xz").write_bytes(data)
    kept, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "a.tar.xz"), format="webdataset"))
    assert kept["text"].to_list() == [f"sample {i} " * 300 for i in range(200)] and rejects.is_empty()


def _random_tar(n: int) -> bytes:
    """A tar of ``n`` samples of random hex (which compresses about 2:1): damage in its middle is far from its ends."""
    out, rng = io.BytesIO(), random.Random(0)
    with tarfile.open(fileobj=out, mode="w") as tar:
        for i in range(n):
            data = rng.randbytes(5000).hex().encode()
            info = tarfile.TarInfo(f"k{i:05d}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.mark.parametrize("kind", ["gz", "zst", "xz", "bz2"])
@pytest.mark.parametrize("named", ["tar.{}", "tar"])
def test_a_compressed_tar_damaged_in_its_middle_keeps_the_samples_before_and_one_truncated_reject(
    tmp_path, kind, named
):
    """A damaged .tar.zst or .tar.xz was a traceback (ZstdError, LZMAError), and a damaged zstd tar named .tar
    refused as holding no tar; a gzip one kept the samples before the damage and one read:truncated."""
    import bz2
    import gzip
    import lzma

    import zstandard

    raw = _random_tar(200)
    compress = {
        "gz": gzip.compress,
        "zst": zstandard.ZstdCompressor().compress,
        "xz": lzma.compress,
        "bz2": bz2.compress,
    }
    data = bytearray(compress[kind](raw))
    # 160 KiB of 0xff from the middle: longer than a zstd block, so a block header is 0xff (a reserved type), which
    # every decoder finds where it is (zstd without a checksum decodes some damage into other text, found nowhere)
    middle = len(data) // 2
    data[middle : middle + (160 << 10)] = b"\xff" * (160 << 10)
    name = "a." + named.format(kind)
    (tmp_path / name).write_bytes(bytes(data))
    kept, rejects = read_all(InputConfig(source="s", path=str(tmp_path / name), format="webdataset"))
    members = tarfile.open(fileobj=io.BytesIO(raw))
    before = [members.extractfile(m).read().decode() for m in members.getmembers()[: kept.height]]
    assert 0 < kept.height < 200 and kept["text"].to_list() == before  # samples before the damage, each intact
    assert rejects["reason"].to_list() == ["read:truncated"]
    assert json.loads(rejects["meta"][0])["file"].endswith(name)


def _other_formats(tmp_path) -> dict[str, bytes]:
    import gzip

    import pyarrow.feather as feather

    table = pa.table({"text": ["a few words of text"]})
    pq.write_table(table, tmp_path / "t.parquet")
    feather.write_feather(table, tmp_path / "t.arrow")
    return {
        "utf16": good_lines(3).decode().encode("utf-16"),
        "utf16_no_bom": good_lines(3).decode().encode("utf-16-le"),
        "parquet": (tmp_path / "t.parquet").read_bytes(),
        "feather": (tmp_path / "t.arrow").read_bytes(),
        "tar": _tar(range(2)),
        "png": b"\x89PNG\r\n\x1a\n" + bytes(64),
        "gzip": gzip.compress(good_lines(3)),
    }


@pytest.mark.parametrize(
    ("kind", "fmt", "said"),
    [
        ("utf16", "jsonl", r"is UTF-16 text .*not JSON Lines; .*iconv -f UTF-16 -t UTF-8"),
        ("utf16_no_bom", "jsonl", r"is UTF-16LE text"),
        ("parquet", "jsonl", r"is a Parquet file .*format = \"parquet\""),
        ("tar", "jsonl", r"is a tar archive .*format = \"webdataset\""),
        ("gzip", "parquet", r"is gzip-compressed data .*not a Parquet file .*\.jsonl\.gz.*format = \"jsonl\""),
        ("feather", "parquet", r"is an Arrow IPC \(Feather\) file .*not a Parquet file"),
        ("utf16", "parquet", r"is UTF-16 text .*not a Parquet file"),
    ],
)
def test_a_file_in_another_format_than_its_inputs_is_refused_naming_what_it_is(tmp_path, kind, fmt, said):
    """Each was read on: JSON Lines in UTF-16 as one bad_json reject per line (and a count of records that were
    never there), a PNG among text files as a bad_utf8 document, a Feather or gzip JSON Lines file named .parquet
    as one read:truncated reject whose id was its absolute path. A whole file is the input's mistake: said once.
    (In a folder of text files, which often holds an image or a PDF, such a file is its own reject: below.)"""
    name = {"jsonl": "a.jsonl", "text": "a.txt", "parquet": "a.parquet"}[fmt]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / name).write_bytes(_other_formats(tmp_path)[kind])
    with pytest.raises(InputError, match=rf"input s: .*{name} {said}"):
        read_all(InputConfig(source="s", path=str(tmp_path / "in" / name), format=fmt))


def test_a_winnow_layout_file_naming_other_sources_than_its_input_says_they_are_replaced(tmp_path, caplog):
    """Its `source` column was replaced by the input's source without a word (a file without `meta` keeps it in
    meta); the row groups' statistics tell, without reading the column."""
    from winnow.curate.readers import native_columns

    table = {"id": ["a", "b"], "text": ["one two three", "four five six"], "meta": ['{"k": 1}', None]}
    pq.write_table(pa.table({**table, "source": ["wikipedia", "arxiv"]}), tmp_path / "theirs.parquet")
    nested = pa.array([{"source": "x"}, {"source": "y"}])  # a struct's own source field is not the source column
    pq.write_table(pa.table({"m": nested, **table, "source": ["web", "web"]}), tmp_path / "same.parquet")
    for name, said in (("same", False), ("theirs", True)):
        cfg = InputConfig(source="web", path=str(tmp_path / f"{name}.parquet"), format="parquet")
        caplog.clear()
        with caplog.at_level("WARNING", logger="winnow.curate.readers"):
            native_columns([cfg], plan_read_tasks([cfg]))
        assert ("name other sources in their source column ('arxiv', 'wikipedia')" in caplog.text) is said, caplog.text
        assert not said or 'set source_field = "source"' in caplog.text
    kept, _ = read_all(InputConfig(source="web", path=str(tmp_path / "theirs.parquet"), format="parquet"))
    assert kept["source"].to_list() == ["web", "web"]  # the input's source, as it says; theirs kept in meta
    assert [json.loads(m)["source"] for m in kept["meta"]] == ["wikipedia", "arxiv"]
    assert json.loads(kept["meta"][0])["k"] == 1


def test_a_winnow_webdataset_sample_naming_another_source_keeps_it_in_meta(tmp_path):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for key, member in (("a.txt", b"some words"), ("a.json", b'{"meta": "{\\"k\\": 1}", "source": "wiki"}')):
            info = tarfile.TarInfo(key)
            info.size = len(member)
            tar.addfile(info, io.BytesIO(member))
    (tmp_path / "s.tar").write_bytes(out.getvalue())
    kept, _ = read_all(InputConfig(source="web", path=str(tmp_path / "s.tar"), format="webdataset"))
    assert kept["source"].to_list() == ["web"] and json.loads(kept["meta"][0]) == {"source": "wiki", "k": 1}


def test_a_winnow_layout_rows_own_source_is_kept_in_meta_as_valid_json_whatever_meta_holds(tmp_path):
    """Meta's text was spliced: `{ }` became `{"source":"zz", }` (not JSON), `{"source":"mine"}` a doubled key that
    hid the row's own source, and meta that is not an object lost it."""
    metas = ["{ }", "{\n}", '{"source":"mine"}', '{"source":"zz","k":1}', "not json", "[1, 2]", None]
    n = len(metas)
    table = {"id": [f"e{i}" for i in range(n)], "source": ["zz"] * n, "text": ["words"] * n, "meta": metas}
    pq.write_table(pa.table(table), tmp_path / "x.parquet")
    kept, _ = read_all(InputConfig(source="p", path=str(tmp_path / "x.parquet"), format="parquet"))
    assert [json.loads(m) for m in kept["meta"]] == [
        {"source": "zz"}, {"source": "zz"}, {"source.row": "zz", "source": "mine"}, {"source": "zz", "k": 1},
        {"source": "zz", "meta": "not json"}, {"source": "zz", "meta": [1, 2]}, {"source": "zz"},
    ]  # fmt: skip


def _samples_tar(path, samples: list[tuple[str, bytes]]) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for key, body in samples:
            for name, member in ((f"{key}.txt", b"some words"), (f"{key}.json", body)):
                info = tarfile.TarInfo(name)
                info.size = len(member)
                tar.addfile(info, io.BytesIO(member))
    path.write_bytes(out.getvalue())


def test_a_webdataset_samples_json_keeps_every_field_whatever_its_meta_and_source_hold(tmp_path):
    """A sample whose json held `source` and a `meta` that was not an object, or a `source` that was not a string,
    lost its source; one whose meta named a source of its own lost the sample's."""
    bodies = {
        "a": {"source": "other", "meta": 5},
        "b": {"source": "other", "meta": "str"},
        "c": {"source": "other", "meta": [1]},
        "d": {"source": 5, "meta": {}},
        "e": {"source": "other", "meta": {"source": "mine"}},
        "f": {"source": "other", "meta": '{"k": 1}'},
    }
    _samples_tar(tmp_path / "s.tar", [(k, json.dumps(v).encode()) for k, v in bodies.items()])
    kept, rejects = read_all(InputConfig(source="web", path=str(tmp_path / "s.tar"), format="webdataset"))
    assert rejects.height == 0 and kept["source"].to_list() == ["web"] * 6
    assert [json.loads(m) for m in kept["meta"]] == [
        bodies["a"], bodies["b"], bodies["c"], bodies["d"], {"source.row": "other", "source": "mine"},
        {"source": "other", "k": 1},
    ]  # fmt: skip


def test_winnows_held_out_rows_read_back_stay_held_out_with_the_columns_a_job_added(tmp_path, caplog):
    """A WebDataset val shard of a job with keep_fields (or keep_metrics, a score's column) came back as training
    rows; so did a Parquet one rebuilt from records, whose all-null meta a writer types as null, and one whose
    meta it types as a number is said to train, with the reason."""
    from winnow.curate.readers import native_columns

    body = {"meta": None, "source": "a", "split": "val", "quality": 0.5, "url": "http://x/1", "length_chars": 10}
    _samples_tar(tmp_path / "val.tar", [("k1", json.dumps(body).encode())])
    kept, _ = read_all(InputConfig(source="a", path=str(tmp_path / "val.tar"), format="webdataset"))
    assert kept["split"].to_list() == ["val"] and kept["quality"].to_list() == [0.5]
    assert json.loads(kept["meta"][0]) == {"url": "http://x/1", "length_chars": 10}
    table = {"id": ["r1"], "source": ["a"], "text": ["held out words"], "split": ["val"]}
    pq.write_table(pa.table({**table, "meta": pa.nulls(1)}), tmp_path / "null.parquet")
    pq.write_table(pa.table({**table, "meta": pa.array([None], pa.float64())}), tmp_path / "float.parquet")
    kept, _ = read_all(InputConfig(source="a", path=str(tmp_path / "null.parquet"), format="parquet"))
    assert kept["split"].to_list() == ["val"] and kept["meta"].to_list() == [None]
    cfg = InputConfig(source="a", path=str(tmp_path / "float.parquet"), format="parquet")
    with caplog.at_level("WARNING", logger="winnow.curate.readers"):
        native_columns([cfg], plan_read_tasks([cfg]))
    assert "with a split column are not in winnow's layout" in caplog.text
    assert "its 'meta' column is Float64, not a string): their rows are read as training rows" in caplog.text


def test_a_folder_of_text_files_keeps_an_image_or_utf16_file_as_a_reject_naming_what_it_is(tmp_path):
    """A folder of documents often holds a figure or a PDF: one reject each, the job goes on; a text that only
    starts like a Parquet file (PAR1) is text."""
    formats = _other_formats(tmp_path)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.md").write_text("a readme of words")
    (tmp_path / "in" / "fig.png").write_bytes(formats["png"])
    (tmp_path / "in" / "notes.txt").write_bytes(formats["utf16"])
    (tmp_path / "in" / "par.txt").write_text("PAR1 is the first paragraph of these notes")
    (tmp_path / "in" / "pdf.md").write_text("%PDF-1.7 starts every PDF file; GIF89a a GIF")  # notes, in UTF-8 text
    kept, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "in"), format="text"))
    assert sorted(kept["text"].to_list()) == [
        "%PDF-1.7 starts every PDF file; GIF89a a GIF", "PAR1 is the first paragraph of these notes", "a readme of words"
    ]  # fmt: skip
    errors = {json.loads(m)["file"].rsplit("/", 1)[-1]: json.loads(m)["error"] for m in rejects["meta"]}
    assert rejects["reason"].to_list() == ["read:not_text"] * 2
    assert errors["fig.png"].startswith("a PNG image (its first bytes say so), not UTF-8 text")
    assert errors["notes.txt"].startswith("UTF-16 text") and "iconv -f UTF-16 -t UTF-8" in errors["notes.txt"]


def test_a_folder_inputs_hidden_files_are_left_out_and_said(tmp_path, caplog):
    """A text folder that is a git checkout curated `.git/HEAD`, `.git/config` and the packed objects as documents."""
    (tmp_path / "in" / ".git" / "refs").mkdir(parents=True)
    (tmp_path / "in" / "docs").mkdir()
    (tmp_path / "in" / "a.md").write_text("a readme of words")
    (tmp_path / "in" / "docs" / "b.md").write_text("a guide of words")
    (tmp_path / "in" / ".git" / "HEAD").write_text("ref: refs/heads/main")
    (tmp_path / "in" / ".git" / "refs" / "main").write_text("0" * 40)
    (tmp_path / "in" / "docs" / ".b.md.swp").write_text("an editor's swap file")
    kept, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "in"), format="text"))
    assert sorted(kept["text"].to_list()) == ["a guide of words", "a readme of words"] and rejects.is_empty()
    assert "3 hidden file(s)" in caplog.text and ".git/HEAD" in caplog.text
    named, _ = read_all(InputConfig(source="s", path=str(tmp_path / "in" / ".git" / "HEAD"), format="text"))
    assert named["text"].to_list() == ["ref: refs/heads/main"]  # named in path: read


@pytest.mark.parametrize("task_bytes", [1 << 28, 1 << 14])
@pytest.mark.parametrize("compressed", [False, True])
def test_a_damaged_tar_header_is_a_reject_and_the_members_after_it_are_read(tmp_path, task_bytes, compressed):
    """A member whose header failed its checksum vanished with the member, counted nowhere: reading past end
    markers (`ignore_zeros`) also stepped over damaged headers without a word."""
    import gzip

    raw = bytearray(_tar(range(10)))
    third = 2 * (512 + 3072)  # each member: its header and 3,000 bytes of data in 6 blocks
    assert raw[third + 257 : third + 262] == b"ustar"
    raw[third + 148 : third + 156] = b"0000000\0"  # the third member's checksum
    data = gzip.compress(bytes(raw)) if compressed else bytes(raw)
    (tmp_path / "a.tar").write_bytes(data)
    cfg = InputConfig(source="s", path=str(tmp_path / "a.tar"), format="webdataset")
    batches = [b for t in plan_read_tasks([cfg], task_bytes=task_bytes) for b in read_task(cfg, t, 1000)]
    texts = [x for b in batches for x in b.rows["text"].to_list()]
    assert texts == [f"sample {i} " * 300 for i in range(10) if i != 2]
    rejects = pl.concat([b.rejects for b in batches if b.rejects is not None])
    assert rejects["reason"].to_list() == ["read:truncated"]
    where = json.loads(rejects["meta"][0])
    assert where["offset"] == third and "damaged tar header" in where["error"] and "lost" in where["error"]


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (good_lines(200), r"is JSON text, not a WebDataset tar shard; .*format = \"jsonl\""),
        (b"PAR1" + bytes(600), r"is a Parquet file, not a WebDataset tar shard"),
        (bytes(range(256)) * 8, r"is not a tar archive \(no tar header parses in it\)"),
    ],
)
def test_a_file_of_a_webdataset_input_that_is_no_tar_is_refused(tmp_path, content, said):
    """A JSON Lines file named b.tar in a WebDataset folder was 0 rows and 0 rejects: with end markers skipped, every
    block that was not a header was stepped over too, so the file's 200 records were counted nowhere."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.tar").write_bytes(_tar(range(3)))
    (tmp_path / "in" / "b.tar").write_bytes(content)
    with pytest.raises(InputError, match=rf"input s: .*b\.tar {said}"):
        read_all(InputConfig(source="s", path=str(tmp_path / "in"), format="webdataset"))


def test_a_file_matched_by_two_inputs_is_said_to_be_read_twice(tmp_path, caplog):
    """A glob and a path under another source both read the file: its rows curated twice, without a word."""
    (tmp_path / "a.jsonl").write_bytes(good_lines(2))
    (tmp_path / "b.jsonl").write_bytes(good_lines(1))
    inputs = [
        InputConfig(source="web", path=str(tmp_path / "*.jsonl")),
        InputConfig(source="curated", path=str(tmp_path / "a.jsonl")),
    ]
    with caplog.at_level("WARNING", logger="winnow.curate.readers"):
        tasks = plan_read_tasks(inputs)
    assert sum(len(t.files) for t in tasks) == 3  # read as asked: the warning says so
    assert f"inputs web and curated both match 1 file(s) ({tmp_path / 'a.jsonl'})" in caplog.text


def test_a_source_taken_from_a_field_cannot_make_another_files_derived_id(tmp_path):
    """`a/b` in x/d.jsonl and source `a` reading b/d.jsonl both derived `a/b/d.jsonl@0`: the second row, another
    document, was rejected as a duplicate id."""
    (tmp_path / "x").mkdir()
    (tmp_path / "root" / "b").mkdir(parents=True)
    (tmp_path / "x" / "d.jsonl").write_text('{"src": "a/b", "text": "the row whose source field says a/b"}\n')
    (tmp_path / "root" / "b" / "d.jsonl").write_text('{"text": "another row, of source a"}\n')
    pq.write_table(pa.table({"src": ["c/d%"], "text": ["a parquet row"]}), tmp_path / "p.parquet")
    kept, rejects = read_all(InputConfig(source_field="src", path=str(tmp_path / "x")))
    other, _ = read_all(InputConfig(source="a", path=str(tmp_path / "root")))
    parquet, _ = read_all(InputConfig(source_field="src", path=str(tmp_path / "p.parquet"), format="parquet"))
    assert kept["id"].to_list() == ["a%2Fb/d.jsonl@0"] and kept["source"].to_list() == ["a/b"]
    assert other["id"].to_list() == ["a/b/d.jsonl@0"] and rejects.height == 0
    assert parquet["id"].to_list() == ["c%2Fd%25/p.parquet/0"]


def test_list_view_columns_are_read_as_lists_at_any_depth_and_as_text_or_id_are_bad_schema(tmp_path):
    """polars reads no list view (`datatype "+vl" is still not supported`): a traceback at planning, whatever the
    column; pyarrow's own cast to a list gives an array short of an offset."""
    from winnow.curate.readers import native_columns

    view = pa.list_view(pa.string())
    nested = pa.array([[["a"], None], None, [["b", "c"]]], pa.large_list_view(view))
    inside = pa.StructArray.from_arrays([pa.array([["x"], None, ["y"]], view), pa.array([1, 2, 3])], names=["l", "n"])
    rows = {"id": ["a", "b", "c"], "text": ["one", "two", "three"], "tags": pa.array([["t"], [], None], view)}
    pq.write_table(pa.table({**rows, "nested": nested, "s": inside}), tmp_path / "a.parquet")
    pq.write_table(pa.table({**rows, "source": ["s"] * 3, "meta": ["{}"] * 3}), tmp_path / "winnow.parquet")
    cfg = InputConfig(source="s", path=str(tmp_path), format="parquet")
    assert native_columns([cfg], plan_read_tasks([cfg])) == {"tags": pl.List(pl.String)}
    kept, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "a.parquet"), format="parquet"))
    assert rejects.height == 0 and [json.loads(m) for m in kept["meta"]] == [
        {"tags": ["t"], "nested": [["a"], None], "s": {"l": ["x"], "n": 1}},
        {"tags": [], "nested": None, "s": {"l": None, "n": 2}},
        {"tags": None, "nested": [["b", "c"]], "s": {"l": ["y"], "n": 3}},
    ]
    kept, _ = read_all(InputConfig(source="s", path=str(tmp_path / "winnow.parquet"), format="parquet"))
    assert kept["tags"].to_list() == [["t"], [], None]
    for column in ("text", "id"):
        wrong = pa.table({**rows, column: pa.array([["q"]] * 3, pa.large_list_view(pa.string()))})
        pq.write_table(wrong, tmp_path / "b.parquet")
        kept, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "b.parquet"), format="parquet"))
        assert kept.height == 0 and rejects["reason"].to_list() == ["read:bad_schema"] * 3
        assert f"column {column!r}" in json.loads(rejects["meta"][0])["error"]


def test_nan_and_infinities_at_any_depth_are_kept_in_meta_as_top_level_ones_are(tmp_path):
    """In a float16 column, a list, an array or a struct, polars' JSON wrote NaN and infinities as null."""
    nan, inf = math.nan, math.inf
    table = pa.table(
        {
            "id": ["a", "b"],
            "text": ["one", "two"],
            "f16": pa.array([nan, 0.5], pa.float32()).cast(pa.float16()),
            "scores": pa.array([[0.5, nan, inf], None]),
            "pair": pa.array([[-inf, 1.0], [2.0, 3.0]], pa.list_(pa.float64(), 2)),
            "st": pa.array([{"x": nan, "y": [{"z": inf}]}, {"x": 1.0, "y": None}]),
        }
    )
    pq.write_table(table, tmp_path / "a.parquet")
    rows, _ = read_all(InputConfig(source="s", path=str(tmp_path / "a.parquet"), format="parquet"))
    assert [json.loads(m) for m in rows["meta"]] == [
        {"f16": "NaN", "scores": [0.5, "NaN", "Infinity"], "pair": ["-Infinity", 1.0],
         "st": {"x": "NaN", "y": [{"z": "Infinity"}]}},
        {"f16": 0.5, "scores": None, "pair": [2.0, 3.0], "st": {"x": 1.0, "y": None}},
    ]  # fmt: skip
    pq.write_table(table.drop(["text"]), tmp_path / "b.parquet")  # no text: each row a reject holding all of it
    _, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "b.parquet"), format="parquet"))
    assert json.loads(rejects["text"][0])["st"] == {"x": "NaN", "y": [{"z": "Infinity"}]}


def test_nan_float_ids_are_derived_as_null_ids_are(tmp_path):
    """Every NaN id read as "NaN": the second and later were read:duplicate_id of an unrelated document."""
    ids = pa.array([1.0, math.nan, None, math.nan, 4.0])
    pq.write_table(pa.table({"id": ids, "text": ["one", "two", "three", "four", "five"]}), tmp_path / "a.parquet")
    kept, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "a.parquet"), format="parquet"))
    assert rejects.height == 0
    assert kept["id"].to_list() == ["1.0", "s/a.parquet/1", "s/a.parquet/2", "s/a.parquet/3", "4.0"]


def test_column_names_that_are_another_columns_stand_in_are_told_apart(tmp_path):
    """`x, x, x#2`: the repeated x became a second x#2 (polars DuplicateError); a column named like the stand-in of
    a column named "" took its place likewise."""
    values = [pa.array(["t"])] + [pa.array([v]) for v in range(1, 7)]
    names = ["text", "x", "x", "x#2", "", "__row_blank4", "__row_blank6"]
    pq.write_table(pa.Table.from_arrays(values, names=names), tmp_path / "a.parquet")
    kept, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "a.parquet"), format="parquet"))
    assert rejects.height == 0
    assert json.loads(kept["meta"][0]) == {"x": 1, "x#2#1": 2, "x#2": 3, "": 4, "__row_blank4": 5, "__row_blank6": 6}


def test_a_sliced_batch_of_maps_and_lists_holding_nulls_is_read():
    """A batch read on from a damaged row group is a slice: pyarrow refused its maps' sliced offsets beside nulls."""
    from winnow.curate.readers.rows import rows_from_arrow

    counts = pa.array([[(1, "x")], None, [(2, "y")]], pa.map_(pa.int64(), pa.string()))
    prices = pa.array([[decimal.Decimal(1)], None, [decimal.Decimal("2.5")]], pa.large_list(pa.decimal256(40, 2)))
    table = pa.table({"text": ["a", "b", "c"], "counts": counts, "prices": prices})
    batch = rows_from_arrow(
        table.slice(1), source="s", source_field=None, text_field="text", id_field="id", file_label="f", row_offset=1
    )
    assert [json.loads(m) for m in batch.rows["meta"]] == [
        {"counts": None, "prices": None},
        {"counts": [{"key": 2, "value": "y"}], "prices": ["2.50"]},
    ]
