"""FSDP2 with parameters, gradients and optimizer state offloaded to the host, on a machine without an accelerator."""

import pytest
import torch

from tests.train.parallel_workers import build, fit, spawn
from winnow.train.parallel import Parallel

pytestmark = pytest.mark.slow


def test_fsdp2_cpu_offload_trains_on_gloo_and_matches_the_one_process_losses(tmp_path):
    # CPUOffloadPolicy's default pin_memory=True raises on a machine without an accelerator
    torch.set_num_threads(1)
    ref = fit(build(tmp_path / "ref", parallel=Parallel.local(torch.device("cpu")), grad_accum=2, steps=3))
    got = spawn(
        {"run_dir": str(tmp_path / "off"), "steps": 3, "parallel": {"dp_shard": 2, "cpu_offload": True}},
        tmp_path / "off.json",
    )
    assert got["losses"] == pytest.approx(ref["losses"], abs=1e-5)
    assert got["norms"] == pytest.approx(ref["norms"], rel=1e-4)
