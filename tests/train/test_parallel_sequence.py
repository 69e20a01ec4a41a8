"""Sequence parallelism (tp 2 on gloo): the same run as one process, on half the sequence between the split regions."""

import json
import os
from pathlib import Path

import pytest
import torch

from tests.train.parallel_workers import reference_run, spawn, start
from tests.train.test_parallel_tensor import _assert_same_run
from tests.train.test_trainer_loop import SyntheticBatches, tiny_config
from winnow.train.errors import ConfigError
from winnow.train.model import Transformer
from winnow.train.model.layers import RMSNorm
from winnow.train.parallel import Parallel, ParallelConfig, exit_process, shutdown

pytestmark = pytest.mark.slow

# a dense first block (the split SwiGLU), MoE after it, a shared expert (its partial sum joins the experts')
MODEL = {"n_shared_experts": 1, "n_dense_layers": 1, "n_layers": 3}


def test_sequence_parallel_two_processes_match_one_process(tmp_path):
    ref = reference_run(tmp_path, steps=5, grad_accum=1, model=MODEL)
    got = spawn(
        {"run_dir": str(tmp_path / "sp"), "steps": 5, "model": MODEL, "parallel": {"tp": 2, "sequence_parallel": True}},
        tmp_path / "out.json",
    )
    _assert_same_run(got, ref, tmp_path / "sp", tmp_path / "ref")  # losses 1e-5, per-source sums, norms
    assert got["comm"]["seconds"] > 0 and got["comm"]["bytes_sent"] > 0


def _saved_worker(rank: int, world: int, port: int, sequence_parallel: bool, out: str) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    try:
        parallel = Parallel.from_env(
            ParallelConfig(tp=2, sequence_parallel=sequence_parallel), device="cpu", n_experts=4
        )
        cfg = tiny_config(Path(out).parent, model=MODEL)
        torch.manual_seed(cfg.seed)
        model = Transformer(cfg.model)
        parallel.parallelize(model)
        batch = SyntheticBatches().make(0)
        norm_lengths = []
        for m in model.modules():
            if isinstance(m, RMSNorm):
                m.register_forward_pre_hook(lambda _m, args: norm_lengths.append(args[0].shape[1]))
        saved = {"count": 0, "bytes": 0}

        def pack(t):
            saved["count"] += 1
            saved["bytes"] += t.numel() * t.element_size()
            return t

        before = parallel.comm.bytes_sent
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out_ = model(batch.tokens, batch.doc_ids)
            loss = torch.nn.functional.cross_entropy(out_.logits_BLV.flatten(0, 1), batch.targets.flatten())
        loss.backward()
        result = {
            **saved,
            "norm_lengths": norm_lengths,
            "seq": batch.tokens.shape[1],
            "loss": loss.item(),
            "comm_bytes": parallel.comm.bytes_sent - before,
            "comm_seconds": parallel.comm.seconds,
        }
        Path(f"{out}.{rank}").write_text(json.dumps(result))
    finally:
        shutdown()
    exit_process(0)  # a spawned rank that finished: no finalization for gloo's threads to race


def _saved(tmp_path, sequence_parallel: bool) -> list[dict]:
    out = tmp_path / f"saved-{sequence_parallel}.json"
    start(_saved_worker, 2, sequence_parallel, str(out))
    return [json.loads(Path(f"{out}.{r}").read_text()) for r in range(2)]


def test_sequence_parallel_norms_see_half_the_sequence_and_fewer_activations_are_saved(tmp_path):
    plain, seq = _saved(tmp_path, False), _saved(tmp_path, True)
    for p, s in zip(plain, seq, strict=True):
        assert s["loss"] == pytest.approx(p["loss"], abs=1e-6)  # the same forward
        assert set(p["norm_lengths"]) == {p["seq"]}  # without it every norm runs on the whole sequence
        assert set(s["norm_lengths"]) == {s["seq"] // 2}  # with it, on this rank's half (7 norms: 2 per block + final)
        assert len(s["norm_lengths"]) == 2 * MODEL["n_layers"] + 1
        assert s["bytes"] < p["bytes"]  # the norms' saved inputs are half as long
        assert s["comm_bytes"] > 0 and s["comm_seconds"] > 0  # the gathers and scatters are timed for comm_pct


def test_sequence_parallel_needs_tp():
    with pytest.raises(ConfigError, match="train.parallel.sequence_parallel.*tp > 1"):
        ParallelConfig(sequence_parallel=True)
    assert ParallelConfig(tp=2, sequence_parallel=True).sequence_parallel
    assert ParallelConfig(tp=2, pp=2, sequence_parallel=True).sequence_parallel  # stages exchange sequence parts


def test_a_sequence_length_tp_does_not_divide_is_an_error_naming_the_key():
    from winnow.train.parallel.tensor_parallel import _seq_part

    x = torch.arange(2 * 6 * 3.0).view(2, 6, 3)
    assert torch.equal(_seq_part(x, 1, 2), x[:, 3:])  # rank 1 holds the second half of every sequence
    with pytest.raises(ConfigError, match="train.data.seq_len"):
        _seq_part(torch.zeros(2, 15, 3), 0, 2)
