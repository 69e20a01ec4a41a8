"""``winnow ablate``: plan the study, split the shards per source, train what is not finished, tabulate."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

from curate.errors import ConfigError
from pipelines.ablate.config import AblateConfig
from pipelines.ablate.layout import StudyLayout
from pipelines.ablate.plan import variants
from pipelines.ablate.runner import VariantTask, run_variants, variant_config
from pipelines.ablate.sources import split_by_source
from pipelines.ablate.table import write_study
from pipelines.jobfile import build_config, read_toml


def run_ablate(args: argparse.Namespace) -> int:
    from pipelines.report.page import write_report
    from pipelines.train import load_train_config

    raw = read_toml(args.job)
    if "ablate" not in raw:
        raise ConfigError(f"{args.job}: no [ablate] table; add one (kind = 'leave_one_out' is the default study)")
    acfg = build_config(AblateConfig, raw["ablate"], f"{args.job} [ablate]")
    acfg = dataclasses.replace(acfg, **{k: v for k, v in (("steps", args.steps), ("parallel", args.parallel),
                                                          ("output", args.output)) if v is not None})
    train_cfg = load_train_config(args.job, steps=acfg.steps)
    layout = StudyLayout(Path(acfg.output or Path(train_cfg.shards) / "ablate"))
    folders, base = split_by_source(train_cfg.shards, layout.sources_root)
    sources = json.loads((Path(train_cfg.shards) / "manifest.json").read_text())["sources"]
    runs = variants(acfg, base, train_cfg.seed)
    print(f"ablation study: {len(runs)} runs of {train_cfg.steps} steps -> {layout.root}")
    threads = acfg.threads or (max(1, (os.cpu_count() or 1) // acfg.parallel) if acfg.parallel > 1 else 0)
    todo = [VariantTask(cfg=variant_config(train_cfg, acfg, layout, v, sources), folders=folders, sources=sources,
                        variant=v, job_file=str(args.job), study=str(layout.root), threads=threads)
            for v in runs if layout.read_result(v["name"]) is None]
    for task in todo:
        weights = ", ".join(f"{k}={w:.3f}" for k, w in task.variant["weights"].items())
        print(f"  training {task.variant['name']} ({weights})")
    for result in run_variants(todo, acfg):
        print(f"  trained {result['name']}")
    results = [layout.read_result(v["name"]) for v in runs]
    table = write_study(layout.root, results, sources, base)
    print(table)
    print(f"table:  {layout.table_csv}")
    print(f"report: {write_report(layout.root)}")
    return 0
