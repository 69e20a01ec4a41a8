"""Training on Parquet folders no ``winnow curate`` wrote: the loader makes its own view of the folder."""

from __future__ import annotations

import json

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from winnow.train.data import Loader, LoaderConfig
from winnow.train.data.foreign import find_split_files
from winnow.train.errors import ShardError

CFG = LoaderConfig(batch_size=2, seq_len=64, num_workers=0)


def write(path, texts, sources=None, **extra):
    path.parent.mkdir(parents=True, exist_ok=True)
    cols = {"text": texts, **({"source": sources} if sources is not None else {}), **extra}
    pq.write_table(pa.table(cols), path)


def docs_read(loader, n_batches):
    batches = [next(loader) for _ in range(n_batches)]
    toks = np.concatenate([b.targets[b.loss_mask].numpy() for b in batches])
    srcs = np.concatenate([b.source_ids[b.loss_mask].numpy() for b in batches])
    ends = np.flatnonzero(toks == 256)
    docs = [toks[s:e].astype(np.uint8).tobytes().decode() for s, e in zip(np.r_[0, ends[:-1] + 1], ends)]
    return docs, [loader.sources[i] for i in srcs[ends]]


def test_hub_style_folder_trains_in_natural_order_with_sources_from_the_column(tmp_path):
    texts = {i: [f"doc {i}-{j}" for j in range(3)] for i in (1, 2, 10)}
    for i, t in texts.items():  # natural order: 1, 2, 10 (not 1, 10, 2)
        write(tmp_path / "data" / f"train-{i:d}-of-10.parquet", t, ["web", "code", "web"], url=["u"] * 3)
    write(tmp_path / "data" / "validation-0.parquet", ["held out"], ["web"])
    loader = Loader(CFG, tmp_path)
    assert loader.sources == ["web", "code"]
    (view,) = loader.views
    assert [s["path"] for s in view["shards"]] == [
        "data/train-1-of-10.parquet",
        "data/train-2-of-10.parquet",
        "data/train-10-of-10.parquet",
    ]
    docs, srcs = docs_read(loader, 4)
    assert docs[:9] == texts[1] + texts[2] + texts[10]
    assert srcs[:3] == ["web", "code", "web"]
    val = Loader(CFG, tmp_path, split="val", sources=loader.sources)
    assert docs_read(val, 1)[0][0] == "held out"


def test_folder_without_source_column_is_one_source_named_after_it(tmp_path):
    write(tmp_path / "mycorpus" / "a.parquet", ["x" * 10, "y" * 10])
    loader = Loader(CFG, tmp_path / "mycorpus")
    assert loader.sources == ["mycorpus"]
    docs, srcs = docs_read(loader, 1)
    assert docs[:2] == ["x" * 10, "y" * 10] and set(srcs) == {"mycorpus"}
    with pytest.raises(ShardError, match="no manifest.json and no Parquet files for split 'val'"):
        Loader(CFG, tmp_path / "mycorpus", split="val")


def test_split_folders_and_winnow_layout_are_found(tmp_path):
    fs = fsspec.filesystem("file")
    for rel in ("train/b.parquet", "train/a.parquet", "validation/v.parquet", "_work/x.parquet", ".tmp.parquet"):
        write(tmp_path / "hub" / rel, ["t"])
    assert find_split_files(fs, str(tmp_path / "hub"), "train") == ["train/a.parquet", "train/b.parquet"]
    assert find_split_files(fs, str(tmp_path / "hub"), "val") == ["validation/v.parquet"]
    for rel in ("shards/parquet/train/part-00000-00000.parquet", "shards/parquet/val/part-00000-00000.parquet"):
        write(tmp_path / "job" / rel, ["t"], ["s"])
    assert find_split_files(fs, str(tmp_path / "job"), "val") == ["shards/parquet/val/part-00000-00000.parquet"]
    write(tmp_path / "flat" / "x.parquet", ["t"])
    write(tmp_path / "flat" / "val_0.parquet", ["t"])
    assert find_split_files(fs, str(tmp_path / "flat"), "train") == ["x.parquet"]  # the val file is not train data


@pytest.mark.parametrize(
    "files, train, val",
    [
        (["train.parquet", "validation.parquet", "test.parquet"], ["train.parquet"], ["validation.parquet"]),
        (["x/part-0.parquet", "x/test-0.parquet"], ["x/part-0.parquet"], []),
        (["a.parquet", "test/c.parquet"], ["a.parquet"], []),
        (
            ["data/train_0.parquet", "data/test_0.parquet", "data/dev_0.parquet"],
            ["data/train_0.parquet"],
            ["data/dev_0.parquet"],
        ),
        (["contest.parquet", "latest-1.parquet"], ["contest.parquet", "latest-1.parquet"], []),
    ],
)
def test_files_named_after_their_split_are_that_split_and_a_test_split_is_never_trained_on(tmp_path, files, train, val):
    """The Hub's train.parquet / validation.parquet (the split's name then `.parquet`) are their splits (the
    validation file was not found); test files and folders are never training data (they were trained on)."""
    fs = fsspec.filesystem("file")
    for rel in files:
        write(tmp_path / rel, ["t"])
    assert find_split_files(fs, str(tmp_path), "train") == train
    assert find_split_files(fs, str(tmp_path), "val") == val


def test_bad_folders_say_what_to_do(tmp_path):
    with pytest.raises(ShardError, match=r"no manifest.json, and no such folder.*--shards"):
        Loader(CFG, tmp_path / "missing")
    write(tmp_path / "notext" / "a.parquet", ["t"], content=["c"])
    pq.write_table(pa.table({"content": ["c"]}), tmp_path / "notext" / "a.parquet")
    with pytest.raises(ShardError, match=r"a\.parquet: no 'text' column \(has \['content'\]\)"):
        Loader(CFG, tmp_path / "notext")
    # a 'text' column of numbers, in a later file: found when the folder is opened, not when the loader reaches it
    write(tmp_path / "numbers" / "a.parquet", ["a real document"])
    pq.write_table(pa.table({"text": pa.array([1, 2], pa.int64())}), tmp_path / "numbers" / "b.parquet")
    with pytest.raises(ShardError, match=r"b\.parquet: its 'text' column holds int64 values"):
        Loader(CFG, tmp_path / "numbers")
    pq.write_table(pa.table({"text": pa.array([b"bytes"]).dictionary_encode()}), tmp_path / "numbers" / "b.parquet")
    assert Loader(CFG, tmp_path / "numbers").sources == ["numbers"]  # UTF-8 bytes, dictionary-encoded: text
    (tmp_path / "half" / "_work").mkdir(parents=True)
    with pytest.raises(ShardError, match="has not finished"):
        Loader(CFG, tmp_path / "half")
    write(tmp_path / "lost" / "shards" / "parquet" / "train" / "part-00000.parquet", ["t"], source=["s"])
    (tmp_path / "lost" / ".winnow-output").write_text("")  # a curated folder whose manifest.json was removed
    with pytest.raises(ShardError, match=r"\.winnow-output\) whose manifest.json is missing.*curate. command again"):
        Loader(CFG, tmp_path / "lost")
    # a job's rejects/ (the rows curation removed) or shards/, and a folder holding jobs (a study's): trained on as
    # plain Parquet without a word
    job = tmp_path / "studies" / "job"
    write(job / "shards" / "parquet" / "train" / "part-00000.parquet", ["t"], source=["s"])
    write(job / "rejects" / "part-00000.parquet", ["removed"], source=["s"], reason=["dedup:exact"])
    (job / "manifest.json").write_text("{}")
    for inner, said in (("rejects", "rejects: the rows curation removed"), ("shards", "shards: part of it")):
        with pytest.raises(ShardError, match=rf"inside the `winnow curate` job folder .*job \({said}.*--shards "):
            Loader(CFG, job / inner)
    with pytest.raises(ShardError, match=r"holds a `winnow curate` job folder \(.*job\).*list each job under"):
        Loader(CFG, tmp_path / "studies")
    # a source column with nulls: named at open (a batch holding one stopped the run, its advice about a manifest)
    write(tmp_path / "nulls" / "train.parquet", ["a", "b", "c", "d"], sources=["x", None, "y", None])
    with pytest.raises(ShardError, match=r"train\.parquet: 2 of its 4 rows have no source .*the first is row 1"):
        Loader(CFG, tmp_path / "nulls")


def test_manifest_folders_are_still_read_through_the_manifest(tmp_path):
    from tests.train.shards_util import make_docs, write_job

    folder = write_job(tmp_path / "job", [make_docs(6)])  # the layout before shards/<format>/ folders
    loader = Loader(CFG, folder)
    assert loader.views == [None]
    assert json.loads((folder / "manifest.json").read_text())["shards"][0]["path"].startswith("shards/train/")
    assert docs_read(loader, 6)[0][:6] == [d["text"] for d in make_docs(6)]


def test_a_file_rewritten_to_the_same_size_and_rows_is_not_resumed_on(tmp_path):
    """Resuming on a folder without a manifest compares each file's rows, size and the hash of its tail: other text
    of the same length (the same size and rows) is another data set, refused."""
    write(tmp_path / "c" / "a.parquet", ["alpha " * 20, "bravo " * 20])
    first = Loader(CFG, tmp_path / "c")
    next(first)
    state = first.state_dict()
    size = (tmp_path / "c" / "a.parquet").stat().st_size
    write(tmp_path / "c" / "a.parquet", ["omega " * 20, "delta " * 20])
    assert (tmp_path / "c" / "a.parquet").stat().st_size == size
    with pytest.raises(Exception, match="resume needs the same shards"):
        Loader(CFG, tmp_path / "c").load_state_dict(state)


def test_dictionary_view_and_binary_text_columns_read_as_their_strings(tmp_path):
    """pandas' category and polars' Categorical write dictionary columns; other tools view or binary ones: read
    as the strings they hold, as curation reads them (refused at the first batch); bytes that are not UTF-8 are a
    ShardError naming the file."""
    texts = [f"document {i} " * 8 for i in range(12)]
    plain = tmp_path / "plain"
    write(plain / "train-0.parquet", texts, ["s"] * 12)
    with Loader(CFG, plain) as loader:
        want = docs_read(loader, 3)
    for name, column in {
        "dict": pa.array(texts).dictionary_encode(),
        "view": pa.array(texts, pa.string_view()),
        "bin": pa.array([t.encode() for t in texts], pa.binary()),
    }.items():
        write(tmp_path / name / "train-0.parquet", column, pa.array(["s"] * 12).dictionary_encode())
        with Loader(CFG, tmp_path / name) as loader:
            assert docs_read(loader, 3) == want, name
    write(tmp_path / "bad" / "train-0.parquet", pa.array([b"\xff\xfe" * 8] * 12, pa.binary()), ["s"] * 12)
    with pytest.raises(ShardError, match=r"train-0.parquet: wrong columns: 'text' has type binary"):
        with Loader(CFG, tmp_path / "bad") as loader:
            next(loader)


def test_rows_without_text_in_a_folder_without_a_manifest_are_said(tmp_path, caplog):
    """Null or empty texts read as empty documents (an EOS alone); the first read of such a shard says how many."""
    write(tmp_path / "f" / "train-0.parquet", pa.array(["some text here"] * 4 + [None, ""], pa.string()), ["s"] * 6)
    with caplog.at_level("WARNING", logger="winnow.train.data.shards"), Loader(CFG, tmp_path / "f") as loader:
        next(loader)
    assert sum("2 of 6 rows have no text" in r.getMessage() for r in caplog.records) == 1


def test_linked_folders_and_files_are_read_once_each_and_a_pipe_is_refused(tmp_path, caplog):
    """On a local disk the view follows a linked folder (its rows were left out without a word), reads a file
    reached twice through links once, with a warning, and refuses a named pipe (a read would wait forever)."""
    import os

    write(tmp_path / "elsewhere" / "b.parquet", ["linked 0", "linked 1"])
    write(tmp_path / "data" / "train" / "a.parquet", ["own 0"])
    (tmp_path / "data" / "train" / "more").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "data" / "train" / "z.parquet").symlink_to(tmp_path / "data" / "train" / "a.parquet")
    (tmp_path / "elsewhere" / "up").symlink_to(tmp_path / "data")  # a loop: walked once
    with caplog.at_level("WARNING"):
        loader = Loader(CFG, tmp_path / "data")
    assert [s["path"] for s in loader.views[0]["shards"]] == ["train/a.parquet", "train/more/b.parquet"]
    assert "train/z.parquet is train/a.parquet again (through a link): read once" in caplog.text
    os.mkfifo(tmp_path / "data" / "train" / "p.parquet")
    with pytest.raises(ShardError, match=r"train/p\.parquet: not a regular file \(a named pipe"):
        Loader(CFG, tmp_path / "data")


def test_files_a_later_layout_would_read_are_named(tmp_path, caplog):
    write(tmp_path / "train" / "a.parquet", ["in the split folder"])
    for name in ("train.parquet", "train-00001-of-00002.parquet", "shards/train/x.parquet"):
        write(tmp_path / name, ["beside it"])
    with caplog.at_level("WARNING"):
        loader = Loader(CFG, tmp_path)
    assert [s["path"] for s in loader.views[0]["shards"]] == ["train/a.parquet"]
    assert "split 'train' is read from train/ (1 file(s))" in caplog.text
    assert "3 other Parquet file(s) a later layout would give it are not read (shards/train/x.parquet, " in caplog.text


def test_source_columns_of_bytes_are_names_and_of_other_types_refused(tmp_path):
    (tmp_path / "bytes").mkdir()
    source = pa.array([b"web", b"news", b"web"], pa.binary())  # what older Spark and Hive write
    pq.write_table(pa.table({"text": ["a", "b", "c"], "source": source}), tmp_path / "bytes" / "a.parquet")
    loader = Loader(CFG, tmp_path / "bytes")
    assert loader.sources == ["web", "news"] and set(docs_read(loader, 1)[1]) <= {"web", "news"}
    write(tmp_path / "struct" / "a.parquet", ["a"], [{"name": "web"}])
    with pytest.raises(ShardError, match=r"a\.parquet: its 'source' column holds struct<name: string> values"):
        Loader(CFG, tmp_path / "struct")


def test_a_file_name_that_is_not_utf8_is_read(tmp_path):
    import os

    (tmp_path / "data").mkdir()
    with open(os.fsencode(tmp_path / "data") + b"/caf\xe9.parquet", "wb") as fh:  # a Latin-1 name
        pq.write_table(pa.table({"text": ["a document"]}), fh)
    loader = Loader(CFG, tmp_path / "data")
    assert docs_read(loader, 1)[0][0] == "a document"
