"""FSDP2 x expert parallel and DDP x expert parallel on gloo against one process; precision across ranks.

Dense parameters are sharded over every rank, each MoE layer's local experts over the ranks
that hold the same experts (torchtitan's layout); five fp32 steps must give the one-process
run's losses and per-source sums. fp16's overflow check must be agreed by every rank.
"""

import pytest

from tests.train.parallel_workers import assert_same_run, reference_run, spawn

pytestmark = pytest.mark.slow

EXPERT = "blocks.0.ffn.experts.w13_ED2F"  # (E, D, 2F) = (4, 32, 64) in the one-process model
DENSE = "blocks.0.attn.wq.weight"
LAYOUTS = {"fsdp": {"dp_shard": -1, "ep": 2}, "ddp": {"ep": 2}}  # FSDP2 x EP, DDP x EP


@pytest.mark.parametrize("mode", ["fsdp", "ddp"])
def test_expert_parallel_on_two_processes_matches_one_process(tmp_path, mode):
    ref = reference_run(tmp_path, steps=5, grad_accum=2)
    got = spawn({"run_dir": str(tmp_path / mode), "steps": 5, "parallel": LAYOUTS[mode]}, tmp_path / "out.json")
    assert_same_run(got, ref, tmp_path / mode, tmp_path / "ref")
    expert, dense = got["layouts"][EXPERT], got["layouts"][DENSE]
    assert expert["local_shape"] == [2, 32, 64]  # rank 0 holds experts 0 and 1
    if mode == "fsdp":  # dense over both ranks; the experts over the ranks sharing them (here: one)
        assert dense["dtensor"] and dense["mesh_size"] == 2 and dense["placements"] == ["S(0)"]
        assert expert["dtensor"] and expert["mesh"] == ["edp"] and expert["mesh_size"] == 1
    assert got["comm"]["bytes_sent"] > 0


def test_fsdp2_with_expert_parallel_on_a_two_by_two_mesh_matches_one_process(tmp_path):
    # 4 ranks: ep = 2 (experts 0-1 on ranks 0 and 2, 2-3 on ranks 1 and 3), dp = 2 over the ranks sharing experts
    ref = reference_run(tmp_path, steps=5, grad_accum=4)
    got = spawn(
        {"run_dir": str(tmp_path / "fsdp"), "steps": 5, "parallel": {"dp_shard": -1, "ep": 2}},
        tmp_path / "out.json",
        world=4,
    )
    assert_same_run(got, ref, tmp_path / "fsdp", tmp_path / "ref")
    expert = got["layouts"][EXPERT]  # rank 0's two experts, sharded over the 2 ranks holding them: one each
    assert expert["mesh"] == ["edp"] and expert["mesh_size"] == 2 and expert["local_shape"] == [1, 32, 64]
    assert got["layouts"][DENSE]["mesh_size"] == 4


# FSDP2: torch's DTensor inf check already takes the maximum over the first gradient's mesh (every
# rank here), so plain GradScaler agrees too. DDP x EP: each rank's experts are plain tensors
# only it holds, and without the scaler's all-reduce the other rank would step (this case fails
# with torch.amp.GradScaler).
@pytest.mark.parametrize("parallel, param", [({"dp_shard": -1}, DENSE), ({"ep": 2}, EXPERT)], ids=["fsdp", "ddp+ep"])
def test_fp16_under_fsdp2_skips_the_same_steps_on_every_rank_when_one_rank_overflows(tmp_path, parallel, param):
    # skip_nonfinite off: the scaler alone decides whether the optimizer steps
    job = {
        "run_dir": str(tmp_path / "fp16"),
        "steps": 5,
        "parallel": parallel,
        "config": {"precision": "fp16", "skip_nonfinite": False},
        "overflow": {"rank": 1, "steps": [2, 4], "param": param},
    }
    ranks = spawn(job, tmp_path / "out.json")["ranks"]
    for seen in ranks:
        assert [s["stepped"] for s in seen["steps"]] == [True, False, True, False, True]
    # the scale backs off on the overflowing steps on both ranks, and stays equal throughout
    scales = [[s["scale"] for s in seen["steps"]] for seen in ranks]
    assert scales[0] == scales[1]
    assert scales[0][1] == scales[0][0] / 2 and scales[0][3] == scales[0][2] / 2
    assert [s["loss"] for s in ranks[0]["steps"]] == [s["loss"] for s in ranks[1]["steps"]]
    assert all(s["loss"] == s["loss"] for s in ranks[0]["steps"])  # no NaN reached the weights
    layout = ranks[0]["layouts"][DENSE]
    assert layout["dtype"] == "torch.float32" and layout["dtensor"] == ("dp_shard" in parallel)  # fp32 master


def test_bf16_under_fsdp2_with_expert_parallel_keeps_fp32_master_weights_and_tracks_one_process(tmp_path):
    ref = reference_run(tmp_path, steps=5, grad_accum=2, config={"precision": "bf16"})
    got = spawn(
        {
            "run_dir": str(tmp_path / "bf16"),
            "steps": 5,
            "parallel": {"dp_shard": -1, "ep": 2},
            "config": {"precision": "bf16"},
        },
        tmp_path / "out.json",
    )
    assert {x["dtype"] for x in got["layouts"].values()} == {"torch.float32"}
    assert got["optim_dtypes"] == ["torch.float32"]
    # bf16 rounds differently when the batch is split over ranks; the runs agree to bf16's precision
    assert got["losses"] == pytest.approx(ref["losses"], abs=2e-2)
