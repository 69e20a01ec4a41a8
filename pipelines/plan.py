"""``winnow plan``: size a run from a budget (model, tokens, parallel layout), or cost a job's ``[train]`` run."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from winnow.train.errors import ConfigError
from winnow.train.plan import hardware
from winnow.train.plan.budget import DEFAULT_MFU, describe, duration, measured_mfu, plan_run
from winnow.train.plan.hardware import DEVICES, LINKS_GBPS


def register(sub: argparse._SubParsersAction) -> None:
    q = sub.add_parser("plan", help="size a run from a compute budget, or estimate a job's [train] run")
    q.add_argument("job", type=Path, nargs="?", help="a job file: estimate its [train] run's time and memory instead")
    q.add_argument(
        "--gpu",
        help=f"device type, one of: {', '.join(DEVICES)} (default: this machine's accelerator, "
        "with the memory the driver reports, when it has one; else h100)",
    )
    q.add_argument("--gpus", type=int, default=8, help="number of devices (default 8)")
    q.add_argument("--hours", type=float, help="wall-clock hours on those devices (the budget)")
    q.add_argument("--flops", type=float, help="the budget in FLOPs instead of hours")
    q.add_argument("--from", dest="from_run", help="a run folder: use the MFU it measured instead of 35%%")
    q.add_argument("--mfu", type=float, help="expected MFU (default 0.35, or measured with --from)")
    q.add_argument("--experts", type=int, help="routed experts (default 8; 0 = dense)")
    q.add_argument("--top-k", type=int, help="experts per token (default 2)")
    q.add_argument("--seq-len", type=int, help="sequence length (default 4096)")
    q.add_argument("--vocab", type=int, help="vocabulary size (default 32768)")
    q.add_argument(
        "--memory-gib",
        type=float,
        help="override the device's memory (default: the local device's "
        "when it is the one planned for, else the table's)",
    )
    q.add_argument("--peak-tflops", type=float, help="override the device's dense bf16 peak")
    q.add_argument("--intra", help=f"link inside a node: GB/s or one of {', '.join(LINKS_GBPS)}")
    q.add_argument("--inter", help="link across nodes, per device: GB/s or a link name")
    q.add_argument("--gpus-per-node", type=int, help="devices per node (default: the table's, usually 8)")
    q.set_defaults(func=run_plan)


def check_flags(args: argparse.Namespace) -> None:
    """``ConfigError`` naming the first flag whose number no device or model can have."""

    def refuse(flag: str, value, allowed: str) -> None:
        raise ConfigError(f"{flag} = {value} is invalid; allowed: {allowed}")

    for flag, value, low in (("--gpus", args.gpus, 1), ("--experts", args.experts, 0), ("--top-k", args.top_k, 1),
                             ("--seq-len", args.seq_len, 1), ("--vocab", args.vocab, 1),
                             ("--gpus-per-node", args.gpus_per_node, 1)):  # fmt: skip
        if value is not None and value < low:
            refuse(flag, value, f"an integer >= {low}")
    if args.hours is not None and args.flops is not None:  # one budget: neither may silently override the other
        raise ConfigError(
            f"--hours {args.hours:g} and --flops {args.flops:g} are two budgets; give one of them (--hours plans for "
            "the time on --gpus devices, --flops for that many FLOPs)"
        )
    if args.experts and args.top_k > args.experts:
        refuse("--top-k", args.top_k, f"at most --experts ({args.experts})")
    for flag, value in (("--memory-gib", args.memory_gib), ("--peak-tflops", args.peak_tflops)):
        if value is not None and not (math.isfinite(value) and value > 0):
            refuse(flag, value, "a finite number > 0")
    if args.mfu is not None and not (math.isfinite(args.mfu) and 0 < args.mfu <= 1):
        refuse("--mfu", args.mfu, "a fraction in (0, 1]")
    for flag, link in (("--intra", args.intra), ("--inter", args.inter)):
        try:
            speed = float(link) if link is not None else None
        except ValueError:
            continue  # a link's name: hardware.resolve checks it
        if speed is not None and not (math.isfinite(speed) and speed > 0):
            refuse(flag, link, f"GB/s as a finite number > 0, or one of {', '.join(LINKS_GBPS)}")


#: What the budget mode sizes; a job file's [train] already says each (``_estimate_job``).
_BUDGET_FLAGS = {"hours": "--hours", "flops": "--flops", "experts": "--experts", "top_k": "--top-k",
                 "seq_len": "--seq-len", "vocab": "--vocab"}  # fmt: skip
_DEFAULTS = {"experts": 8, "top_k": 2, "seq_len": 4096, "vocab": 32768}


def run_plan(args: argparse.Namespace) -> int:
    given = [flag for key, flag in _BUDGET_FLAGS.items() if getattr(args, key) is not None]
    if args.job is not None and given:  # the estimate reads the job's model, batch and steps: these would be ignored
        raise ConfigError(
            f"{', '.join(given)} size a run from a budget; with a job file the estimate is of its [train] run (its "
            f"model, batch and steps): drop {'it' if len(given) == 1 else 'them'}, or plan without the job file"
        )
    for key, value in _DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    check_flags(args)
    dev, memory_basis = hardware.resolve(
        args.gpu,
        memory_gib=args.memory_gib,
        peak_tflops=args.peak_tflops,
        intra=args.intra,
        inter=args.inter,
        per_node=args.gpus_per_node,
        local=hardware.local_device(),
    )
    print(f"device memory: {dev.memory_gib:g} GiB per device, {memory_basis}")
    mfu, basis = (
        (args.mfu, "given") if args.mfu is not None else (DEFAULT_MFU, "assumed; --from RUN uses a measured one")
    )
    if args.from_run is not None and args.mfu is None:
        mfu, basis = measured_mfu(args.from_run), f"measured in {args.from_run}"
    if args.job is not None:
        return _estimate_job(args, dev, mfu)
    hours = args.hours if args.hours is not None or args.flops is not None else 24.0
    plan = plan_run(
        dev,
        gpus=args.gpus,
        hours=hours if args.flops is None else None,
        flops=args.flops,
        mfu=mfu,
        mfu_basis=basis,
        n_experts=args.experts,
        top_k=args.top_k,
        vocab_size=args.vocab,
        seq_len=args.seq_len,
    )
    if args.hours is None and args.flops is None:
        print("no budget given: planning 24 h (set --hours or --flops)")
    print(describe(plan, dev, args.gpus))
    return 0


def _estimate_job(args: argparse.Namespace, dev, mfu: float) -> int:
    from winnow.pipelines.train import load_train_config
    from winnow.train.planner import estimate_run

    est = estimate_run(load_train_config(args.job), peak_flops=dev.peak_flops, utilization=mfu, devices=args.gpus)
    print(
        f"[train] run on {args.gpus} x {dev.name}: {est['total_params'] / 1e6:.2f}M total / "
        f"{est['active_params'] / 1e6:.2f}M active params, {est['tokens'] / 1e6:.2f}M tokens "
        f"({est['tokens_per_param']:.1f} per active param), {est['flops']:.3g} FLOPs ≈ {duration(est['hours'])} "
        f"at MFU {mfu:.0%}, ≈ {est['memory_gib_per_device']:.2f} GiB per device"
    )
    return 0
