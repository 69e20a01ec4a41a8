"""Benchmark: winnow's MoE training step vs Hugging Face Mixtral, same shape, same batch (CPU, fp32).

    pip install transformers          # bench-only peer; not a winnow dependency
    python bench/trainer.py --rounds 5 --steps 3       # CPU: tokens/s of each contender and the ratios
    python bench/trainer.py --gpu                      # one GPU: bf16 ~0.9B-total MoE, tokens/s and MFU

Three contenders train the same Mixtral-shaped model (13.8M total / 4.3M
active, seq 256, batch 8) with AdamW and gradient clipping at 1.0:

- ``winnow model``: the bare ``Transformer``, cross-entropy + router loss, backward, winnow's
  optimizer (torch's fused AdamW kernel);
- ``winnow trainer``: ``Trainer.train_step`` — the same plus per-source loss and routing
  accounting, the NaN/spike check (one host sync), weight-decay groups, the LR schedule;
- ``HF Mixtral``: ``MixtralForCausalLM`` built from a config (no download), its own loss
  with the router auxiliary loss, ``torch.optim.AdamW(foreach=True)`` (the multi-tensor path; faster here than the default loop).

The last line is a roofline: the CPU's fp32 matmul rate on the model's widest shape, the share
of it each contender's training FLOPs reach, and the ratio over Mixtral that a step running
every FLOP at that rate (and nothing else: no attention softmax, no routing, no optimizer)
would have. It bounds what any implementation of the same math can show on this machine.

Every round runs each contender once, in an order that alternates between rounds
(A B C, C B A, ...), with one untimed warm-up step before each timing so the caches the
previous contender left are not charged to the next. The ratio printed is the median of
the per-round ratios (each against the Mixtral timing of the same round), which is what
stays meaningful on a shared, noisy machine; tokens per CPU-second of the process is printed
beside tokens per wall-second, as the figure that time spent descheduled does not distort.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
from winnow.train.build import build_trainer
from winnow.train.config import TrainConfig
from winnow.train.data import Batch, LoaderConfig, RepeatBatch
from winnow.train.metrics import peak_flops_basis
from winnow.train.model import ModelConfig, Transformer, cross_entropy_per_token
from winnow.train.optim import OptimConfig, build_optimizer

CPU_SHAPE = dict(vocab_size=320, dim=256, n_layers=4, n_heads=4, ffn_hidden=512, n_experts=8, top_k=2)
GPU_SHAPE = dict(vocab_size=32768, dim=1024, n_layers=16, n_heads=16, ffn_hidden=1024, n_experts=16, top_k=2)
AUX_COEF, CLIP, LR = 0.01, 1.0, 1e-4


def _model_config(shape: dict, seq: int) -> ModelConfig:
    return ModelConfig(**shape, max_seq_len=seq, aux_loss_coef=AUX_COEF, z_loss_coef=0.0)  # Mixtral has no z-loss


def winnow_step_fn(shape: dict, seq: int, device: torch.device, dtype: torch.dtype | None):
    """The bare model's training step (no accounting); returns (step(tokens, targets), config)."""
    cfg = _model_config(shape, seq)
    torch.manual_seed(0)  # both winnow contenders start from the same weights, so route alike
    model = Transformer(cfg).to(device)
    opt = build_optimizer(model, OptimConfig(lr=LR))

    def step(tokens, targets):
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            out = model(tokens)
            loss = cross_entropy_per_token(out.logits_BLV, targets).mean() + out.router_loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step, cfg


def _two_source_batch(tokens: torch.Tensor, targets: torch.Tensor) -> Batch:
    """The timed batch for the trainer, half of its rows from each of two sources."""
    B, L = tokens.shape
    source_ids = (torch.arange(B) % 2)[:, None].expand(B, L).contiguous()
    return Batch(
        tokens,
        targets,
        source_ids,
        torch.ones(B, L, dtype=torch.bool),
        torch.zeros(B, L, dtype=torch.int32),
        [("bench", b) for b in range(B)],
    )


def trainer_step_fn(shape: dict, seq: int, batch_size: int, run_dir: str):
    """winnow's full ``Trainer.train_step`` on the CPU, fp32; the step ignores its arguments (the loader has the batch)."""
    model_cfg = _model_config(shape, seq)
    cfg = TrainConfig(
        output=run_dir,
        model=model_cfg,
        steps=10**6,
        eval_every=0,
        optim=OptimConfig(lr=LR, grad_clip=CLIP, warmup_steps=0),
        data=LoaderConfig(batch_size=batch_size, seq_len=seq, num_workers=0),
    )
    holder: dict = {}

    def step(tokens, targets):
        if "trainer" not in holder:  # built on first use so the loader stand-in holds this batch
            batches = RepeatBatch(_two_source_batch(tokens, targets))
            holder["trainer"] = build_trainer(cfg, data=batches, sources=["a", "b"])
        holder["trainer"].train_step()

    return step


def mixtral_step_fn(shape: dict, seq: int):
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig(
        vocab_size=shape["vocab_size"],
        hidden_size=shape["dim"],
        intermediate_size=shape["ffn_hidden"],
        num_hidden_layers=shape["n_layers"],
        num_attention_heads=shape["n_heads"],
        num_key_value_heads=shape["n_heads"],
        num_local_experts=shape["n_experts"],
        num_experts_per_tok=shape["top_k"],
        max_position_embeddings=seq,
        output_router_logits=True,
        router_aux_loss_coef=AUX_COEF,
        attn_implementation="sdpa",
    )
    model = MixtralForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, foreach=True)

    def step(tokens, targets):
        loss = model(input_ids=tokens, labels=tokens).loss  # shifts internally
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def timed(step, batch, steps: int, sync=lambda: None) -> tuple[float, float]:
    """(tokens per wall second, tokens per CPU second of this process) over ``steps`` steps after one warm-up step.

    CPU time is the steadier figure on a shared machine: time spent descheduled is not counted.
    """
    step(*batch)
    sync()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step(*batch)
    sync()
    tokens = batch[0].numel() * steps
    return tokens / (time.perf_counter() - wall), tokens / (time.process_time() - cpu)


def matmul_peak(rows: int, dim: int, hidden: int, repeats: int = 20) -> float:
    """This CPU's fp32 matmul rate (FLOP/s, best of ``repeats``) on the model's widest shape: the roofline."""
    x, w = torch.randn(rows, dim), torch.randn(hidden, dim)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.nn.functional.linear(x, w)
        best = min(best, time.perf_counter() - start)
    return 2 * rows * dim * hidden / best


def _summary(name: str, rates: dict[str, list[float]]) -> str:
    line = f"{statistics.median(rates[name]):9,.0f}"
    if name != "mixtral":
        ratios = [w / m for w, m in zip(rates[name], rates["mixtral"])]
        line += f"  ratio {statistics.median(ratios):.2f}x (rounds {min(ratios):.2f}-{max(ratios):.2f}x)"
    return line


def run_cpu(args) -> None:
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tokens = torch.randint(0, CPU_SHAPE["vocab_size"], (args.batch, args.seq + 1))
    batch = (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
    run_dir = tempfile.mkdtemp(prefix="winnow-bench-trainer-")
    contenders = {"mixtral": mixtral_step_fn(CPU_SHAPE, args.seq)}
    if args.mode in ("model", "both"):
        contenders["winnow model"] = winnow_step_fn(CPU_SHAPE, args.seq, torch.device("cpu"), None)[0]
    if args.mode in ("trainer", "both"):
        contenders["winnow trainer"] = trainer_step_fn(CPU_SHAPE, args.seq, args.batch, run_dir)
    for step in contenders.values():
        step(*batch)  # first-call setup (allocator, kernel selection) stays out of every round
    wall: dict[str, list[float]] = {name: [] for name in contenders}
    cpu: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            w, c = timed(contenders[name], batch, args.steps)
            wall[name].append(w)
            cpu[name].append(c)
        print(
            f"round {r + 1}: "
            + ", ".join(f"{n} {wall[n][-1]:,.0f} ({cpu[n][-1]:,.0f})" for n in names)
            + " tok/s (per CPU-s)",
            flush=True,
        )
    print(
        f"batch {args.batch} x seq {args.seq}, fp32, {torch.get_num_threads()} threads, {args.rounds} rounds x "
        f"{args.steps} steps; ratios are medians of per-round ratios against HF Mixtral (shared machine: noisy)"
    )
    for name in names:
        print(f"  {name:15s} tokens/s {_summary(name, wall)}   tokens/CPU-s {_summary(name, cpu)}")
    # How far any implementation of this math can go here: every training FLOP at the matmul peak, nothing else
    peak = matmul_peak(args.batch * args.seq * CPU_SHAPE["top_k"], CPU_SHAPE["dim"], 2 * CPU_SHAPE["ffn_hidden"])
    flops = _model_config(CPU_SHAPE, args.seq).flops_per_token(args.seq)
    used = {name: statistics.median(wall[name]) * flops / peak for name in names}
    print(
        f"roofline: fp32 matmul peak here {peak / 1e9:.0f} GFLOP/s; share of it each contender's {flops / 1e6:.1f} "
        "MFLOP/token reach: "
        + ", ".join(f"{n} {100 * u:.0f}%" for n, u in used.items())
        + f"; a step running every FLOP at that peak and nothing else would be {1 / used['mixtral']:.2f}x Mixtral"
    )


def run_gpu(args) -> None:
    device = torch.device("cuda")
    torch.manual_seed(0)
    tokens = torch.randint(0, GPU_SHAPE["vocab_size"], (args.batch, args.seq + 1), device=device)
    batch = (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
    step, cfg = winnow_step_fn(GPU_SHAPE, args.seq, device, torch.bfloat16)
    total, active = cfg.param_counts()
    peak, basis = peak_flops_basis(device, args.peak_flops)
    rates = [timed(step, batch, args.steps, torch.cuda.synchronize)[0] for _ in range(args.rounds)]
    rate = statistics.median(rates)
    mfu = rate * cfg.flops_per_token(args.seq) / peak
    print(
        f"{total / 1e6:.0f}M total / {active / 1e6:.0f}M active params, bf16, batch {args.batch} x seq {args.seq}: "
        f"{rate:,.0f} tokens/s, MFU {100 * mfu:.1f}% of {peak:.3g} FLOP/s ({basis}); "
        f"peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpu", action="store_true", help="measure the bf16 ~0.9B-total MoE on one GPU instead")
    p.add_argument(
        "--mode",
        choices=("model", "trainer", "both"),
        default="both",
        help="CPU: time the bare model step, the full Trainer step, or both (against Mixtral)",
    )
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=3, help="timed steps per contender and round (the size flag)")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (CPU)")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--seq", type=int, default=None)
    p.add_argument("--peak-flops", type=float, default=None, help="MFU basis (GPU mode); default from the device name")
    args = p.parse_args()
    args.batch = args.batch or (16 if args.gpu else 8)
    args.seq = args.seq or (2048 if args.gpu else 256)
    (run_gpu if args.gpu else run_cpu)(args)


if __name__ == "__main__":
    main()
