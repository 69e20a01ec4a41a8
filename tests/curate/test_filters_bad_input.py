"""Bad input through clean and every heuristic filter: no crash, no silent drop, named reasons only."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from winnow.curate.stages.base import StageContext
from winnow.curate.stages.clean import Clean, CleanConfig
from winnow.curate.stages.filters.c4 import C4Filter
from winnow.curate.stages.filters.fineweb import FineWebFilter
from winnow.curate.stages.filters.gopher import GopherQualityFilter
from winnow.curate.stages.filters.gopher_repetition import GopherRepetitionFilter

FILTERS = [GopherQualityFilter, GopherRepetitionFilter, C4Filter, FineWebFilter]
# A lone surrogate cannot live in a UTF-8 column; readers decode it to U+FFFD, which is what stages see.
LONE_SURROGATE = "bad \ud800 byte".encode("utf-8", "surrogatepass").decode("utf-8", "replace")
BAD = {
    "empty": "",
    "whitespace": " \t\n\n \u3000 ",
    "cjk": "机器学习是人工智能的一个分支。它使计算机能够从数据中学习。" * 20,
    "minified": "function(a){return a.map(function(b){return b*2}).filter(Boolean)};" * 40,
    "surrogate": LONE_SURROGATE,
    "controls": "\x00\x01\x02 text \x1b[31m red \x1b[0m",
}


def ctx(tmp_path: Path) -> StageContext:
    return StageContext(stage_id="t", job_name="t", output_dir=tmp_path, plan_dir=tmp_path / "plan", sources=("s",))


def frame(texts: dict[str, str]) -> pl.DataFrame:
    return pl.DataFrame(
        {"id": list(texts), "source": "s", "text": list(texts.values()), "meta": None},
        schema_overrides={"meta": pl.String},
    )


def check(stage, out, ids: set[str]) -> None:
    assert set(out.kept["id"]) | set(out.rejected["id"]) == ids
    assert out.kept.height + out.rejected.height == len(ids)
    assert set(out.rejected["reason"]) <= set(stage.reasons)


@pytest.mark.parametrize("cls", FILTERS, ids=lambda c: c.kind)
def test_filters_survive_bad_input(cls, tmp_path):
    stage = cls(cls.Config(keep_metrics=True), ctx(tmp_path))
    check(stage, stage.apply(frame(BAD)), set(BAD))


def test_clean_survives_bad_input(tmp_path):
    stage = Clean(CleanConfig(boilerplate_min_docs=2, boilerplate_min_fraction=0.0), ctx(tmp_path))
    batch = frame(BAD)
    stage.plan(stage.collect(batch).with_columns(pl.lit(0).alias("_task")).lazy())
    out = stage.apply(batch)
    check(stage, out, set(BAD))
    assert set(out.rejected["id"]) == {"empty", "whitespace"}


@pytest.mark.slow
def test_single_50mb_document(tmp_path):
    big = {"big": ("All work and no play makes a dull text. " * 10 + "\n") * 125_000, "small": "A short line."}
    assert len(big["big"]) > 50_000_000
    batch = frame(big)
    for cls in FILTERS:
        stage = cls(cls.Config(), ctx(tmp_path))
        check(stage, stage.apply(batch), set(big))
    clean = Clean(CleanConfig(boilerplate_min_docs=None), ctx(tmp_path))
    clean.plan(clean.collect(batch).with_columns(pl.lit(0).alias("_task")).lazy())
    check(clean, clean.apply(batch), set(big))
