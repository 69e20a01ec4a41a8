"""The prepared GPU check's driver: winnow's ``Trainer`` on a bf16 MoE, reporting what its own metrics records say.

    bash bench/gpu.sh                                   # one H200: ~1.04B total / 0.25B active, 300 steps
    python bench/gpu.py --preset tiny --device cpu --steps 4   # the same code path on a CPU (the test runs this)

It trains through ``Trainer.fit`` (bf16 autocast, fp32 master weights, AdamW, the per-source
accounting, the stability checks) on synthetic token batches, so the figures are the trainer's
and not a hand-made loop's: tokens/s, MFU on active parameters (6·N_active + attention FLOPs
per token over the device's dense bf16 peak: 989 TFLOP/s on an H200) and the peak memory come
from the run's one ``metrics.jsonl`` record, which covers the timed steps only (``fit`` restarts
the throughput clock, so the warm-up steps before it — allocator growth, kernel selection — stay out). The last line is one
JSON object with the same figures, for scripts.

When ``import torchtitan`` works (it is not a project dependency: ``pip install torchtitan``, which on
0.3.0 also imports ``triton``), the same process then trains torchtitan's MoE at the same size on the
same batches (``bench/gpu_torchtitan.py``) and prints its figures and "winnow N x torchtitan" ratios;
``--peer none`` skips it. On a CPU the two peak-memory figures are the process's peak RSS, which the
second run cannot go below, so only the GPU's per-run allocator peaks compare.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from winnow.train.build import build_trainer  # noqa: E402
from winnow.train.checkpoint import CheckpointConfig  # noqa: E402
from winnow.train.config import TrainConfig  # noqa: E402
from winnow.train.data import Batch, LoaderConfig  # noqa: E402
from winnow.train.metrics import MetricsConfig  # noqa: E402
from winnow.train.model import ModelConfig  # noqa: E402
from winnow.train.parallel import Parallel  # noqa: E402

PRESETS = {  # ModelConfig keys, then (batch, seq)
    "h200": (
        dict(vocab_size=32768, dim=1024, n_layers=16, n_heads=16, ffn_hidden=1152, n_experts=16, top_k=2),
        (8, 2048),
    ),
    "tiny": (dict(vocab_size=256, dim=32, n_layers=2, n_heads=2, ffn_hidden=32, n_experts=4, top_k=2), (2, 32)),
}
H200_PEAK = 989e12  # dense bf16 FLOP/s


class RandomBatches:
    """Endless synthetic token batches, different every step (so the router sees varied loads); resumable."""

    def __init__(
        self, *, batch: int, seq: int, vocab: int, device: torch.device, rank: int = 0, world: int = 1
    ) -> None:
        self.batch, self.seq, self.vocab, self.device = batch, seq, vocab, device
        self.rank, self.world, self.position = rank, world, 0

    def __iter__(self):
        return self

    def __next__(self) -> Batch:
        g = torch.Generator().manual_seed(self.position + self.rank)
        self.position += self.world
        seq = torch.randint(0, self.vocab, (self.batch, self.seq + 1), generator=g)
        shape = (self.batch, self.seq)
        source_ids = (torch.arange(self.batch) % 2)[:, None].expand(shape).contiguous()  # two sources
        return Batch(
            seq[:, :-1].contiguous(),
            seq[:, 1:].contiguous(),
            source_ids,
            torch.ones(shape, dtype=torch.bool),
            torch.zeros(shape, dtype=torch.int32),
            [],
        )

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


def measure(
    *,
    preset: str,
    device: str,
    steps: int,
    warmup: int,
    precision: str,
    peak_flops: float | None,
    batch: int | None = None,
    seq: int | None = None,
) -> dict:
    """Train ``warmup + steps`` steps; the figures of the timed steps, from the trainer's last metrics record."""
    shape, (default_batch, default_seq) = PRESETS[preset]
    batch, seq = batch or default_batch, seq or default_seq
    dev = torch.device(device)
    model_cfg = ModelConfig(**shape, max_seq_len=seq)
    peak_flops = resolve_peak(dev, peak_flops)
    with tempfile.TemporaryDirectory(prefix="winnow-gpu-") as run_dir:
        cfg = TrainConfig(
            output=run_dir,
            steps=warmup + steps,
            model=model_cfg,
            precision=precision,
            eval_every=0,
            data=LoaderConfig(batch_size=batch, seq_len=seq, num_workers=0),
            metrics=MetricsConfig(log_every=warmup + steps, peak_flops=peak_flops),
            checkpoint=CheckpointConfig(every=0, resume=False),
        )
        torch.manual_seed(0)
        data = RandomBatches(batch=batch, seq=seq, vocab=model_cfg.vocab_size, device=dev)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        start = time.perf_counter()
        with build_trainer(cfg, data=data, sources=["a", "b"], parallel=Parallel.local(dev)) as trainer:
            total, active = trainer.model.cfg.param_counts()
            for _ in range(warmup):  # fit() starts its throughput clock afresh: these stay out of the record
                trainer.train_step()
            trainer.fit()
            basis, peak = trainer.peak_basis, trainer.peak_flops
        wall = time.perf_counter() - start
        records = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in records if "tokens_per_s" in r][-1]
    return {
        "preset": preset,
        "device": str(dev),
        "precision": precision,
        "total_params": total,
        "active_params": active,
        "batch": batch,
        "seq": seq,
        "timed_steps": steps,
        "step": last["step"],
        "tokens_per_s": last["tokens_per_s"],
        "mfu": last["mfu"],
        "mfu_basis": basis,
        "peak_flops": peak,
        "memory": last["memory"],
        "loss": last["loss"],
        "wall_s": wall,
    }


def resolve_peak(dev: torch.device, given: float | None) -> float | None:
    """The MFU basis: the given figure, 989 TFLOP/s on an H200, else None (the trainer's table decides)."""
    if given is None and dev.type == "cuda" and "H200" in torch.cuda.get_device_name(dev):
        return H200_PEAK
    return given


def _billions(n: int) -> str:
    return f"{n / 1e9:.3f}B" if n >= 1e8 else f"{n / 1e6:.3f}M"


def _peak_memory(mem: dict) -> str:
    return f"{mem['peak_gib']:.1f} GiB allocated" if "peak_gib" in mem else f"{mem.get('peak_rss_gib', 0):.2f} GiB RSS"


def measure_peer(args, winnow: dict) -> dict | None:
    """torchtitan's MoE at the preset's size on the same batches; None (and a line saying why) when it is absent."""
    import bench.gpu_torchtitan as peer

    why = peer.available()
    if why is not None:
        print(
            f"torchtitan: not measured, its MoE model does not import here ({why}); "
            "pip install torchtitan to add the peer"
        )
        return None
    shape, _ = PRESETS[args.preset]
    dev = torch.device(args.device)
    batches = RandomBatches(batch=winnow["batch"], seq=winnow["seq"], vocab=shape["vocab_size"], device=dev)
    r = peer.measure(
        shape=shape,
        batch=winnow["batch"],
        seq=winnow["seq"],
        device=args.device,
        steps=args.steps,
        warmup=args.warmup,
        precision=args.precision,
        peak_flops=winnow["peak_flops"],
        batches=batches,
        attn=args.tt_attn,
    )
    print(
        f"torchtitan {_billions(r['total_params'])} total / {_billions(r['active_params'])} active "
        f"(winnow: {_billions(winnow['total_params'])} / {_billions(winnow['active_params'])}), {args.precision}, "
        f"{r['attention']} attention, same batches: {r['tokens_per_s']:,.0f} tokens/s, "
        f"MFU {100 * r['mfu']:.1f}% on active parameters, peak memory {_peak_memory(r['memory'])}, "
        f"loss {r['loss']:.3f}, wall {r['wall_s']:.0f} s"
    )
    ratio = {"tokens_per_s": winnow["tokens_per_s"] / r["tokens_per_s"], "mfu": winnow["mfu"] / r["mfu"]}
    mem_w, mem_t = winnow["memory"], r["memory"]
    if "peak_gib" in mem_w and "peak_gib" in mem_t:
        ratio["peak_memory"] = mem_w["peak_gib"] / mem_t["peak_gib"]
    print(
        f"winnow {ratio['tokens_per_s']:.2f} x torchtitan tokens/s, {ratio['mfu']:.2f} x torchtitan MFU"
        + (
            f", {ratio['peak_memory']:.2f} x torchtitan peak memory"
            if "peak_memory" in ratio
            else " (peak memory: process RSS on CPU, not comparable)"
        )
    )
    return {**r, "ratio": ratio}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="h200")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--steps", type=int, default=300, help="timed steps (after the warm-up)")
    p.add_argument("--warmup", type=int, default=20, help="untimed first steps")
    p.add_argument("--precision", choices=("bf16", "fp32", "fp16"), default="bf16")
    p.add_argument("--batch", type=int, help="sequences per step (default: the preset's)")
    p.add_argument("--seq", type=int, help="sequence length (default: the preset's)")
    p.add_argument("--peak-flops", type=float, help="MFU basis; default: 989e12 on an H200, else the trainer's table")
    p.add_argument(
        "--peer",
        choices=("auto", "none"),
        default="auto",
        help="auto: also train torchtitan's MoE at the same size when torchtitan imports",
    )
    p.add_argument(
        "--tt-attn",
        choices=("sdpa", "flex"),
        default="sdpa",
        help="torchtitan's attention: causal SDPA (winnow's kernel) or its FlexAttention (no CPU backward)",
    )
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda: this torch sees no CUDA device (use --device cpu with --preset tiny to check the path)")
    r = measure(
        preset=args.preset,
        device=args.device,
        steps=args.steps,
        warmup=args.warmup,
        precision=args.precision,
        peak_flops=args.peak_flops,
        batch=args.batch,
        seq=args.seq,
    )
    peak = _peak_memory(r["memory"])
    print(
        f"winnow {_billions(r['total_params'])} total / {_billions(r['active_params'])} active, {r['precision']}, "
        f"batch {r['batch']} x seq {r['seq']}, {r['timed_steps']} timed steps on {r['device']}: "
        f"{r['tokens_per_s']:,.0f} tokens/s, MFU {100 * r['mfu']:.1f}% on active parameters "
        f"(basis {r['mfu_basis']}), peak memory {peak}, loss {r['loss']:.3f}, wall {r['wall_s']:.0f} s"
    )
    if args.peer == "auto":
        r["torchtitan"] = measure_peer(args, r)
    print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
