"""Attribution under 2-process gloo DDP with gradient accumulation equals the one-process run's."""

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.train.parallel_workers import start
from tests.train.test_attribution import _MODEL, _records, _setting, _trainer
from winnow.train.data import Batch
from winnow.train.parallel import Parallel, ParallelConfig, exit_process, shutdown

pytestmark = pytest.mark.slow
# the router's balancing loss is a mean over each rank's own tokens under data parallelism, so a run with
# it differs from one process by more than rounding; without it the two runs do the same arithmetic
MODEL = dataclasses.replace(_MODEL, load_balance="none", z_loss_coef=0.0)


def _rows(batch: Batch, rows: list[int]) -> Batch:
    return Batch(*(getattr(batch, k)[rows] for k in ("tokens", "targets", "source_ids", "loss_mask", "doc_ids")))


def _worker(rank: int, world: int, port: int, run_dir: str, split: str) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)
    try:
        parallel = Parallel.from_env(ParallelConfig(), device="cpu", n_experts=4)
        heldout, train = _setting(12)
        half = _rows(train, [0, 1, 4, 5] if rank == 0 else [2, 3, 6, 7])  # both sources on each rank
        trainer = _trainer(
            Path(run_dir), half, heldout, steps=4, every=2, split=split, grad_accum=2, parallel=parallel, model=MODEL
        )
        trainer.fit()
    finally:
        shutdown()
    exit_process(0)  # a spawned rank that finished: no finalization for gloo's threads to race


@pytest.mark.parametrize("split", ["tokens", "losses"])
def test_ddp_with_accumulation_gives_the_one_process_attribution(tmp_path, split):
    heldout, train = _setting(12)
    _trainer(tmp_path / "one", train, heldout, steps=4, every=2, split=split, grad_accum=2, model=MODEL).fit()
    os.environ["OMP_NUM_THREADS"] = "1"
    start(_worker, 2, str(tmp_path / "ddp"), split)
    one, ddp = _records(tmp_path / "one")[-1], _records(tmp_path / "ddp")[-1]
    np.testing.assert_allclose(ddp["measured"], one["measured"], rtol=1e-4, atol=1e-6)
    scale = np.abs(one["measured"]).max()
    for key in ("matrix", "unattributed", "residual"):
        np.testing.assert_allclose(ddp[key], one[key], rtol=0, atol=1e-3 * scale, err_msg=key)
    for key, value in one["unattributed_parts"].items():
        np.testing.assert_allclose(ddp["unattributed_parts"][key], value, rtol=0, atol=1e-3 * scale, err_msg=key)
    assert json.dumps(ddp["sources"]) == json.dumps(one["sources"])
