"""Bad input for dedup: empty and one-word documents, a 50 MB document, all-identical and duplicate-free corpora."""

from __future__ import annotations

import resource

import numpy as np
import polars as pl
import pytest

from winnow.curate.dedup import duplicate_clusters
from winnow.curate.dedup.exact import ExactConfig, ExactDedup
from winnow.curate.dedup.minhash import MinHashConfig, MinHashDedup
from winnow.curate.stages.base import StageContext


def _stage(cls, config, tmp_path):
    ctx = StageContext(
        stage_id="01.dedup", job_name="t", output_dir=tmp_path, plan_dir=tmp_path / "plan", sources=("a",)
    )
    return cls(config, ctx)


def _plan(stage, texts):
    rows = pl.DataFrame({"id": [f"d{i:06d}" for i in range(len(texts))], "source": "a", "text": texts, "meta": "{}"})
    keys = stage.collect(rows).with_columns(pl.lit(0, pl.Int32).alias("_task"))
    plan = stage.plan(keys.lazy())
    return stage.apply(rows, plan.decision.drop("_task")), plan.report


def _random_docs(n, words=80, seed=0):
    rng = np.random.default_rng(seed)
    return [" ".join(f"w{j}" for j in row) for row in rng.integers(0, 10**6, size=(n, words))]


def test_empty_documents_are_never_near_duplicates(tmp_path):
    texts = ["", "", "  ", None, *_random_docs(3)]
    out, report = _plan(_stage(MinHashDedup, MinHashConfig(), tmp_path), texts)
    assert out.rejected.height == 0 and report["candidate_pairs"] == 0


def test_empty_documents_are_exact_duplicates_of_each_other(tmp_path):
    out, _ = _plan(_stage(ExactDedup, ExactConfig(), tmp_path), ["", "  ", "x", None])
    assert out.kept["id"].to_list() == ["d000000", "d000002"]


def test_one_repeated_word_documents(tmp_path):
    texts = ["spam " * 1000, "spam " * 10, "spam spam", "eggs " * 1000]
    # 1000 and 10 repeats have the same single 5-gram; two words are a different (short) shingle.
    assert duplicate_clusters(texts) == [[0, 1]]


def test_all_identical_corpus_keeps_one_and_pairs_stay_linear(tmp_path):
    n = 3000
    texts = ["the very same document text repeated for everyone"] * n
    out, report = _plan(_stage(MinHashDedup, MinHashConfig(), tmp_path), texts)
    assert out.kept["id"].to_list() == ["d000000"] and out.rejected.height == n - 1
    assert report["clusters"] == 1 and report["candidate_pairs"] <= 2 * n
    exact_out, _ = _plan(_stage(ExactDedup, ExactConfig(), tmp_path), texts)
    assert exact_out.rejected.height == n - 1


def test_corpus_without_duplicates_keeps_everything(tmp_path):
    texts = _random_docs(2000)
    out, report = _plan(_stage(MinHashDedup, MinHashConfig(), tmp_path), texts)
    assert out.rejected.height == 0 and report["clusters"] == 0 and report["removed_per_source"] == {}
    exact_out, exact_report = _plan(_stage(ExactDedup, ExactConfig(), tmp_path), texts)
    assert exact_out.rejected.height == 0 and exact_report["clusters"] == 0


@pytest.mark.slow
def test_fifty_megabyte_document_in_bounded_memory(tmp_path):
    rng = np.random.default_rng(0)
    big = " ".join(map(str, rng.integers(10**8, 10**9, size=5_000_001)))  # 50 MB, 5M words
    assert len(big) >= 50_000_000
    near = big[: len(big) // 50] + " tail"
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out, report = _plan(_stage(MinHashDedup, MinHashConfig(), tmp_path), [big, near, big])
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    assert out.rejected["id"].to_list() == ["d000002"] and report["clusters"] == 1
    # Text is 50 MB (x2 copies in the batch); scratch is ~16 bytes per word, sets 4 bytes per shingle.
    assert grown < 1_000_000_000
