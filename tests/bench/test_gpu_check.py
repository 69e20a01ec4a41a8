"""bench/gpu.sh walks its whole path on a CPU: the shell script, the driver, the Trainer in bf16, the figures it prints."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from winnow.train.model import ModelConfig

ROOT = Path(__file__).resolve().parents[2]


def _driver():
    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "bench" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_gpu_check_runs_a_tiny_bf16_model_on_cpu_and_prints_the_trainers_figures():
    out = subprocess.run(
        [
            "bash",
            str(ROOT / "bench" / "gpu.sh"),
            "--preset",
            "tiny",
            "--device",
            "cpu",
            "--steps",
            "3",
            "--warmup",
            "2",
            "--peak-flops",
            "1e12",
            "--peer",
            "none",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        env={**os.environ, "PYTHON": sys.executable},
    ).stdout  # the venv's, activated or not
    r = json.loads(out.strip().splitlines()[-1])
    assert "tokens/s, MFU" in out
    assert r["precision"] == "bf16" and r["timed_steps"] == 3 and r["step"] == 5  # the record is the last step's
    assert r["tokens_per_s"] > 0 and r["memory"]["peak_rss_gib"] > 0
    shape, (batch, seq) = _driver().PRESETS["tiny"]
    assert (r["batch"], r["seq"]) == (batch, seq)
    cfg = ModelConfig(**shape, max_seq_len=seq)
    assert (r["total_params"], r["active_params"]) == cfg.param_counts()
    # MFU on active parameters: the trainer's tokens/s x FLOPs per token over the given peak
    assert r["mfu"] == pytest.approx(r["tokens_per_s"] * cfg.flops_per_token(seq) / 1e12, rel=1e-6)


def test_the_h200_preset_is_about_one_billion_parameters():
    shape, (_, seq) = _driver().PRESETS["h200"]
    total, active = ModelConfig(**shape, max_seq_len=seq).param_counts()
    assert 0.95e9 < total < 1.1e9 and active < total / 3


def _run_with_peer():
    return subprocess.run(
        [
            "bash",
            str(ROOT / "bench" / "gpu.sh"),
            "--preset",
            "tiny",
            "--device",
            "cpu",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--peak-flops",
            "1e12",
        ],
        capture_output=True,
        text=True,
        timeout=400,
        check=True,
        env={**os.environ, "PYTHON": sys.executable},
    ).stdout


def test_the_torchtitan_peer_trains_the_same_size_on_the_same_batches_and_prints_ratios():
    pytest.importorskip("torchtitan")
    why = _driver_peer().available()
    if why is not None:
        pytest.skip(f"torchtitan is installed but its MoE model does not import: {why}")
    out = _run_with_peer()
    r = json.loads(out.strip().splitlines()[-1])
    t = r["torchtitan"]
    assert (t["total_params"], t["active_params"]) == (r["total_params"], r["active_params"])  # the same size
    shape, (batch, seq) = _driver().PRESETS["tiny"]
    assert t["flops_per_token"] == ModelConfig(**shape, max_seq_len=seq).flops_per_token(seq)  # one FLOP convention
    assert (t["batch"], t["seq"], t["timed_steps"]) == (batch, seq, 2)
    assert t["tokens_per_s"] > 0 and abs(t["loss"] - r["loss"]) < 0.5  # both near ln(256) after 3 steps
    assert t["ratio"]["tokens_per_s"] == pytest.approx(r["tokens_per_s"] / t["tokens_per_s"])
    assert "x torchtitan tokens/s" in out and "torchtitan " in out


def _driver_peer():
    spec = importlib.util.spec_from_file_location("bench_gpu_torchtitan", ROOT / "bench" / "gpu_torchtitan.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_torchtitan_config_matches_winnows_h200_preset_parameter_for_parameter():
    pytest.importorskip("torchtitan")
    peer = _driver_peer()
    if peer.available() is not None:
        pytest.skip("torchtitan's MoE model does not import here")
    import torch

    shape, (_, seq) = _driver().PRESETS["h200"]
    cfg = peer.build(shape, seq)
    with torch.device("meta"):
        model = cfg.build()
    total, active, _ = peer.param_counts(model, cfg)
    assert (total, active) == ModelConfig(**shape, max_seq_len=seq).param_counts()


def test_without_torchtitan_the_check_says_why_the_peer_is_missing(monkeypatch, capsys):
    driver = _driver()
    import bench.gpu_torchtitan as peer

    monkeypatch.setattr(peer, "available", lambda: "ModuleNotFoundError: No module named 'torchtitan'")
    args = driver.argparse.Namespace(preset="tiny", device="cpu", steps=1, warmup=0, precision="bf16", tt_attn="sdpa")
    assert driver.measure_peer(args, {}) is None
    assert "torchtitan: not measured" in capsys.readouterr().out
