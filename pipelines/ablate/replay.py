"""The ``replay`` study: the same continued run from the same base, once per replay share.

Every run starts from ``[train] init_from`` and trains on ``[train] shards`` with ``[train] replay``
at one of ``[ablate] shares`` (same seed, model, steps and tokens; early stopping off, so every
share gets the same budget). Each run evaluates at step 0, before any update, and at the end, on
``[train] eval`` (default: the new data and the replayed base data). Per run: *forgetting* is the
mean rise of held-out loss on the old sources (those of the replay folder that the new data does
not hold), *gain* the mean fall on the new ones. ``noise_seeds`` repeats the first share with
other seeds (``[train.data] shuffle_window`` makes the seed change the document order): the
spread is the seed noise a difference between shares must exceed. Results: ``ablation/table.csv``
/ ``table.md``, ``ablation/replay.png`` (gain against forgetting, one point per share: the knee)
and ``ablation/replay.json``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import polars as pl

from winnow.curate.errors import ConfigError
from winnow.pipelines.ablate.checks import finished
from winnow.pipelines.ablate.config import AblateConfig, name_number
from winnow.pipelines.ablate.layout import StudyLayout, write_atomic
from winnow.pipelines.ablate.runner import VariantTask, drop_checkpoints, run_variants
from winnow.pipelines.ablate.table import markdown_table


def _name(share: float) -> str:
    return f"replay_{name_number(share)}"


def replay_variants(acfg: AblateConfig, seed: int) -> list[dict]:
    """One run per share, then the first share again with seeds seed+1.. (its noise)."""

    def run(share: float, kind: str, s: int, suffix: str = "") -> dict:
        weights = {"new": 1 - share} | ({"replay": share} if share > 0 else {})
        return {"name": _name(share) + suffix, "kind": kind, "seed": s, "share": share, "weights": weights}

    first = acfg.shares[0]
    return [run(x, "replay", seed) for x in acfg.shares] + [
        run(first, "noise", seed + k, f"_seed{seed + k}") for k in range(1, acfg.noise_seeds)
    ]


def replay_config(train_cfg, layout: StudyLayout, variant: dict):
    """The variant's ``TrainConfig``: the study's [train] with its folder, seed and replay share."""
    from winnow.train.attribution import AttributionConfig
    from winnow.train.stopping import StopConfig

    return dataclasses.replace(
        train_cfg,
        output=str(layout.run_dir(variant["name"])),
        seed=variant["seed"],
        eval_every=0,
        data=dataclasses.replace(train_cfg.data, seed=variant["seed"]),
        stop=StopConfig(),
        replay=dataclasses.replace(train_cfg.replay, share=variant["share"]),
        attribution=AttributionConfig(),
    )


def train_replay(task: VariantTask) -> dict:
    """Train one share (in a worker); its result holds the held-out losses at step 0 and at the end."""
    import torch

    from winnow.pipelines.provenance import write_provenance
    from winnow.pipelines.report.training import load_run
    from winnow.pipelines.train import build_trainer, run_inputs

    if task.threads:
        torch.set_num_threads(task.threads)
    cfg, variant = task.cfg, task.variant
    with build_trainer(cfg, progress=False) as trainer:
        inputs = run_inputs(cfg, trainer)
        write_provenance(
            cfg.output,
            job_file=task.job_file,
            data=inputs["data"],
            extra={**(inputs["extra"] or {}), "variant": variant},
        )
        summary = trainer.fit()
    if summary["preempted"]:
        raise KeyboardInterrupt(f"variant {variant['name']} stopped at step {summary['step']}")
    evals = load_run(cfg.output).evals
    result = {
        **variant,
        "start": evals[0]["eval"]["per_source"],
        "held_out": summary["eval"]["eval"]["per_source"],
        "steps": summary["step"],
        "tokens_seen": summary["tokens_seen"],
    }
    StudyLayout(Path(task.study)).write_result(variant["name"], result)
    drop_checkpoints(task)
    return result


def _manifest_sources(folder: str) -> list[str]:
    path = Path(folder) / "manifest.json"
    if not path.is_file():
        raise ConfigError(f"{path} does not exist: curate that job first (the replay study trains on curated shards)")
    return list(json.loads(path.read_text())["sources"])


def run_replay_study(args, acfg: AblateConfig, train_cfg) -> int:
    """``winnow ablate`` with ``kind = "replay"``."""
    from winnow.pipelines.ablate.study import check_study_folder, study_folder
    from winnow.pipelines.report.page import write_report
    from winnow.train.data.sets import training_sets

    if train_cfg.init_from is None or train_cfg.replay is None:
        raise ConfigError(
            f"{args.job}: [ablate] kind = 'replay' needs [train] init_from (the base run) and "
            "replay = {from = <the base job folder>, share = ...} (the study replaces the share)"
        )
    folders, _ = training_sets(train_cfg.shards, None, train_cfg.data.mix_weights)
    new = list(dict.fromkeys(s for f in folders for s in _manifest_sources(f)))
    old = [s for s in _manifest_sources(train_cfg.replay.path) if s not in new]
    layout = StudyLayout(study_folder(acfg, train_cfg))
    check_study_folder(layout)  # a user's folder is refused before its files are read as the study's
    runs = replay_variants(acfg, train_cfg.seed)
    configs = {v["name"]: replay_config(train_cfg, layout, v) for v in runs}
    done = {v["name"]: finished(layout, v, configs[v["name"]]) for v in runs}
    check_study_folder(layout, claim=True)  # created and marked before anything is written into it
    threads = acfg.threads or (max(1, (os.cpu_count() or 1) // acfg.parallel) if acfg.parallel > 1 else 0)
    todo = [
        VariantTask(
            cfg=configs[v["name"]],
            folders={},
            sources=[],
            variant=v,
            job_file=str(args.job),
            study=str(layout.root),
            threads=threads,
            keep_checkpoints=acfg.keep_checkpoints,
        )
        for v in runs
        if done[v["name"]] is None
    ]
    print(f"replay study: {len(runs)} runs of {train_cfg.steps} steps from {train_cfg.init_from} -> {layout.root}")
    for result in run_variants(todo, acfg, lambda r: print(f"  trained {r['name']}"), train=train_replay):
        done[result["name"]] = result
    table = write_replay_study(layout, [done[v["name"]] for v in runs], old=old, new=new)
    print(table)
    print(f"table:  {layout.table_csv}")
    print(f"report: {write_report(layout.root)}")
    return 0


def _mean_change(result: dict, sources: list[str]) -> float | None:
    changes = [
        result["held_out"][s] - result["start"][s]
        for s in sources
        if result["held_out"].get(s) is not None and result["start"].get(s) is not None
    ]
    return sum(changes) / len(changes) if changes else None


def write_replay_study(layout: StudyLayout, results: list[dict], *, old: list[str], new: list[str]) -> str:
    """Table, figure and summary of a replay study; returns the Markdown table with its noise line."""
    sources = old + new
    rows = []
    for r in results:
        forgetting, fall = _mean_change(r, old), _mean_change(r, new)
        row = {
            "variant": r["name"],
            "kind": r["kind"],
            "share": r["share"],
            "seed": r["seed"],
            "forgetting": forgetting,
            "gain": None if fall is None else -fall,
        }
        row |= {
            f"change_{s}": (r["held_out"][s] - r["start"][s])
            if r["held_out"].get(s) is not None and r["start"].get(s) is not None
            else None
            for s in sources
        }
        row |= {f"loss_{s}": r["held_out"].get(s) for s in sources}
        rows.append(row)
    frame = pl.DataFrame(
        rows, schema_overrides={c: pl.Float64 for c in rows[0] if c not in ("variant", "kind", "seed")}
    )
    same = frame.filter(pl.col("share") == results[0]["share"])
    noise = {
        k: float(same[k].max() - same[k].min()) if same.height > 1 and same[k].null_count() == 0 else None
        for k in ("forgetting", "gain")
    }
    layout.tables.mkdir(parents=True, exist_ok=True)
    frame.write_csv(layout.table_csv)
    note = (
        f"old sources (forgetting = mean held-out loss rise since step 0): {', '.join(old) or '-'}; new sources "
        f"(gain = mean fall): {', '.join(new)}"
    )
    if noise["forgetting"] is not None:
        note += (
            f"; seed noise at share {results[0]['share']:g} ({same.height} seeds): forgetting ±{noise['forgetting']:.4f}, "
            f"gain ±{noise['gain']:.4f}"
        )
    markdown = markdown_table(frame) + "\n\n" + note
    write_atomic(layout.table_md, markdown + "\n")
    write_atomic(
        layout.tables / "replay.json", json.dumps({"old": old, "new": new, "noise": noise, "rows": rows}, indent=1)
    )
    (layout.tables / "replay.png").write_bytes(plot(frame.filter(pl.col("kind") == "replay"), noise))
    return markdown


def plot(frame: pl.DataFrame, noise: dict) -> bytes:
    """Gain against forgetting, one point per replay share in share order, with the seed noise as error bars."""
    from winnow.pipelines.report import plots

    fig, (knee, by_share) = plots._subplots(1, 2, figsize=(11, 4))
    f, g, shares = frame["forgetting"].to_numpy(), frame["gain"].to_numpy(), frame["share"].to_list()
    knee.errorbar(f, g, xerr=noise.get("forgetting") or 0, yerr=noise.get("gain") or 0, marker="o", capsize=3)
    for x, y, share in zip(f, g, shares):
        knee.annotate(f"{share:g}", (x, y), textcoords="offset points", xytext=(5, 5))
    knee.set(
        title="replay share: gain on new vs forgetting of old sources",
        xlabel="forgetting (nats, lower is better)",
        ylabel="gain (nats, higher is better)",
    )
    by_share.plot(shares, f, marker="o", label="forgetting")
    by_share.plot(shares, g, marker="s", label="gain")
    by_share.set_xscale("symlog", linthresh=0.01)
    by_share.set(title="per replay share", xlabel="replay share of training tokens", ylabel="nats")
    plots.legend(by_share)
    return plots._png(fig)
