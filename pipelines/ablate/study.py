"""``winnow ablate``: one pass — plan the variants, check them, prepare their data, train, compare.

1. plan (``plan.py``): every run; a curation variant's change is validated against the job here,
   so a stage, key or value the job does not have is refused before anything is curated;
2. check (``checks.py``): reference runs the variants build on, finished runs' settings;
3. prepare (``prepare.py``): the baseline's shards split per source; a study that varies the
   curation first curates the baseline job, then each variant (reusing the baseline's phases);
   a variant that leaves a source without train rows, or trains on a held-out row, is refused;
4. train (``runner.py``): the runs not finished yet, ``parallel`` at a time;
5. compare (``compare.py``, written by ``table.py``): one row per variant, noise included.

A ``random_mixes`` study trains in two rounds: the baseline, its noise seeds and the random
mixes; then the regression over their results proposes a mix, which is trained like the baseline
and reported next to it. With ``adaptive = "doremi"`` the second round also trains the adaptive
run, whose reference is the finished baseline. Both rounds skip variants whose ``result.json`` is
already there, and a re-run of the command resumes a study wherever it stopped.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
from pathlib import Path

from winnow.curate.errors import ConfigError
from winnow.curate.workdir import local_path
from winnow.pipelines.ablate.checks import check_references, finished
from winnow.pipelines.ablate.config import AblateConfig
from winnow.pipelines.ablate.curation import CurationJob, load_curation_job
from winnow.pipelines.ablate.layout import BASELINE, StudyLayout, is_study_root, result_name, study_owns
from winnow.pipelines.ablate.plan import check_runnable, curated_runs, curation_variants, variants
from winnow.pipelines.ablate.prepare import StudyData, check_before_curating, prepare_baseline, prepare_variants
from winnow.pipelines.ablate.runner import VariantTask, run_variants, variant_config
from winnow.pipelines.ablate.table import write_study
from winnow.pipelines.jobfile import build_config, read_toml
from winnow.train.attribution.counterfactual import MEAN
from winnow.train.data.shards import job_manifest, split_rows

log = logging.getLogger(__name__)

_REACH = 0.5  # a run that reads less than this part of a source in file order is warned about


@dataclasses.dataclass(slots=True)
class _Study:
    acfg: AblateConfig
    train_cfg: object
    layout: StudyLayout
    data: StudyData
    sources: list[str]
    job_file: str

    def train(self, runs: list[dict]) -> list[dict]:
        """Train the runs not finished yet; every run's result, in plan order."""
        threads = self.acfg.threads or (
            max(1, (os.cpu_count() or 1) // self.acfg.parallel) if self.acfg.parallel > 1 else 0
        )
        for v in runs:  # every run trains, or is evaluated, on the baseline job's shards: recorded in its result
            v["data"] = self.data.shards
        configs = {v["name"]: variant_config(self.train_cfg, self.acfg, self.layout, v, self.sources) for v in runs}
        done = {v["name"]: finished(self.layout, v, configs[v["name"]]) for v in runs}
        todo = [
            VariantTask(
                cfg=configs[v["name"]],
                folders=self.data.folders_for(v),
                sources=self.sources,
                variant=v,
                job_file=self.job_file,
                study=str(self.layout.root),
                threads=threads,
                keep_checkpoints=self.acfg.keep_checkpoints,
            )
            for v in runs
            if done[v["name"]] is None
        ]
        for task in todo:  # the shares each run trains on: the weights normalised, as the loader draws them
            total = sum(task.variant["weights"].values()) or 1.0
            weights = ", ".join(f"{k}={w / total:.3f}" for k, w in task.variant["weights"].items())
            print(f"  to train: {task.variant['name']} ({weights})")
        for result in run_variants(todo, self.acfg):
            print(f"  trained {result['name']}")
            done[result["name"]] = result
        return [done[v["name"]] for v in runs]


def run_ablate(args: argparse.Namespace) -> int:
    from winnow.pipelines.report.page import write_report

    raw = read_toml(args.job)
    if "ablate" not in raw:
        raise ConfigError(f"{args.job}: no [ablate] table; add one (kind = 'leave_one_out' is the default study)")
    acfg = build_config(AblateConfig, raw["ablate"], f"{args.job} [ablate]")
    acfg = dataclasses.replace(
        acfg,
        **{
            k: v
            for k, v in (("steps", args.steps), ("parallel", args.parallel), ("output", args.output))
            if v is not None
        },
    )
    acfg = study_ablate_config(acfg)
    job = load_curation_job(args.job, raw, acfg.job) if acfg.curates else None
    train_cfg = study_train_config(args.job, raw, acfg, job, shards=getattr(args, "shards", None))
    if "replay" in acfg.kinds:  # one continued run per replay share from the same base: a study of its own
        from winnow.pipelines.ablate.replay import run_replay_study

        return run_replay_study(args, acfg, train_cfg)
    layout = StudyLayout(study_folder(acfg, train_cfg))
    progress = not getattr(args, "quiet", False)

    if acfg.curates:  # a missing job, or a bad stage, key or value, is refused before anything is curated
        curation_variants(acfg, train_cfg.seed, job)
    check_study_folder(layout)
    if not acfg.curates:  # its shards are there: every key naming a source, checked before the folder is claimed
        from winnow.pipelines.train import check_held_out_sources

        plan_on_manifest(acfg, train_cfg, job, path=args.job)
        check_held_out_sources(train_cfg)
    else:  # a job edited since it was curated, or since runs finished: said before anything is curated
        check_before_curating(curated_runs(acfg, train_cfg.seed, job), job, layout)
    check_study_folder(layout, claim=True)  # the baseline's run folder too: claimed before anything is written
    data = prepare_baseline(train_cfg.shards, layout, job, progress=progress)
    runs, sources = plan_on_manifest(acfg, train_cfg, job, data.base, path=args.job)
    _say_reach(train_cfg, data)
    # trained after the baseline (it is their reference); configured now, so a bad setting is refused before any
    # variant is curated or trained
    adaptive = [
        {"name": method, "kind": "adaptive", "seed": train_cfg.seed, "weights": dict(data.base)}
        for method in acfg.adaptive_methods
    ]
    for run in adaptive:
        variant_config(train_cfg, acfg, layout, run, sources)
    if job is not None:
        prepare_variants(runs, data, job, layout, progress=progress)
    study = _Study(acfg, train_cfg, layout, data, sources, str(args.job))
    print(f"ablation study: {len(runs)} runs of {train_cfg.steps} steps -> {layout.root}")
    _say_unplanned(
        layout, [r["name"] for r in runs + adaptive] + (["proposed"] if "random_mixes" in acfg.kinds else [])
    )
    results = study.train(runs)
    second = [_proposal(acfg, results, data.base, train_cfg)] if "random_mixes" in acfg.kinds else []
    second += adaptive
    if second:
        for run in second:
            if data.identity is not None:  # trained on the baseline's curated shards, like the first round
                run["curation"] = data.identity
        results += study.train(second)
    table = write_study(
        layout.root, results, sources, data.base, target=acfg.target, curation=data.curation, interval=acfg.interval
    )
    print(table)
    print(f"effects: {layout.effects_md}")
    print(f"table:   {layout.table_csv}")
    print(f"report:  {write_report(layout.root)}")
    return 0


def reach(train_cfg, data: StudyData) -> dict[str, float]:
    """The fraction of each source's train tokens the baseline run reads (its share of the run's tokens over the
    source's tokens); empty where the sets do not count their tokens (Parquet alone)."""
    tokens = train_cfg.steps * train_cfg.grad_accum * train_cfg.data.batch_size * train_cfg.data.seq_len
    out = {}
    for source, folder in data.folders.items():
        path = Path(folder) / "manifest.json"
        held = json.loads(path.read_text()).get("tokens_of_source") if path.is_file() else None
        if held:
            out[source] = data.base.get(source, 0.0) * tokens / held
    return out


def _say_reach(train_cfg, data: StudyData) -> None:
    """Warn when the runs read a small part of a source in file order: a change of its share then changes which
    of its documents a run reads (the next ones in the file) as well as how many."""
    if train_cfg.data.shuffle_window > 1:
        return
    short = {s: _percent(f) for s, f in sorted(reach(train_cfg, data).items(), key=lambda x: x[1]) if f < _REACH}
    if short:
        what = (
            f"the first {next(iter(short.values()))} of each source"
            if len(short) == len(data.folders) and len(set(short.values())) == 1
            else "the first " + ", ".join(f"{f} of {s}" for s, f in short.items())
        )
        log.warning(
            "each run reads its sources' documents in file order, and the baseline reads only %s: a share change "
            "also changes which documents a run sees, so a source whose files are ordered (by name, date or "
            "topic) is measured on its first files; [train.data] shuffle_window = <rows of a shard> reads each "
            "shard's documents in an order the seed draws (shards stay in order; the seed's noise then includes "
            "the sample)",
            what,
        )


def _percent(fraction: float) -> str:
    return f"{100 * fraction:.0f}%" if fraction >= 0.01 else f"{100 * fraction:.1g}%"


def _say_unplanned(layout: StudyLayout, planned: list[str]) -> None:
    """Name the finished runs in the study's folder that ``planned`` (this study's runs, the proposal among them
    when it has one) does not hold, an earlier study's with other kinds: they stay on disk, and this study's
    tables leave them out."""
    known = {layout.run_dir(name) for name in planned}
    others = [
        result_name(result.parent) or result.parent.name
        for result in sorted((layout.root / "variants").glob("*/result.json"))
        if result.parent not in known
    ]
    if others:
        print(
            f"  not in this study's plan, kept in {layout.root / 'variants'} and left out of its tables: "
            + ", ".join(others)
        )


def plan_on_manifest(
    acfg: AblateConfig,
    train_cfg,
    job: CurationJob | None,
    base: dict[str, float] | None = None,
    *,
    path: str | Path | None = None,
) -> tuple[list[dict], list[str]]:
    """The study's runs and the job's sources, planned on its ``manifest.json``: a ``ConfigError`` names the key
    of a source no shard holds, a random-mix fit without held-out rows, a reference run trained elsewhere.
    ``base`` is the baseline's share per source with train rows; None plans on the manifest's row counts (the
    shares move the weights, not which variants are valid), so ``winnow check`` and ``winnow ablate`` refuse
    the same keys before anything is written."""
    manifest = job_manifest(train_cfg.shards)
    sources = manifest["sources"]
    if "random_mixes" in acfg.kinds:  # the regression fits every source's held-out loss
        held = split_rows(manifest, "val")
        if missing := [s for s in sources if s not in held]:
            raise ConfigError(
                f"ablate.kind = 'random_mixes' fits each source's held-out loss, and {missing} have no held-out rows in "
                f"{train_cfg.shards}; give them some (the split stage's val_fraction_by_source), or study without "
                "random_mixes"
            )
    if MEAN in sources:  # the studies' tables and the counterfactual give that name to the held-out sets' average
        raise ConfigError(
            f"{train_cfg.shards}: a source is named {MEAN!r}, the name a study gives the average over the held-out sets; "
            "rename the source (its [[inputs]] source) and curate again"
        )
    if base is None:
        rows = split_rows(manifest, "train")
        total = sum(rows.values()) or 1
        base = {s: n / total for s, n in rows.items() if n > 0}
    try:
        runs = variants(acfg, base, train_cfg.seed, sources=sources, job=job)
    except ConfigError as err:  # a key naming sources the shards lack: said with the file, as every key is
        raise ConfigError(f"{path} [ablate]: {err}" if path else str(err)) from None
    check_references(train_cfg, sources, BASELINE)
    return runs, sources


def study_folder(acfg: AblateConfig, train_cfg) -> Path:
    """The study's folder: ``[ablate] output``, else ``ablate`` in the job folder a study re-mixes, or ``replay`` in
    the first set a replay study trains on."""
    if acfg.output is not None:
        return Path(acfg.output)
    if "replay" not in acfg.kinds:
        return Path(train_cfg.shards) / "ablate"
    from winnow.train.data.sets import training_sets

    folders, _ = training_sets(train_cfg.shards, None, train_cfg.data.mix_weights)
    return Path(folders[0]) / "replay"


#: What a replay study writes at its top (its runs train in variants/)
_REPLAY_ENTRIES = {"variants", "ablation", "report.html"}


def check_study_folder(layout: StudyLayout, *, claim: bool = False) -> None:
    """The study's folder as ``winnow ablate`` takes it, ``claim`` creating and marking it (``winnow check``: nothing
    is written). Refused naming ``ablate.output``: a run of ``winnow train``, and a folder holding files winnow did
    not write (``train.runfolder``: a user's files there would be overwritten), a mix study's and a replay
    study's alike."""
    from winnow.train.runfolder import check_run_folder, claim_run_folder

    root = layout.root
    # a study writes sources/ before training (and rebuilds it when it was removed)
    if (root / "checkpoints").is_dir() and not layout.sources_root.is_dir() and not is_study_root(root):
        raise ConfigError(
            f"ablate.output = {str(root)!r} holds a run of `winnow train`, not a study: a study's baseline trains at "
            "its top and would take that run for its own; give the study a folder of its own"
        )
    if _earlier_replay_study(root):
        return
    (claim_run_folder if claim else check_run_folder)(root, "ablate.output")


def _earlier_replay_study(root: Path) -> bool:
    """Whether ``root`` is a replay study that a winnow which did not mark study folders wrote: a replay study's
    entries alone, and a share's result among its runs (a mix study's is known by its baseline's files)."""
    from winnow.train.runfolder import MARKER

    if not root.is_dir() or (root / MARKER).exists() or not {p.name for p in root.iterdir()} <= _REPLAY_ENTRIES:
        return False
    for path in (root / "variants").glob("*/result.json"):
        try:
            found = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(found, dict) and found.get("kind") in ("replay", "noise") and "share" in found:
            return True
    return False


def study_ablate_config(acfg: AblateConfig) -> AblateConfig:
    """``acfg`` with a ``file://`` or ``~`` output as the folder it names."""
    if acfg.output is None or not acfg.output.startswith(("file:", "~")):
        return acfg
    return dataclasses.replace(acfg, output=str(local_path(acfg.output)))


def study_train_config(
    path: str | Path,
    raw: dict,
    acfg: AblateConfig,
    job: CurationJob | None,
    *,
    shards=None,
    steps: int | None = None,
    **overrides,
):
    """The study's ``[train]`` table (``winnow ablate`` and ``winnow check`` alike): on ``shards`` (``--shards``),
    else on [train] shards, else on the curation job's output, which a study varying the curation curates (so
    it must be that folder then); ``steps`` (``--steps``) over ``[ablate] steps``. Refused naming the key: a list
    of shard sets (but by a replay study, which trains on its sets), a ``[train.mixing]`` the study would
    replace, ``[train.stop]`` (but in a replay study, which turns it off: every run trains the study's steps),
    and an ``[ablate] output`` equal to a job folder it trains on or inside another study."""
    from winnow.pipelines.train import load_train_config, refuse_shard_folder
    from winnow.train.config import StopConfig

    given = shards or (raw.get("train") or {}).get("shards")
    if job is not None:
        if given is not None and (not isinstance(given, str) or Path(given).resolve() != Path(job.output).resolve()):
            raise ConfigError(
                f"{path}: train.shards (or --shards) = {given!r}, but the study varies the curation of "
                f"{job.path}, whose baseline it curates into {job.output!r}; allowed: that folder, or no "
                "train.shards"
            )
        shards = job.output
    train_cfg = load_train_config(path, steps=steps if steps is not None else acfg.steps, shards=shards, **overrides)
    replay = "replay" in acfg.kinds  # its runs are continuations, each with its own [train] (mixing, evaluations)
    if train_cfg.mixing.adaptive and not replay:
        raise ConfigError(
            f"{path} [train.mixing] key 'adaptive': a study sets every run's mix itself, so it would not be used; "
            "remove it, and compare adaptive mixes with [ablate] adaptive = ['doremi', 'counterfactual']"
        )
    if not isinstance(train_cfg.shards, str) and not replay:
        raise ConfigError(
            f"{path} [train] key 'shards': a study re-mixes the sources of one curated job folder, and this is a "
            'list of shard sets; give the folder\'s path (shards = "out/job") or --shards'
        )
    if not replay:
        schedule = acfg.eval_steps(train_cfg.steps)
        if train_cfg.stop != StopConfig():
            raise ConfigError(
                f"{path} [train.stop]: a study compares runs of the same steps, and early stopping would end each "
                "run at a step of its own (a run of another length than the baseline's is left out of the "
                "comparison); remove [train.stop] from the study's file"
            )
        if isinstance(raw.get("train"), dict) and "eval_every" in raw["train"] and acfg.eval_every is None:
            log.warning(
                "[train] eval_every is not a study's: every run evaluates %s ([ablate] eval_every sets it)",
                f"every {schedule} steps" if schedule else "at its end",
            )
        study_folder = acfg.output or f"{str(train_cfg.shards).rstrip('/')}/ablate"
        given = raw["train"].get("output") if isinstance(raw.get("train"), dict) else None
        if isinstance(given, str) and os.path.normpath(given) != os.path.normpath(study_folder):
            log.warning(
                "[train] output = %r is not a study's: its runs train in its own folder, %s ([ablate] output sets it)",
                given,
                study_folder,
            )
    if acfg.output is not None:
        refuse_shard_folder(acfg.output, train_cfg, f"{path} [ablate] key 'output' (or --output)")
        owner = study_owns(acfg.output)
        if owner is not None and owner != Path(acfg.output).resolve():
            raise ConfigError(
                f"{path} [ablate] key 'output' (or --output) = {acfg.output!r} lies inside another study "
                f"({owner}); give the study a folder of its own"
            )
    return train_cfg


def _proposal(acfg: AblateConfig, results: list[dict], base: dict[str, float], train_cfg) -> dict:
    """The mix the regression over the random-mix runs proposes, as a variant trained like the baseline."""
    from winnow.pipelines.ablate.mixes import fit_mixes, propose

    fit = fit_mixes(results, list(base), steps=acfg.mix_steps or train_cfg.steps)
    weights = propose(fit, base, target=acfg.target, concentration=acfg.concentration, seed=train_cfg.seed)
    variant = {"name": "proposed", "kind": "proposed", "seed": train_cfg.seed, "weights": weights}
    check_runnable(variant, base)
    print(f"  proposed mix for target {acfg.target!r}: " + ", ".join(f"{k}={w:.3f}" for k, w in weights.items()))
    return variant
