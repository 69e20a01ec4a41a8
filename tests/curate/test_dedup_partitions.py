"""The dedup plans within [job] memory_gb: 1 and 8 partitions give the same decisions; a budget too small is an error."""

from __future__ import annotations

from collections import Counter

import numpy as np
import orjson
import polars as pl
import pytest

from winnow import curate
from winnow.curate.dedup.budget import partitions
from winnow.curate.dedup.clusters import connected_components
from winnow.curate.dedup.components import components
from winnow.curate.errors import ConfigError
from winnow.curate.pipeline import run_job
from winnow.pipelines.jobfile import load_job

JOB = """
batch_rows = 16
memory_gb = {memory_gb}

[[inputs]]
source = "web"
path = "{root}/*.jsonl"

[[stages]]
kind = "dedup.exact"

[[stages]]
kind = "dedup.minhash"

[output]
formats = ["parquet"]
"""


def _corpus(root) -> None:
    """120 documents: exact copies, chains of one-word edits (a-b-c... linked only through neighbours), unrelated ones."""
    rng = np.random.default_rng(3)
    texts = [" ".join(f"w{j}" for j in rng.integers(0, 10**5, size=150)) for _ in range(60)]
    for i in range(0, 20):
        texts.append(texts[i])  # exact copies
    for start in (20, 30):
        words = texts[start].split()
        for step in range(10):  # a chain: each edit is near the previous one, the ends are not
            words = list(words)
            for k in rng.choice(len(words), size=4, replace=False):
                words[k] = f"e{step}x{k}"
            texts.append(" ".join(words))
    texts += ["", "   ", "one"] * 5 + ["x " * 3] * 5
    order = rng.permutation(len(texts))
    root.mkdir()
    for part in range(4):
        rows = [{"id": f"d{i:03d}", "text": texts[i]} for i in order[part::4]]
        (root / f"p{part}.jsonl").write_bytes(b"\n".join(orjson.dumps(r) for r in rows) + b"\n")


def _rejects(out) -> pl.DataFrame:
    return pl.read_parquet(out / "rejects" / "*.parquet").select("id", "reason", "duplicate_of").sort("id")


@pytest.mark.parametrize("verify", ["all", "sample", "none"])
def test_in_memory_one_and_eight_partitions_give_the_same_decisions(tmp_path, write_job, monkeypatch, verify):
    """A plan that fits in memory_gb runs on arrays; one that does not, on files in partitions: the same result."""
    _corpus(tmp_path / "in")
    reads = Counter()  # (run, spilled column) -> windows of the spill read
    results, reports = [], []
    real = curate.dedup.verify.read_window
    in_memory = curate.dedup.grouping._group_in_memory
    runs_in_memory = []
    monkeypatch.setattr(
        curate.dedup.grouping, "_group_in_memory", lambda *a, **k: runs_in_memory.append(1) or in_memory(*a, **k)
    )
    for parts in (0, 1, 8):  # 0: in memory (what this small job does), else the partitioned steps
        if parts:
            fixed = lambda items, bytes_per_item, memory_gb, *, what, _p=parts: _p  # noqa: E731
            monkeypatch.setattr(curate.dedup.grouping, "partitions", fixed)
            monkeypatch.setattr(curate.dedup.exact, "partitions", fixed)
            monkeypatch.setattr(curate.dedup.grouping, "in_memory_bytes", lambda *a: float("inf"))

        def counted(keys, column, *args, _p=parts):
            reads[_p, column] += 1
            return real(keys, column, *args)

        for module in (curate.dedup.routing, curate.dedup.verify):
            monkeypatch.setattr(module, "read_window", counted)
        # a small sample: both ways draw the same share of the same candidates
        text = JOB.format(root=tmp_path / "in", memory_gb=4).replace(
            '"dedup.minhash"', f'"dedup.minhash"\nverify = "{verify}"\nverify_sample = 20'
        )
        job = load_job(write_job(text, name=f"p{parts}"))
        manifest = run_job(job, progress=False)
        results.append(_rejects(job.output_dir))
        reports.append({s["id"]: s.get("report", {}) for s in manifest["stages"]})
        assert len(runs_in_memory) == 1  # only the first run planned in memory
    assert results[0].height > 30 and set(results[0]["reason"]) == {"dedup:exact", "dedup:minhash"}
    assert results[0].equals(results[1]) and results[0].equals(results[2])
    minhash = [r["02.dedup.minhash"] for r in reports]
    assert [m["partitions"] for m in minhash] == [
        {"bands": 1, "verify": 1, "components": 1},
        {"bands": 1, "verify": 1, "components": 1},
        {"bands": 8, "verify": 8, "components": 8},
    ]
    # the same report, key for key and in the same order, whichever way the plan ran with one partition
    assert list(minhash[0].items()) == list(minhash[1].items())
    keys = ("clusters", "removed", "candidate_pairs", "verified_pairs", "screened_pairs", "sampled_pairs",
            "estimated_false_positive_rate")  # fmt: skip
    for key in keys:
        assert minhash[0].get(key) == minhash[2].get(key), key
    assert reports[2]["01.dedup.exact"]["partitions"] == 8
    if verify == "all":  # the spill is read once whatever the partitions: one pass per column, each window once
        assert minhash[0]["spill_passes"] == minhash[2]["spill_passes"] == {"signatures": 1, "sets": 1}
        for column in ("_sig8", "_shingles"):
            assert reads[0, column] == reads[1, column] == reads[8, column] == 1, (column, reads)


def test_a_budget_too_small_for_one_band_names_the_key(tmp_path, write_job):
    _corpus(tmp_path / "in")
    job = load_job(write_job(JOB.format(root=tmp_path / "in", memory_gb=1e-12), name="tiny"))
    with pytest.raises(ConfigError, match=r"job\.memory_gb = 1e-12 is too small .* set job\.memory_gb to at least"):
        run_job(job, progress=False)


def test_memory_gb_must_be_positive(tmp_path, write_job):
    with pytest.raises(ConfigError, match=r"job\.memory_gb = 0"):
        load_job(write_job(JOB.format(root=tmp_path, memory_gb=0), name="zero"))


def test_partition_count_follows_the_model():
    assert partitions(10**6, 48, 4.0, what="x") == 1
    assert partitions(10**9, 48, 4.0, what="x") == 12  # 48 GB over 4 GB
    with pytest.raises(ConfigError, match="at least"):
        partitions(10**9, 48, 1e-6, what="x")


@pytest.mark.parametrize("parts", [1, 2, 5])
def test_star_components_equal_union_find(tmp_path, parts):
    rng = np.random.default_rng(parts)
    n = 3000
    a, b = rng.integers(0, n, 2500), rng.integers(0, n, 2500)
    chain = np.arange(1000, 1600)  # a long path: the case label propagation needs many rounds for
    a, b = np.r_[a, chain[:-1]], np.r_[b, chain[1:]]
    lo, hi = np.minimum(a, b).astype(np.uint32), np.maximum(a, b).astype(np.uint32)
    lo, hi = lo[lo != hi], hi[lo != hi]
    files = []
    for k, half in enumerate(np.array_split(np.arange(len(lo)), 3)):
        files.append(str(tmp_path / f"e{k}.parquet"))
        pl.DataFrame({"a": lo[half], "b": hi[half]}).write_parquet(files[-1])
    labels = components(files, parts, tmp_path / "cc")
    nodes = np.unique(np.r_[lo, hi])
    assert np.array_equal(labels["node"].to_numpy(), nodes)
    assert np.array_equal(labels["label"].to_numpy(), connected_components(n, lo, hi)[nodes])


@pytest.mark.parametrize("per_pass", [2, 5, 64])
def test_bands_read_together_give_each_bands_pairs(tmp_path, per_pass):
    """Step 1 reading several band columns per scan of the keys writes the same pairs, band by band, as one per scan."""
    rng = np.random.default_rng(7)
    n, bands = 400, 5
    keys = pl.DataFrame(
        {
            "_nsh": rng.integers(0, 3, size=n).astype(np.int32),  # 0: no shingles, never a candidate
            **{f"b{j}": rng.integers(0, 60, size=n).astype(np.uint64) for j in range(bands)},
        }
    ).lazy()
    columns = [f"b{j}" for j in range(bands)]

    def pairs(folder, **kw):
        files, total = curate.dedup.grouping.candidate_files(keys, columns, 1, folder, **kw)
        found = {f.rsplit("/", 1)[-1]: pl.read_parquet(f)["pair"].to_list() for f in files}
        assert total == sum(map(len, found.values()))
        return found

    one = pairs(tmp_path / "one")
    assert len(one) == bands and all(one.values())
    assert pairs(tmp_path / "many", bands_per_pass=per_pass) == one
