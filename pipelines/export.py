"""``winnow export RUN``: a run's trained model as one safetensors file, and as a Hugging Face Mixtral where it maps."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a run's model as safetensors (and a Hugging Face Mixtral where it maps)")
    p.add_argument("run", type=Path, help="the run folder (its newest valid checkpoint) or one checkpoints/step-N folder")
    p.add_argument("--output", type=Path, help="where to write (default: RUN/export)")
    p.set_defaults(func=run_export)


def run_export(args: argparse.Namespace) -> int:
    from train.checkpoint import load_checkpoint
    from train.export import export_model

    checkpoint, state = load_checkpoint(args.run, what=f"winnow export {args.run}")
    run_dir = checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent
    out = args.output or run_dir / "export"
    step = (state.get("counters") or {}).get("step")
    written = export_model(state, out, step=step, sources=state.get("sources"))
    print(f"exported {checkpoint} (step {step}): {written['winnow']}")
    if written["hf"]:
        print(f"Hugging Face Mixtral (AutoModelForCausalLM.from_pretrained): {written['hf']}")
    else:
        print("no Hugging Face Mixtral: this model does not map onto it exactly:\n  " + "\n  ".join(written["hf_blockers"]))
    return 0
