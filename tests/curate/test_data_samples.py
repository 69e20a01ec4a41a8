"""The committed sample data: files parse, counts hold, and the planted dirt is really there as recorded."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import zstandard

ROOT = Path(__file__).resolve().parents[2] / "data_samples"
SOURCES = ("docs", "code", "legal", "changelog")
WORD_RE = re.compile(r"\w+")


@cache
def planted() -> dict:
    return json.loads((ROOT / "planted.json").read_text("utf-8"))


def _jsonl(data: bytes) -> list[dict]:
    return [json.loads(line) for line in data.decode("utf-8").splitlines()]


@cache
def rows(source: str) -> tuple[tuple[str, str], ...]:
    """(id, text) of every document of ``source``, read straight from the committed files."""
    out = []
    if source == "legal":
        out = [(p.name, p.read_bytes().decode("utf-8")) for p in sorted((ROOT / "legal").glob("*.txt"))]
    for name in planted()["sources"][source]["files"] if source != "legal" else ():
        path = ROOT / name
        if name.endswith(".parquet"):
            table = pq.read_table(path, columns=["id", "text"])
            out += zip(table["id"].to_pylist(), table["text"].to_pylist())
        else:
            data = path.read_bytes()
            data = gzip.decompress(data) if name.endswith(".gz") else data
            data = zstandard.ZstdDecompressor().decompressobj().decompress(data) if name.endswith(".zst") else data
            out += [(r["id"], r["text"]) for r in _jsonl(data)]
    return tuple(out)


def texts(source: str) -> set[str]:
    return {t for _, t in rows(source)}


def _shingles(text: str) -> set[tuple[str, ...]]:
    words = [w.lower() for w in WORD_RE.findall(text)]
    return {tuple(words[i : i + 5]) for i in range(max(1, len(words) - 4))}


@pytest.mark.parametrize("source", SOURCES)
def test_files_parse_into_string_ids_and_texts(source):
    got = rows(source)
    assert got, f"{source}: no rows read"
    assert all(isinstance(i, str) and i and isinstance(t, str) and t for i, t in got)


def test_gzip_files_carry_no_timestamp():
    for name in planted()["sources"]["docs"]["files"]:
        header = (ROOT / name).read_bytes()[:10]
        assert header[:2] == b"\x1f\x8b" and header[4:8] == b"\0\0\0\0", f"{name}: gzip mtime is set"


@pytest.mark.parametrize("source", SOURCES)
def test_document_count_in_promised_range_and_recorded(source):
    n = len(rows(source))
    assert 300 <= n <= 5000
    assert n == planted()["sources"][source]["documents"]


@pytest.mark.parametrize("source", SOURCES)
def test_ids_unique_within_source(source):
    ids = [i for i, _ in rows(source)]
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("source", SOURCES)
def test_exact_duplicate_count_matches_planted(source):
    extra_copies = len(rows(source)) - len(texts(source))
    assert extra_copies == planted()["sources"][source]["exact_duplicate"] > 0


def test_cross_source_duplicates_match_planted():
    recorded = {s: planted()["sources"][s]["cross_source_duplicate"] for s in SOURCES}
    for i, a in enumerate(SOURCES):
        for b in SOURCES[i + 1 :]:
            expected = recorded[a].get(b, 0) + recorded[b].get(a, 0)
            assert len(texts(a) & texts(b)) == expected, f"{a} x {b}"
    assert sum(sum(c.values()) for c in recorded.values()) > 0


@pytest.mark.parametrize("source", SOURCES)
def test_boilerplate_line_counts_match_planted(source):
    lines = planted()["sources"][source]["boilerplate_lines"]
    assert len(lines) >= 3
    for line, count in lines.items():
        found = sum(1 for _, t in rows(source) if line in t.splitlines())
        assert found == count > 0, line


@pytest.mark.parametrize("source", SOURCES)
def test_short_document_count_matches_planted(source):
    short = sum(1 for _, t in rows(source) if len(t) < 60)
    assert short == planted()["sources"][source]["short"] > 0


def test_every_planted_record_points_at_real_documents():
    ids = {s: {i for i, _ in rows(s)} for s in SOURCES}
    for r in planted()["records"]:
        assert r["id"] in ids[r["source"]], r
        if r["of"] is not None:
            home = r["detail"] if r["kind"] == "cross_source_duplicate" else r["source"]
            assert r["of"] in ids[home], r


def test_near_duplicates_have_the_recorded_jaccard():
    text = {s: dict(rows(s)) for s in SOURCES}
    near = [r for r in planted()["records"] if r["kind"] == "near_duplicate"]
    kinds = {r["detail"] for r in near}
    assert kinds == {"word_edits", "sentence_inserted", "sentence_deleted", "paragraphs_shuffled"}
    for r in near:
        a, b = _shingles(text[r["source"]][r["id"]]), _shingles(text[r["source"]][r["of"]])
        assert text[r["source"]][r["id"]] != text[r["source"]][r["of"]]
        assert round(len(a & b) / len(a | b), 3) == r["jaccard"] >= 0.5, r


def test_every_junk_kind_is_planted_in_every_source():
    for source in SOURCES:
        assert set(planted()["sources"][source]["junk"]) == {
            "keyboard_mash",
            "symbol_soup",
            "lorem_ipsum",
            "repeated_lines",
        }


def test_folder_stays_small():
    size = sum(p.stat().st_size for p in ROOT.rglob("*") if p.is_file())
    assert size < 6 * 2**20, f"data_samples/ holds {size} bytes"


def _load_build():
    spec = importlib.util.spec_from_file_location("data_samples_build", ROOT / "build.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def _synthetic(build) -> dict:
    """Sixty documents of four paragraphs per source, so planting and writing run without the machine's inputs."""
    words = "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega".split()
    found = {}
    for s in SOURCES:
        docs = []
        for n in range(60):
            paras = [
                " ".join(f"{words[(n * 7 + p * 3 + k) % len(words)]}{(n + k) % 13}." for k in range(30))
                for p in range(4)
            ]
            name = f"copyright-pkg{n}.txt" if s == "legal" else build.make_id(s, f"synthetic/{n}")
            docs.append(build.Doc(name, "\n\n".join(paras), {"n": n}))
        found[s] = docs
    return found


def test_plant_and_write_are_byte_identical_across_runs(tmp_path):
    build = _load_build()
    trees = []
    for run in ("a", "b"):
        planters, clean = build.plant(_synthetic(build))
        build.write(planters, tmp_path / run)
        trees.append(
            {p.relative_to(tmp_path / run): p.read_bytes() for p in sorted((tmp_path / run).rglob("*")) if p.is_file()}
        )
    assert trees[0] == trees[1]
    assert len(trees[0]) > 4


@pytest.mark.slow
def test_full_rebuild_is_deterministic_across_hash_seeds(tmp_path):
    procs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        procs.append(
            subprocess.Popen(
                [sys.executable, str(ROOT / "build.py"), "--out", str(tmp_path / seed)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        )
    outputs = [p.communicate(timeout=600)[0].decode() for p in procs]
    if any(p.returncode == 2 and "cannot build" in out for p, out in zip(procs, outputs)):
        pytest.skip("this machine lacks a required input of the sample data: " + outputs[0][-300:])
    assert [p.returncode for p in procs] == [0, 0], outputs
    trees = [
        {p.relative_to(tmp_path / s): p.read_bytes() for p in (tmp_path / s).rglob("*") if p.is_file()} for s in "12"
    ]
    assert trees[0] == trees[1]
    assert set(json.loads(trees[0][Path("planted.json")])["sources"]) == set(SOURCES)
