"""Pipeline parallel composed with the mesh's other dimensions on 4 gloo processes, against one process.

pp 2 x dp_shard 2 (each stage FSDP2-sharded over its 2 dp ranks) and pp 2 x tp 2 (each stage's
heads and hidden widths split over its 2 tp ranks): five fp32 steps give the one-process run's
losses, gradient norms and per-source sums. fp16 under pipeline parallelism: one stage's overflow
makes every stage skip the step. Micro-batch shapes that change (a sequence-length warm-up) get a
schedule each.
"""

import pytest
import torch

from tests.train.parallel_workers import assert_same_run, build, fit, full_state, reference_run, spawn
from winnow.train.parallel import Parallel

pytestmark = pytest.mark.slow


def test_pipeline_under_fsdp2_four_processes_matches_one_process(tmp_path):
    # pp 2 x dp_shard 2: ranks 0, 1 hold stage 0 (sharded over them), ranks 2, 3 stage 1; 2 micro-batches per dp rank
    torch.set_num_threads(1)
    one = build(tmp_path / "ref", parallel=Parallel.local(torch.device("cpu")), grad_accum=4, steps=5)
    ref = fit(one)
    got = spawn(
        {
            "run_dir": str(tmp_path / "pp"),
            "steps": 5,
            "grad_accum": 2,
            "full_state": True,
            "parallel": {"pp": 2, "dp_shard": 2, "dp_replicate": 1, "pp_schedule": "1f1b"},
        },
        tmp_path / "out.json",
        world=4,
    )
    assert_same_run(got, ref, tmp_path / "pp", tmp_path / "ref")
    # the one-process state (Trainer.state_dict): every stage's FSDP2 shards gathered, under one-process names
    mine, theirs = got["full_state"], full_state(one)
    assert mine["optimizer"] == theirs["optimizer"]
    assert mine["model"] == pytest.approx(theirs["model"], rel=1e-4, abs=1e-5)
    layouts = got["layouts"]  # rank 0: stage 0's layer and the embedding, each a DTensor sharded over dp_shard
    assert set(layouts) and all(n.startswith(("embed.", "blocks.0.")) for n in layouts)
    assert all(x["dtensor"] and x["mesh"] == ["dp_shard"] and x["mesh_size"] == 2 for x in layouts.values())
    assert layouts["embed.weight"]["placements"] == ["S(0)"]


def test_pipeline_with_tensor_parallel_four_processes_matches_one_process(tmp_path):
    # pp 2 x tp 2: ranks 0, 1 hold stage 0 (its heads and hidden widths split over them), ranks 2, 3 stage 1
    ref = reference_run(tmp_path, steps=5, grad_accum=2)
    got = spawn(
        {
            "run_dir": str(tmp_path / "pp"),
            "steps": 5,
            "grad_accum": 2,
            "parallel": {"pp": 2, "tp": 2, "pp_schedule": "gpipe"},
        },
        tmp_path / "out.json",
        world=4,
    )
    assert_same_run(got, ref, tmp_path / "pp", tmp_path / "ref")
    layouts = got["layouts"]
    assert all(n.startswith(("embed.", "blocks.0.")) for n in layouts)
    assert layouts["blocks.0.attn.wq.weight"]["local_shape"] == [32 // 2, 32]  # one of the 2 heads
    assert layouts["blocks.0.ffn.experts.w13_ED2F"]["local_shape"] == [4, 32, 64 // 2]  # every expert, half of F
    assert not any(x["dtensor"] for x in layouts.values())  # plain tensors: the crossings are the trainer's own


def test_fp16_under_pipeline_parallel_skips_the_same_steps_on_every_rank_when_one_stage_overflows(tmp_path):
    # an inf in stage 1's gradient (rank 1 only): rank 0 holds no such gradient and would step on its own
    job = {
        "run_dir": str(tmp_path / "fp16"),
        "steps": 5,
        "grad_accum": 2,
        "parallel": {"pp": 2, "pp_schedule": "1f1b"},
        "config": {"precision": "fp16", "skip_nonfinite": False},
        "overflow": {"rank": 1, "steps": [2, 4], "param": "blocks.1.attn.wq.weight"},
    }
    ranks = spawn(job, tmp_path / "out.json")["ranks"]
    for seen in ranks:
        assert [s["stepped"] for s in seen["steps"]] == [True, False, True, False, True]
    scales = [[s["scale"] for s in seen["steps"]] for seen in ranks]
    assert scales[0] == scales[1]
    assert scales[0][1] == scales[0][0] / 2 and scales[0][3] == scales[0][2] / 2
    assert [s["loss"] for s in ranks[0]["steps"]] == [s["loss"] for s in ranks[1]["steps"]]
    assert all(s["loss"] == s["loss"] for s in ranks[0]["steps"])  # no NaN reached the weights
    # step 2's loss follows step 1's update, which the loss scale must not have changed: as in one process
    torch.set_num_threads(1)
    ref = fit(
        build(
            tmp_path / "ref",
            parallel=Parallel.local(torch.device("cpu")),
            grad_accum=2,
            steps=5,
            config={"precision": "fp16", "skip_nonfinite": False},
        )
    )
    assert [s["loss"] for s in ranks[0]["steps"][:2]] == pytest.approx(ref["losses"][:2], abs=5e-3)


@pytest.mark.parametrize("dp", ["dp_shard", "dp_replicate"])
def test_pipeline_with_expert_parallel_four_processes_matches_one_process(tmp_path, dp):
    # pp 2 x dp 2, the experts split over the 2 dp ranks of each stage (ep 2): FSDP2 x EP or DDP x EP per stage
    ref = reference_run(tmp_path, steps=5, grad_accum=4)
    other = "dp_replicate" if dp == "dp_shard" else "dp_shard"
    got = spawn(
        {
            "run_dir": str(tmp_path / "pp"),
            "steps": 5,
            "grad_accum": 2,
            "parallel": {"pp": 2, dp: 2, other: 1, "ep": 2, "pp_schedule": "1f1b"},
        },
        tmp_path / "out.json",
        world=4,
    )
    assert_same_run(got, ref, tmp_path / "pp", tmp_path / "ref")
    expert, dense = got["layouts"]["blocks.0.ffn.experts.w13_ED2F"], got["layouts"]["blocks.0.attn.wq.weight"]
    assert expert["local_shape"] == [2, 32, 64]  # rank 0 holds experts 0 and 1 of stage 0's layer
    assert dense["dtensor"] == (dp == "dp_shard")


def test_pipeline_under_fsdp2_checkpoints_resume_on_one_process_and_back(tmp_path):
    torch.set_num_threads(1)
    local = Parallel.local(torch.device("cpu"))
    layout = {"pp": 2, "dp_shard": 2, "dp_replicate": 1}
    ref = fit(build(tmp_path / "ref", parallel=local, grad_accum=4, steps=6))
    # pp 2 x dp_shard 2 saves each stage's FSDP2 shards (DCP); one process reads them all back
    first = spawn(
        {"run_dir": str(tmp_path / "pp"), "steps": 6, "stop_after": 3, "grad_accum": 2, "parallel": layout},
        tmp_path / "first.json",
        world=4,
    )
    assert first["losses"] == pytest.approx(ref["losses"][:3], abs=1e-5)
    resumed = build(tmp_path / "pp", parallel=local, grad_accum=4, steps=6, resume=True)
    resumed.model.reset_parameters()  # the checkpoint must win over fresh weights
    assert fit(resumed)["losses"] == pytest.approx(ref["losses"][3:], abs=1e-5)
    # one process -> pp 2 x dp_shard 2: each rank reads its stage's shard of every tensor
    one = build(tmp_path / "one", parallel=local, grad_accum=4, steps=6)
    [one.train_step() for _ in range(3)]
    one.save_checkpoint()
    second = spawn(
        {"run_dir": str(tmp_path / "one"), "steps": 6, "resume": True, "grad_accum": 2, "parallel": layout},
        tmp_path / "second.json",
        world=4,
    )
    assert second["losses"] == pytest.approx(ref["losses"][3:], abs=1e-5)


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved_1f1b"])
def test_pipeline_with_growing_sequence_lengths_matches_one_process(tmp_path, schedule):
    # a sequence-length warm-up's batches: 8 tokens, then 16 from the 4th batch on, so step 2's two
    # micro-batches differ (one schedule step each, breadth-first); one schedule per shape
    lengths = [8, 8, 8, 16]
    model = {"n_layers": 4} if schedule == "interleaved_1f1b" else None
    torch.set_num_threads(1)
    ref = fit(
        build(
            tmp_path / "ref",
            parallel=Parallel.local(torch.device("cpu")),
            grad_accum=2,
            steps=5,
            lengths=lengths,
            model=model,
            val_batches=3,
        )
    )
    parallel = {"pp": 2, "pp_schedule": schedule, "pp_stages_per_rank": 2 if model else 1}
    got = spawn(
        {
            "run_dir": str(tmp_path / "pp"),
            "steps": 5,
            "grad_accum": 2,
            "lengths": lengths,
            "model": model,
            "val_batches": 3,
            "parallel": parallel,
        },
        tmp_path / "out.json",
    )
    assert_same_run(got, ref, tmp_path / "pp", tmp_path / "ref")
    assert got["summary"]["eval"]["eval"]["loss"] == pytest.approx(ref["summary"]["eval"]["eval"]["loss"], rel=1e-5)


def test_pipeline_with_sequence_parallel_four_processes_matches_one_process(tmp_path):
    # pp 2 x tp 2 with sequence parallel: the stages exchange each tp rank's half of the sequence
    ref = reference_run(tmp_path, steps=5, grad_accum=2)
    got = spawn(
        {
            "run_dir": str(tmp_path / "pp"),
            "steps": 5,
            "grad_accum": 2,
            "parallel": {"pp": 2, "tp": 2, "sequence_parallel": True, "pp_schedule": "1f1b"},
        },
        tmp_path / "out.json",
        world=4,
    )
    assert_same_run(got, ref, tmp_path / "pp", tmp_path / "ref")
    assert got["comm"]["bytes_sent"] > 0
