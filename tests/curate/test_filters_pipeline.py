"""clean and the heuristic filters through a TOML job: per-rule counts and nothing lost."""

from __future__ import annotations

import json

import orjson
import pytest

from winnow.curate.pipeline import run_job
from winnow.pipelines.jobfile import load_job

PROSE = [
    "Rivers carve deep valleys over millions of years, and the water shapes the stone.",
    "Bakers knead their dough before dawn so that the bread is ready with the sunrise.",
    "Comets trail bright dust when they near the sun, and the tail points away from it.",
    "Old maps show coastlines that have since moved, and the sea has taken the towns.",
    "Violinists tune every string before the concert, and the hall waits to be filled.",
    "Glaciers store most of the planet's fresh water, and they melt faster than before.",
]
JOB = """
workers = 1

[[inputs]]
source = "web"
path = "{path}"

[[stages]]
kind = "clean"
boilerplate_min_docs = 3

[[stages]]
kind = "filter.gopher_quality"

[[stages]]
kind = "filter.gopher_repetition"

[[stages]]
kind = "filter.c4"

[[stages]]
kind = "filter.fineweb"
keep_metrics = true
"""


@pytest.mark.slow
def test_job_with_clean_and_filters(tmp_path, write_job, nothing_lost):
    # Each good document words its lines its own way (a shared line would be boilerplate); all share the banner.
    docs = {
        f"good{i}": "Accept cookies\n" + "\n".join(f"{name} says that {p[0].lower()}{p[1:]}" for p in PROSE)
        for i, name in enumerate(("Anna", "Boris", "Clara", "David", "Elena", "Felix"))
    }
    docs |= {
        "short": "Too short.",
        "empty": "   ",
        "mash": "asdf jkl; qwer " * 30 + ".",
        "lorem": "\n".join(PROSE) + "\nLorem ipsum dolor sit amet, consectetur.",
    }
    (tmp_path / "in.jsonl").write_bytes(b"\n".join(orjson.dumps({"id": k, "text": v}) for k, v in docs.items()) + b"\n")
    job = load_job(write_job(JOB.format(path=tmp_path / "in.jsonl")))
    manifest = run_job(job, progress=False)
    nothing_lost(job.output_dir, set(docs))
    text = json.dumps(manifest)
    for reason in ("clean:empty", "filter:gopher_min_words", "filter:c4_lorem_ipsum"):
        assert reason in text, reason
    import polars as pl

    shards = [job.output_dir / s["path"] for s in manifest["shards"] if s["format"] == "parquet"]
    kept = pl.concat([pl.read_parquet(p) for p in shards])
    assert sorted(kept["id"]) == sorted(k for k in docs if k.startswith("good"))
    assert not kept["text"].str.contains("Accept cookies").any()  # boilerplate line found across the source
    assert "fineweb_line_punct_ratio" in kept.columns
