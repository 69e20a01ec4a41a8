"""Each reader: good rows, configurable fields, meta kept verbatim, and every bad-input case as a reject."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile

import numpy as np
import orjson
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from winnow.curate.config import InputConfig
from winnow.curate.errors import ConfigError, InputError
from winnow.curate.readers import plan_read_tasks, read_task


def read_all(cfg: InputConfig, batch_rows: int = 1000) -> tuple[pl.DataFrame, pl.DataFrame]:
    rows, rejects = [], []
    for task in plan_read_tasks([cfg]):
        for b in read_task(cfg, task, batch_rows):
            rows.append(b.rows)
            rejects.append(b.rejects)
    return pl.concat(rows), pl.concat(rejects)


def jsonl_bytes(records: list[dict]) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in records)


RECORDS = [{"id": f"d{i}", "text": f"document number {i}", "url": f"https://x/{i}", "n": i} for i in range(25)]


@pytest.mark.parametrize(
    "suffix,compress",
    [
        (".jsonl", lambda b: b),
        (".jsonl.gz", lambda b: gzip.compress(b, mtime=0)),
        (".jsonl.zst", lambda b: zstandard.ZstdCompressor().compress(b)),
    ],
)
def test_jsonl_reads_plain_gzip_and_zstd(tmp_path, suffix, compress):
    (tmp_path / f"a{suffix}").write_bytes(compress(jsonl_bytes(RECORDS)))
    rows, rejects = read_all(InputConfig(source="s", path=str(tmp_path / f"a{suffix}")), batch_rows=7)
    assert rows["id"].to_list() == [r["id"] for r in RECORDS]
    assert rows["source"].unique().to_list() == ["s"]
    assert json.loads(rows["meta"][3]) == {"url": "https://x/3", "n": 3}
    assert rejects.height == 0


def test_jsonl_custom_fields_and_derived_ids(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(jsonl_bytes([{"body": "x y", "lang": "en"}, {"body": "z"}]))
    rows, _ = read_all(InputConfig(source="s", path=str(tmp_path / "a.jsonl"), text_field="body"))
    first = len(orjson.dumps({"body": "x y", "lang": "en"})) + 1
    assert rows["id"].to_list() == ["s/a.jsonl@0", f"s/a.jsonl@{first}"]  # by the byte offset of the line
    assert rows["text"].to_list() == ["x y", "z"]
    assert rows["meta"].to_list() == ['{"lang":"en"}', None]


def test_jsonl_source_field_takes_source_per_row(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(
        jsonl_bytes([{"text": "a", "src": "web"}, {"text": "b", "src": "books"}, {"text": "c"}])
    )
    rows, rejects = read_all(InputConfig(source_field="src", path=str(tmp_path / "a.jsonl")))
    assert rows["source"].to_list() == ["web", "books"]
    assert rejects["reason"].to_list() == ["read:missing_source"]


def test_jsonl_bad_lines_become_rejects_with_offsets(tmp_path):
    good = orjson.dumps({"id": "ok", "text": "fine"}) + b"\n"
    lines = [
        good,
        b'{"id": "b", "text": \n',
        b"[1, 2]\n",
        b'{"id": "n", "text": 5}\n',
        b'{"id": "m"}\n',
        b'{"id": "u", "text": "\xff\xfe"}\n',
        b"\n",
        good.replace(b"ok", b"ok2"),
    ]
    (tmp_path / "a.jsonl").write_bytes(b"".join(lines))
    rows, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "a.jsonl")))
    assert rows["id"].to_list() == ["ok", "ok2"]
    assert rejects["reason"].to_list() == [
        "read:bad_json",
        "read:not_an_object",
        "read:text_not_string",
        "read:missing_text",
        "read:bad_utf8",
    ]
    where = [json.loads(m) for m in rejects["meta"]]
    assert [w["offset"] for w in where] == [sum(map(len, lines[:i])) for i in range(1, 6)]
    assert all(w["file"].endswith("a.jsonl") for w in where)
    assert rejects["text"][1] == "[1, 2]"  # the raw record is kept


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst"])
def test_truncated_compressed_file_keeps_rows_before_damage(tmp_path, suffix):
    records = [{"id": str(i), "text": "word " * 50 + str(i)} for i in range(2000)]
    data = jsonl_bytes(records)
    blob = (
        gzip.compress(data, mtime=0)
        if suffix.endswith("gz")
        else zstandard.ZstdCompressor(write_content_size=False).compress(data)
    )
    (tmp_path / f"a{suffix}").write_bytes(blob[: len(blob) * 3 // 4])
    rows, rejects = read_all(InputConfig(source="s", path=str(tmp_path / f"a{suffix}")))
    assert rejects["reason"].to_list() == ["read:truncated"]
    assert rows.height < len(records)
    assert rows["id"].to_list() == [str(i) for i in range(rows.height)]  # a prefix, in order
    if suffix.endswith("gz"):
        assert rows.height > 0


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.xz", ".jsonl.bz2"])
def test_a_compressed_file_damaged_in_its_middle_keeps_the_rows_before_the_damage(tmp_path, suffix, caplog):
    """The call that meets the damage yields nothing: pieces of the stream are small (gzip's salvaged from its
    state before the call), so the rows before the damage are kept. bzip2 checks a whole block (up to 900 kB of
    text) before it yields it: that block goes."""
    import bz2
    import lzma

    records = [{"id": f"r{i}", "text": f"document number {i}"} for i in range(60_000)]  # ~3 MB: bzip2 has 4 blocks
    compress = {
        ".jsonl.gz": lambda b: gzip.compress(b, mtime=0),
        ".jsonl.xz": lzma.compress,
        ".jsonl.bz2": bz2.compress,
    }
    blob = bytearray(compress[suffix](jsonl_bytes(records)))
    middle = len(blob) // 2
    blob[middle : middle + 16] = bytes(b ^ 0xFF for b in blob[middle : middle + 16])
    (tmp_path / f"a{suffix}").write_bytes(bytes(blob))
    with caplog.at_level("WARNING"):
        rows, rejects = read_all(InputConfig(source="s", path=str(tmp_path / f"a{suffix}")))
    intact = [r["id"] for r in records[: len(records) // 4]]  # well before the damage (for bzip2: its first block)
    assert rows["id"].to_list()[: len(intact)] == intact
    assert rejects["reason"].to_list()[-1] == "read:truncated"
    if suffix == ".jsonl.gz":
        # deflate finds this damage only by the member's checksum at its end: what it decoded past the damage is
        # garbled, mostly into lines that are no JSON (rejected), and the file is said to be damaged, by name
        assert "read:bad_json" in rejects["reason"].to_list()
        assert "its gzip checksum fails" in caplog.text and f"a{suffix}" in caplog.text
        assert "may be garbled" in json.loads(rejects["meta"][-1])["error"]
    else:  # xz and bzip2 check as they go: every row kept is intact
        assert rows["text"].to_list() == [f"document number {i[1:]}" for i in rows["id"]]
        assert caplog.text == ""


def test_empty_file_gives_no_rows(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(b"")
    assert (
        sum(
            b.rows.height + b.rejects.height
            for t in plan_read_tasks([InputConfig(source="s", path=str(tmp_path / "a.jsonl"))])
            for b in read_task(InputConfig(source="s", path=str(tmp_path / "a.jsonl")), t, 10)
        )
        == 0
    )


def test_missing_path_is_an_error_naming_it(tmp_path):
    with pytest.raises(InputError, match="nope.jsonl"):
        plan_read_tasks([InputConfig(source="s", path=str(tmp_path / "nope.jsonl"))])


def test_globs_and_folders_list_files_sorted(tmp_path):
    for name in ("b.jsonl", "a.jsonl", "c.txt"):
        (tmp_path / name).write_bytes(jsonl_bytes(RECORDS[:1]))
    by_glob = plan_read_tasks([InputConfig(source="s", path=str(tmp_path / "*.jsonl"))])
    by_dir = plan_read_tasks([InputConfig(source="s", path=str(tmp_path))])
    assert [[f.rel for f in t.files] for t in by_glob] == [["a.jsonl", "b.jsonl"]]  # small files: one task
    assert [[f.rel for f in t.files] for t in by_dir] == [["a.jsonl", "b.jsonl"]]
    each = plan_read_tasks([InputConfig(source="s", path=str(tmp_path))], group_bytes=0)
    assert [[f.rel for f in t.files] for t in each] == [["a.jsonl"], ["b.jsonl"]]


def test_parquet_reader_meta_and_bad_schema(tmp_path):
    pq.write_table(pa.table({"id": ["1", "2"], "text": ["a", None], "score": [0.5, 0.25]}), tmp_path / "good.parquet")
    pq.write_table(pa.table({"id": ["3"], "body": ["x"]}), tmp_path / "bad.parquet")
    rows, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "*.parquet"), format="parquet"))
    assert rows["id"].to_list() == ["1"]
    assert json.loads(rows["meta"][0]) == {"score": 0.5}
    assert sorted(rejects["reason"].to_list()) == ["read:bad_schema", "read:missing_text"]
    bad = rejects.filter(pl.col("reason") == "read:bad_schema")
    assert json.loads(bad["meta"][0])["row"] == 0 and "body" in bad["text"][0]


def test_parquet_reader_truncated_file(tmp_path):
    pq.write_table(pa.table({"text": ["a"] * 100}), tmp_path / "a.parquet")
    blob = (tmp_path / "a.parquet").read_bytes()
    (tmp_path / "a.parquet").write_bytes(blob[:-20])
    rows, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "a.parquet"), format="parquet"))
    assert rows.height == 0 and rejects["reason"].to_list() == ["read:truncated"]


@pytest.mark.parametrize("damaged", [5, 9])
@pytest.mark.parametrize("batch_rows", [300, 4096])
@pytest.mark.parametrize("task_bytes", [256 << 20, 1 << 20])  # the file whole, or in spans of its row groups
def test_a_parquet_row_group_damaged_is_one_reject_and_the_groups_around_it_are_read(
    tmp_path, damaged, batch_rows, task_bytes
):
    n = 10_000
    texts = [hashlib.sha512(str(i).encode()).hexdigest() * 4 for i in range(n)]  # ~3 MB as Parquet
    pq.write_table(
        pa.table({"id": [f"r{i}" for i in range(n)], "text": texts}), tmp_path / "a.parquet", row_group_size=1000
    )
    at = pq.ParquetFile(tmp_path / "a.parquet").metadata.row_group(damaged).column(1).data_page_offset
    blob = bytearray((tmp_path / "a.parquet").read_bytes())
    blob[at + 2 : at + 12] = bytes(b ^ 0xFF for b in blob[at + 2 : at + 12])  # its text column's page header
    (tmp_path / "a.parquet").write_bytes(bytes(blob))
    cfg = InputConfig(source="s", path=str(tmp_path / "a.parquet"), format="parquet")
    tasks = plan_read_tasks([cfg], task_bytes=task_bytes)
    assert (len(tasks) == 1) == (task_bytes > 1 << 20)
    rows, rejects = [], []
    for task in tasks:
        for b in read_task(cfg, task, batch_rows):
            rows += b.rows["id"].to_list()
            rejects += [json.loads(m) for m in b.rejects["meta"]]
    lost = range(1000 * damaged, 1000 * (damaged + 1))
    assert rows == [f"r{i}" for i in range(n) if i not in lost]
    assert [(r["row"], r["rows"]) for r in rejects] == [(lost.start, 1000)]


def _tar(path, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w") as tar:
        for name, payload in members:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))


def test_webdataset_reader_groups_members_by_key(tmp_path):
    _tar(
        tmp_path / "a.tar",
        [
            ("k1.txt", b"hello"),
            ("k1.json", b'{"id": "x1", "lang": "en"}'),
            ("k2.txt", b"\xff bad"),
            ("k3.json", b'{"id": "x3"}'),
            ("k4.txt", b"world"),
        ],
    )
    rows, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "a.tar"), format="webdataset"))
    assert rows["id"].to_list() == ["x1", "s/a.tar/k4"]
    assert rows["meta"][0] == '{"lang":"en"}'
    assert rejects["reason"].to_list() == ["read:bad_utf8", "read:missing_text"]


def test_webdataset_reader_truncated_tar(tmp_path):
    _tar(tmp_path / "a.tar", [(f"k{i}.txt", b"x" * 3000) for i in range(10)])
    blob = (tmp_path / "a.tar").read_bytes()
    (tmp_path / "a.tar").write_bytes(blob[:20000])
    rows, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "a.tar"), format="webdataset"))
    assert 0 < rows.height < 10
    assert rejects["reason"].to_list() == ["read:truncated"]


def test_text_reader_one_document_per_file(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "one.txt").write_text("first document")
    (tmp_path / "two").write_bytes(b"\xff\xfe not utf8")
    rows, rejects = read_all(InputConfig(source="lic", path=str(tmp_path), format="text"))
    assert rows["id"].to_list() == ["lic/sub/one.txt"]
    assert rows["text"].to_list() == ["first document"]
    assert rejects["reason"].to_list() == ["read:bad_utf8"]


def test_hf_reader_load_from_disk_and_builder(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": ["a", "b"], "label": [1, 2]}).save_to_disk(str(tmp_path / "ds"))
    rows, _ = read_all(InputConfig(source="s", path=str(tmp_path / "ds"), format="hf"))
    assert rows["text"].to_list() == ["a", "b"]
    assert [json.loads(m) for m in rows["meta"]] == [{"label": 1}, {"label": 2}]
    (tmp_path / "x.csv").write_text("text,k\nhello,1\nworld,2\n")
    rows, _ = read_all(InputConfig(source="s", path=str(tmp_path / "x.csv"), format="hf", hf_builder="csv"))
    assert rows["text"].to_list() == ["hello", "world"]


def test_a_saved_dataset_dict_is_read_one_named_split_at_a_time(tmp_path):
    """Its splits were read together into training: a test split trained on, and ids reused per split rejected as
    duplicates of unrelated rows. A builder's name datasets does not ship would be fetched from the Hub."""
    datasets = pytest.importorskip("datasets")
    splits = {name: datasets.Dataset.from_dict({"text": [f"{name} document {i}" for i in range(3)]}) for name in ("train", "test")}  # fmt: skip
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(InputError, match=r"dd is a DatasetDict of the splits train, test; set inputs\.hf_split"):
        read_all(InputConfig(source="s", path=str(tmp_path / "dd"), format="hf"))
    rows, _ = read_all(InputConfig(source="s", path=str(tmp_path / "dd"), format="hf", hf_split="test"))
    assert rows["text"].to_list() == [f"test document {i}" for i in range(3)]
    with pytest.raises(InputError, match=r"hf_split = 'dev', but .*dd holds the splits train, test"):
        read_all(InputConfig(source="s", path=str(tmp_path / "dd"), format="hf", hf_split="dev"))
    datasets.DatasetDict({"train": splits["train"]}).save_to_disk(str(tmp_path / "one"))
    rows, _ = read_all(InputConfig(source="s", path=str(tmp_path / "one"), format="hf"))
    assert rows.height == 3
    with pytest.raises(ConfigError, match="inputs.hf_split = 'test' names the split"):
        InputConfig(source="s", path=str(tmp_path / "x.jsonl"), hf_split="test")
    (tmp_path / "x.jsonl").write_text('{"text": "a"}\n')
    with pytest.raises(InputError, match=r"inputs\.hf_builder = 'jsonl' is not a builder datasets .* ships \(.*json"):
        read_all(InputConfig(source="s", path=str(tmp_path / "x.jsonl"), format="hf", hf_builder="jsonl"))


def test_columnar_fast_path_and_line_path_give_identical_rows(tmp_path):
    """Uniform blocks go through Arrow's JSON parser; a block with a missing key must not gain a null."""
    uniform = [
        {"id": f"u{i}", "text": f"t{i}", "url": f"https://x/{i}", "n": i, "tags": ["a"] * (i % 3), "nested": {"k": i}}
        for i in range(50)
    ]
    ragged = uniform[:10] + [{"id": "r", "text": "t", "url": "https://y"}] + uniform[10:20]
    (tmp_path / "u.jsonl").write_bytes(jsonl_bytes(uniform))
    (tmp_path / "r.jsonl").write_bytes(jsonl_bytes(ragged))
    rows, _ = read_all(InputConfig(source="s", path=str(tmp_path / "u.jsonl")))
    assert [json.loads(m) for m in rows["meta"]] == [
        {k: v for k, v in r.items() if k not in ("id", "text")} for r in uniform
    ]
    rows, _ = read_all(InputConfig(source="s", path=str(tmp_path / "r.jsonl")))
    assert json.loads(rows["meta"][10]) == {"url": "https://y"}  # no "n": null, no "tags": null
    no_ids = [{"text": f"t{i}", "n": i} for i in range(5)]
    (tmp_path / "n.jsonl").write_bytes(jsonl_bytes(no_ids))
    rows, _ = read_all(InputConfig(source="s", path=str(tmp_path / "n.jsonl")))
    offsets = np.cumsum([0] + [len(orjson.dumps(r)) + 1 for r in no_ids])[:5]
    assert rows["id"].to_list() == [f"s/n.jsonl@{o}" for o in offsets]


@pytest.mark.parametrize("fmt", ["text", "jsonl", "parquet"])
@pytest.mark.parametrize("named", ["folder", "file", "glob"])
def test_a_local_name_holding_two_colons_is_that_file(tmp_path, fmt, named):
    """fsspec reads `::` in a URL as a chain of file systems: `docs/std::vector.txt` opened `docs/std`, another file
    whose text was curated under this file's id (or the error named a file the job never gave)."""
    docs = tmp_path / "docs"
    docs.mkdir()
    ext = {"text": ".txt", "jsonl": ".jsonl", "parquet": ".parquet"}[fmt]
    for name, text in ((f"std::vector{ext}", "notes about std::vector"), ("std", "an unrelated file")):
        if fmt == "parquet":
            pq.write_table(pa.table({"text": [text]}), docs / name)
        else:
            (docs / name).write_bytes(jsonl_bytes([{"text": text}]) if fmt == "jsonl" else text.encode())
    path = {"folder": docs, "file": docs / f"std::vector{ext}", "glob": docs / f"std::*{ext}"}[named]
    rows, _ = read_all(InputConfig(source="s", path=str(path), format=fmt))
    assert (
        "notes about std::vector" in rows["text"].to_list()
        and "an unrelated file" not in rows.filter(pl.col("id").str.contains("vector"))["text"].to_list()
    )
    (docs / "std").unlink()
    rows, _ = read_all(InputConfig(source="s", path=str(path), format=fmt))
    assert rows["text"].to_list() == ["notes about std::vector"]


@pytest.mark.parametrize("builder", [True, False])
def test_hugging_face_inputs_named_with_glob_characters_or_two_colons_are_those_files(tmp_path, builder):
    """`load_dataset` takes data_files as globs (`data[1].jsonl` read `data1.jsonl`, its own rows in neither shards
    nor rejects), and datasets opens paths as fsspec URLs (`std::v` read `std`)."""
    datasets = pytest.importorskip("datasets")
    for name, other in (("data[1]", "data1"), ("a*?b", "axyb"), ("std::v", "std")):
        if builder:
            (tmp_path / f"{name}.jsonl").write_bytes(jsonl_bytes([{"id": "mine", "text": "the named file"}]))
            (tmp_path / f"{other}.jsonl").write_bytes(jsonl_bytes([{"id": "other", "text": "another file"}]))
            if other == "std":  # `std::v.jsonl` chains to `std`
                (tmp_path / f"{other}.jsonl").rename(tmp_path / other)
        else:  # datasets cannot save to a path holding `::`: saved, then renamed
            datasets.Dataset.from_dict({"id": ["mine"], "text": ["the named file"]}).save_to_disk(str(tmp_path / "m"))
            datasets.Dataset.from_dict({"id": ["other"], "text": ["another file"]}).save_to_disk(str(tmp_path / other))
            (tmp_path / "m").rename(tmp_path / name)
        path = tmp_path / (f"{name}.jsonl" if builder else name)
        cfg = InputConfig(source="s", path=str(path), format="hf", hf_builder="json" if builder else None)
        rows, rejects = read_all(cfg)
        assert rows["id"].to_list() == ["mine"] and rejects.is_empty(), name


def test_empty_hugging_face_inputs_are_no_rows_and_a_cut_arrow_file_keeps_the_rows_before_the_cut(tmp_path):
    """A zero-row save_to_disk folder ended in IndexError, an empty file under the json builder in "generator
    raised StopIteration", a cut .arrow file in OSError: each a traceback that stopped the job."""
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"id": [], "text": []}).save_to_disk(str(tmp_path / "empty_ds"))
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": []})}).save_to_disk(str(tmp_path / "empty_dd"))
    (tmp_path / "empty.jsonl").write_bytes(b"")
    (tmp_path / "empty.jsonl.gz").write_bytes(gzip.compress(b""))
    for cfg in (
        InputConfig(source="s", path=str(tmp_path / "empty_ds"), format="hf"),
        InputConfig(source="s", path=str(tmp_path / "empty_dd"), format="hf"),
        InputConfig(source="s", path=str(tmp_path / "empty.jsonl"), format="hf", hf_builder="json"),
        InputConfig(source="s", path=str(tmp_path / "empty.jsonl.gz"), format="hf", hf_builder="json"),
    ):
        rows, rejects = _read_or_nothing(cfg)
        assert rows == [] and rejects == [], cfg.path
    ids = [f"r{i}" for i in range(5000)]
    datasets.Dataset.from_dict({"id": ids, "text": ["x" * 100] * 5000}).save_to_disk(str(tmp_path / "cut"))
    (arrow,) = (tmp_path / "cut").glob("*.arrow")  # five record batches of 1,000 rows
    arrow.write_bytes(arrow.read_bytes()[: arrow.stat().st_size * 7 // 10])
    rows, rejects = read_all(InputConfig(source="s", path=str(tmp_path / "cut"), format="hf"))
    assert rows["id"].to_list() == ids[:3000] and rejects["reason"].to_list() == ["read:truncated"]
    where = json.loads(rejects["meta"][0])
    assert where["row"] == 3000 and f"{arrow} is cut short or damaged" in where["error"]


def _read_or_nothing(cfg: InputConfig) -> tuple[list[str], list[str]]:
    """The ids kept and the reasons rejected, where ``read_all`` has no batch to concatenate."""
    rows, rejects = [], []
    for task in plan_read_tasks([cfg]):
        for b in read_task(cfg, task, 100):
            rows += b.rows["id"].to_list()
            rejects += b.rejects["reason"].to_list()
    return rows, rejects


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "text"])
@pytest.mark.parametrize("pattern", ["", "**/*", "*/*"])
def test_linked_folders_in_a_folder_input_are_read_once(tmp_path, caplog, fmt, pattern):
    """fsspec's find and glob list a link to a folder as a file: its files were never read (a folder path warned
    that it was a file of another format; `*/*.jsonl` matched no files)."""
    ext = {"jsonl": ".jsonl", "parquet": ".parquet", "text": ".txt"}[fmt]
    for folder, name in (("real", "a"), ("top", "b")):
        (tmp_path / folder).mkdir()
        if fmt == "parquet":
            pq.write_table(pa.table({"text": [f"{name} text"]}), tmp_path / folder / f"{name}{ext}")
        else:
            body = jsonl_bytes([{"text": f"{name} text"}]) if fmt == "jsonl" else f"{name} text".encode()
            (tmp_path / folder / f"{name}{ext}").write_bytes(body)
    (tmp_path / "top" / "2024").symlink_to("../real")
    (tmp_path / "real" / "up").symlink_to("../top")  # a loop: top/2024/up is top
    (tmp_path / "top" / "again").symlink_to("../real")  # the same folder by two names
    path = tmp_path / "top" / (pattern + ext if pattern else "")
    with caplog.at_level("WARNING", logger="winnow.curate.readers"):
        rows, _ = read_all(InputConfig(source="s", path=str(path), format=fmt))
    assert sorted(rows["text"]) == (["a text"] if pattern == "*/*" else ["a text", "b text"])
    assert rows.filter(pl.col("text") == "a text")["id"].str.starts_with(f"s/2024/a{ext}").all()  # by the link's name
    assert "again is" in caplog.text and "through a link, and read once" in caplog.text
    assert "not ending in" not in caplog.text


@pytest.mark.parametrize("fmt", ["jsonl", "text"])
def test_a_zstd_file_written_with_a_2_gib_window_is_read(tmp_path, fmt):
    """`zstd --long=31` from a pipe writes frames whose window is 2 GiB: zstandard's default limit (128 MiB) made such
    an intact file one read:truncated reject, every record in it lost from the counts."""
    params = zstandard.ZstdCompressionParameters(window_log=31, compression_level=1)
    compress = zstandard.ZstdCompressor(compression_params=params).compressobj()  # no content size, as from a pipe
    body = jsonl_bytes(RECORDS) if fmt == "jsonl" else b"one document"
    blob = compress.compress(body) + compress.flush()
    assert zstandard.get_frame_parameters(blob).window_size == 1 << 31
    (tmp_path / f"a.{'jsonl' if fmt == 'jsonl' else 'txt'}.zst").write_bytes(blob)
    rows, rejects = _read_or_nothing(InputConfig(source="s", path=str(tmp_path), format=fmt))
    assert len(rows) == (len(RECORDS) if fmt == "jsonl" else 1) and rejects == []
