"""DCP checkpoints resume on another mesh: saved on 2 gloo processes or 1, resumed on 1 or 2, in another layout.

Whatever the two meshes, the resumed run reads the same global batches and reaches the
uninterrupted one-process run's losses (the global batch is fixed: one process accumulates
over as many micro-batches as the other run has data-parallel ranks).
"""

import pytest
import torch

from tests.train.parallel_workers import build, fit, spawn
from winnow.train.checkpoint import SHARDS_DIR, CheckpointManager
from winnow.train.parallel import Parallel

pytestmark = pytest.mark.slow

LOCAL = None  # one process, no torchrun


def _reference(tmp_path):
    return fit(build(tmp_path / "ref", parallel=Parallel.local(torch.device("cpu")), grad_accum=2, steps=6))


def _job(layout: dict) -> dict:
    """The 2-process job for ``layout``; under tp = 2 the one dp rank accumulates both micro-batches."""
    return {"parallel": layout, "grad_accum": 2 if layout.get("tp", 1) == 2 else 1}


def _first_half(tmp_path, layout) -> list[float]:
    """Train 3 of 6 steps on ``layout`` and checkpoint (a preempted run); its losses."""
    if layout is LOCAL:
        trainer = build(tmp_path / "run", parallel=Parallel.local(torch.device("cpu")), grad_accum=2, steps=6)
        losses = [trainer.train_step().loss for _ in range(3)]
        trainer.save_checkpoint()
        return losses
    return spawn(
        {"run_dir": str(tmp_path / "run"), "steps": 6, "stop_after": 3, **_job(layout)}, tmp_path / "first.json"
    )["losses"]


def _second_half(tmp_path, layout) -> dict:
    if layout is LOCAL:
        resumed = build(
            tmp_path / "run", parallel=Parallel.local(torch.device("cpu")), grad_accum=2, steps=6, resume=True
        )
        resumed.model.reset_parameters()  # the checkpoint must win over fresh weights
        return fit(resumed)
    return spawn(
        {"run_dir": str(tmp_path / "run"), "steps": 6, "resume": True, **_job(layout)}, tmp_path / "second.json"
    )


@pytest.mark.parametrize(
    ("saved", "resumed"),
    [
        ({"ep": 2}, LOCAL),  # DDP x EP on 2 -> 1 process
        ({"dp_shard": -1}, LOCAL),  # FSDP2 on 2 -> 1
        (LOCAL, {"dp_shard": -1}),  # 1 -> FSDP2 on 2
        ({"dp_shard": -1}, {"ep": 2}),  # FSDP2 -> DDP x EP: full-shard DTensors read back as expert shards
        ({"tp": 2}, LOCAL),  # TP 2 -> 1: the split weights were saved whole
        (LOCAL, {"tp": 2}),  # 1 -> TP 2: each rank keeps its part of the whole tensors
        ({"dp_shard": -1, "ep": 2}, LOCAL),  # FSDP2 x EP on 2 -> 1: experts gathered over edp, saved over ep
        (LOCAL, {"dp_shard": -1, "ep": 2}),  # 1 -> FSDP2 x EP: each rank's experts re-sharded over edp
    ],
    ids=[
        "ddp+ep-to-1",
        "fsdp-to-1",
        "1-to-fsdp",
        "fsdp-to-ddp+ep",
        "tp-to-1",
        "1-to-tp",
        "fsdp+ep-to-1",
        "1-to-fsdp+ep",
    ],
)
def test_a_checkpoint_resumes_on_another_mesh_with_the_uninterrupted_losses(tmp_path, saved, resumed):
    torch.set_num_threads(1)
    ref = _reference(tmp_path)
    first = _first_half(tmp_path, saved)
    assert first == pytest.approx(ref["losses"][:3], abs=1e-5)
    (checkpoint,) = CheckpointManager(tmp_path / "run" / "checkpoints").checkpoints()
    assert (checkpoint / SHARDS_DIR / ".metadata").is_file()  # weights and moments went through DCP
    assert len(list((checkpoint / SHARDS_DIR).glob("*.distcp"))) == (1 if saved is LOCAL else 2)  # one per rank
    second = _second_half(tmp_path, resumed)
    assert second["positions"][0] == ref["positions"][3]  # the same global batches (rank 0's stream)
    assert second["losses"] == pytest.approx(ref["losses"][3:], abs=1e-5)
