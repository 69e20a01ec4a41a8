"""Tensor parallelism on gloo processes: TP 2 and DDP x TP (2 x 2) against one process (fp32, CPU)."""

import json

import pytest
import torch

from tests.train.parallel_workers import build, fit, reference_run, spawn
from winnow.train.parallel import Parallel
from winnow.train.parallel.tensor_parallel import join_parts, local_part

pytestmark = pytest.mark.slow


def _per_source(run_dir) -> list[dict]:
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: (v["loss_sum"], v["tokens"]) for k, v in r["per_source"].items()} for r in records if "per_source" in r]


def _assert_same_run(got: dict, ref: dict, run_dir, ref_dir) -> None:
    assert got["losses"] == pytest.approx(ref["losses"], abs=1e-5)
    assert got["norms"] == pytest.approx(ref["norms"], rel=1e-4)
    mine, theirs = _per_source(run_dir), _per_source(ref_dir)
    assert len(mine) == len(theirs) == len(ref["losses"])
    for a, b in zip(mine, theirs, strict=True):
        assert a.keys() == b.keys()
        for name in a:
            assert a[name][0] == pytest.approx(b[name][0], rel=1e-5) and a[name][1] == b[name][1]


def test_layout_parts_join_back_to_the_full_tensor():
    full = torch.arange(2 * 8 * 4, dtype=torch.float32).view(2, 8, 4)
    for layout in [(0, 1), (1, 1), (1, 2), (2, 2)]:
        parts = [local_part(full, layout, r, 2) for r in range(2)]
        assert parts[0].shape[layout[0]] == full.shape[layout[0]] // 2
        torch.testing.assert_close(join_parts(parts, layout), full)
    # fused [k | v] rows: rank 1 keeps the second half of k and the second half of v
    kv = torch.arange(8.0)[:, None]
    assert local_part(kv, (0, 2), 1, 2).flatten().tolist() == [2.0, 3.0, 6.0, 7.0]


def test_tensor_parallel_two_processes_match_one_process(tmp_path):
    # tp = 2, dp = 1: both ranks read the one-process batches; a shared expert exercises the split SwiGLU in MoE
    model = {"n_shared_experts": 1}
    ref = reference_run(tmp_path, steps=5, grad_accum=1, model=model)
    got = spawn(
        {"run_dir": str(tmp_path / "tp"), "steps": 5, "model": model, "parallel": {"tp": 2}}, tmp_path / "out.json"
    )
    _assert_same_run(got, ref, tmp_path / "tp", tmp_path / "ref")
    assert got["comm"]["seconds"] > 0 and got["comm"]["bytes_sent"] > 0  # the tp all-reduces are timed


def test_ddp_by_tensor_parallel_four_processes_match_one_process(tmp_path):
    # dp_replicate = 2 x tp = 2: the two tp groups read different batches, so one process accumulates 2
    ref = reference_run(tmp_path, steps=5, grad_accum=2)
    got = spawn(
        {"run_dir": str(tmp_path / "ddp_tp"), "steps": 5, "parallel": {"tp": 2}}, tmp_path / "out.json", world=4
    )
    _assert_same_run(got, ref, tmp_path / "ddp_tp", tmp_path / "ref")
    assert got["positions"] == ref["positions"]  # the same global batches in the same order


def test_expert_by_tensor_parallel_four_processes_match_one_process(tmp_path):
    # tp = 2 inside each of 2 dp ranks, the experts split over both dp ranks (ep = 2): a rank runs its
    # tp columns of its ep rank's experts on tokens that came from the other dp rank's tp peer
    ref = reference_run(tmp_path, steps=5, grad_accum=2)
    got = spawn(
        {"run_dir": str(tmp_path / "ep_tp"), "steps": 5, "parallel": {"tp": 2, "ep": 2}}, tmp_path / "out.json", world=4
    )
    _assert_same_run(got, ref, tmp_path / "ep_tp", tmp_path / "ref")


@pytest.mark.parametrize("ep", [1, 2])
def test_fsdp2_by_tensor_parallel_four_processes_match_one_process(tmp_path, ep):
    # dp_shard = 2 x tp = 2: each tp rank's parts are FSDP2-sharded over the 2 ranks holding the same part
    # (torchtitan's 2-D layout); with ep = 2 the experts are also split over the 2 dp ranks
    ref = reference_run(tmp_path, steps=5, grad_accum=2)
    got = spawn(
        {
            "run_dir": str(tmp_path / "fsdp_tp"),
            "steps": 5,
            "parallel": {"tp": 2, "dp_shard": 2, "dp_replicate": 1, "ep": ep},
        },
        tmp_path / "out.json",
        world=4,
    )
    _assert_same_run(got, ref, tmp_path / "fsdp_tp", tmp_path / "ref")
    wq = got["layouts"]["blocks.0.attn.wq.weight"]  # (32, 32) whole; (16, 32) a tp part; (8, 32) its shard
    assert wq["dtensor"] and wq["mesh"] == ["dp_shard"] and wq["local_shape"] == [8, 32]


def test_fsdp2_by_tensor_parallel_checkpoint_resumes_on_one_process(tmp_path):
    torch.set_num_threads(1)
    local = Parallel.local(torch.device("cpu"))
    ref = fit(build(tmp_path / "ref", parallel=local, grad_accum=2, steps=6))
    first = spawn(
        {
            "run_dir": str(tmp_path / "run"),
            "steps": 6,
            "stop_after": 3,
            "parallel": {"tp": 2, "dp_shard": 2, "dp_replicate": 1},
        },
        tmp_path / "first.json",
        world=4,
    )
    assert first["losses"] == pytest.approx(ref["losses"][:3], abs=1e-5)
    resumed = build(tmp_path / "run", parallel=local, grad_accum=2, steps=6, resume=True)
    resumed.model.reset_parameters()  # the checkpoint must win over fresh weights
    assert fit(resumed)["losses"] == pytest.approx(ref["losses"][3:], abs=1e-5)
