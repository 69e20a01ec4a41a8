"""``winnow run JOB.toml``: the whole flow — curate, train on the shards, write the report — in one command.

Ends by printing the report's path and, when ``[train.attribution]`` is on, what a change of the mix is
predicted to do (the counterfactual, in sentences), then a short per-source table (tokens trained on,
training and held-out loss, the predicted change without the source) and the decomposition.
"""

from __future__ import annotations

import argparse
import logging
import posixpath
from pathlib import Path

from winnow.curate.errors import ConfigError
from winnow.curate.pipeline import run_job
from winnow.curate.workdir import is_url
from winnow.pipelines.check import trains_on_curation, validate
from winnow.pipelines.cleanup import removed_on_failure
from winnow.pipelines.curate import print_summary
from winnow.pipelines.jobfile import read_toml
from winnow.pipelines.provenance import write_provenance
from winnow.pipelines.report import counterfactual as cf_text
from winnow.pipelines.report.page import write_report
from winnow.pipelines.report.training import Attribution, TrainingRun, attribution_rows, load_run
from winnow.pipelines.train import build_trainer, load_train_config, model_line, refuse_study_folder, run_inputs

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="curate, train (when the job has [train]) and write the report")
    p.add_argument("job", type=Path, help="the job file (TOML)")
    p.add_argument("--steps", type=int, help="override [train] steps (e.g. a short check)")
    p.add_argument(
        "--output",
        help="override [job] output (the run folder becomes OUTPUT/train, unless [train] output names "
        "another folder than [job] output's train/)",
    )
    p.add_argument("--workers", type=int, help="local curation processes (overrides [job] workers)")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace another job's outputs, or a finished curation "
        "made with another configuration, in the output folder (refused otherwise)",
    )
    p.add_argument(
        "--shards",
        help="skip curation and train on this folder or URL (a curated job folder, or any "
        "folder of Parquet files with a `text` column), then write the report",
    )
    p.set_defaults(func=run)


def train_overrides(args: argparse.Namespace) -> dict:
    """What the command line changes of ``[train]``: ``--steps``, ``--shards``, and with ``--output`` the run folder
    ``OUTPUT/train``, unless the file's ``[train] output`` names another folder than its ``[job] output``'s
    ``train/`` (the default, which moves with it)."""
    overrides = {"steps": args.steps, "shards": args.shards}
    if args.output is None:
        return overrides
    raw = read_toml(args.job)
    given = (raw.get("train") or {}).get("output") if isinstance(raw.get("train"), dict) else None
    job_output = (raw.get("job") or {}).get("output") if isinstance(raw.get("job"), dict) else None
    default = posixpath.join(job_output, "train") if isinstance(job_output, str) else None
    if not isinstance(given, str) or (default is not None and posixpath.normpath(given) == posixpath.normpath(default)):
        overrides["output"] = str(Path(args.output) / "train")
    return overrides


def run(args: argparse.Namespace) -> int:
    overrides = train_overrides(args)
    if args.shards is None:
        checked = validate(  # [train] too, as this command trains it
            args.job, output=args.output, workers=args.workers, train_overrides=overrides, study=False
        )
        job = checked.job
        if job is None:
            raise ConfigError(f"{args.job}: no [[inputs]] to curate; give --shards to train on curated data")
        print(f"[1/3] curate {args.job} -> {job.job.output}")
        print_summary(run_job(job, progress=not args.quiet, overwrite=args.overwrite), job.job.output)
        raw, report_dir = job.raw, job.job.output  # a folder, or a URL the report reads in place
    else:  # nothing to curate: the job file needs no [job] or [[inputs]], only [train]
        raw = read_toml(args.job)
        if "train" not in raw:
            raise ConfigError(f"{args.job}: --shards skips curation and trains, so the job file needs a [train] table")
        print(f"[1/3] curate: skipped, training on --shards {args.shards}")
        report_dir = Path(".")  # replaced by the run folder below
    if "train" in raw:
        if args.shards is None and trains_on_curation(raw):
            overrides["shards"] = job.job.output
        elif args.shards is None:
            print(f"      training on [train] shards {raw['train']['shards']}, not on what this job curates")
        cfg = load_train_config(args.job, **overrides)  # again: the run folder's default depends on what curation wrote
        refuse_study_folder(cfg.output)
        print(f"[2/3] train {cfg.steps} steps -> {cfg.output}")
        with removed_on_failure(cfg.output), build_trainer(cfg, progress=not args.quiet) as trainer:
            write_provenance(cfg.output, job_file=args.job, **run_inputs(cfg, trainer))
            print(model_line(trainer))
            summary = trainer.fit()
        if summary["preempted"]:
            print(f"training preempted at step {summary['step']}; re-run the same command to resume")
            return 1
        if summary.get("stopped"):
            print(f"stopped early at step {summary['step']}: {summary['stopped']}")
        report_dir = Path(cfg.output)
    else:
        print("[2/3] no [train] table: nothing to train")
    storage = job.job.storage_options if args.shards is None else None
    path = write_report(report_dir, storage_options=storage)
    print("[3/3] report written")
    if not is_url(report_dir) and (Path(report_dir) / "metrics.jsonl").is_file():
        print(source_table(load_run(report_dir)))
    print(f"report: {path}")
    return 0


def source_table(run: TrainingRun) -> str:
    """What a change of the mix would do, in sentences, then per source: tokens trained on, mean training loss,
    final held-out loss, and the predicted change of its own and the mean held-out loss if it were left out."""
    tokens: dict[str, int] = {}
    for record in run.logs:
        for source, figures in (record.get("per_source") or {}).items():
            tokens[source] = tokens.get(source, 0) + int(figures.get("tokens") or 0)
    last = (run.logs[-1].get("per_source") or {}) if run.logs else {}
    held = (run.evals[-1]["eval"].get("per_source") or {}) if run.evals else {}
    cf = run.counterfactual
    left_out = cf is not None and 0.0 in cf.predicted

    def num(value, width: int, sign: str = "", digits: int = 3) -> str:
        return f"{value:>{sign}{width}.{digits}f}" if isinstance(value, (int, float)) else f"{'-':>{width}}"

    def without(source: str, column: str) -> str:
        if not left_out or source not in cf.sources or column not in cf.held_out:
            return f"{'-':>16}"
        value, half = cf.cell(0.0, source, column)
        return f"{value:>+9.3f} ±{half:<6.3f}"

    lines = [cf_text.text(cf), ""] if cf is not None else []
    if cf is None and run.attribution is None and (run.config.get("attribution") or {}).get("every"):
        lines += ["attribution: the run ended before its first attributed stretch closed; nothing to predict from", ""]
    lines.append(
        f"{'source':<14}{'tokens':>10}{'train loss':>12}{'held-out':>10}"
        + (f"{'without: own':>16}{'without: mean':>16}" if left_out else "")
    )
    for source in run.sources:
        lines.append(
            f"{source:<14}{tokens.get(source, 0):>10}{num((last.get(source) or {}).get('mean_loss'), 12)}"
            f"{num(held.get(source), 10)}" + (f"{without(source, source)}{without(source, 'mean')}" if left_out else "")
        )
    if left_out:
        lines.append(
            "without: the predicted change (nats, ± two standard errors) of the source's own held-out loss "
            "and of the held-out sets' mean if it were left out (above 0: the source helps)"
        )
    if run.attribution is not None and run.attribution.measured is not None:
        lines += ["", _attribution_text(run.attribution)]
    return "\n".join(lines)


def _attribution_text(attr: Attribution) -> str:
    """The decomposition per held-out source: measured change, the part attributed to sources, the rest, and
    the quadrature residual."""
    steps = f"steps {attr.steps[0]}-{attr.steps[1]}" if attr.steps else f"up to step {attr.step}"
    lines = [
        f"where the held-out loss change came from (decomposition), {steps} (nats; negative = lowered):",
        f"{'held-out':<14}{'measured':>10}{'sources':>10}{'other':>10}{'residual':>10}{'attributed':>12}",
    ]
    for row in attribution_rows(attr):
        share = f"{100 * row['share']:.0f}%" if row["share"] is not None else "-"
        lines.append(
            f"{row['source']:<14}{row['measured']:>+10.4f}{row['attributed']:>+10.4f}"
            f"{row['unattributed']:>+10.4f}{row['residual']:>+10.4f}{share:>12}"
        )
    lines.append(
        "sources + other + residual = measured; other: weight decay, router losses, momentum from before "
        "the first attributed step; residual: the quadrature's error"
    )
    return "\n".join(lines)
