"""``[train.parallel]`` validation, refusals of tensor/pipeline parallelism, and the one-process Parallel."""

import pytest
import torch

from train.errors import ConfigError
from train.parallel import Parallel, ParallelConfig, init_world


@pytest.mark.parametrize("kw, key", [({"mode": "zero3"}, "mode"), ({"expert_parallel": 0}, "expert_parallel"),
                                     ({"cpu_offload": True}, "cpu_offload"),
                                     ({"mode": "fsdp", "powersgd_rank": 2}, "powersgd_rank"),
                                     ({"mode": "fsdp", "expert_parallel": 2}, "expert_parallel"),
                                     ({"backend": "mpi"}, "backend")])
def test_bad_values_name_the_key(kw, key):
    with pytest.raises(ConfigError, match=f"train.parallel.{key}"):
        ParallelConfig(**kw)


@pytest.mark.parametrize("key, why", [("tensor_parallel", "nn.Linear"), ("pipeline_parallel", "only tensors")])
def test_tensor_and_pipeline_parallel_are_refused_with_the_reason(key, why):
    with pytest.raises(ConfigError, match=why):
        ParallelConfig(**{key: 2})


def test_world_checks_divisibility_of_ranks_and_experts():
    cfg = ParallelConfig(expert_parallel=2)
    cfg.check_world(4, 8)
    with pytest.raises(ConfigError, match="divisor of the number of processes"):
        cfg.check_world(3, 8)
    with pytest.raises(ConfigError, match="n_experts"):
        cfg.check_world(2, 3)


def test_expert_parallel_without_torchrun_is_refused(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ConfigError, match="torchrun"):
        init_world(ParallelConfig(expert_parallel=2), device="cpu")


def test_one_process_parallel_is_the_plain_operations():
    p = Parallel.local(torch.device("cpu"))
    model = torch.nn.Linear(3, 2)
    model.cfg = None
    assert p.wrap(model) is model and p.grad_scale == 1.0 and p.global_tokens(7) == 7
    model(torch.ones(1, 3)).sum().mul(100).backward()
    norm = p.clip_grad_norm(model, 1.0)
    assert norm > 1 and torch.linalg.vector_norm(torch.cat([q.grad.flatten() for q in model.parameters()])) == \
        pytest.approx(1.0, rel=1e-5)
    assert p.step_values(torch.tensor(2.5), norm) == (2.5, pytest.approx(float(norm)))
