"""``winnow ablate JOB.toml``: short runs that differ from a baseline in one decision, one table.

A study varies the mix (leave a source out, re-weight it, named or random mixes: the curated
shards re-mixed at load time) or the curation (drop stages, change a stage setting, re-order the
curriculum: the job re-curated from the first phase the change touches). Every run has the same
model, seeds, steps and tokens and is measured on the baseline's held-out rows. A study reads as
one pass (``study.py``), one module per step:

* plan (``plan.py``): every run, each kind of variant one small plan function; the curation job
  and its changes in ``curation.py``;
* check (``checks.py``): reference runs and finished runs;
* prepare (``prepare.py``, ``sources.py``): the shards split per source; curation variants curated;
* train (``runner.py``): through ``curate.executors``, ``parallel`` at a time;
* compare (``compare.py``; ``table.py`` writes it, ``correlation.py`` and ``mixes.py`` add the
  attribution comparison and the mixing regression).

``layout.py`` owns the study folder. Only argparse is imported here: the study's modules (and
torch) load when the command runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ablate", help="train variants of the mix or the curation ([ablate]) and tabulate their effect")
    p.add_argument("job", type=Path, help="the job file (TOML) with [train] and [ablate] tables")
    p.add_argument("--steps", type=int, help="override the steps of every run")
    p.add_argument("--parallel", type=int, help="override [ablate] parallel")
    p.add_argument("--output", help="override [ablate] output (the study folder)")
    p.add_argument(
        "--shards",
        help="the curated job folder to re-mix (overrides [train] shards; a study that varies "
        "the curation trains on its job's output)",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from winnow.pipelines.ablate.study import run_ablate

    return run_ablate(args)
