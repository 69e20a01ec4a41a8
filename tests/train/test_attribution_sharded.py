"""Attribution where ranks hold pieces of the parameters (FSDP2, expert and tensor parallel) equals one process's.

Each rank splits the step over its own pieces (FSDP2 shards, its experts, its tensor-parallel
slices) and the dot products are summed over the ranks, each piece counted once
(``train/attribution/pieces.py``); every record must be the one-process run's up to fp32 rounding.
"""

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.train.parallel_workers import start
from tests.train.test_attribution import L, _records, _trainer
from tests.train.test_attribution import _setting as _base_setting
from tests.train.test_attribution_ddp import MODEL, _rows
from winnow.train.data import Batch
from winnow.train.parallel import Parallel, ParallelConfig, exit_process, shutdown

pytestmark = pytest.mark.slow

LAYOUTS = {
    "fsdp": {"dp_shard": -1},
    "ep": {"ep": 2},
    "fsdp_ep": {"dp_shard": -1, "ep": 2},
    "tp": {"tp": 2},
    "tp_sp": {"tp": 2, "sequence_parallel": True},
    "fsdp_tp": {"dp_shard": 2, "dp_replicate": 1, "tp": 2},
    "pp": {"pp": 2, "pp_schedule": "1f1b"},
}
WORLD = {"fsdp_tp": 4}  # processes of a layout (2 when not named)
DEEP = dataclasses.replace(MODEL, n_layers=2)  # a block per pipeline stage
STEPS, EVERY = 4, 2


def _worker(rank: int, world: int, port: int, run_dir: str, layout: dict, split: str) -> None:
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
        parallel = Parallel.from_env(ParallelConfig(**layout), device="cpu", n_experts=MODEL.n_experts)
        heldout, train = _setting(12, mixed=layout.get("sequence_parallel", False))
        if parallel.world.dp_size > 1:  # both sources on each data-parallel rank; tp ranks share the batch
            train = _rows(train, [0, 1, 4, 5] if parallel.world.dp_rank == 0 else [2, 3, 6, 7])
        trainer = _trainer(
            Path(run_dir),
            train,
            heldout,
            steps=STEPS,
            every=EVERY,
            split=split,
            grad_accum=2,
            parallel=parallel,
            model=DEEP if "pp" in layout else MODEL,
        )
        trainer.fit()
    finally:
        shutdown()
    exit_process(0)  # a spawned rank that finished: no finalization for gloo's threads to race


def _setting(seed: int, *, mixed: bool = False):
    """The attribution tests' data; ``mixed``: two rows' second halves from another source, so a rank's part of
    the sequence (sequence parallelism) holds other sources than the whole row."""
    heldout, train = _base_setting(seed)
    if mixed:
        ids = train.source_ids.clone()
        ids[:, L // 2 :] = ids.roll(1, 0)[:, L // 2 :]  # rows 0 and 4 now hold two sources each
        train = Batch(train.tokens, train.targets, ids, train.loss_mask, train.doc_ids)
    return heldout, train


def _run(tmp_path, name: str, split: str) -> dict:
    os.environ["OMP_NUM_THREADS"] = "1"
    world = WORLD.get(name, 2)
    start(_worker, world, str(tmp_path / name), LAYOUTS[name], split)
    return _records(tmp_path / name)


def _assert_same_records(got: list[dict], ref: list[dict]) -> None:
    # fp32, sums in another order. What must add up (measured, unattributed and its parts, residual)
    # agrees to 1e-6 of the largest measured change (measured: 1e-7 of it, 1e-8 seen here); a matrix cell
    # to 1e-4 of it: where two sources' gradients nearly cancel, Adam divides each source's part by the
    # small total's second moment, amplifying rounding (plain DDP, whose ranks hold every parameter,
    # moves the cells by the same 4e-5 of the scale here, and FSDP2, EP and FSDP2 x EP by the same amount)
    assert len(got) == len(ref) == STEPS // EVERY
    for mine, theirs in zip(got, ref):
        scale = np.abs(theirs["measured"]).max()
        np.testing.assert_allclose(mine["measured"], theirs["measured"], rtol=0, atol=1e-7 * scale)
        np.testing.assert_allclose(mine["matrix"], theirs["matrix"], rtol=0, atol=1e-4 * scale)
        for key in ("unattributed", "residual"):
            np.testing.assert_allclose(mine[key], theirs[key], rtol=0, atol=1e-6 * scale, err_msg=key)
        for key, value in theirs["unattributed_parts"].items():
            np.testing.assert_allclose(mine["unattributed_parts"][key], value, rtol=0, atol=1e-6 * scale, err_msg=key)
        assert mine["sources"] == theirs["sources"] and mine["steps"] == theirs["steps"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One-process runs by (split, mixed data), made once for every layout."""
    torch.set_num_threads(1)
    out = {}

    def get(split: str, mixed: bool = False, model=MODEL) -> list[dict]:
        key = split, mixed, model.n_layers
        if key not in out:
            heldout, train = _setting(12, mixed=mixed)
            folder = tmp_path_factory.mktemp(f"one-{split}")
            _trainer(folder, train, heldout, steps=STEPS, every=EVERY, split=split, grad_accum=2, model=model).fit()
            out[key] = _records(folder)
        return out[key]

    return get


# the experts' layouts with the default split; FSDP2 and EP alone with one backward per source
# (held-out and per-source gradients taken through FSDP2's unsharded parameters, the all-to-all on every rank);
# sequence parallel on rows whose halves hold different sources (the norms split this rank's half by source); FSDP2 x TP
# on 4 processes (each tp part's pieces sharded over dp_shard); PP 2 (the probe through the stages)
@pytest.mark.parametrize(
    "name, split",
    [
        ("fsdp_ep", "tokens"),
        ("tp", "tokens"),
        ("fsdp", "losses"),
        ("ep", "losses"),
        ("tp_sp", "tokens"),
        ("fsdp_tp", "tokens"),
        ("pp", "tokens"),
    ],
)
def test_sharded_layouts_give_the_one_process_attribution(tmp_path, reference, name, split):
    got = _run(tmp_path, name, split)
    _assert_same_records(
        got,
        reference(split, mixed=LAYOUTS[name].get("sequence_parallel", False), model=DEEP if name == "pp" else MODEL),
    )
    matrix, measured = np.abs(got[-1]["matrix"]), np.abs(got[-1]["measured"])
    assert matrix.max() > 0.1 * measured.max(), "the sources moved the held-out losses"
