"""``winnow ablate JOB.toml``: a data-mix study — short runs re-mixed from the same curated shards, one table.

The study folder is the baseline run's folder (its metrics and attribution), with the variants
under ``variants/``. Nothing is re-curated: the job's train shards are split once into one
shard set per source (``sources/<name>/``, curriculum order kept), and every run mixes those
sets at load time by token weight (``train.data.mix_weights``). The baseline weights are the
curated mix's realized token shares (UTF-8 bytes, which are tokens for the byte tokenizer), so
the baseline and every variant differ in their weights only: same seed, model, steps and tokens.
Results: ``ablation/table.csv`` and ``table.md`` (per-source held-out loss and ``delta_<source>``
= variant minus baseline), ``heatmap.png``, and ``ablation/attribution_vs_ablation.csv`` with
the Spearman rank correlation between the baseline's first-order prediction and the measured
deltas (``correlation.json``). A variant whose folder holds ``result.json`` is not run again.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import hashlib
import io
import json
import logging
import multiprocessing
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import polars as pl

from curate.errors import ConfigError
from pipelines.jobfile import build_config, read_toml
from pipelines.provenance import manifest_sha256, write_provenance
from pipelines.report import plots
from pipelines.report.page import write_report
from pipelines.report.training import load_run
from pipelines.train import build_trainer, load_train_config
from train.attribution import AttributionConfig
from train.config import TrainConfig

log = logging.getLogger(__name__)


@dataclass(kw_only=True, slots=True)
class AblateConfig:
    """The ``[ablate]`` table: which variants of the mix to train and how."""

    kind: Literal["leave_one_out", "weights", "mixes"] = "leave_one_out"
    sources: list[str] = field(default_factory=list)  # leave_one_out / weights: sources to vary; [] = all
    factors: list[float] = field(default_factory=lambda: [0.5, 2.0])  # weights: multipliers of a source's weight
    mixes: dict[str, dict[str, float]] = field(default_factory=dict)  # mixes: variant name -> {source: weight}
    output: str | None = None  # the study folder; None: <[job] output>/ablate
    steps: int | None = None  # steps per run; None: [train] steps
    noise_seeds: int = 1  # extra baseline runs with seeds seed+1.. to measure run-to-run noise
    attribution_every: int = 10  # first-order attribution on the baseline run every N steps (0: off)
    parallel: int = 1  # runs trained at once, one process each

    def __post_init__(self) -> None:
        def check(ok: bool, key: str, value: object, allowed: str) -> None:
            if not ok:
                raise ConfigError(f"ablate.{key} = {value!r} is invalid; allowed: {allowed}")

        check(self.kind in ("leave_one_out", "weights", "mixes"), "kind", self.kind,
              "'leave_one_out', 'weights' or 'mixes'")
        check(all(f >= 0 and f != 1 for f in self.factors) and bool(self.factors), "factors", self.factors,
              "non-negative numbers other than 1")
        check(self.kind != "mixes" or bool(self.mixes), "mixes", self.mixes, "at least one mix when kind = 'mixes'")
        for name, mix in self.mixes.items():
            check(name != "baseline" and all(w >= 0 for w in mix.values()) and any(w > 0 for w in mix.values()),
                  f"mixes.{name}", mix, "a name other than 'baseline' and non-negative weights, one of them > 0")
        check(self.steps is None or self.steps >= 1, "steps", self.steps, "an integer >= 1")
        check(self.noise_seeds >= 1, "noise_seeds", self.noise_seeds, "an integer >= 1 (1: no extra seed)")
        check(self.attribution_every >= 0, "attribution_every", self.attribution_every, "an integer >= 0")
        check(self.parallel >= 1, "parallel", self.parallel, "an integer >= 1")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ablate", help="train mix variants ([ablate]) from a job's shards and tabulate their effect")
    p.add_argument("job", type=Path, help="the job file (TOML) with [train] and [ablate] tables")
    p.add_argument("--steps", type=int, help="override the steps of every run")
    p.add_argument("--parallel", type=int, help="override [ablate] parallel")
    p.add_argument("--output", help="override [ablate] output (the study folder)")
    p.set_defaults(func=run_ablate)


# ---- per-source shard sets --------------------------------------------------------------------
def split_by_source(job_dir: str, out: Path) -> tuple[dict[str, str], dict[str, float]]:
    """One train shard set per source from the job's Parquet train shards; returns folders and byte shares."""
    if not (Path(job_dir) / "manifest.json").is_file():
        raise ConfigError(f"{job_dir}/manifest.json does not exist: curate the job first (`winnow curate JOB.toml` "
                          "or `winnow run JOB.toml`); an ablation re-mixes curated shards and never re-curates")
    manifest = json.loads((Path(job_dir) / "manifest.json").read_text())
    entries = [e for e in manifest["shards"] if e.get("split") == "train" and e.get("format") == "parquet"]
    if not entries:
        raise ConfigError(f"{job_dir}/manifest.json lists no Parquet train shards; [output] formats must include 'parquet'")
    digest = manifest_sha256(job_dir)
    folders, sizes = {}, {}
    for source in manifest["sources"]:
        folder = out / source
        if (folder / "manifest.json").is_file() and json.loads((folder / "manifest.json").read_text()).get(
                "derived_from", {}).get("manifest_sha256") == digest:
            view = json.loads((folder / "manifest.json").read_text())
            folders[source], sizes[source] = str(folder), view["bytes_of_text"]
            continue
        shards, text_bytes = [], 0
        (folder / "shards" / "train").mkdir(parents=True, exist_ok=True)
        for i, entry in enumerate(entries):
            if not (entry.get("sources") or {}).get(source, 1):
                continue
            rows = pl.read_parquet(Path(job_dir) / entry["path"]).filter(pl.col("source") == source)
            if rows.is_empty():
                continue
            path = f"shards/train/part-{i:05d}.parquet"
            rows.write_parquet(folder / path)
            data = (folder / path).read_bytes()
            shards.append({"split": "train", "format": "parquet", "path": path, "rows": rows.height,
                           "sha256": hashlib.sha256(data).hexdigest(), "sources": {source: rows.height}})
            text_bytes += int(rows.get_column("text").str.len_bytes().sum())
        if not shards:
            log.warning("source %s has no train rows in %s; left out of the study", source, job_dir)
            continue
        view = {"format_version": 1, "job": f"{manifest.get('job')}:{source}", "sources": [source], "shards": shards,
                "bytes_of_text": text_bytes, "derived_from": {"path": str(job_dir), "manifest_sha256": digest}}
        (folder / "manifest.json").write_text(json.dumps(view, indent=1))
        folders[source], sizes[source] = str(folder), text_bytes
    total = sum(sizes.values())
    return folders, {s: b / total for s, b in sizes.items()}


# ---- variants ---------------------------------------------------------------------------------
def variants(cfg: AblateConfig, base: dict[str, float], seed: int) -> list[dict]:
    """``{"name", "kind", "seed", "weights"}`` per run; the baseline (and its noise seeds) first."""
    out = [{"name": "baseline", "kind": "baseline", "seed": seed, "weights": dict(base)}]
    out += [{"name": f"baseline_seed{seed + k}", "kind": "noise", "seed": seed + k, "weights": dict(base)}
            for k in range(1, cfg.noise_seeds)]
    chosen = cfg.sources or list(base)
    unknown = [s for s in chosen + [s for mix in cfg.mixes.values() for s in mix] if s not in base]
    if unknown:
        raise ConfigError(f"ablate: unknown source {unknown[0]!r}; the shards hold {sorted(base)}")
    if cfg.kind == "leave_one_out":
        out += [{"name": f"without_{s}", "kind": "leave_one_out", "seed": seed,
                 "weights": {k: w for k, w in base.items() if k != s}} for s in chosen]
    elif cfg.kind == "weights":
        out += [{"name": f"{s}_x{f:g}", "kind": "weights", "seed": seed,
                 "weights": {k: w * (f if k == s else 1.0) for k, w in base.items() if k != s or f > 0}}
                for s in chosen for f in cfg.factors]
    else:
        out += [{"name": name, "kind": "mix", "seed": seed, "weights": {k: w for k, w in mix.items() if w > 0}}
                for name, mix in cfg.mixes.items()]
    return out


def train_variant(cfg: TrainConfig, folders: dict[str, str], sources: list[str], variant: dict, job_file: str,
                  threads: int | None = None) -> dict:
    """Train one variant into ``cfg.output``; returns (and saves as ``result.json``) its held-out losses."""
    if threads:
        import torch

        torch.set_num_threads(threads)
    names = [s for s in sources if s in variant["weights"]]
    trainer = build_trainer(cfg, train_data=[folders[s] for s in names], sources=sources)
    write_provenance(cfg.output, job_file=job_file, data=[cfg.shards], extra={"variant": variant})
    try:
        summary = trainer.fit()
    finally:
        trainer.data.close()
    if summary["preempted"]:  # no result.json: the next `winnow ablate` resumes this run from its checkpoint
        raise KeyboardInterrupt(f"variant {variant['name']} stopped at step {summary['step']}")
    held = (summary["eval"] or {}).get("eval", {}).get("per_source") or {}
    result = {**variant, "held_out": held, "steps": summary["step"], "tokens_seen": summary["tokens_seen"]}
    Path(cfg.output, "result.json").write_text(json.dumps(result, indent=1))
    return result


# ---- the study --------------------------------------------------------------------------------
def run_ablate(args: argparse.Namespace) -> int:
    raw = read_toml(args.job)
    if "ablate" not in raw:
        raise ConfigError(f"{args.job}: no [ablate] table; add one (kind = 'leave_one_out' is the default study)")
    acfg = build_config(AblateConfig, raw["ablate"], f"{args.job} [ablate]")
    acfg = dataclasses.replace(acfg, **{k: v for k, v in (("steps", args.steps), ("parallel", args.parallel),
                                                          ("output", args.output)) if v is not None})
    train_cfg = load_train_config(args.job, steps=acfg.steps)
    study = Path(acfg.output or Path(train_cfg.shards) / "ablate")
    folders, base = split_by_source(train_cfg.shards, study / "sources")
    sources = json.loads((Path(train_cfg.shards) / "manifest.json").read_text())["sources"]
    runs = variants(acfg, base, train_cfg.seed)
    print(f"ablation study: {len(runs)} runs of {train_cfg.steps} steps -> {study}")
    todo = []
    for v in runs:
        out = study if v["name"] == "baseline" else study / "variants" / v["name"]
        if (out / "result.json").is_file():
            continue
        attribution = (dataclasses.replace(train_cfg.attribution, every=acfg.attribution_every)
                       if v["name"] == "baseline" else AttributionConfig())
        data = dataclasses.replace(train_cfg.data, format="parquet", seed=v["seed"],
                                   mix_weights=[v["weights"][s] for s in sources if s in v["weights"]])
        todo.append((dataclasses.replace(train_cfg, output=str(out), seed=v["seed"], data=data, eval_every=0,
                                         attribution=attribution), v))
    if acfg.parallel > 1 and len(todo) > 1:
        threads = max(1, (os.cpu_count() or 1) // acfg.parallel)
        with concurrent.futures.ProcessPoolExecutor(acfg.parallel, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(train_variant, c, folders, sources, v, str(args.job), threads) for c, v in todo]
            for done in concurrent.futures.as_completed(futures):
                print(f"  trained {done.result()['name']}")
    else:
        for c, v in todo:
            print(f"  training {v['name']} ({', '.join(f'{k}={w:.3f}' for k, w in v['weights'].items())})")
            train_variant(c, folders, sources, v, str(args.job))
    results = [json.loads(((study if v["name"] == "baseline" else study / "variants" / v["name"]) / "result.json")
                          .read_text()) for v in runs]
    table = write_study(study, results, sources, base)
    print(table)
    print(f"table:  {study / 'ablation' / 'table.csv'}")
    print(f"report: {write_report(study)}")
    return 0


def write_study(study: Path, results: list[dict], sources: list[str], base: dict[str, float]) -> str:
    """Write the table (CSV, Markdown), heatmap and attribution comparison; returns the Markdown table."""
    baseline = results[0]["held_out"]
    rows = []
    for r in results:
        row = {"variant": r["name"], "kind": r["kind"], "seed": r["seed"],
               "weights": " ".join(f"{k}={w / sum(r['weights'].values()):.3f}" for k, w in r["weights"].items())}
        row |= {f"loss_{s}": r["held_out"].get(s) for s in sources}
        row |= {f"delta_{s}": (r["held_out"][s] - baseline[s]) if r["held_out"].get(s) is not None and
                baseline.get(s) is not None else None for s in sources}
        rows.append(row)
    frame = pl.DataFrame(rows, schema_overrides={f"{p}_{s}": pl.Float64 for s in sources for p in ("loss", "delta")})
    (study / "ablation").mkdir(parents=True, exist_ok=True)
    frame.write_csv(study / "ablation" / "table.csv")
    header = list(frame.columns)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(f"{v:+.4f}" if isinstance(v, float) and k.startswith("delta") else
                                f"{v:.4f}" if isinstance(v, float) else str(v) for k, v in zip(header, r)) + " |"
              for r in frame.iter_rows()]
    markdown = "\n".join(lines)
    (study / "ablation" / "table.md").write_text(markdown + "\n")
    heatmap = plots.ablation_heatmap(frame.filter(pl.col("variant") != "baseline"))
    if heatmap:
        (study / "heatmap.png").write_bytes(heatmap)  # beside ablation/: the report draws its own from table.csv
    run = load_run(study) if (study / "metrics.jsonl").is_file() else None
    if run is not None and run.attribution is not None:
        summary = compare_with_attribution(results, run.attribution.sources, run.attribution.matrix, base)
        cells = summary.pop("cells")
        cells.write_csv(study / "ablation" / "attribution_vs_ablation.csv")
        (study / "ablation" / "attribution_vs_ablation.png").write_bytes(scatter(cells, summary["spearman"]))
        (study / "ablation" / "correlation.json").write_text(json.dumps(summary, indent=1))
        markdown += (f"\n\nSpearman rank correlation, first-order prediction vs measured delta: {summary['spearman']:.3f} "
                     f"over {summary['n_cells']} cells; signs agree on {summary['sign_agree']}/{summary['above_noise']} "
                     f"cells whose |delta| exceeds the seed-to-seed noise")
    return markdown


def scatter(cells: pl.DataFrame, spearman: float) -> bytes:
    """Predicted vs measured held-out loss change per (variant, source); hollow markers are within the noise."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no display needed

    fig = Figure(figsize=(6, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for i, source in enumerate(cells["source"].unique(maintain_order=True).to_list()):
        part = cells.filter(pl.col("source") == source)
        for above, face in ((True, f"C{i}"), (False, "none")):
            sel = part.filter(pl.col("above_noise") == above)
            if sel.height:
                ax.scatter(sel["predicted"], sel["measured"], label=source if above else None, edgecolors=f"C{i}",
                           facecolors=face)
    ax.axhline(0, color="gray", linewidth=0.8)
    ax.axvline(0, color="gray", linewidth=0.8)
    ax.set(title=f"Attribution vs ablation (Spearman {spearman:.2f})", xlabel="first-order prediction (nats)",
           ylabel="measured change vs baseline (nats)")
    ax.legend(fontsize=8, title="held-out source")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    return buf.getvalue()


def compare_with_attribution(results: list[dict], sources: list[str], matrix: np.ndarray,
                             base: dict[str, float]) -> dict:
    """First-order prediction of each variant's delta from the baseline's attribution, against the measured one.

    The attribution is linear in each source's token share, so a variant that scales source
    ``a``'s share by ``r_a`` (0 when left out; the others grow to fill) is predicted to change
    held-out loss on ``b`` by ``sum_a (r_a - 1) · A[a, b]``.
    """
    baseline = results[0]["held_out"]
    noise = {s: max([abs(r["held_out"][s] - baseline[s]) for r in results if r["kind"] == "noise"], default=0.0)
             for s in sources}
    base_share = np.array([base.get(s, 0.0) for s in sources])
    cells = []
    for r in results:
        if r["kind"] in ("baseline", "noise"):
            continue
        w = np.array([r["weights"].get(s, 0.0) for s in sources])
        ratio = np.divide(w / w.sum(), base_share, out=np.ones_like(w), where=base_share > 0)
        predicted = (ratio - 1) @ matrix
        for j, s in enumerate(sources):
            if r["held_out"].get(s) is None or baseline.get(s) is None:
                continue
            measured = r["held_out"][s] - baseline[s]
            cells.append({"variant": r["name"], "source": s, "measured": measured, "predicted": float(predicted[j]),
                          "noise": noise[s], "above_noise": abs(measured) > noise[s]})
    frame = pl.DataFrame(cells, schema={"variant": pl.String, "source": pl.String, "measured": pl.Float64,
                                        "predicted": pl.Float64, "noise": pl.Float64, "above_noise": pl.Boolean})
    ranks = frame.select(pl.col("measured").rank(), pl.col("predicted").rank()).to_numpy()
    spearman = float(np.corrcoef(ranks.T)[0, 1]) if frame.height > 2 else float("nan")
    strong = frame.filter(pl.col("above_noise"))
    agree = int((np.sign(strong["measured"].to_numpy()) == np.sign(strong["predicted"].to_numpy())).sum())
    return {"spearman": spearman, "n_cells": frame.height, "above_noise": strong.height, "sign_agree": agree,
            "noise": noise, "cells": frame}
