"""The catalogue of bad inputs: every kind a hostile or unlucky corpus holds, as a job.

Each case writes a tiny input, runs ``winnow curate`` on it and asserts what must happen:
either the named ``read:<error>`` rejects (with everything else kept, and the job's
nothing-is-lost identity over the input's ids), or a ``winnow curate: error:`` message that
names the problem and the inputs left untouched. docs/reliability.md lists
these cases; ``test_catalogue_size`` keeps the count honest.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import os
import tarfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from winnow.pipelines.cli import main


@dataclass(frozen=True)
class Case:
    """One bad-input kind: ``build(folder)`` writes the input and returns its ``[[inputs]]`` tables and ids."""

    name: str
    build: Callable[[Path], tuple[str, set[str]]]
    rejects: dict[str, int] = field(default_factory=dict)  # reason -> rows, over the whole job
    kept: int | None = None  # rows written, when the case fixes it
    error: str | None = None  # the job fails: a fragment of its message
    check: Callable[[Path, Path], None] | None = None  # more assertions on (input folder, output folder)
    skip: str | None = None
    output: Callable[[Path], str] | None = None  # the --output to give, made by the case (default: a new folder)


def inputs(path: Path, fmt: str = "jsonl", source: str = "s") -> str:
    return f'[[inputs]]\nsource = "{source}"\npath = "{path}"\nformat = "{fmt}"\n'


def jl(*records: dict | bytes) -> bytes:
    return b"".join(r if isinstance(r, bytes) else orjson.dumps(r) + b"\n" for r in records)


GOOD = [{"id": f"g{i}", "text": f"good document {i}"} for i in range(3)]
GOOD_IDS = {r["id"] for r in GOOD}
AFTER_GOOD = f"s/a.jsonl@{len(jl(*GOOD))}"  # the derived id of the line after GOOD's (by its byte offset)
SURROGATES = (b'{"id": "u", "text": "x\\ud800"}\n', b'{"id": "v\\udc00", "text": "y"}\n')  # lone \u escapes


def jsonl_case(data: bytes, ids: set[str], name: str = "a.jsonl") -> Callable[[Path], tuple[str, set[str]]]:
    def build(folder: Path) -> tuple[str, set[str]]:
        (folder / name).write_bytes(data)
        return inputs(folder / name), ids

    return build


def many(n: int) -> list[dict]:
    return [{"id": f"m{i}", "text": f"many words in document {i}"} for i in range(n)]


def compressed_truncated(kind: str) -> Callable[[Path], tuple[str, set[str]]]:
    records = many(400)
    data = jl(*records)

    def build(folder: Path) -> tuple[str, set[str]]:
        blob = (
            gzip.compress(data, mtime=0)
            if kind == "gz"
            else zstandard.ZstdCompressor(write_content_size=False).compress(data)
        )
        (folder / f"a.jsonl.{kind}").write_bytes(blob[: len(blob) * 2 // 3])
        return inputs(folder / f"a.jsonl.{kind}"), None  # type: ignore[return-value]  # ids: a prefix + one

    return build


def tar_case(
    members: list[tuple[str, bytes | tuple[bytes, str]]], ids: set[str]
) -> Callable[[Path], tuple[str, set[str]]]:
    """``(name, payload)`` members; a payload ``(type, linkname)`` makes a link or special member."""

    def build(folder: Path) -> tuple[str, set[str]]:
        with tarfile.open(
            folder / "a.tar", "w", format=tarfile.GNU_FORMAT, encoding="utf-8", errors="surrogateescape"
        ) as tar:
            for name, payload in members:
                info = tarfile.TarInfo(name)
                if isinstance(payload, tuple):
                    info.type, info.linkname = payload
                    tar.addfile(info)
                else:
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
        return inputs(folder / "a.tar", "webdataset"), ids

    return build


def truncated_tar(folder: Path) -> tuple[str, set[str]]:
    tar_case([(f"k{i}.txt", b"x" * 3000) for i in range(10)], set())(folder)
    blob = (folder / "a.tar").read_bytes()
    (folder / "a.tar").write_bytes(blob[:20000])
    return inputs(folder / "a.tar", "webdataset"), None  # type: ignore[return-value]


def parquet_case(table: pa.Table, ids: set[str], cut: slice | None = None) -> Callable[[Path], tuple[str, set[str]]]:
    def build(folder: Path) -> tuple[str, set[str]]:
        pq.write_table(table, folder / "a.parquet")
        if cut is not None:  # a damaged file is one reject, named by the file's path and row
            blob = (folder / "a.parquet").read_bytes()
            (folder / "a.parquet").write_bytes(blob[cut])
            return inputs(folder / "a.parquet", "parquet"), {f"{folder / 'a.parquet'}#0"}
        return inputs(folder / "a.parquet", "parquet"), ids

    return build


def invalid_string(values: list[bytes]) -> pa.Array:
    raw = pa.array(values, pa.binary())
    return pa.Array.from_buffers(pa.string(), len(raw), raw.buffers())  # a writer that did not validate


def corrupt_footer(folder: Path) -> tuple[str, set[str]]:
    pq.write_table(pa.table({"id": ["p0", "p1"], "text": ["a", "b"]}), folder / "a.parquet")
    blob = bytearray((folder / "a.parquet").read_bytes())
    blob[-12:-4] = b"\xff" * 8  # footer length and metadata garbled, magic kept
    (folder / "a.parquet").write_bytes(bytes(blob))
    return inputs(folder / "a.parquet", "parquet"), {f"{folder / 'a.parquet'}#0"}


def two_inputs_same_ids(folder: Path) -> tuple[str, set[str]]:
    (folder / "web.jsonl").write_bytes(jl(*GOOD))
    (folder / "books.jsonl").write_bytes(jl({"id": "g1", "text": "another g1"}, {"id": "b0", "text": "a book"}))
    return inputs(folder / "web.jsonl", source="web") + inputs(folder / "books.jsonl", source="books"), GOOD_IDS | {
        "b0"
    }


def same_name_in_two_folders(folder: Path) -> tuple[str, set[str]]:
    """Rows without ids in ``2023/part.jsonl`` and ``2024/part.jsonl`` of one source (two paths of one input,
    and a second input of the same source): their derived ids differ by folder."""
    lines = [jl({"text": f"document {i} of {year}"}) for year in (2023, 2024, 2025) for i in range(2)]
    ids = set()
    for k, year in enumerate((2023, 2024, 2025)):
        (folder / str(year)).mkdir()
        (folder / str(year) / "part.jsonl").write_bytes(lines[2 * k] + lines[2 * k + 1])
        ids |= {f"s/{year}/part.jsonl@0", f"s/{year}/part.jsonl@{len(lines[2 * k])}"}
    paths = json.dumps([str(folder / "2023/*.jsonl"), str(folder / "2024/*.jsonl")])
    return f'[[inputs]]\nsource = "s"\npath = {paths}\n' + inputs(folder / "2025"), ids


def extensions_in_any_case(folder: Path) -> tuple[str, set[str]]:
    """A folder input reads ``B.JSONL``, ``c.jsonl.gzip`` and ``d.NDJSON.XZ`` as it reads ``a.jsonl``."""
    names = {"a.jsonl": bytes, "B.JSONL": bytes, "c.jsonl.gzip": gzip.compress, "d.NDJSON.XZ": lzma.compress}
    for i, (name, pack) in enumerate(names.items()):
        (folder / name).write_bytes(pack(jl({"id": f"x{i}", "text": f"document {i}"})))
    return inputs(folder), {f"x{i}" for i in range(len(names))}


def empty_ids(fmt: str) -> Callable[[Path], tuple[str, set[str]]]:
    """Rows whose id is ``""`` (JSONL, Parquet): each gets a derived id, as a row without one does."""

    def build(folder: Path) -> tuple[str, set[str]]:
        texts = [f"distinct document {i}" for i in range(3)]
        if fmt == "parquet":
            pq.write_table(pa.table({"id": ["", "", "p2"], "text": texts}), folder / "a.parquet")
            return inputs(folder / "a.parquet", "parquet"), {"s/a.parquet/0", "s/a.parquet/1", "p2"}
        lines = [jl({"id": "", "text": t}) for t in texts[:2]] + [jl({"id": "j2", "text": texts[2]})]
        (folder / "a.jsonl").write_bytes(b"".join(lines))
        return inputs(folder / "a.jsonl"), {"s/a.jsonl@0", f"s/a.jsonl@{len(lines[0])}", "j2"}

    return build


def kept_field_and_stage(stage: str) -> Callable[[Path], tuple[str, set[str]]]:
    """Rows keeping a field ``length_chars`` (a filter.length metric's name) and ``rating``, then ``stage``."""

    def build(folder: Path) -> tuple[str, set[str]]:
        rows = [
            {"id": f"k{i}", "text": f"document number {i}", "length_chars": "mine", "rating": "good"} for i in range(3)
        ]
        (folder / "a.jsonl").write_bytes(jl(*rows))
        table = inputs(folder / "a.jsonl") + 'keep_fields = ["length_chars", "rating"]\n'
        return table + f"[[stages]]\n{stage}\n", {r["id"] for r in rows}

    return build


def good_rows_and(tables: str) -> Callable[[Path], tuple[str, set[str]]]:
    """GOOD's rows as input ``s``, then ``tables`` (a ``[job]`` key needs its own table: give stages here)."""

    def build(folder: Path) -> tuple[str, set[str]]:
        (folder / "a.jsonl").write_bytes(jl(*GOOD))
        return inputs(folder / "a.jsonl") + tables, GOOD_IDS

    return build


def two_sources_and(stages: str) -> Callable[[Path], tuple[str, set[str]]]:
    """Sources ``a`` and ``b`` (a file each, so a task each), then ``stages``."""

    def build(folder: Path) -> tuple[str, set[str]]:
        ids = set()
        for source in ("a", "b"):
            rows = [{"id": f"{source}{i}", "text": f"words of {source} document {i} " * (i + 1)} for i in range(4)]
            (folder / f"{source}.jsonl").write_bytes(jl(*rows))
            ids |= {r["id"] for r in rows}
        return inputs(folder / "a.jsonl", source="a") + inputs(folder / "b.jsonl", source="b") + stages, ids

    return build


def one_schema(folder: Path, out: Path) -> None:
    """Every Parquet shard has the same columns: the folder opens as one dataset."""
    shards = sorted((out / "shards" / "parquet").rglob("*.parquet"))
    assert len({tuple(pq.read_schema(p).names) for p in shards}) == 1, [pq.read_schema(p).names for p in shards]
    assert pl.scan_parquet(shards, glob=False).collect().height == 8


def bracketed_input(folder: Path) -> tuple[str, set[str]]:
    """An input file named ``data[1].jsonl`` beside a ``data1.jsonl`` its name matches as a glob: the file named."""
    (folder / "data[1].jsonl").write_bytes(jl(*GOOD))
    (folder / "data1.jsonl").write_bytes(jl({"id": "other", "text": "the file a glob would read"}))
    return inputs(folder / "data[1].jsonl"), GOOD_IDS


def kept_values_stay(folder: Path, out: Path) -> None:
    assert kept_rows(out)["length_chars"].to_list() == ["mine"] * 3


def webdataset_holds(n: int) -> Callable[[Path, Path], None]:
    """The WebDataset shards hold ``n`` samples, each with its text and JSON, under distinct keys."""

    def check(folder: Path, out: Path) -> None:
        names = [m.name for t in (out / "shards" / "webdataset").rglob("*.tar") for m in tarfile.open(t).getmembers()]
        keys = Counter(name.split(".", 1)[0] for name in names)
        assert len(keys) == n and set(keys.values()) == {2}, names

    return check


def symlink_loop(folder: Path) -> tuple[str, set[str]]:
    (folder / "in").mkdir()
    (folder / "in" / "ok.jsonl").write_bytes(jl(*GOOD))
    os.symlink("loop2.jsonl", folder / "in" / "loop1.jsonl")
    os.symlink("loop1.jsonl", folder / "in" / "loop2.jsonl")
    return inputs(folder / "in"), GOOD_IDS


def dangling_link(folder: Path) -> tuple[str, set[str]]:
    os.symlink("nowhere.jsonl", folder / "a.jsonl")
    return inputs(folder / "a.jsonl"), set()


def fifo_in_folder(folder: Path) -> tuple[str, set[str]]:
    (folder / "in").mkdir()
    (folder / "in" / "ok.jsonl").write_bytes(jl(*GOOD))
    os.mkfifo(folder / "in" / "pipe.jsonl")
    return inputs(folder / "in"), GOOD_IDS


def folder_named_like_a_file(folder: Path) -> tuple[str, set[str]]:
    (folder / "a.jsonl").mkdir()
    return inputs(folder / "a.jsonl"), set()


def a_pattern_of_a_list_that_matches_nothing(folder: Path) -> tuple[str, set[str]]:
    """A typo in one pattern of a path list (`d/*.jsnol`) was read as no files, without a word."""
    (folder / "a.jsonl").write_bytes(jl(*GOOD))
    return f'[[inputs]]\nsource = "s"\npath = ["{folder}/*.jsonl", "{folder}/*.jsnol"]\n', set()


def unreadable(folder: Path) -> tuple[str, set[str]]:
    (folder / "a.jsonl").write_bytes(jl(*GOOD))
    (folder / "a.jsonl").chmod(0)
    return inputs(folder / "a.jsonl"), set()


def truncated_text_file(folder: Path) -> tuple[str, set[str]]:
    (folder / "docs").mkdir()
    (folder / "docs" / "a.txt").write_text("a whole document")
    (folder / "docs" / "b.txt.gz").write_bytes(gzip.compress(b"a long document " * 500, mtime=0)[:60])
    return inputs(folder / "docs", "text"), {"s/a.txt", "s/b.txt.gz"}


def kernel_refuses_reads(folder: Path) -> tuple[str, set[str]]:
    os.symlink("/proc/self/mem", folder / "a.jsonl")  # even root cannot read it as a stream
    return inputs(folder / "a.jsonl"), set()


def empty_and_good(folder: Path) -> tuple[str, set[str]]:
    (folder / "in").mkdir()
    (folder / "in" / "a.jsonl").write_bytes(b"")
    (folder / "in" / "b.jsonl.gz").write_bytes(b"")
    (folder / "in" / "c.jsonl").write_bytes(jl(*GOOD))
    return inputs(folder / "in" / "*"), GOOD_IDS


def kept_rows(out: Path) -> pl.DataFrame:
    """The rows of every Parquet shard of the output ``out``, by id."""
    return pl.read_parquet(sorted((out / "shards").rglob("*.parquet")), glob=False).sort("id")


def kept_text(expected: list[str]) -> Callable[[Path, Path], None]:
    def check(folder: Path, out: Path) -> None:
        texts = kept_rows(out)["text"].to_list()
        assert sorted(texts) == sorted(expected)

    return check


def nothing_outside(folder: Path, out: Path) -> None:
    """Hostile member names (``../../x``, ``/abs``) are ids, never paths: nothing lands outside ``out``."""
    assert not (folder.parent / "escape.txt").exists() and not Path("/abs-winnow.txt").exists()
    assert sorted(p.name for p in folder.iterdir()) == ["a.tar", "job.toml"]


def good_input(folder: Path) -> tuple[str, set[str]]:
    (folder / "a.jsonl").write_bytes(jl(*GOOD))
    return inputs(folder / "a.jsonl"), GOOD_IDS


def _file(path: Path) -> str:
    path.write_text("a file, not a folder")
    return str(path)


def _foreign(tmp: Path) -> str:
    (tmp / "theirs" / "shards").mkdir(parents=True)
    (tmp / "theirs" / "shards" / "my.parquet").write_bytes(b"the user's own data")
    return str(tmp / "theirs")


BIG = "w" * (30 << 20)

HUGE = [2**64 - 1, 2**64 - 2, 2**70, 2**70 + 1]  # hash ids: past 2**53 a float would merge them


def kept_meta(expected: dict[str, str | None]) -> Callable[[Path, Path], None]:
    """The kept rows' ids and their meta, byte for byte."""

    def check(folder: Path, out: Path) -> None:
        rows = kept_rows(out)
        assert dict(zip(rows["id"].to_list(), rows["meta"].to_list())) == expected

    return check


LIMIT = "max_record_bytes = 1048576\n"  # 1 MiB, so the too-long cases stay small
LONG_GOOD = [{"id": f"h{i}", "text": f"after the long one {i}"} for i in range(3)]


def long_line(kind: str, mib: int = 8) -> Callable[[Path], tuple[str, set[str]]]:
    """A JSONL file whose middle line is ``mib`` MiB (built from repeated compressed members, so it stays small)."""
    head, tail = jl(*GOOD) + b'{"id": "big", "text": "', b'"}\n' + jl(*LONG_GOOD)
    name = {"gz": "a.jsonl.gz", "zst": "a.jsonl.zst", "plain": "a.jsonl"}[kind]

    def build(folder: Path) -> tuple[str, set[str]]:
        if kind == "gz":
            x = gzip.compress(b"x" * (1 << 20), compresslevel=1, mtime=0)
            blob = gzip.compress(head, mtime=0) + x * mib + gzip.compress(tail, mtime=0)
        elif kind == "zst":
            z = zstandard.ZstdCompressor()
            blob = z.compress(head) + z.compress(b"x" * (1 << 20)) * mib + z.compress(tail)
        else:
            blob = head + b"x" * (mib << 20) + tail
        (folder / name).write_bytes(blob)
        offset = len(jl(*GOOD))
        return inputs(folder / name) + LIMIT, GOOD_IDS | {r["id"] for r in LONG_GOOD} | {f"s/{name}@{offset}"}

    return build


def long_last_line(folder: Path) -> tuple[str, set[str]]:
    (folder / "a.jsonl").write_bytes(jl(*GOOD) + b"y" * (3 << 20))  # no newline at the end
    return inputs(folder / "a.jsonl") + LIMIT, GOOD_IDS | {AFTER_GOOD}


def long_text_file(folder: Path) -> tuple[str, set[str]]:
    (folder / "docs").mkdir()
    (folder / "docs" / "a.txt").write_text("a short document")
    (folder / "docs" / "b.txt.gz").write_bytes(gzip.compress(b"z" * (3 << 20), mtime=0))
    return inputs(folder / "docs", "text") + LIMIT, {"s/a.txt", "s/b.txt.gz"}


def tokens_output(tokenizer: str) -> str:
    return f'[output]\nshard_rows = 4\nformats = ["parquet", "tokens"]\n[output.tokens]\ntokenizer = "{tokenizer}"\n'


def tokenizer_case(make: Callable[[Path], None]) -> Callable[[Path], tuple[str, set[str]]]:
    """A job whose ``[output.tokens] tokenizer`` is the file ``make`` builds."""

    def build(folder: Path) -> tuple[str, set[str]]:
        make(folder / "tokenizer.json")
        return good_input(folder)[0] + tokens_output(str(folder / "tokenizer.json")), GOOD_IDS

    return build


def sparse(size: int) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        with open(path, "wb") as fh:
            fh.truncate(size)  # a sparse file: its size without its bytes on disk

    return make


def output_with(name: str, target: str) -> Callable[[Path], str]:
    """An output folder that holds ``name`` as a link to ``target`` (a device, a FIFO)."""

    def make(tmp: Path) -> str:
        (tmp / "theirs").mkdir()
        os.symlink(target, tmp / "theirs" / name)
        return str(tmp / "theirs")

    return make


def link_untouched(name: str, target: str) -> Callable[[Path, Path], None]:
    def check(folder: Path, out: Path) -> None:
        assert os.readlink(out / name) == target

    return check


def raw_jsonl(*lines: str) -> bytes:
    return "".join(line + "\n" for line in lines).encode()


def parquet_text(array: pa.Array, **extra: pa.Array) -> Callable[[Path], tuple[str, set[str]]]:
    ids = [f"p{i}" for i in range(len(array))]
    return parquet_case(pa.table({"id": ids, "text": array, **extra}), set(ids))


def nested(depth: int) -> bytes:
    """A record whose ``meta`` field is ``depth - 1`` lists deep (the record itself is level 1)."""
    return b'{"id": "deep", "text": "t", "meta": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}\n"


def repeated_columns(name: str) -> pa.Table:
    """Two rows whose Parquet file holds the column ``name`` twice."""
    columns = {"id": pa.array(["p0", "p1"]), "text": pa.array(["first", "second"]), "x": pa.array(["a", "b"])}
    arrays = [*columns.values(), pa.array(["again0", "again1"])]
    return pa.Table.from_arrays(arrays, names=[*columns, name])


def kept_meta_key(key: str, values: list[str]) -> Callable[[Path, Path], None]:
    def check(_: Path, out: Path) -> None:
        assert [json.loads(m)[key] for m in kept_rows(out)["meta"]] == values

    return check


def source_values(folder: Path) -> tuple[str, set[str]]:
    """Sources from a field (``source_field = "dom"``) that are numbers, null, empty or not a name at all."""
    values = ["web", 5, b"7.50", None, "", True]
    lines = [
        b'{"id": "r%d", "text": "t", "dom": %s}\n' % (i, v if isinstance(v, bytes) else json.dumps(v).encode())
        for i, v in enumerate(values)
    ]
    (folder / "a.jsonl").write_bytes(b"".join(lines))
    return f'[[inputs]]\nsource_field = "dom"\npath = "{folder / "a.jsonl"}"\n', {f"r{i}" for i in range(len(values))}


def kept_sources(expected: list[str]) -> Callable[[Path, Path], None]:
    def check(_: Path, out: Path) -> None:
        assert kept_rows(out)["source"].to_list() == expected

    return check


def cleaned(data: bytes, ids: set[str]) -> Callable[[Path], tuple[str, set[str]]]:
    """``jsonl_case`` with the ``clean`` stage (boilerplate lines found in 10 or more documents)."""

    def build(folder: Path) -> tuple[str, set[str]]:
        tables, found = jsonl_case(data, ids)(folder)
        return tables + '[[stages]]\nkind = "clean"\n', found

    return build


CASES: list[Case] = [
    # -- text that cleaning empties -------------------------------------------------------------
    Case(
        "bidi_marks_only_text",
        cleaned(jl(*GOOD, {"id": "b", "text": "\u200e\u202e\u2066\u2069 \u200f"}), GOOD_IDS | {"b"}),
        {"clean:empty": 1},
        kept=3,
    ),
    Case(
        "boilerplate_only_documents",
        # the line is in 11 distinct documents (copies of one count once): the two of it alone are emptied
        cleaned(
            jl(
                *GOOD,
                *(
                    {"id": f"bp{i}", "text": f"Subscribe to our newsletter for weekly updates.\nItem {i}."}
                    for i in range(10)
                ),
                *({"id": f"only{i}", "text": "Subscribe to our newsletter for weekly updates."} for i in range(2)),
            ),
            GOOD_IDS | {f"bp{i}" for i in range(10)} | {"only0", "only1"},
        ),
        {"clean:boilerplate": 2},
        kept=13,
    ),
    # -- encoding ------------------------------------------------------------------------------
    Case(
        "raw_invalid_utf8",
        jsonl_case(jl(*GOOD, b'{"id": "u", "text": "caf\xe9"}\n'), GOOD_IDS | {"u"}),
        {"read:bad_utf8": 1},
        kept=3,
    ),
    Case(
        "escaped_lone_surrogate",  # the reject keeps its id, as a raw bad byte's does; one in the id cannot
        jsonl_case(jl(*GOOD, *SURROGATES), GOOD_IDS | {"u", f"s/a.jsonl@{len(jl(*GOOD, SURROGATES[0]))}"}),
        {"read:bad_utf8": 2},
        kept=3,
    ),
    Case(
        "parquet_invalid_utf8",
        parquet_case(pa.table({"id": ["p0", "p1"], "text": invalid_string([b"ok", b"caf\xe9"])}), {"p0", "p1"}),
        {"read:bad_utf8": 1},
        kept=1,
    ),
    Case(
        "raw_nul_byte",
        jsonl_case(jl(*GOOD, b'{"id": "n", "text": "a\x00b"}\n'), GOOD_IDS | {AFTER_GOOD}),
        {"read:bad_json": 1},
        kept=3,
    ),
    Case(
        "escaped_nul_is_kept",
        jsonl_case(jl({"id": "n", "text": "a\u0000b"}), {"n"}),
        kept=1,
        check=kept_text(["a\x00b"]),
    ),
    Case(
        "bom",
        jsonl_case(b"\xef\xbb\xbf" + jl(*GOOD, b"{not json\n"), GOOD_IDS | {f"s/a.jsonl@{len(jl(*GOOD)) + 3}"}),
        {"read:bad_json": 1},
        kept=3,
    ),
    Case(
        "crlf_line_ends",
        jsonl_case(jl(*GOOD).replace(b"\n", b"\r\n"), GOOD_IDS),
        kept=3,
        check=kept_text([r["text"] for r in GOOD]),
    ),
    # -- structure -----------------------------------------------------------------------------
    Case(
        "bad_json",
        jsonl_case(jl(*GOOD, b'{"id": "b", "text": \n'), GOOD_IDS | {AFTER_GOOD}),
        {"read:bad_json": 1},
        kept=3,
    ),
    Case(
        "top_level_array",
        jsonl_case(b'[{"id": "a", "text": "x"}, {"id": "b", "text": "y"}]\n', {"s/a.jsonl@0"}),
        {"read:not_an_object": 1},
        kept=0,
    ),
    Case(
        "non_object_lines",
        jsonl_case(
            jl(*GOOD, b'"a string"\n42\nnull\ntrue\n'),
            GOOD_IDS | {f"s/a.jsonl@{len(jl(*GOOD)) + o}" for o in (0, 11, 14, 19)},
        ),
        {"read:not_an_object": 4},
        kept=3,
    ),
    Case(
        "wrong_text_types",
        jsonl_case(
            jl(*GOOD, *({"id": f"t{i}", "text": v} for i, v in enumerate([5, 1.5, ["x"], {"a": 1}, True]))),
            GOOD_IDS | {f"t{i}" for i in range(5)},
        ),
        {"read:text_not_string": 5},
        kept=3,
    ),
    Case(
        "missing_or_null_text",
        jsonl_case(jl(*GOOD, {"id": "m0"}, {"id": "m1", "text": None}), GOOD_IDS | {"m0", "m1"}),
        {"read:missing_text": 2},
        kept=3,
    ),
    Case("line_of_30_mb", jsonl_case(jl(*GOOD, {"id": "big", "text": BIG}), GOOD_IDS | {"big"}), kept=4),
    # Arrow's block parser recursed once per level: 100,000 brackets in one line ended the process (SIGSEGV)
    Case("nesting_100000_deep", jsonl_case(jl(*GOOD) + nested(100_000), GOOD_IDS | {AFTER_GOOD}), {"read:bad_json": 1}),
    Case("nesting_past_200_deep", jsonl_case(jl(*GOOD) + nested(201), GOOD_IDS | {AFTER_GOOD}), {"read:bad_json": 1}),
    Case("nesting_200_deep_is_kept", jsonl_case(jl(*GOOD) + nested(200), GOOD_IDS | {"deep"}), kept=4),
    Case(
        "source_field_numbers_null_empty_bool",
        source_values,
        {"read:missing_source": 3},
        kept=3,
        check=kept_sources(["web", "5", "7.50"]),  # a number as written, like an id
    ),
    Case(
        "ids_that_are_objects_lists_bools",
        jsonl_case(
            jl({"id": True, "text": "a"}, {"id": {"k": 1}, "text": "b"}, {"id": [1, "2"], "text": "c"}),
            {"true", '{"k":1}', '[1,"2"]'},
        ),
        kept=3,
    ),
    Case("empty_files", empty_and_good, kept=3),
    Case("blank_lines_only", jsonl_case(b"\n\n   \n\n", set()), kept=0),
    # -- damaged files -------------------------------------------------------------------------
    Case("truncated_gzip", compressed_truncated("gz"), {"read:truncated": 1}),
    Case("truncated_zstd", compressed_truncated("zst"), {"read:truncated": 1}),
    Case(
        "gzip_that_is_not_gzip",
        jsonl_case(b"this is not gzip data at all\n", {"s/a.jsonl.gz@0"}, name="a.jsonl.gz"),
        {"read:truncated": 1},
        kept=0,
    ),
    Case("truncated_tar", truncated_tar, {"read:truncated": 1}),
    Case("bzip2_jsonl", jsonl_case(bz2.compress(jl(*GOOD)), GOOD_IDS, name="a.jsonl.bz2"), kept=3),
    Case("xz_jsonl", jsonl_case(lzma.compress(jl(*GOOD)), GOOD_IDS, name="a.jsonl.xz"), kept=3),
    Case("upper_case_extension", jsonl_case(gzip.compress(jl(*GOOD)), GOOD_IDS, name="A.JSONL.GZ"), kept=3),
    Case("extensions_in_any_case_in_a_folder", extensions_in_any_case, kept=4),
    Case("truncated_gzip_text_file", truncated_text_file, {"read:truncated": 1}, kept=1),
    Case(
        "parquet_truncated",
        parquet_case(pa.table({"id": ["p0"], "text": ["a"]}), set(), cut=slice(0, 40)),
        {"read:truncated": 1},
        kept=0,
    ),
    Case("parquet_corrupt_footer", corrupt_footer, {"read:truncated": 1}, kept=0),
    Case(
        "parquet_no_text_column",
        parquet_case(pa.table({"id": ["p0", "p1"], "body": ["a", "b"]}), {"a.parquet#0", "a.parquet#1"}),
        {"read:bad_schema": 2},
        kept=0,
    ),
    Case(
        "parquet_text_column_twice",
        parquet_case(repeated_columns("text"), {"a.parquet#0", "a.parquet#1"}),
        {"read:bad_schema": 2},
        kept=0,
    ),
    Case(
        "parquet_other_column_twice",
        parquet_case(repeated_columns("x"), {"p0", "p1"}),
        kept=2,
        check=kept_meta_key("x#3", ["again0", "again1"]),
    ),
    Case(
        "parquet_text_not_string",
        parquet_case(pa.table({"id": ["p0"], "text": [3]}), {"a.parquet#0"}),
        {"read:bad_schema": 1},
        kept=0,
    ),
    # -- tar members ---------------------------------------------------------------------------
    Case(
        "tar_symlink_member",
        tar_case([("a.txt", b"one"), ("b.txt", (tarfile.SYMTYPE, "/etc/passwd"))], {"s/a.tar/a", "s/a.tar/b.txt"}),
        {"read:link_member": 1},
        kept=1,
    ),
    Case(
        "tar_hardlink_member",
        tar_case([("a.txt", b"one"), ("b.txt", (tarfile.LNKTYPE, "a.txt"))], {"s/a.tar/a", "s/a.tar/b.txt"}),
        {"read:link_member": 1},
        kept=1,
    ),
    Case(
        "tar_fifo_member",
        tar_case([("a.txt", b"one"), ("p.txt", (tarfile.FIFOTYPE, ""))], {"s/a.tar/a", "s/a.tar/p.txt"}),
        {"read:special_member": 1},
        kept=1,
    ),
    Case(
        "tar_hostile_member_names",
        tar_case(
            [("../../escape.txt", b"up"), ("/abs-winnow.txt", b"root")], {"s/a.tar/../../escape", "s/a.tar//abs-winnow"}
        ),
        kept=2,
        check=nothing_outside,
    ),
    Case(
        "tar_member_name_not_utf8",
        tar_case([(b"k\xff.txt".decode("utf-8", "surrogateescape"), b"text")], {"s/a.tar/k\\xff"}),
        kept=1,
    ),
    Case(
        "tar_bad_json_member",
        tar_case([("a.txt", b"one"), ("a.json", b"{nope")], {"s/a.tar/a"}),
        {"read:bad_json": 1},
        kept=0,
    ),
    Case(
        "tar_json_member_not_utf8",
        tar_case(
            [
                ("a.txt", b"one"),
                ("a.json", b'{"lang": "caf\xe9"}'),
                ("b.txt", b"two"),
                ("b.json", b'{"lang": "\\udc00"}'),
            ],
            {"s/a.tar/a", "s/a.tar/b"},
        ),
        {"read:bad_utf8": 2},
        kept=0,
    ),
    Case(
        "tar_sample_without_text",
        tar_case([("a.json", b'{"id": "j"}'), ("b.txt", b"two")], {"j", "s/a.tar/b"}),
        {"read:missing_text": 1},
        kept=1,
    ),
    # -- ids -----------------------------------------------------------------------------------
    Case("duplicate_ids_across_inputs", two_inputs_same_ids, {"read:duplicate_id": 1}, kept=4),
    Case("same_file_name_in_two_folders", same_name_in_two_folders, kept=6),
    Case(
        "kept_field_named_like_a_score_column",
        kept_field_and_stage('kind = "score.heuristic"\ncolumn = "rating"'),
        error="keeps from its rows (keep_fields)",
    ),
    Case(
        "kept_field_named_like_a_filter_metric",
        kept_field_and_stage('kind = "filter.length"\nmin_chars = 1'),
        kept=3,
        check=kept_values_stay,
    ),
    Case(
        "kept_field_named_like_a_kept_filter_metric",
        kept_field_and_stage('kind = "filter.length"\nmin_chars = 1\nkeep_metrics = true'),
        error="keep_metrics would write the column(s) ['length_chars']",
    ),
    Case(
        "stage_scoped_to_one_source_adds_a_column_then_order",
        two_sources_and(
            '[[stages]]\nkind = "score.heuristic"\nsources = ["a"]\n[[stages]]\nkind = "order"\nby = "quality"\n'
        ),
        kept=8,
        check=one_schema,
    ),
    Case(
        "filter_scoped_to_one_source_keeps_metrics",
        two_sources_and('[[stages]]\nkind = "filter.length"\nsources = ["a"]\nmin_words = 1\nkeep_metrics = true\n'),
        kept=8,
        check=one_schema,
    ),
    Case(
        "minhash_num_perm_past_its_range",  # 16,384 slots asked for 10 GB on 45 rows
        good_rows_and('[[stages]]\nkind = "dedup.minhash"\nnum_perm = 16384\n'),
        error="num_perm = 16384 must be at most 1024",
    ),
    Case(
        "order_by_a_misspelt_column",  # refused before the read phase, not after every phase before it
        good_rows_and('[[stages]]\nkind = "score.difficulty"\n[[stages]]\nkind = "order"\nby = "dificulty"\n'),
        error="by = 'dificulty' names no column the rows hold there (did you mean 'difficulty'?)",
    ),
    Case(
        "order_by_its_default_with_no_difficulty_stage",  # JSONL rows carry no winnow columns: refused early too
        good_rows_and('[[stages]]\nkind = "score.heuristic"\n[[stages]]\nkind = "order"\n'),
        error="by = 'difficulty' names no column the rows hold there (by's default: put a score.difficulty stage",
    ),
    Case("input_file_named_with_brackets", bracketed_input, kept=3, check=kept_text([r["text"] for r in GOOD])),
    Case(
        "output_folder_named_with_brackets",  # every work file of every barrier is read without globbing
        two_sources_and(
            "".join(f'[[stages]]\nkind = "{k}"\n' for k in ("dedup.exact", "dedup.minhash", "score.heuristic"))
            + '[[stages]]\nkind = "order"\nby = "quality"\n'
        ),
        kept=8,
        output=lambda tmp: str(tmp / "out[1]"),
    ),
    Case(
        "numbers_that_are_inf_or_past_range",  # each of these crashed or misled after the read phase
        good_rows_and('[[stages]]\nkind = "mix"\nweights = {s = 1.0}\nmax_epochs = inf\n'),
        error="max_epochs = inf is invalid; allowed: finite numbers",
    ),
    Case(
        "mix_bytes_per_token_too_small",
        good_rows_and('[[stages]]\nkind = "mix"\nweights = {s = 1.0}\nbytes_per_token = 1e-300\n'),
        error="mix.bytes_per_token = 1e-300 is invalid",
    ),
    Case(
        "input_path_that_is_empty",
        lambda folder: (f'[[inputs]]\nsource = "s"\npath = ["{folder}", ""]\n', set()),
        error="inputs.path holds ''",
    ),
    Case("stage_kind_not_a_string", kept_field_and_stage("kind = 5"), error="kind = 5 is invalid"),
    Case("empty_ids_jsonl", empty_ids("jsonl"), kept=3),
    Case("empty_ids_parquet", empty_ids("parquet"), kept=3),
    Case(
        "ids_holding_nul_in_webdataset",
        jsonl_case(
            jl({"id": "a\x00x", "text": "one"}, {"id": "a\x00y", "text": "two"}, {"id": "ok", "text": "3"}),
            {"a\x00x", "a\x00y", "ok"},
        ),
        kept=3,
        check=webdataset_holds(3),
    ),
    Case(
        "integer_ids_past_2_53",
        jsonl_case(raw_jsonl(*(f'{{"id": {i}, "text": "doc {i}"}}' for i in HUGE)), {str(i) for i in HUGE}),
        kept=4,
        check=kept_meta({str(i): None for i in HUGE}),
    ),
    Case(
        "int_id_beside_float_id",
        jsonl_case(
            raw_jsonl(
                '{"id": 7, "text": "a"}',
                '{"id": 1.5, "text": "b"}',
                '{"id": 1e3, "text": "c"}',
                '{"id": 0.10, "text": "d"}',
            ),
            {"7", "1.5", "1e3", "0.10"},
        ),
        kept=4,
    ),
    Case(
        "meta_numbers_exact",
        jsonl_case(
            raw_jsonl(
                '{"id": "a", "text": "x", "n": 12345678901234567890123, "f": 1.5}',
                '{"id": "b", "text": "y", "n": 1, "f": 2}',
                '{"id": "c", "text": "z", "n": 18446744073709551615, "f": 0.1}',
            ),
            {"a", "b", "c"},
        ),
        kept=3,
        check=kept_meta(
            {
                "a": '{"n":12345678901234567890123,"f":1.5}',
                "b": '{"n":1,"f":2}',
                "c": '{"n":18446744073709551615,"f":0.1}',
            }
        ),
    ),
    Case(
        "tar_json_integer_ids_past_2_53",
        tar_case(
            [
                ("a.txt", b"one"),
                ("a.json", f'{{"id": {2**70}}}'.encode()),
                ("b.txt", b"two"),
                ("b.json", f'{{"id": {2**70 + 1}}}'.encode()),
            ],
            {str(2**70), str(2**70 + 1)},
        ),
        kept=2,
    ),
    Case(
        "parquet_ids_uint64",
        parquet_case(pa.table({"id": pa.array(HUGE[:2], pa.uint64()), "text": ["a", "b"]}), {str(i) for i in HUGE[:2]}),
        kept=2,
    ),
    # -- Parquet text columns: every Arrow encoding a writer may choose -----------------------------------
    Case(
        "parquet_text_binary",
        parquet_text(pa.array([b"one", b"caf\xc3\xa9"], pa.binary())),
        kept=2,
        check=kept_text(["one", "café"]),
    ),
    Case("parquet_text_large_binary", parquet_text(pa.array([b"one", b"two"], pa.large_binary())), kept=2),
    Case("parquet_text_fixed_size_binary", parquet_text(pa.array([b"ab", b"cd"], pa.binary(2))), kept=2),
    Case("parquet_text_dictionary", parquet_text(pa.array(["one", "one", "two"]).dictionary_encode()), kept=3),
    Case("parquet_text_large_string", parquet_text(pa.array(["one", "two"], pa.large_string())), kept=2),
    Case(
        "parquet_binary_text_not_utf8",
        parquet_text(pa.array([b"ok", b"caf\xe9"], pa.binary())),
        {"read:bad_utf8": 1},
        kept=1,
    ),
    Case(
        "parquet_binary_meta_column",
        parquet_text(pa.array(["one", "two"]), blob=pa.array([b"\x00\xff", None])),
        kept=2,
        check=kept_meta({"p0": '{"blob":"AP8="}', "p1": '{"blob":null}'}),
    ),
    Case(
        "parquet_id_column_nested",
        parquet_case(pa.table({"id": pa.array([[1], [2]]), "text": ["a", "b"]}), {"a.parquet#0", "a.parquet#1"}),
        {"read:bad_schema": 2},
        kept=0,
    ),
    # -- records past [[inputs]] max_record_bytes: one reject each, read past in bounded memory --------------
    Case("gzip_line_past_max_record_bytes", long_line("gz"), {"read:too_long": 1}, kept=6),
    Case("zstd_line_past_max_record_bytes", long_line("zst"), {"read:too_long": 1}, kept=6),
    Case("plain_line_past_max_record_bytes", long_line("plain", 3), {"read:too_long": 1}, kept=6),
    Case("unterminated_last_line_past_max_record_bytes", long_last_line, {"read:too_long": 1}, kept=3),
    Case("text_file_past_max_record_bytes", long_text_file, {"read:too_long": 1}, kept=1),
    Case(
        "tar_member_past_max_record_bytes",
        lambda folder: (
            tar_case(
                [("a.txt", b"one"), ("b.txt", b"t" * (3 << 20)), ("b.json", b"{}"), ("c.txt", b"three")],
                {"s/a.tar/a", "s/a.tar/b", "s/a.tar/c"},
            )(folder)[0]
            + LIMIT,
            {"s/a.tar/a", "s/a.tar/b", "s/a.tar/c"},
        ),
        {"read:too_long": 1},
        kept=2,
    ),
    Case(
        "parquet_text_past_max_record_bytes",
        lambda folder: (parquet_text(pa.array(["one", "p" * (3 << 20)]))(folder)[0] + LIMIT, {"p0", "p1"}),
        {"read:too_long": 1},
        kept=1,
    ),
    # -- the file system -----------------------------------------------------------------------
    Case("symlink_loop_in_folder", symlink_loop, error="Too many levels of symbolic links"),
    Case("dangling_symlink", dangling_link, error="symbolic link to nothing or into a loop"),
    Case("fifo_in_folder", fifo_in_folder, error="is not a regular file"),
    Case("folder_named_like_a_file", folder_named_like_a_file, error="matched no files"),
    Case(
        "a_pattern_of_a_list_that_matches_nothing",
        a_pattern_of_a_list_that_matches_nothing,
        error="*.jsnol' (one of 2) matched no files; check it and the format (jsonl), or remove it",
    ),
    Case(
        "unreadable_file",
        unreadable,
        error="Permission denied",
        skip="root reads a chmod 000 file; file_nobody_can_read covers an unreadable file for root"
        if os.geteuid() == 0
        else None,
    ),
    Case("file_nobody_can_read", kernel_refuses_reads, error="cannot open input file"),
    Case("missing_path", lambda folder: (inputs(folder / "nope.jsonl"), set()), error="does not exist"),
    # -- files read whole: a regular file under a cap, never a device read forever ----------------------
    Case(
        "tokenizer_linked_to_dev_zero", tokenizer_case(lambda p: os.symlink("/dev/zero", p)), error="not a regular file"
    ),
    Case("tokenizer_larger_than_its_cap", tokenizer_case(sparse((256 << 20) + 1)), error="over winnow's cap"),
    Case("tokenizer_not_utf8", tokenizer_case(lambda p: p.write_bytes(b"\xff\xfe{")), error="not a tokenizer.json"),
    Case(
        "output_readme_linked_to_dev_zero",
        good_input,
        kept=3,
        output=output_with("README.md", "/dev/zero"),
        check=link_untouched("README.md", "/dev/zero"),
    ),
    Case(
        "output_manifest_linked_to_dev_zero",
        good_input,
        error="holds files winnow did not write",
        output=output_with("manifest.json", "/dev/zero"),
    ),
    # -- the output folder ---------------------------------------------------------------------
    Case("output_is_a_file", good_input, error="is a file, not a folder", output=lambda tmp: _file(tmp / "afile")),
    Case(
        "output_under_a_file",
        good_input,
        error="cannot write the output folder",
        output=lambda tmp: _file(tmp / "afile") + "/sub",
    ),
    Case(
        "output_not_writable",
        good_input,
        error="cannot write the output folder",
        output=lambda tmp: "/sys/winnow-catalogue",
    ),
    Case(
        "output_url_without_a_driver",
        good_input,
        error="no fsspec driver for nosuchscheme://",
        output=lambda tmp: "nosuchscheme://bucket/out",
    ),
    Case("output_holds_foreign_data", good_input, error="holds files winnow did not write", output=_foreign),
]


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c.name, marks=pytest.mark.skipif(bool(c.skip), reason=c.skip or "")) for c in CASES]
)
def test_bad_input(case: Case, tmp_path: Path, capsys, nothing_lost) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    tables, ids = case.build(folder)
    output = case.output(tmp_path) if case.output else str(tmp_path / "out")  # a str: Path() would eat "//"
    out = Path(output)
    job = folder / "job.toml"
    own_output = "" if "[output]" in tables else "[output]\nshard_rows = 4\n"  # a case may set its own
    job.write_text(f'[job]\nname = "cat"\noutput = "{tmp_path / "out"}"\n' + tables + own_output)
    before = {
        p: p.read_bytes()
        for p in tmp_path.rglob("*")
        if p.is_file() and not p.is_symlink() and os.access(p, os.R_OK) and not p.is_fifo()
    }
    rc = main(["-q", "curate", str(job), "--output", output])
    err = capsys.readouterr().err
    assert {p: p.read_bytes() for p in before} == before  # inputs are never touched
    if case.error is not None:
        assert rc == 2, err
        assert err.startswith("winnow curate: error: ") and case.error in err, err
        assert not (out / "manifest.json").is_file() and not Path("s3:").exists()
        return
    assert rc == 0, err
    manifest = nothing_lost(out, ids)
    rejected = Counter()
    for stage in manifest["stages"]:
        rejected.update(stage["rejected"])
    assert dict(rejected) == case.rejects
    if case.kept is not None:
        assert manifest["totals"]["rows_written"] == case.kept
    elif case.name == "truncated_gzip":  # the rows before the damage are kept and the damage is one reject
        assert manifest["totals"]["rows_written"] > 0
    for path in (out / "shards").rglob("*.parquet"):  # every shard is valid UTF-8, whatever the input
        pq.read_table(path).validate(full=True)
    for path in (out / "shards").rglob("*.tar"):
        with tarfile.open(path, encoding="utf-8", errors="strict") as tar:
            for member in tar:
                tar.extractfile(member).read().decode("utf-8")
    if case.check is not None:
        case.check(folder, out)


# -- kinds that are not one job's inputs: the output folder's owner, a second writer, the job file ------------
@dataclass(frozen=True)
class Kind:
    """One bad input or fault around a job: ``run(tmp_path, capsys)`` builds it and asserts what happens."""

    name: str
    run: Callable[[Path, pytest.CaptureFixture], None]


KINDS: list[Kind] = []


def kind(fn: Callable[[Path, pytest.CaptureFixture], None]) -> Callable[[Path, pytest.CaptureFixture], None]:
    KINDS.append(Kind(fn.__name__, fn))
    return fn


def job_file(tmp: Path, name: str, out: Path, extra: str = "") -> Path:
    (tmp / "a.jsonl").write_bytes(jl(*GOOD))
    path = tmp / f"{name}-{len(list(tmp.glob('*.toml')))}.toml"
    path.write_text(f'[job]\nname = "{name}"\noutput = "{out}"\n' + inputs(tmp / "a.jsonl") + extra)
    return path


def curate(capsys, job: Path, *args: str) -> tuple[int, str]:
    rc = main(["-q", "curate", str(job), *args])
    return rc, capsys.readouterr().err


def shard_bytes(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted((out / "shards").rglob("*")) if p.is_file()}


@kind
def another_jobs_finished_output(tmp: Path, capsys) -> None:
    out = tmp / "out"
    assert curate(capsys, job_file(tmp, "alpha", out))[0] == 0
    before = shard_bytes(out)
    rc, err = curate(capsys, job_file(tmp, "beta", out))
    assert rc == 2 and "job 'alpha'" in err and "job 'beta'" in err and "--overwrite" in err, err
    assert shard_bytes(out) == before and json.loads((out / ".winnow-output").read_text())["job"] == "alpha"
    assert curate(capsys, job_file(tmp, "beta", out), "--overwrite")[0] == 0  # the way on, when meant
    assert json.loads((out / ".winnow-output").read_text())["job"] == "beta"


@kind
def changed_config_on_a_finished_output(tmp: Path, capsys) -> None:
    out = tmp / "out"
    assert curate(capsys, job_file(tmp, "alpha", out))[0] == 0
    before = shard_bytes(out)
    assert curate(capsys, job_file(tmp, "alpha", out))[0] == 0 and shard_bytes(out) == before  # the same job: as before
    rc, err = curate(capsys, job_file(tmp, "alpha", out, '[[stages]]\nkind = "filter.length"\nmin_words = 2\n'))
    assert rc == 2 and "another configuration" in err and "--overwrite" in err, err
    assert shard_bytes(out) == before


def _hold_lock(folder: str, ready, done) -> None:
    from winnow.curate.lock import FolderLock

    FolderLock(folder, what="output folder").acquire()
    ready.set()
    done.wait(60)


@kind
def second_curate_on_a_running_output(tmp: Path, capsys) -> None:
    import multiprocessing

    fork = multiprocessing.get_context("fork")
    ready, done = fork.Event(), fork.Event()
    holder = fork.Process(target=_hold_lock, args=(str(tmp / "out"), ready, done))  # the first run, mid-job
    holder.start()
    try:
        assert ready.wait(60)
        rc, err = curate(capsys, job_file(tmp, "alpha", tmp / "out"))
        assert rc == 2 and f"pid {holder.pid}" in err and "in use by another winnow run" in err, err
        assert "Traceback" not in err and not (tmp / "out" / "manifest.json").exists()
    finally:
        done.set()
        holder.join()


@kind
def job_file_linked_to_dev_zero(tmp: Path, capsys) -> None:
    os.symlink("/dev/zero", tmp / "job.toml")
    rc, err = curate(capsys, tmp / "job.toml")
    assert rc == 2 and "not a regular file" in err, err


@kind
def job_file_integer_past_64_bits(tmp: Path, capsys) -> None:
    job = job_file(tmp, "big", tmp / "out")
    job.write_text(job.read_text().replace("[job]\n", "[job]\nseed = 99999999999999999999999\n"))
    rc, err = curate(capsys, job)
    assert rc == 2 and "[job] key 'seed': 99999999999999999999999 does not fit a 64-bit integer" in err, err
    assert not (tmp / "out").exists()


@kind
def disk_full_during_curation(tmp: Path, capsys) -> None:
    from tests.curate.conftest import check_nothing_lost
    from tests.disk import small_disk

    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda".split()
    docs = [{"id": f"d{i}", "text": " ".join(words[(i * j) % len(words)] for j in range(80))} for i in range(4000)]
    (tmp / "a.jsonl").write_bytes(jl(*docs))
    job = tmp / "job.toml"
    job.write_text(f'[job]\nname = "full"\noutput = "{tmp / "disk" / "out"}"\n' + inputs(tmp / "a.jsonl"))
    with small_disk(tmp / "disk", "160k") as disk:
        rc, err = curate(capsys, job)
        assert rc == 2 and f"no space left on the device holding {tmp / 'disk' / 'out'}" in err, err
        assert "Traceback" not in err and "Exception ignored" not in err, err  # no writer left to fail at exit
        assert not list((tmp / "disk").rglob("*.tmp")), "a failed task removes what it had written"
        disk.resize("64m")  # room made: the same command finishes the job
        assert curate(capsys, job)[0] == 0
        check_nothing_lost(tmp / "disk" / "out", {d["id"] for d in docs})


@pytest.mark.parametrize("case", [pytest.param(k, id=k.name) for k in KINDS])
def test_kind(case: Kind, tmp_path: Path, capsys) -> None:
    case.run(tmp_path, capsys)


def test_catalogue_size() -> None:
    """Every kind has its own name, and docs/reliability.md gives the catalogue's true size."""
    from tests.pipelines.test_bad_input_catalogue import KINDS as PIPELINE_KINDS
    from tests.train.test_bad_input_catalogue import KINDS as TRAIN_KINDS

    names = [c.name for c in CASES] + [k.name for k in KINDS] + [k.name for k in TRAIN_KINDS + PIPELINE_KINDS]
    assert len(set(names)) == len(names)
    page = (Path(__file__).resolve().parents[2] / "docs" / "reliability.md").read_text()
    assert f"{len(CASES) + len(KINDS)} kinds, " in page and f"holds {len(names)} named kinds" in page, len(names)
