"""MFU's peak FLOP/s comes from the machine the run is on, with its source named."""

from __future__ import annotations

import subprocess
from pathlib import Path

import torch

from winnow.train.metrics import measured_peak, peak_flops_basis

ROOT = Path(__file__).resolve().parents[2]


def test_a_configured_peak_wins():
    assert peak_flops_basis(torch.device("cpu"), 1e12) == (1e12, "configured (train.metrics.peak_flops)")


def test_a_cpu_peak_is_measured_once_per_thread_count_without_touching_the_random_state():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    measured_peak.cache_clear()
    peak, basis = peak_flops_basis(torch.device("cpu"), None)
    assert torch.equal(torch.rand(3), expected)  # constant inputs: a run's random stream is unchanged
    assert peak > 1e8 and basis.startswith("this CPU, measured: the best of ")
    assert f"on {torch.get_num_threads()} thread(s)" in basis
    assert peak_flops_basis(torch.device("cpu"), None) == (peak, basis)  # cached


def test_a_known_gpu_takes_the_accelerator_tables_peak(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    peak, basis = peak_flops_basis(torch.device("cuda", 0), None)
    assert peak == 989e12 and basis == "NVIDIA H100 80GB HBM3: the accelerator table's dense bf16 peak for H100 SXM"


def test_no_tracked_file_names_a_path_outside_the_repository():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    outside = ("PERF_NOTES", "shared/DESIGN.md", "shared/STYLE.md", "/work/")
    mine = str(Path(__file__).relative_to(ROOT))
    found = [
        f"{name}: {word}"
        for name in files
        if name.endswith((".py", ".md", ".toml")) and name != mine
        for word in outside
        if word in (ROOT / name).read_text(errors="replace")
    ]
    assert found == []
