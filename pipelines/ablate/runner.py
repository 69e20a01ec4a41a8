"""Training a study's variants: one run per variant, in this process, a local process pool, or Ray tasks.

Runs go through ``curate.executors.Executor``, the executor curation uses. In a local pool each
worker process claims one GPU for its lifetime (``CUDA_VISIBLE_DEVICES``, round-robin when there
are more workers than GPUs) and ``threads`` intra-op threads; Ray reserves one GPU per task where
the cluster has GPUs. A variant's ``result.json`` is written atomically after its run finishes,
so a crash leaves no marker and the next ``winnow ablate`` runs it again (resuming from its
checkpoint when the trainer left one).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from winnow.curate.executors import Executor
from winnow.pipelines.ablate.config import AblateConfig
from winnow.pipelines.ablate.layout import BASELINE, StudyLayout

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class VariantTask:
    """Everything one worker needs to train one variant (picklable: it crosses process boundaries)."""

    cfg: object  # the variant's TrainConfig (output = its run folder, seed, mix weights)
    folders: dict[str, str]  # source -> its shard set (the baseline's, or a curation variant's own)
    sources: list[str]  # the job's source ids, in order
    variant: dict
    job_file: str
    study: str
    threads: int = 0  # torch intra-op threads; 0: leave as is
    keep_checkpoints: bool = True  # False: removed once the result is saved (``drop_checkpoints``)


def variant_config(train_cfg, acfg: AblateConfig, layout: StudyLayout, variant: dict, sources: list[str]):
    """The ``TrainConfig`` of one variant: the study's [train] with its folder, seed and mix weights."""
    from winnow.train.adaptive import MixingConfig
    from winnow.train.attribution import AttributionConfig

    # the baseline, and the first attribution_seeds - 1 noise seeds: their counterfactuals are averaged; a
    # counterfactual mix that follows its own counterfactual
    following = variant["kind"] == "adaptive" and variant["name"] == "counterfactual" and acfg.counterfactual_step_size
    attribute = (
        variant["name"] == BASELINE
        or bool(following)
        or (variant["kind"] == "noise" and variant["seed"] - train_cfg.seed < acfg.attribution_seeds)
    )
    attribution = (
        dataclasses.replace(train_cfg.attribution, every=acfg.attribution_every) if attribute else AttributionConfig()
    )
    data = dataclasses.replace(
        train_cfg.data,
        seed=variant["seed"],
        mix_weights=[variant["weights"][s] for s in sources if s in variant["weights"]],
    )
    mixing = MixingConfig()
    if variant["kind"] == "adaptive":  # its name is the method
        step = acfg.counterfactual_step_size if variant["name"] == "counterfactual" else acfg.adaptive_step_size
        mixing = MixingConfig(
            adaptive=variant["name"],
            reference=str(layout.run_dir(BASELINE)),
            every=acfg.adaptive_every,
            step_size=step,
            target=acfg.target,
            max_factor=acfg.counterfactual_max_factor,
        )
    # every run evaluates on the same schedule, so their held-out curves compare step by step
    return dataclasses.replace(
        train_cfg,
        output=str(layout.run_dir(variant["name"])),
        seed=variant["seed"],
        data=data,
        steps=variant.get("steps", train_cfg.steps),
        eval_every=acfg.eval_steps(train_cfg.steps),
        attribution=attribution,
        mixing=mixing,
    )


def train_variant(task: VariantTask) -> dict:
    """Train one variant into its run folder; returns (and saves as ``result.json``) its held-out losses, and
    with periodic evaluations its held-out curve (``curve``: step and loss per source, ending at the last step)."""
    import torch

    from winnow.pipelines.provenance import write_provenance
    from winnow.pipelines.report.training import load_run
    from winnow.pipelines.train import build_trainer

    before = torch.get_num_threads()
    if task.threads:
        torch.set_num_threads(task.threads)
    try:
        cfg, variant = task.cfg, task.variant
        names = [s for s in task.sources if s in variant["weights"]]
        with build_trainer(cfg, train_data=[task.folders[s] for s in names], sources=task.sources) as trainer:
            write_provenance(cfg.output, job_file=task.job_file, data=[cfg.shards], extra={"variant": variant})
            summary = trainer.fit()
    finally:
        torch.set_num_threads(before)
    if summary["preempted"]:  # no result.json: the next `winnow ablate` resumes this run from its checkpoint
        raise KeyboardInterrupt(f"variant {variant['name']} stopped at step {summary['step']}")
    held = (summary["eval"] or {}).get("eval", {}).get("per_source") or {}
    result = {**variant, "held_out": held, "steps": summary["step"], "tokens_seen": summary["tokens_seen"]}
    if cfg.eval_every:
        points = {r["step"]: r["eval"].get("per_source") or {} for r in load_run(cfg.output).evals}
        result["curve"] = [{"step": step, "held_out": points[step]} for step in sorted(points)]
    if summary["mixing"]:  # an adaptive run: the weights it moved to, and their mean (DoReMi's output mix)
        result["mixing"] = summary["mixing"]
    StudyLayout(Path(task.study)).write_result(variant["name"], result)
    drop_checkpoints(task)
    return result


def drop_checkpoints(task: VariantTask) -> None:
    """Remove a finished run's ``checkpoints/`` (the trainer's own folder in the run folder winnow made), unless
    the study keeps them or the run is the baseline; its result is saved first, so a crash between the two only
    leaves the checkpoints."""
    if task.keep_checkpoints or task.variant["name"] == BASELINE:
        return
    folder = Path(task.cfg.output) / "checkpoints"
    if folder.is_dir() and not folder.is_symlink():
        shutil.rmtree(folder)
        log.info("removed the checkpoints of finished run %s", task.variant["name"])


def _claim_device(gpus, threads: int) -> None:
    """Pool initializer: pin this worker to one GPU (before CUDA starts in it) and set its threads."""
    if gpus is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpus.get())
    if threads:
        import torch

        torch.set_num_threads(threads)


def run_variants(
    tasks: list[VariantTask],
    acfg: AblateConfig,
    announce: Callable[[dict], None] = lambda result: None,
    *,
    train: Callable[[VariantTask], dict] = train_variant,
) -> Iterator[dict]:
    """Train ``tasks`` ``acfg.parallel`` at a time (local processes or Ray), yielding results as they finish;
    ``train`` runs one task in a worker (a module-level function: it is pickled by reference)."""
    workers = min(acfg.parallel, len(tasks)) if acfg.executor == "local" else acfg.parallel
    gpus = _gpu_count()
    queue = None
    if acfg.executor == "local" and workers > 1 and gpus:
        import multiprocessing

        queue = multiprocessing.get_context("spawn").Queue()
        for i in range(workers):
            queue.put(i % gpus)
    threads = tasks[0].threads if tasks else 0
    # Ctrl-C goes to the training workers too: each trainer saves a checkpoint and stops (train.shutdown).
    with Executor(
        workers=workers,
        kind=acfg.executor,
        initializer=_claim_device,
        initargs=(queue, threads),
        gpus_per_task=1.0,
        interrupt="forward",
    ) as executor:
        for result in executor.run(train, tasks):
            announce(result)
            yield result


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
