"""Pipeline parallel (torch.distributed.pipelining) on 2 gloo processes against one process, fp32 on CPU.

Both runs take the same 2 micro-batches per step; the pipeline splits the layers over the ranks.
"""

import json

import pytest
import torch

from tests.train.parallel_workers import assert_same_run, build, fit, reference_run, spawn
from winnow.train.parallel import Parallel

pytestmark = pytest.mark.slow


def _records(run_dir) -> list[dict]:
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "per_source" in r]


def _reference(tmp_path, steps: int, model: dict | None = None) -> dict:
    torch.set_num_threads(1)
    return fit(
        build(
            tmp_path / "ref",
            parallel=Parallel.local(torch.device("cpu")),
            grad_accum=2,
            steps=steps,
            model=model,
            val_batches=3,
        )
    )


def _held_out_matches(got: dict, ref: dict) -> None:
    # 3 held-out batches in micro-batch pairs: one full schedule step, one padded with a masked copy
    assert got["summary"]["eval"]["eval"]["per_source"] == pytest.approx(
        ref["summary"]["eval"]["eval"]["per_source"], rel=1e-5
    )
    assert got["summary"]["eval"]["eval"]["loss"] == pytest.approx(ref["summary"]["eval"]["eval"]["loss"], rel=1e-5)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_two_stage_pipeline_matches_one_process(tmp_path, schedule):
    ref = _reference(tmp_path, 5)
    got = spawn(
        {
            "run_dir": str(tmp_path / "pp"),
            "steps": 5,
            "grad_accum": 2,
            "val_batches": 3,
            "parallel": {"pp": 2, "pp_schedule": schedule},
        },
        tmp_path / "out.json",
    )
    _held_out_matches(got, ref)
    assert got["losses"] == pytest.approx(ref["losses"], abs=1e-5)
    assert got["norms"] == pytest.approx(ref["norms"], rel=1e-4)
    mine, theirs = _records(tmp_path / "pp"), _records(tmp_path / "ref")
    assert len(mine) == len(theirs) == 5
    for a, b in zip(mine, theirs):
        assert {k: v["loss_sum"] for k, v in a["per_source"].items()} == pytest.approx(
            {k: v["loss_sum"] for k, v in b["per_source"].items()}, rel=1e-6
        )
        assert {k: v["tokens"] for k, v in a["per_source"].items()} == {
            k: v["tokens"] for k, v in b["per_source"].items()
        }
        assert a["routing"] == b["routing"]  # both stages' layers, counted on the rank that holds them
        assert a["aux_loss"] == pytest.approx(b["aux_loss"], rel=1e-5)
        assert a["z_loss"] == pytest.approx(b["z_loss"], rel=1e-5)
        assert a["tokens_seen"] == b["tokens_seen"]
        assert a["comm"]["bytes_sent"] > 0 and 0 < a["comm_pct"] < 100  # send/recv is timed


def test_interleaved_1f1b_two_stages_per_rank_matches_one_process(tmp_path):
    # 4 layers over 4 virtual stages: rank 0 holds stages 0 and 2, rank 1 stages 1 and 3
    model = {"n_layers": 4}
    ref = _reference(tmp_path, 5, model=model)
    got = spawn(
        {
            "run_dir": str(tmp_path / "pp"),
            "steps": 5,
            "grad_accum": 2,
            "val_batches": 3,
            "model": model,
            "parallel": {"pp": 2, "pp_schedule": "interleaved_1f1b", "pp_stages_per_rank": 2},
        },
        tmp_path / "out.json",
    )
    assert got["losses"] == pytest.approx(ref["losses"], abs=1e-5)
    assert got["norms"] == pytest.approx(ref["norms"], rel=1e-4)
    for a, b in zip(_records(tmp_path / "pp"), _records(tmp_path / "ref"), strict=True):
        assert {k: v["loss_sum"] for k, v in a["per_source"].items()} == pytest.approx(
            {k: v["loss_sum"] for k, v in b["per_source"].items()}, rel=1e-6
        )
        assert a["routing"] == b["routing"]
    _held_out_matches(got, ref)


def test_distillation_runs_the_teacher_on_the_last_stage_and_matches_one_process(tmp_path):
    config = {"distill": {"teacher": "a fixed random model", "alpha": 0.5, "temperature": 2.0}}
    ref = reference_run(tmp_path, steps=4, grad_accum=2, config=config)
    plain = reference_run(tmp_path / "plain", steps=4, grad_accum=2)
    assert ref["losses"] != pytest.approx(plain["losses"], abs=1e-3)  # the soft targets are in the loss
    got = spawn(
        {
            "run_dir": str(tmp_path / "pp"),
            "steps": 4,
            "grad_accum": 2,
            "config": config,
            "parallel": {"pp": 2, "pp_schedule": "1f1b"},
        },
        tmp_path / "out.json",
    )
    assert_same_run(got, ref, tmp_path / "pp", tmp_path / "ref")
    assert not got["holds_teacher"]  # rank 0, the first stage, dropped it: only the last stage scores


def test_pipeline_checkpoints_hold_the_whole_model_and_resume_across_layouts(tmp_path):
    torch.set_num_threads(1)
    local = Parallel.local(torch.device("cpu"))
    pp = {"pp": 2, "pp_schedule": "1f1b"}
    ref = fit(build(tmp_path / "ref", parallel=local, grad_accum=2, steps=6))
    # 2 stages -> 1 process: rank 0 writes both stages' layers and optimizer state
    first = spawn(
        {"run_dir": str(tmp_path / "pp"), "steps": 6, "stop_after": 3, "grad_accum": 2, "parallel": pp},
        tmp_path / "first.json",
    )
    assert first["losses"] == pytest.approx(ref["losses"][:3], abs=1e-5)
    resumed = build(tmp_path / "pp", parallel=local, grad_accum=2, steps=6, resume=True)
    resumed.model.reset_parameters()  # the checkpoint must win over fresh weights
    assert fit(resumed)["losses"] == pytest.approx(ref["losses"][3:], abs=1e-5)
    # 1 process -> 2 stages: each rank loads its layers' part
    one = build(tmp_path / "one", parallel=local, grad_accum=2, steps=6)
    [one.train_step() for _ in range(3)]
    one.save_checkpoint()
    second = spawn(
        {"run_dir": str(tmp_path / "one"), "steps": 6, "resume": True, "grad_accum": 2, "parallel": pp},
        tmp_path / "second.json",
    )
    assert second["losses"] == pytest.approx(ref["losses"][3:], abs=1e-5)


def test_pipeline_under_ddp_four_processes_matches_one_process(tmp_path):
    # dp_replicate 2 x pp 2: each pipeline's stages are DDP over the 2 dp ranks; one process takes all 4 batches
    torch.set_num_threads(1)
    ref = fit(build(tmp_path / "ref", parallel=Parallel.local(torch.device("cpu")), grad_accum=4, steps=3))
    got = spawn(
        {
            "run_dir": str(tmp_path / "pp"),
            "steps": 3,
            "grad_accum": 2,
            "parallel": {"pp": 2, "dp_replicate": 2, "pp_schedule": "1f1b"},
        },
        tmp_path / "out.json",
        world=4,
    )
    assert got["losses"] == pytest.approx(ref["losses"], abs=1e-5)
    assert got["norms"] == pytest.approx(ref["norms"], rel=1e-4)
    for a, b in zip(_records(tmp_path / "pp"), _records(tmp_path / "ref"), strict=True):
        assert {k: v["loss_sum"] for k, v in a["per_source"].items()} == pytest.approx(
            {k: v["loss_sum"] for k, v in b["per_source"].items()}, rel=1e-6
        )
        assert a["routing"] == b["routing"]
