"""Expert parallelism on 2 gloo processes: the sharded MoE block equals the unsharded one (training: test_parallel_fsdp_ep)."""

import pytest
import torch
import torch.distributed as dist

from tests.train.parallel_workers import start
from winnow.train.model import ModelConfig
from winnow.train.model.moe import MoE
from winnow.train.parallel import ParallelConfig, exit_process, init_world, shutdown
from winnow.train.parallel.comm import CommTimer
from winnow.train.parallel.expert_parallel import EXPERT_PARAMS, apply_expert_parallel

pytestmark = pytest.mark.slow


def _moe_worker(rank: int, world: int, port: int) -> None:
    import os

    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    try:
        w = init_world(ParallelConfig(ep=2), device="cpu", n_experts=4)
        torch.manual_seed(0)
        cfg = ModelConfig(dim=32, n_heads=2, ffn_hidden=32, n_experts=4, top_k=2)
        ref = MoE(cfg)
        for p in ref.parameters():
            torch.nn.init.normal_(p, std=0.2)
        x_full = torch.randn(2, 12, 32, requires_grad=True)  # row r is rank r's batch
        probe = torch.randn(2, 12, 32)
        out_ref, stats_ref = ref(x_full)
        (out_ref * probe).sum().backward()

        moe = MoE(cfg)
        moe.load_state_dict(ref.state_dict())
        apply_expert_parallel(moe, w, CommTimer())
        names = EXPERT_PARAMS
        x = x_full.detach()[rank : rank + 1].clone().requires_grad_()
        out, stats = moe(x)
        (out * probe[rank : rank + 1]).sum().backward()

        torch.testing.assert_close(out, out_ref[rank : rank + 1], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(x.grad, x_full.grad[rank : rank + 1], atol=1e-5, rtol=1e-5)
        for name in names:  # each rank's expert slice got every rank's tokens' gradient
            full = ref.get_parameter(name).grad
            torch.testing.assert_close(
                moe.get_parameter(name).grad, full[2 * rank : 2 * rank + 2], atol=1e-5, rtol=1e-5
            )
        gate = moe.router.gate.weight.grad.clone()
        dist.all_reduce(gate)
        torch.testing.assert_close(gate, ref.router.gate.weight.grad, atol=1e-5, rtol=1e-5)
        load = stats.load_E.clone()
        dist.all_reduce(load)
        torch.testing.assert_close(load, stats_ref.load_E)
    finally:
        shutdown()
    exit_process(0)  # a spawned rank that finished: no finalization for gloo's threads to race


def test_sharded_moe_forward_and_backward_match_the_unsharded_block():
    start(_moe_worker, 2)
