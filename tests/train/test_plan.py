"""``winnow plan``: model, tokens and layout from a budget; memory per device checked against hand arithmetic."""

from __future__ import annotations

import json

import pytest

from winnow.train.errors import ConfigError
from winnow.train.model import ModelConfig
from winnow.train.plan.budget import duration, measured_mfu, plan_run
from winnow.train.plan.hardware import device
from winnow.train.plan.layout import memory_per_device

GiB = 2**30


def small_moe() -> ModelConfig:
    return ModelConfig(vocab_size=32768, dim=1024, n_layers=8, n_heads=8, ffn_hidden=1024, n_experts=8, top_k=2)


def test_memory_per_device_matches_hand_arithmetic():
    cfg = small_moe()
    # by hand: embeddings 2·32768·1024 = 67,108,864; per layer attention 4·1024² = 4,194,304, two norms 2,048,
    # router 8,192, experts 8·3·1024·1024 = 25,165,824 -> 29,370,368; 8 layers + embeddings + final norm:
    P = 8 * 29_370_368 + 67_108_864 + 1024
    assert cfg.param_counts()[0] == P == 302_072_832
    mem = memory_per_device(cfg, gpus=8, tp=2, pp=1, ep=2, seq_len=2048, checkpointing=False)
    assert mem["states"] == 16 * P / 8  # 604,145,664: sharded over all 8 devices
    assert mem["activations"] == 8 * 34 * 2048 * 1024 / 2  # 285,212,672: L·34·s·d / tp
    assert mem["logits"] == 2048 * 32768 * 6 / 2  # 201,326,592
    # one block gathered plus one prefetched, bf16: dense part 4,204,672 (incl. 1/8 of the final norm), experts / ep
    assert mem["gathered"] == pytest.approx(2 * 2 * (4_204_672 + 25_165_824 / 2) / 2)
    ckpt = memory_per_device(cfg, gpus=8, tp=2, pp=1, ep=2, seq_len=2048, checkpointing=True)
    assert ckpt["activations"] == 2 * 2048 * 1024 * 8 + 34 * 2048 * 1024 / 2


@pytest.mark.parametrize(
    ("gpu", "gpus", "hours", "memory_gib"),
    [
        ("l4", 1, 2, None),  # one small GPU: a ~60M-active model, nothing to split
        ("a100", 16, 12, None),  # two nodes
        ("h100", 64, 24, 16),  # memory-bound: 16 GiB per device forces splitting activations
    ],
)
def test_budget_layouts_fit_and_their_memory_is_the_formula(gpu, gpus, hours, memory_gib):
    dev = device(gpu, memory_gib=memory_gib)
    plan = plan_run(dev, gpus=gpus, hours=hours)
    lay = plan.layout
    assert lay is not None and lay.dp * lay.tp * lay.pp == gpus and lay.dp % lay.ep == 0
    cfg, s = plan.model, plan.seq_len
    total = cfg.param_counts()[0]
    hand = (
        16 * total / gpus
        + s * cfg.padded_vocab * 6 / lay.tp
        + (
            2 * s * cfg.dim * cfg.n_layers + 34 * s * cfg.dim / lay.tp
            if lay.checkpointing
            else cfg.n_layers * 34 * s * cfg.dim / lay.tp
        )
    )
    assert lay.memory_bytes - lay.memory["gathered"] == pytest.approx(hand)
    assert lay.memory_bytes <= 0.9 * dev.memory_gib * GiB
    # compute-optimal: the budget's FLOPs are what the model's tokens cost
    assert plan.tokens * cfg.flops_per_token(s) == pytest.approx(plan.compute_flops)
    assert plan.compute_flops == pytest.approx(gpus * hours * 3600 * dev.peak_flops * 0.35)
    assert plan.hours >= hours * 0.99  # communication and bubbles only add time to the MFU's estimate


def test_memory_bound_budget_splits_and_costs_communication():
    roomy = plan_run(device("h100"), gpus=64, hours=24)
    tight = plan_run(device("h100", memory_gib=16), gpus=64, hours=24)
    assert (roomy.layout.tp, roomy.layout.pp) == (1, 1)
    assert tight.layout.tp * tight.layout.pp > 1 or tight.layout.checkpointing
    assert tight.layout.step_s > roomy.layout.step_s


def test_nothing_fits_says_so():
    plan = plan_run(device("l4", memory_gib=1), gpus=1, hours=100)
    assert plan.layout is None


def test_mfu_from_a_previous_run(tmp_path):
    records = [{"step": 10, "mfu": 0.9}, {"step": 20, "mfu": 0.41}, {"step": 30, "mfu": 0.43}, {"step": 30, "eval": {}}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert measured_mfu(tmp_path) == pytest.approx(0.42)  # the first log step (warm-up) left out
    a, b = plan_run(device("h100"), gpus=8, hours=10, mfu=0.42), plan_run(device("h100"), gpus=8, hours=10)
    assert a.compute_flops == pytest.approx(b.compute_flops * 0.42 / 0.35)


def test_mfu_from_a_killed_run_skips_its_torn_line_and_a_file_is_not_a_run(tmp_path):
    records = [{"step": 10, "mfu": 0.9}, {"step": 20, "mfu": 0.41}, [1, 2], {"step": 30, "mfu": 0.43}]
    (tmp_path / "metrics.jsonl").write_bytes(
        b"".join(json.dumps(r).encode() + b"\n" for r in records) + b'\xff\n{"step": 40, "mf'
    )
    assert measured_mfu(tmp_path) == pytest.approx(0.42)
    with pytest.raises(ConfigError, match="no metrics.jsonl there"):
        measured_mfu(tmp_path / "metrics.jsonl")


def test_a_budget_spread_over_too_many_devices_says_it_overruns_and_plans_at_once():
    from winnow.train.plan.budget import describe
    from winnow.train.plan.layout import candidates

    plan = plan_run(device("h100"), gpus=10**9, hours=1)  # dp in the millions: expert sizes come from the experts
    assert plan.hours > 10 and "note:   over the budget's 1.0 h" in describe(plan, device("h100"), 10**9)
    assert {ep for _, _, ep in candidates(plan.model, device("h100"), 10**9)} <= {1, 2, 4, 8}
    huge = plan_run(device("h100"), gpus=8, hours=1e30)
    assert describe(huge, device("h100"), 8).splitlines()[-1].startswith("no [train.model] fits")


def test_durations_never_read_zero_hours():
    assert duration(0.004) == "14.4 s" and duration(1e-7) == "0.36 ms" and duration(0.5) == "30.0 min"
    assert duration(30) == "30.0 h" and duration(100) == "4.2 days"


def test_plan_command_prints_a_plan(capsys):
    from winnow.pipelines.cli import main

    assert main(["plan", "--gpu", "a100", "--gpus", "16", "--hours", "12"]) == 0
    out = capsys.readouterr().out
    assert "layout: dp 16 x tp 1 x pp 1" in out and "memory:" in out and "communication" in out
    assert "0.00 h" not in out and "time:   12.0 h on 16 devices" in out


def test_the_plan_reads_the_local_devices_memory_and_says_so(capsys, monkeypatch):
    import torch

    from winnow.pipelines.cli import main
    from winnow.train.plan import hardware

    # what torch reports on a machine with an H200 (the driver's total is below the 141 GB on the box)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index=0: (int(130.5 * GiB), int(139.8 * GiB)))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H200")
    local = hardware.local_device()
    assert local == hardware.LocalDevice("NVIDIA H200", pytest.approx(139.8), pytest.approx(130.5))

    assert main(["plan", "--gpus", "8", "--hours", "12"]) == 0
    out = capsys.readouterr().out
    assert "device memory: 139.8 GiB per device, this machine's NVIDIA H200: 139.8 GiB total, 130.5 GiB free" in out
    assert "on 8 x NVIDIA H200 (139.8 GiB, 989 TFLOP/s" in out and "of 139.8 GiB per device" in out

    # naming another device plans for the table's one, and says the local figure exists
    dev, basis = hardware.resolve("a100", local=local)
    assert dev.memory_gib == 80 and "table's figure" in basis and "NVIDIA H200 has 139.8 GiB" in basis
    # naming the same device type still takes the driver's figure; --memory-gib beats both
    assert hardware.resolve("h200", local=local)[0].memory_gib == 139.8
    assert hardware.resolve(None, memory_gib=40, local=local) == (
        hardware.device("h200", memory_gib=40),
        "given (--memory-gib)",
    )
    # a device the table lacks: its memory, the h100 entry's peak, and a line saying so
    dev, basis = hardware.resolve(None, local=hardware.LocalDevice("NVIDIA B300", 270.0, 270.0))
    assert (
        dev.memory_gib == 270.0 and dev.peak_flops == hardware.DEVICES["h100"].peak_flops and "--peak-tflops" in basis
    )


def test_without_a_local_device_the_plan_uses_the_table_and_says_so(capsys, monkeypatch):
    import torch

    from winnow.pipelines.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["plan", "--gpu", "a100", "--gpus", "16", "--hours", "12"]) == 0
    out = capsys.readouterr().out
    assert "device memory: 80 GiB per device, the table's figure for A100 80GB SXM (no accelerator" in out


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--top-k", "0"], "--top-k = 0 is invalid; allowed: an integer >= 1"),
        (["--top-k", "9"], "--top-k = 9 is invalid; allowed: at most --experts (8)"),
        (["--experts", "-1"], "--experts = -1 is invalid"),
        (["--gpus-per-node", "0"], "--gpus-per-node = 0 is invalid"),
        (["--intra", "0"], "--intra = 0 is invalid; allowed: GB/s as a finite number > 0, or one of"),
        (["--inter", "-5"], "--inter = -5 is invalid"),
        (["--peak-tflops", "nan"], "--peak-tflops = nan is invalid; allowed: a finite number > 0"),
        (["--memory-gib", "0"], "--memory-gib = 0.0 is invalid"),
        (["--mfu", "1.5"], "--mfu = 1.5 is invalid; allowed: a fraction in (0, 1]"),
        (["--flops", "1e20"], "--hours 1 and --flops 1e+20 are two budgets; give one of them"),  # --hours was ignored
    ],
)
def test_plan_flags_no_device_or_model_can_have_are_refused_naming_the_flag(capsys, flags, message):
    from winnow.pipelines.cli import main

    assert main(["plan", "--hours", "1", *flags]) == 2
    assert message in capsys.readouterr().err


def test_mfu_from_a_metrics_file_with_no_end_is_refused_naming_it(tmp_path, monkeypatch):
    """A metrics.jsonl linked to /dev/zero, or a line past the cap, was read whole until memory ran out."""
    from winnow.train.plan import budget

    (tmp_path / "metrics.jsonl").symlink_to("/dev/zero")
    with pytest.raises(ConfigError, match=r"metrics.jsonl is not a regular file"):
        measured_mfu(tmp_path)
    (tmp_path / "metrics.jsonl").unlink()
    good = json.dumps({"step": 10, "mfu": 0.4}) + "\n"
    (tmp_path / "metrics.jsonl").write_text(good + "[" * 5000 + "\n" + good)  # nested past the parser: skipped
    monkeypatch.setattr(budget, "RECORD_BYTES", 10_000)
    assert measured_mfu(tmp_path) == pytest.approx(0.4)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write("x" * 20_000 + "\n" + good)
    with pytest.raises(ConfigError, match=r"metrics.jsonl has a line over winnow's cap of 10000 bytes"):
        measured_mfu(tmp_path)


def test_a_job_files_estimate_refuses_the_budget_flags_it_would_ignore(tmp_path, capsys):
    """With a job file the estimate reads its [train] run; --seq-len, --hours and the rest were dropped without a
    word. A [job] with a name and no output trains on out/<name>, where `winnow curate` writes it."""
    from winnow.pipelines.cli import main
    from winnow.pipelines.train import load_train_config

    path = tmp_path / "t.toml"
    path.write_text('[job]\nname = "t"\n[train]\nsteps = 2\n[train.model]\ndim = 32\nn_layers = 1\nn_heads = 2\n')
    assert main(["plan", str(path), "--seq-len", "8192", "--hours", "2"]) == 2
    assert "--hours, --seq-len size a run from a budget; with a job file the estimate is of its [train] run" in (
        capsys.readouterr().err
    )
    assert load_train_config(path).shards == "out/t"
    assert main(["plan", str(path)]) == 0
