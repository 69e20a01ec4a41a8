"""The memory limit the diagnosis compares to comes from the device when there is one (a GPU faked on CPU)."""

import torch

from tests.pipelines.report_util import log_record, write_run
from winnow.pipelines.report import diagnose
from winnow.pipelines.report.training import load_run
from winnow.train.metrics import memory_stats

GIB = 2**30


def test_gpu_memory_stats_carry_the_device_limit_and_the_diagnosis_uses_it(monkeypatch, tmp_path):
    cuda = torch.device("cuda", 0)
    seen = []
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d: seen.append(d) or (3 * GIB, 24 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d: 20 * GIB)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d: 23 * GIB)
    stats = memory_stats(cuda)
    assert stats == {"allocated_gib": 20.0, "peak_gib": 23.0, "limit_gib": 24.0} and seen == [cuda]

    run = write_run(tmp_path / "run", [log_record(s, loss=3.0, memory=stats) for s in range(5, 30, 5)])
    found = {f.rule: f for f in diagnose(load_run(run))}["memory"]
    assert "23.00 GiB = 96% of 24.00 GiB (logged by the run)" in found.evidence[0]


def test_cpu_memory_stats_have_no_device_limit():
    assert "limit_gib" not in memory_stats(torch.device("cpu"))
