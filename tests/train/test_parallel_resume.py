"""A checkpoint written by 2 gloo processes resumes on 1 process and continues with the same batches and losses."""

import pytest
import torch

from tests.train.parallel_workers import build, fit, spawn
from train.parallel import Parallel

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("parallel", [{"ep": 2}, {"dp_shard": -1}], ids=["ddp+ep", "fsdp"])
def test_two_process_checkpoint_resumes_on_one_process(tmp_path, parallel):
    torch.set_num_threads(1)
    local = Parallel.local(torch.device("cpu"))
    ref = fit(build(tmp_path / "ref", parallel=local, grad_accum=2, steps=6))
    first = spawn({"run_dir": str(tmp_path / "run"), "steps": 6, "stop_after": 3, "parallel": parallel},
                  tmp_path / "first.json")
    assert first["losses"] == pytest.approx(ref["losses"][:3], abs=1e-5)
    resumed = build(tmp_path / "run", parallel=local, grad_accum=2, steps=6, resume=True)
    resumed.model.reset_parameters()  # the checkpoint must win over fresh weights
    second = fit(resumed)
    assert second["positions"] == ref["positions"][3:]  # the same global batches
    assert second["losses"] == pytest.approx(ref["losses"][3:], abs=1e-5)
