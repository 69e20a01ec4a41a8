"""``winnow export RUN``: a run's trained model as one safetensors file, and as a Hugging Face Mixtral where it maps.

The run folder's tokenizer (``tokenizer_meta.json``, and ``tokenizer.json`` for BPE) goes with
the model, into both; a checkpoint outside its run folder has none, and the export says so.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from winnow.curate.workdir import local_output, local_path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a run's model as safetensors (and a Hugging Face Mixtral where it maps)")
    p.add_argument(
        "run", type=Path, help="the run folder (its newest valid checkpoint) or one checkpoints/step-N folder"
    )
    p.add_argument("--output", help="a local folder to write to (default: RUN/export)")
    p.set_defaults(func=run_export)


def run_export(args: argparse.Namespace) -> int:
    from winnow.curate.errors import disk_full, no_space
    from winnow.curate.readers.utf8 import printable  # a path's bytes that are not UTF-8, as \x escapes
    from winnow.train.checkpoint import load_checkpoint
    from winnow.train.export import export_model

    given = local_output(args.output, "--output") if args.output is not None else None
    checkpoint, state = load_checkpoint(local_path(args.run), what=f"winnow export {args.run}")
    run_dir = checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent
    out = given if given is not None else run_dir / "export"
    step = (state.get("counters") or {}).get("step")
    tokenizer = run_tokenizer(run_dir, state)
    try:
        written = export_model(
            state, out, step=step, sources=state.get("sources"), tokenizer=tokenizer, name=f"checkpoint {checkpoint}"
        )
    except Exception as err:
        if not disk_full(err):
            raise
        raise no_space(out, err, then="nothing there was changed; run the same command again") from err
    hf = printable(str(written["hf"]))
    print(f"exported {printable(str(checkpoint))} (step {step}): {printable(str(written['winnow']))}")
    if tokenizer is None:
        print(f"no tokenizer: {printable(str(run_dir))} holds no tokenizer_meta.json; the export has the model only")
    if written["hf"] and tokenizer is None:
        print(f"Hugging Face Mixtral, without a tokenizer (AutoModelForCausalLM): {hf}")
    elif written["hf"]:
        print(
            f"Hugging Face Mixtral with its tokenizer (AutoModelForCausalLM / AutoTokenizer / "
            f"pipeline('text-generation')): {hf}"
        )
    else:
        print(
            "no Hugging Face Mixtral: this model does not map onto it exactly:\n  "
            + "\n  ".join(written["hf_blockers"])
        )
    return 0


def run_tokenizer(run_dir: Path, state: dict):
    """The tokenizer the run folder holds (None when it holds none); a CheckpointError when it is not the one
    the checkpoint was trained with."""
    from winnow.train.errors import CheckpointError
    from winnow.train.tokenizer import META_FILE, load_tokenizer

    if not (run_dir / META_FILE).is_file():
        return None
    tokenizer = load_tokenizer(run_dir, where=f"{run_dir}: the run's tokenizer")
    trained = (state.get("data") or {}).get("tokenizer")
    if trained is not None and trained != tokenizer.name:
        raise CheckpointError(
            f"{run_dir} holds tokenizer {tokenizer.name!r}, but its checkpoint was trained with "
            f"{trained!r}; export the checkpoint from its own run folder"
        )
    return tokenizer
