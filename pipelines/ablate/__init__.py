"""``winnow ablate JOB.toml``: a data-mix study — short runs re-mixed from the same curated shards, one table.

Nothing is re-curated: the job's train shards are split once into one shard set per source
(``sources.py``), and every run mixes those sets at load time by token weight. The baseline
weights are the curated mix's realized token shares (UTF-8 bytes, which are tokens for the byte
tokenizer), so the baseline and every variant (``plan.py``) differ in their weights only: same
seed, model, steps and tokens. Variants train in parallel through ``curate.executors``
(``runner.py``); ``table.py`` and ``correlation.py`` tabulate them and compare the measured
effects with the baseline's attribution. ``layout.py`` owns the study folder.

Only argparse is imported here: the study's modules (and torch) load when the command runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ablate", help="train mix variants ([ablate]) from a job's shards and tabulate their effect")
    p.add_argument("job", type=Path, help="the job file (TOML) with [train] and [ablate] tables")
    p.add_argument("--steps", type=int, help="override the steps of every run")
    p.add_argument("--parallel", type=int, help="override [ablate] parallel")
    p.add_argument("--output", help="override [ablate] output (the study folder)")
    p.add_argument("--shards", help="the curated job folder to re-mix (overrides [train] shards)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from pipelines.ablate.study import run_ablate

    return run_ablate(args)
