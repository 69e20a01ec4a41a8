"""Benchmark: winnow's MoE training step vs Hugging Face Mixtral, same shape, same batch (CPU, fp32).

    pip install transformers          # bench-only peer; not a winnow dependency
    python bench/trainer.py --rounds 3 --steps 5         # CPU: tokens/s of both and the ratio
    python bench/trainer.py --gpu                        # one GPU: bf16 ~0.9B-total MoE, tokens/s and MFU

Rounds interleave winnow and Mixtral (A B A B) so machine noise hits both alike; the ratio
of the medians is printed. The shapes follow PERF_NOTES.md (13.8M total / 4.3M active).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
from train.metrics import peak_flops_basis
from train.model import ModelConfig, Transformer, cross_entropy_per_token

CPU_SHAPE = dict(vocab_size=320, dim=256, n_layers=4, n_heads=4, ffn_hidden=512, n_experts=8, top_k=2)
GPU_SHAPE = dict(vocab_size=32768, dim=1024, n_layers=16, n_heads=16, ffn_hidden=1024, n_experts=16, top_k=2)


def winnow_step_fn(shape: dict, seq: int, device: torch.device, dtype: torch.dtype | None):
    cfg = ModelConfig(**shape, max_seq_len=seq, aux_loss_coef=0.01, z_loss_coef=0.0)
    model = Transformer(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda" or None)

    def step(tokens, targets):
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            out = model(tokens)
            loss = cross_entropy_per_token(out.logits_BLV, targets).mean() + out.router_loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step, cfg


def mixtral_step_fn(shape: dict, seq: int):
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig(vocab_size=shape["vocab_size"], hidden_size=shape["dim"], intermediate_size=shape["ffn_hidden"],
                        num_hidden_layers=shape["n_layers"], num_attention_heads=shape["n_heads"],
                        num_key_value_heads=shape["n_heads"], num_local_experts=shape["n_experts"],
                        num_experts_per_tok=shape["top_k"], max_position_embeddings=seq, output_router_logits=True,
                        router_aux_loss_coef=0.01, attn_implementation="sdpa")
    model = MixtralForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(tokens, targets):
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def timed(step, batch, steps: int, sync=lambda: None) -> float:
    step(*batch)  # warm-up: allocator, kernels
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        step(*batch)
    sync()
    tokens = batch[0].numel() * steps
    return tokens / (time.perf_counter() - start)


def run_cpu(args) -> None:
    torch.manual_seed(0)
    tokens = torch.randint(0, CPU_SHAPE["vocab_size"], (args.batch, args.seq + 1))
    batch = (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
    ours, _ = winnow_step_fn(CPU_SHAPE, args.seq, torch.device("cpu"), None)
    theirs = mixtral_step_fn(CPU_SHAPE, args.seq)
    results = {"winnow": [], "mixtral": []}
    for r in range(args.rounds):
        results["winnow"].append(timed(ours, batch, args.steps))
        results["mixtral"].append(timed(theirs, batch, args.steps))
        print(f"round {r + 1}: winnow {results['winnow'][-1]:,.0f} tok/s, mixtral {results['mixtral'][-1]:,.0f} tok/s")
    w, m = statistics.median(results["winnow"]), statistics.median(results["mixtral"])
    print(f"median tokens/s  winnow {w:,.0f}  HF Mixtral {m:,.0f}  ratio {w / m:.2f}x "
          f"(batch {args.batch} x seq {args.seq}, fp32, {torch.get_num_threads()} threads; shared machine: noisy)")


def run_gpu(args) -> None:
    device = torch.device("cuda")
    torch.manual_seed(0)
    tokens = torch.randint(0, GPU_SHAPE["vocab_size"], (args.batch, args.seq + 1), device=device)
    batch = (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
    step, cfg = winnow_step_fn(GPU_SHAPE, args.seq, device, torch.bfloat16)
    total, active = cfg.param_counts()
    peak, basis = peak_flops_basis(device, args.peak_flops)
    rates = [timed(step, batch, args.steps, torch.cuda.synchronize) for _ in range(args.rounds)]
    rate = statistics.median(rates)
    mfu = rate * cfg.flops_per_token(args.seq) / peak
    print(f"{total / 1e6:.0f}M total / {active / 1e6:.0f}M active params, bf16, batch {args.batch} x seq {args.seq}: "
          f"{rate:,.0f} tokens/s, MFU {100 * mfu:.1f}% of {peak:.3g} FLOP/s ({basis}); "
          f"peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpu", action="store_true", help="measure the bf16 ~0.9B-total MoE on one GPU instead")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=5, help="timed steps per round (the size flag)")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--seq", type=int, default=None)
    p.add_argument("--peak-flops", type=float, default=None, help="MFU basis (GPU mode); default from the device name")
    args = p.parse_args()
    args.batch = args.batch or (16 if args.gpu else 8)
    args.seq = args.seq or (2048 if args.gpu else 256)
    (run_gpu if args.gpu else run_cpu)(args)


if __name__ == "__main__":
    main()
