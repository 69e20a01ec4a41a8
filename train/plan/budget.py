"""From a budget (GPU type and count with hours, or FLOPs) to model, tokens and layout.

Sizing follows Chinchilla (C = 6·N·D, D ≈ 20·N) on active parameters; the MFU is the one given,
or the median measured in a previous run's ``metrics.jsonl`` (``--from RUN``), else 35%.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from winnow.train.errors import ConfigError
from winnow.train.model import ModelConfig
from winnow.train.plan.hardware import Device
from winnow.train.plan.layout import Layout, best_layout, sequences_per_step
from winnow.train.plan.shape import model_for, non_embedding

TOKENS_PER_PARAM = 20.0
DEFAULT_MFU = 0.35
RECORD_BYTES = 64 << 20  # one line of metrics.jsonl: a logged step's record, per-source and per-expert tables too


@dataclass(frozen=True, slots=True)
class RunPlan:
    compute_flops: float
    mfu: float
    mfu_basis: str
    model: ModelConfig
    tokens: float
    seq_len: int
    global_seqs: int
    steps: int
    layout: Layout | None
    hours: float  # wall-clock on the given devices


def measured_mfu(run_dir: str | Path) -> float:
    """Median MFU of a run's logged steps (the first log step, with warm-up and compilation, left out)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise ConfigError(f"--from {run_dir}: no metrics.jsonl there; give a run folder of `winnow train`")
    if not path.is_file():  # a device or a pipe (a link to /dev/zero): read, it would never end
        raise ConfigError(
            f"--from {run_dir}: {path} is not a regular file (a folder, device, FIFO or socket); give a run folder "
            "of `winnow train`"
        )
    values = [r["mfu"] for r in _records(path, run_dir) if isinstance(r.get("mfu"), (int, float)) and r["mfu"] > 0]
    if not values:
        raise ConfigError(f"--from {run_dir}: {path} has no logged step with an MFU")
    return statistics.median(values[1:] or values)


def _records(path: Path, run_dir: str | Path) -> Iterator[dict]:
    """The JSON objects among a metrics file's lines (a killed run's torn last line, or any other, left out), read
    one line at a time under ``RECORD_BYTES``: the file is never held whole, and a line with no end is refused."""
    with open(path, "rb") as f:
        while line := f.readline(RECORD_BYTES + 1):
            if len(line) > RECORD_BYTES:
                raise ConfigError(
                    f"--from {run_dir}: {path} has a line over winnow's cap of {RECORD_BYTES} bytes for one record; "
                    "is it a run's metrics.jsonl? give a run folder of `winnow train`"
                )
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past what the parser can take
                continue
            if isinstance(record, dict):
                yield record


def plan_run(
    dev: Device,
    *,
    gpus: int,
    hours: float | None = None,
    flops: float | None = None,
    mfu: float = DEFAULT_MFU,
    mfu_basis: str = "assumed",
    n_experts: int = 8,
    top_k: int = 2,
    vocab_size: int = 32768,
    seq_len: int = 4096,
) -> RunPlan:
    """The compute-optimal model for the budget, its tokens, batch and layout, and the wall-clock it needs."""
    if (hours is None) == (flops is None):
        raise ConfigError("give a budget: --hours (with --gpu and --gpus) or --flops")
    if gpus < 1 or not 0 < mfu <= 1:
        raise ConfigError(f"--gpus must be >= 1 and the MFU in (0, 1]; got {gpus} and {mfu}")
    for flag, value in (("--hours", hours), ("--flops", flops)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{flag} = {value} is invalid; allowed: a finite number > 0")
    compute = flops if flops is not None else gpus * hours * 3600 * dev.peak_flops * mfu
    active = math.sqrt(compute / (6 * TOKENS_PER_PARAM))
    model = model_for(active, n_experts=n_experts, top_k=top_k, vocab_size=vocab_size, seq_len=seq_len)
    tokens = compute / model.flops_per_token(seq_len)  # the budget spent on this exact shape
    seqs = sequences_per_step(compute, seq_len)
    steps = max(1, round(tokens / (seqs * seq_len)))
    layout = best_layout(model, dev, gpus=gpus, seq_len=seq_len, global_seqs=seqs, mfu=mfu)
    step_s = (
        layout.step_s if layout else seqs * seq_len * model.flops_per_token(seq_len) / (gpus * dev.peak_flops * mfu)
    )
    return RunPlan(
        compute_flops=compute,
        mfu=mfu,
        mfu_basis=mfu_basis,
        model=model,
        tokens=tokens,
        seq_len=seq_len,
        global_seqs=seqs,
        steps=steps,
        layout=layout,
        hours=steps * step_s / 3600,
    )


def duration(hours: float) -> str:
    """A duration people read: never "0.00 h"."""
    seconds = hours * 3600
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.1f} days"
    if seconds >= 3600:
        return f"{hours:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    if seconds >= 1:
        return f"{seconds:.1f} s"
    return f"{seconds * 1000:.2g} ms"


def count(n: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.3g}"


def describe(plan: RunPlan, dev: Device, gpus: int) -> str:
    """The plan as the lines ``winnow plan`` prints."""
    m = plan.model
    total, active = non_embedding(m)
    lines = [
        f"budget: {plan.compute_flops:.3g} FLOPs on {gpus} x {dev.name} ({dev.memory_gib:g} GiB, "
        f"{dev.peak_flops / 1e12:g} TFLOP/s bf16) at MFU {plan.mfu:.1%} ({plan.mfu_basis})",
        f"model:  {count(active)} active / {count(total)} total params without embeddings "
        f"(dim {m.dim}, {m.n_layers} layers, {m.n_heads} heads, "
        + (
            f"{m.n_experts} experts top-{m.top_k} of width {m.ffn_hidden})"
            if m.is_moe
            else f"dense, ffn {m.ffn_hidden})"
        ),
        f"data:   {count(plan.tokens)} tokens ({plan.tokens / active:.0f} per active param), batch {plan.global_seqs} x "
        f"{plan.seq_len} = {count(plan.global_seqs * plan.seq_len)} tokens, {plan.steps:,} steps",
    ]
    lay = plan.layout
    if lay is None:
        lines.append(
            f"layout: none fits in {dev.memory_gib:g} GiB per device, even with tp, pp, ep and activation "
            "checkpointing; add devices or pick ones with more memory"
        )
    else:
        mem = ", ".join(f"{k} {v / 2**30:.1f}" for k, v in lay.memory.items())
        comm = ", ".join(f"{k} {1000 * v:.0f} ms" for k, v in lay.comm.items() if v)
        lines += [
            f"layout: dp {lay.dp} x tp {lay.tp} x pp {lay.pp}, ep {lay.ep} (inside dp)"
            + (", activation checkpointing" if lay.checkpointing else "")
            + f"; {lay.micro_batches} micro-batches per step",
            f"memory: {lay.memory_bytes / 2**30:.1f} of {dev.memory_gib:g} GiB per device ({mem})",
            f"step:   {duration(lay.step_s / 3600)} ({duration(lay.compute_s / 3600)} compute, pipeline bubble "
            f"{lay.bubble:.0%}, communication {lay.comm_share:.0%}" + (f": {comm}" if comm else "") + ")",
        ]
    lines.append(f"time:   {duration(plan.hours)} on {gpus} device{'s' if gpus > 1 else ''}")
    budget_hours = plan.compute_flops / (gpus * dev.peak_flops * plan.mfu) / 3600
    if lay is not None and plan.hours > 1.1 * budget_hours:
        lines.append(
            f"note:   over the budget's {duration(budget_hours)}: the budget counts every device at MFU "
            f"{plan.mfu:.1%}, but this layout spends its steps communicating and waiting on the pipeline; fewer "
            "devices, or more hours on them, make a run that keeps to its time"
        )
    model_line = (
        f"dim = {m.dim}, n_layers = {m.n_layers}, n_heads = {m.n_heads}, ffn_hidden = {m.ffn_hidden}, "
        f"n_experts = {m.n_experts}, top_k = {m.top_k}"
    )
    lines.append(
        f"[train.model] {model_line}"
        if lay is not None
        else f"no [train.model] fits (the budget's model: {model_line})"
    )
    return "\n".join(lines)
