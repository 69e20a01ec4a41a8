"""``[train.parallel]`` validation: the mesh degrees, what fits a launch, the removed keys, and the one-process Parallel."""

import os
from pathlib import Path

import pytest
import torch

from winnow.pipelines.jobfile import build_config
from winnow.train.errors import ConfigError
from winnow.train.parallel import Parallel, ParallelConfig, init_world
from winnow.train.parallel.config import MeshDims
from winnow.train.parallel.mesh import World


@pytest.mark.parametrize(
    "kw, key",
    [
        ({"dp_shard": 0}, "dp_shard"),
        ({"tp": 0}, "tp"),
        ({"ep": -1}, "ep"),
        ({"dp_replicate": -2}, "dp_replicate"),
        ({"cpu_offload": True}, "cpu_offload"),
        ({"dp_shard": 2, "powersgd_rank": 2}, "powersgd_rank"),
        ({"powersgd_rank": 1, "powersgd_start_iter": 1}, "powersgd_start_iter"),  # torch needs 2 plain steps
        ({"backend": "mpi"}, "backend"),
        ({"pp_schedule": "zb"}, "pp_schedule"),
        ({"pp_stages_per_rank": 2}, "pp_stages_per_rank"),
        ({"pp_schedule": "interleaved_1f1b"}, "pp_stages_per_rank"),
    ],
)
def test_bad_values_name_the_key(kw, key):
    with pytest.raises(ConfigError, match=f"train.parallel.{key}"):
        ParallelConfig(**kw)


@pytest.mark.parametrize(
    "kw, world, want",
    [
        ({}, 4, MeshDims(dp_replicate=4)),  # the default: DDP over every rank
        ({"dp_shard": -1}, 4, MeshDims(dp_shard=4)),  # FSDP2 over every rank
        ({"dp_shard": -1, "dp_replicate": 2}, 8, MeshDims(dp_replicate=2, dp_shard=4)),  # HSDP
        ({"tp": 2}, 4, MeshDims(dp_replicate=2, tp=2)),  # DDP x TP
        ({"tp": 2, "pp": 2}, 8, MeshDims(dp_replicate=2, tp=2, pp=2)),
        ({"tp": 2, "ep": 2}, 8, MeshDims(dp_replicate=4, tp=2, ep=2)),
        ({"ep": 2}, 4, MeshDims(dp_replicate=4, ep=2)),  # ep borrows from the dp ranks
        ({"dp_replicate": 1}, 1, MeshDims()),
    ],
)
def test_degrees_resolve_to_the_world(kw, world, want):
    assert ParallelConfig(**kw).resolve(world, n_experts=8) == want


def test_a_product_that_misses_the_world_says_so():
    with pytest.raises(
        ConfigError,
        match=r"dp_replicate \(1\) x dp_shard \(2\) x tp \(2\) x pp \(1\) does not make "
        r"this launch's 2 processes",
    ):
        ParallelConfig(dp_replicate=1, dp_shard=2, tp=2).resolve(2)
    with pytest.raises(ConfigError, match=r"dp_replicate \(-1\) x dp_shard \(1\) x tp \(2\) .* 3 processes"):
        ParallelConfig(tp=2).resolve(3)


@pytest.mark.parametrize(
    "kw, world, experts, why",
    [
        ({"ep": 2, "tp": 2}, 2, 4, r"divisor of the data-parallel degree"),
        ({"ep": 3}, 4, 6, r"divisor of the data-parallel degree"),
        ({"ep": 2}, 2, 3, r"divisor of train.model.n_experts \(3\)"),
        ({"ep": 2}, 2, 1, r"n_experts"),
        ({"ep": 2, "dp_replicate": 2, "dp_shard": 3}, 6, 4, r"a divisor or a multiple of dp_shard \(3\)"),
    ],
)
def test_expert_parallel_must_fit_the_dp_ranks_and_the_experts(kw, world, experts, why):
    with pytest.raises(ConfigError, match=f"train.parallel.ep = {kw['ep']} .*{why}"):
        ParallelConfig(**kw).resolve(world, n_experts=experts)


def test_fsdp_by_tensor_parallel_resolves():  # each tp rank's parts sharded over its dp_shard ranks
    assert ParallelConfig(tp=2, dp_shard=-1).resolve(4) == MeshDims(dp_replicate=1, dp_shard=2, tp=2)


def test_tensor_parallel_without_torchrun_is_refused(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ConfigError, match="torchrun"):
        init_world(ParallelConfig(tp=2), device="cpu")


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("mode", "fsdp", "dp_shard = -1"),
        ("expert_parallel", 2, "ep = N"),
        ("tensor_parallel", 2, "tp = N"),
        ("pipeline_parallel", 2, "pp = N"),
    ],
)
def test_removed_keys_say_what_to_write_instead(key, value, says):
    with pytest.raises(Exception, match=f"job.toml \\[train.parallel\\]: train.parallel.{key} .*{says}"):
        build_config(ParallelConfig, {key: value}, "job.toml [train.parallel]")


def test_coordinates_follow_the_dense_layout():
    # (pp, dp_replicate, dp_shard, tp) = (1, 2, 2, 2), tp fastest; ep = 2 groups consecutive dp ranks
    dims = MeshDims(dp_replicate=2, dp_shard=2, tp=2, ep=2)
    worlds = [World(rank=r, size=8, local_rank=r, device=torch.device("cpu"), dims=dims) for r in range(8)]
    assert [w.tp_rank for w in worlds] == [0, 1] * 4
    assert [w.dp_rank for w in worlds] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [w.dp_shard_rank for w in worlds] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert [w.ep_rank for w in worlds] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert [w.edp_rank for w in worlds] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert (worlds[0].dp_size, worlds[0].edp_size, worlds[0].pp_rank) == (4, 2, 0)


def test_one_process_parallel_is_the_plain_operations():
    p = Parallel.local(torch.device("cpu"))
    model = torch.nn.Linear(3, 2)
    model.cfg = None
    assert p.parallelize(model) is model and p.grad_scale == 1.0 and p.global_tokens(7) == 7
    model(torch.ones(1, 3)).sum().mul(100).backward()
    norm = p.clip_grad_norm(model, 1.0)
    assert norm > 1 and torch.linalg.vector_norm(
        torch.cat([q.grad.flatten() for q in model.parameters()])
    ) == pytest.approx(1.0, rel=1e-5)
    assert p.step_values(torch.tensor(2.5), norm) == (2.5, pytest.approx(float(norm)))


def test_shutdown_meets_the_other_ranks_first_unless_leaving_on_an_error(tmp_path, monkeypatch):
    import torch.distributed as dist

    from winnow.train.parallel import shutdown

    met = []
    barrier = dist.barrier
    monkeypatch.setattr(dist, "barrier", lambda *a, **kw: (met.append(True), barrier(*a, **kw)))
    for failing in (False, True):
        met.clear()
        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store-{failing}", rank=0, world_size=1)
        try:
            try:
                if failing:
                    raise RuntimeError("a rank's step failed")
            finally:
                shutdown()  # a barrier here would wait for ranks that may never come
        except RuntimeError:
            pass
        assert not dist.is_initialized()
        assert met == ([] if failing else [True])


@pytest.mark.parametrize("left", [True, False])
def test_a_rank_that_left_its_group_exits_without_finalization(tmp_path, left):
    """Flushed output and the exit code survive; Python's exit handlers (finalization) do not run."""
    import subprocess
    import sys

    script = f"""
import atexit, pathlib, sys
import torch.distributed as dist
from winnow.train.parallel import exit_process, shutdown
atexit.register(lambda: pathlib.Path({str(tmp_path / "finalized")!r}).touch())
if {left}:
    dist.init_process_group("gloo", init_method="file://{tmp_path}/store", rank=0, world_size=1)
    shutdown()
print("trained", flush=False)
sys.exit(exit_process(3))
"""
    env = {**os.environ, "WORLD_SIZE": "2", "PYTHONPATH": str(Path(__file__).parents[2])}
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 3 and proc.stdout.strip() == "trained", proc.stderr
    assert (tmp_path / "finalized").exists() is not left
