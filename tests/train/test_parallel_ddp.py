"""2-process gloo DDP and FSDP2 runs against one process with the same global batch (fp32, CPU)."""

import json

import pytest
import torch

from tests.train.parallel_workers import build, per_source, records, reference_run, spawn
from winnow.train.parallel import Parallel

pytestmark = pytest.mark.slow


def test_ddp_two_processes_match_one_process_losses_and_per_source_sums(tmp_path):
    ref = reference_run(tmp_path, steps=5, grad_accum=2)
    got = spawn({"run_dir": str(tmp_path / "ddp"), "steps": 5, "parallel": {}}, tmp_path / "out.json")
    assert got["losses"] == pytest.approx(ref["losses"], abs=1e-5)
    assert got["norms"] == pytest.approx(ref["norms"], rel=1e-4)
    for mine, theirs in zip(per_source(tmp_path / "ddp"), per_source(tmp_path / "ref"), strict=True):
        assert mine == pytest.approx(theirs, rel=1e-5)
    assert got["comm"]["bytes_sent"] > 0 and got["comm"]["seconds"] > 0
    comm_pct = [r["comm_pct"] for r in records(tmp_path / "ddp") if "loss" in r]  # what the diagnosis reads
    assert len(comm_pct) == 5 and all(0 < pct < 100 for pct in comm_pct)
    assert all(r["comm_pct"] == 0 for r in records(tmp_path / "ref") if "loss" in r)  # one process: no collectives


def test_ddp_accumulating_micro_batches_all_reduces_once_per_step(tmp_path):
    # 2 ranks x 2 micro-batches = the one-process run with 4; gradients cross ranks only on each step's last micro-batch
    ref = reference_run(tmp_path, steps=3, grad_accum=4)
    got = spawn({"run_dir": str(tmp_path / "ddp"), "steps": 3, "grad_accum": 2, "parallel": {}}, tmp_path / "out.json")
    assert got["losses"] == pytest.approx(ref["losses"], abs=1e-5)
    assert got["norms"] == pytest.approx(ref["norms"], rel=1e-4)
    records = [json.loads(x) for x in (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()]
    grad_bytes = 4 * sum(
        p.numel()
        for p in build(
            tmp_path / "shape", parallel=Parallel.local(torch.device("cpu")), grad_accum=1, steps=1
        ).model.parameters()
    )
    sent = [r["comm"]["bytes_sent"] for r in records if "comm" in r]  # one record per step (log_every = 1)
    assert len(sent) == 3 and all(grad_bytes <= b < 2 * grad_bytes for b in sent)


def test_fsdp2_matches_the_run_ddp_matches(tmp_path):
    # DDP equals this one-process run (test above); FSDP2 is held to the same trajectory, one spawn instead of two
    ref = reference_run(tmp_path, steps=4, grad_accum=2)
    fsdp = spawn({"run_dir": str(tmp_path / "fsdp"), "steps": 4, "parallel": {"dp_shard": -1}}, tmp_path / "fsdp.json")
    assert fsdp["losses"] == pytest.approx(ref["losses"], abs=1e-5)
    assert fsdp["norms"] == pytest.approx(ref["norms"], rel=1e-4)
    # FSDP2's all-gathers and reduce-scatters are timed: each step moves more than the model's fp32 bytes
    param_bytes = 4 * sum(
        p.numel()
        for p in build(
            tmp_path / "shape", parallel=Parallel.local(torch.device("cpu")), grad_accum=1, steps=1
        ).model.parameters()
    )
    steps = [r for r in records(tmp_path / "fsdp") if "loss" in r]
    assert len(steps) == 4 and all(r["comm"]["bytes_sent"] > param_bytes for r in steps)
    assert all(0 < r["comm_pct"] < 100 for r in steps)


def test_powersgd_trains_and_reports_bytes_saved(tmp_path):
    got = spawn(
        {"run_dir": str(tmp_path / "psgd"), "steps": 5, "parallel": {"powersgd_rank": 1, "powersgd_start_iter": 2}},
        tmp_path / "psgd.json",
    )
    assert all((x == x and x < 10 for x in got["losses"]))  # finite
    records = [json.loads(x) for x in (tmp_path / "psgd" / "metrics.jsonl").read_text().splitlines()]
    comm = [r["comm"] for r in records if "comm" in r]  # one record per step (log_every = 1)
    assert comm[0]["bytes_saved"] == 0 < comm[0]["bytes_sent"]  # warm start: plain all-reduce
    # then rank-1 factors (n + m values) replace the n x m matrices
    assert comm[-1]["bytes_saved"] > comm[-1]["bytes_sent"] > 0


@pytest.mark.parametrize("stop_after", [1, 3])  # before PowerSGD starts, and after (its error feedback and Qs saved)
def test_a_resumed_powersgd_run_continues_exactly(tmp_path, stop_after):
    psgd = {"powersgd_rank": 1, "powersgd_start_iter": 2}
    whole = spawn({"run_dir": str(tmp_path / "whole"), "steps": 6, "parallel": psgd}, tmp_path / "whole.json")
    first = spawn(
        {"run_dir": str(tmp_path / "run"), "steps": 6, "stop_after": stop_after, "parallel": psgd},
        tmp_path / "first.json",
    )
    second = spawn(
        {"run_dir": str(tmp_path / "run"), "steps": 6, "resume": True, "parallel": psgd}, tmp_path / "second.json"
    )
    # bit for bit: DDP lays its buckets out again in the resumed process, and the state follows the parameters
    assert first["losses"] + second["losses"] == whole["losses"]
    assert second["norms"] == whole["norms"][stop_after:]
