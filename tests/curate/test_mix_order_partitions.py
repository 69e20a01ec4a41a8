"""The mix and order plans within [job] memory_gb: a tiny budget (many key ranges) gives the same shards and
manifest as an unbounded one; a budget too small to make progress is an error naming job.memory_gb."""

from __future__ import annotations

import hashlib

import pytest

from tests.curate.test_mix_order_job import JOB, make_inputs
from winnow.curate.errors import ConfigError
from winnow.curate.pipeline import run_job
from winnow.curate.stages.mixing.external import MAX_RANGES, rows_within
from winnow.pipelines.jobfile import load_job


def _run(tmp_path, *, memory_gb: float, out: str, body: str = JOB):
    text = body.format(workers=1, seed=0, root=tmp_path)
    path = tmp_path / f"{out}.toml"
    path.write_text(
        f'[job]\nname = "mo"\noutput = "{tmp_path / out}"\nmemory_gb = {memory_gb}\nkeep_work = true\n' + text
    )
    job = load_job(path)
    return job.output_dir, run_job(job, progress=False)


def _comparable(manifest: dict) -> dict:
    """What a run computes (timings and how many key ranges it read aside)."""
    stages = []
    for s in manifest["stages"]:
        entry = {k: v for k, v in s.items() if "seconds" not in k}
        if "report" in entry:
            entry["report"] = {k: v for k, v in entry["report"].items() if k != "key_ranges"}
        stages.append(entry)
    totals = {k: v for k, v in manifest["totals"].items() if k != "seconds"}
    return {"stages": stages, "totals": totals, "shards": manifest["shards"], "by_source": manifest["by_source"]}


def _shard_bytes(out, manifest) -> dict[str, str]:
    return {s["path"]: hashlib.sha256((out / s["path"]).read_bytes()).hexdigest() for s in manifest["shards"]}


@pytest.mark.slow
def test_a_tiny_budget_gives_the_same_shards_and_manifest(tmp_path):
    make_inputs(tmp_path)
    big_out, big = _run(tmp_path, memory_gb=4, out="big")
    tiny_out, tiny = _run(tmp_path, memory_gb=2e-5, out="tiny")  # 20 kB: ~150 rows per key range
    ranges = {s["kind"]: s["report"]["key_ranges"] for s in tiny["stages"] if s["kind"] in ("mix", "order")}
    assert ranges["mix"] >= 3 and ranges["order"] >= 4, ranges
    assert {s["kind"]: s["report"]["key_ranges"] for s in big["stages"] if s["kind"] in ("mix", "order")} == {
        "mix": 1,
        "order": 1,
    }
    assert _comparable(tiny) == _comparable(big)
    assert _shard_bytes(tiny_out, tiny) == _shard_bytes(big_out, big)
    plans = sorted(p.name for p in (tiny_out / "_work" / "plans").iterdir())
    assert any("order" in p for p in plans) and not list(
        (tiny_out / "_work" / "plans").glob("*/spill")
    )  # scratch removed


def test_a_budget_below_one_window_names_the_key(tmp_path):
    make_inputs(tmp_path)
    with pytest.raises(
        ConfigError, match=r"job.memory_gb = 1e-06 is too small for one window .* set job.memory_gb to at least"
    ):
        _run(tmp_path, memory_gb=1e-6, out="small")


def test_a_paced_source_larger_than_the_budget_names_the_key(tmp_path):
    make_inputs(tmp_path)
    body = JOB.replace("window = 50", 'window = 50\npacing = "linear"')
    with pytest.raises(
        ConfigError, match=r"job.memory_gb = 5e-05 is too small for order.pacing = 'linear'.*pacing = 'sorted'"
    ):
        _run(tmp_path, memory_gb=5e-5, out="paced", body=body)  # one window fits, the pool does not


def test_more_key_ranges_than_allowed_is_an_error_with_the_least_budget():
    assert rows_within(1.0, 64, 10**6, what="x") == 1e9 // 64 // 2
    with pytest.raises(
        ConfigError,
        match=r"job.memory_gb = 1e-06 is too small for x: .*\(at most 4096\); set job.memory_gb to at least",
    ) as err:
        rows_within(1e-6, 64, MAX_RANGES * 100, what="x")
    least = float(str(err.value).rsplit(" ", 1)[1])
    assert rows_within(least * 1.01, 64, MAX_RANGES * 100, what="x") >= 100  # the value it names is enough
