"""``winnow report DIR [--diagnose] [--output PATH]``: write the report page, optionally print the diagnosis."""

from __future__ import annotations

import argparse

from winnow.curate.workdir import is_url, local_output, local_path
from winnow.pipelines.report.diagnose import DiagnoseConfig, diagnose, format_findings
from winnow.pipelines.report.page import locate, write_report


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write report.html for a job folder, a run folder, or both")
    p.add_argument(
        "dir",
        help="a curation job folder (manifest.json), a training run folder (metrics.jsonl), "
        "or a job's output URL (s3://...; the page is written there)",
    )
    p.add_argument("--output", help="a local file to write the page to (default: DIR/report.html)")
    p.add_argument("--diagnose", action="store_true", help="also print the diagnosis of the training run")
    p.add_argument(
        "--memory-limit-gib", type=float, help="device memory for the memory rule (default: logged, or host RAM)"
    )
    p.set_defaults(func=run_report)


def run_report(args: argparse.Namespace) -> int:
    cfg = DiagnoseConfig(memory_limit_gib=args.memory_limit_gib)
    output = local_output(args.output, "--output") if args.output is not None else None
    folder = str(args.dir) if is_url(args.dir) else str(local_path(args.dir))  # a file: URL is its local folder
    located = locate(folder)  # read once: a run's unreadable lines are reported once
    path = write_report(folder, output=output, diagnose_cfg=cfg, located=located)
    _, run, study = located
    if (run is not None and run.counterfactual is not None) or (study is not None and study.calibrated):
        from winnow.pipelines.report.counterfactual import lead, text

        cf = lead(run.counterfactual if run is not None else None, study)
        if cf is not None:
            print(text(cf))
    if args.diagnose:
        print(
            format_findings(diagnose(run, cfg))
            if run is not None
            else f"diagnosis: {args.dir} holds no training run (metrics.jsonl); nothing to diagnose"
        )
    print(f"report: {path}")
    return 0
