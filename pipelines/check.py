"""``winnow check JOB.toml``: validate a whole job file without running anything.

Every table the file holds is built as the commands that use it build it (``[job]``,
``[[inputs]]``, ``[[stages]]`` and ``[output]`` as ``winnow curate`` does, ``[train]`` as
``winnow train`` does, ``[ablate]`` as ``winnow ablate`` does), so an error here is the error
the command would stop on, naming the file, the table and the key. The inputs' files are listed
(read-only) so a wrong path is caught too, and data ``[train]`` reads that exists already (shards, held-out
and replay folders) is opened as training opens it, with training's messages; nothing is written. ``winnow run`` runs the same
validation before it curates, so a mistake in ``[train]`` never waits for curation to finish.
"""

from __future__ import annotations

import argparse
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from winnow.curate.config import Job, JobSection
from winnow.curate.errors import ConfigError
from winnow.pipelines.jobfile import build_config, check_sources, check_top_level, load_job, read_toml


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="validate a job file (every table, the inputs' paths) without running anything")
    p.add_argument("job", type=Path, help="the job file (TOML)")
    p.set_defaults(func=run_check)


@dataclass(slots=True)
class CheckedJob:
    """What a job file holds, each part validated: None where the file has no such table."""

    raw: dict[str, Any]
    job: Job | None  # [job], [[inputs]], [[stages]], [output]
    train: Any = None  # train.config.TrainConfig
    ablate: Any = None  # pipelines.ablate.config.AblateConfig
    unchecked: str | None = None  # a table that needs a package this install lacks


def validate(
    path: str | Path,
    *,
    output: str | None = None,
    workers: int | None = None,
    train_overrides: dict[str, Any] | None = None,
    study: bool = True,
) -> CheckedJob:
    """Build every table of the job file; a ``ConfigError`` names the first mistake (file, table, key).

    With ``study`` (``winnow check``) a file holding ``[ablate]`` is checked as ``winnow ablate`` runs it: its
    ``[train]`` as the study trains it, the study's folder and, on shards already curated, every key naming a
    source. Without it (``winnow run``, which never reads ``[ablate]`` beyond its table) ``[train]`` is checked
    as ``winnow run`` trains it, with its run folder."""
    raw = read_toml(path)
    check_top_level(raw, Path(path).name)
    curates = "inputs" in raw  # a [job] alone names the curated folder a study or a run trains on
    if not curates and "train" not in raw:
        raise ConfigError(f"{path}: nothing to run: no [[inputs]] to curate, no [train] to train")
    if not curates and "job" in raw:  # it only names the curated folder: no name is needed (ablate and train agree)
        table = raw["job"] if not isinstance(raw["job"], dict) else {"name": "job", **raw["job"]}
        build_config(JobSection, table, f"{Path(path).name} [job]")
    checked = CheckedJob(raw=raw, job=load_job(path, output=output, workers=workers) if curates else None)
    if "train" not in raw and "ablate" not in raw:
        return checked
    try:
        from winnow.pipelines.ablate.config import AblateConfig
        from winnow.pipelines.train import load_train_config
    except ModuleNotFoundError as err:  # a curation-only install: say what was not checked
        checked.unchecked = f"[train] and [ablate] need {err.name!r}: pip install 'winnow[train]'"
        return checked
    overrides = {k: v for k, v in (train_overrides or {}).items() if v is not None}
    table = raw.get("train") or {}
    if checked.job is not None and trains_on_curation(raw):
        overrides.setdefault("shards", checked.job.job.output)  # where `winnow run` trains
        if "output" not in table and "://" not in checked.job.job.output:  # beside the shards curation will write
            overrides.setdefault("output", str(Path(checked.job.job.output) / "train"))
    if "ablate" in raw:
        checked.ablate = build_config(AblateConfig, raw["ablate"], f"{path} [ablate]")
    studying = study and checked.ablate is not None
    study_job = None
    if studying and checked.ablate.curates:
        from winnow.pipelines.ablate.curation import load_curation_job

        study_job = load_curation_job(path, raw, checked.ablate.job)
    if "train" in raw and studying:  # trains where `winnow ablate` does
        from winnow.pipelines.ablate.layout import StudyLayout
        from winnow.pipelines.ablate.study import (
            check_study_folder,
            study_ablate_config,
            study_folder,
            study_train_config,
        )

        checked.ablate = study_ablate_config(checked.ablate)
        shards, steps = overrides.pop("shards", None), overrides.pop("steps", None)
        checked.train = study_train_config(
            Path(path), raw, checked.ablate, study_job, shards=shards, steps=steps, **overrides
        )
        # the folder `winnow ablate` would refuse (a user's files, a run of `winnow train`): nothing is written
        check_study_folder(StudyLayout(study_folder(checked.ablate, checked.train)))
    elif "train" in raw:
        checked.train = load_train_config(Path(path), **overrides)
    if checked.job is not None and checked.train is not None and checked.train.shards == checked.job.job.output:
        _check_training_sources(checked, Path(path).name)
    if checked.train is not None:
        from winnow.pipelines.train import _check_locations, check_held_out_sources, check_set_sources

        _check_train_paths(checked.train, Path(path).name)
        # the data there already is read as training starts by reading it; other paths by their names alone
        data_there = not studying and checked.job is None
        _check_locations(checked.train, exist=data_there)
        _check_init_from(checked)
        check_set_sources(checked.train.shards)
        if checked.job is None and study_job is None:  # trains on shards already curated: their manifests say
            check_held_out_sources(checked.train)
        if not studying and "://" not in str(checked.train.output):  # where `winnow train` or `winnow run` writes
            from winnow.pipelines.train import check_resumable, refuse_study_folder
            from winnow.train.runfolder import check_run_folder

            refuse_study_folder(checked.train.output)
            check_run_folder(checked.train.output)
            check_resumable(checked.train)  # a run there resumes: its [train.model] must be this one
        if data_there:
            from winnow.train.heldout import check_data

            check_data(checked.train)
    if study_job is not None:
        from winnow.pipelines.ablate.plan import curation_variants

        seed = checked.train.seed if checked.train is not None else 0
        curation_variants(checked.ablate, seed, study_job)  # names the key
    elif studying and checked.train is not None and "replay" not in checked.ablate.kinds:
        # on the shards a study re-mixes as they are (`winnow ablate` never curates a study of the mix), unless the
        # file's inputs bring sources they lack: then `winnow run` is to curate them first
        manifest = Path(checked.train.shards) / "manifest.json" if "://" not in checked.train.shards else None
        if manifest is not None and manifest.is_file() and _holds_the_inputs_sources(manifest, checked.job):
            from winnow.pipelines.ablate.study import plan_on_manifest

            plan_on_manifest(checked.ablate, checked.train, None, path=path)
    return checked


def _check_train_paths(train: Any, name: str) -> None:
    """Files and folders [train] reads before it trains, which exist before the run starts: each local one is there.

    (``[train.mixing] reference`` may be a run the same study trains first, so it is left to the run.)"""
    from winnow.curate.workdir import is_url

    named = [("init_from", train.init_from)]
    named += [("tokenizer.path", getattr(train.tokenizer, "path", train.tokenizer))]
    named += [("distill.teacher", train.distill.teacher if train.distill else None)]
    for key, where in named:
        if isinstance(where, str) and where and not is_url(where) and not Path(where).exists():
            raise ConfigError(f"{name} [train] key {key!r}: {where} does not exist; give the path of one that does")


def trains_on_curation(raw: dict) -> bool:
    """Whether a job file's ``[train]`` trains on what its own curation writes: ``shards`` unset, or naming the
    file's ``[job] output`` (so ``--output`` moves both). Other shards, a folder or a list, are trained on as
    given."""
    shards = (raw.get("train") or {}).get("shards")
    if shards is None:
        return True
    output = (raw.get("job") or {}).get("output") if isinstance(raw.get("job"), dict) else None
    return (
        isinstance(shards, str) and isinstance(output, str) and posixpath.normpath(shards) == posixpath.normpath(output)
    )


def _holds_the_inputs_sources(manifest: Path, job: Job | None) -> bool:
    """Whether a curated job's ``manifest`` lists every source ``job``'s inputs name (always without a job)."""
    if job is None:
        return True
    from winnow.train.data.shards import job_manifest

    named = {i.source for i in job.inputs if i.source is not None}
    return named <= set(job_manifest(str(manifest.parent)).get("sources") or [])


def _check_init_from(checked: CheckedJob) -> None:
    """``[train] init_from``'s model and tokenizer against the run's, as ``winnow train`` checks them
    (``train.build.checked_init``). Where the tokenizer comes from shards not curated yet, it is the one this
    job's curation writes them with; shards another command curates first (a study's) are left to the run."""
    from winnow.curate.workdir import is_url

    train = checked.train
    if train.init_from is None or is_url(train.init_from):
        return
    from winnow.train.build import checked_init, run_tokenizer  # torch: only where there is a checkpoint to read
    from winnow.train.tokenizer import load_tokenizer

    job_folder = train.shards if isinstance(train.shards, str) else train.shards[0].path
    curates = checked.job is not None and job_folder == checked.job.job.output
    if train.tokenizer is not None or is_url(job_folder) or (Path(job_folder) / "manifest.json").is_file():
        tokenizer = run_tokenizer(train, job_folder)
    elif curates:
        output = checked.job.output
        tokenizer = load_tokenizer(output.tokens.tokenizer if "tokens" in output.formats else None)
    elif Path(job_folder).is_dir():  # data without a manifest: training reads it with the byte tokenizer
        tokenizer = run_tokenizer(train, job_folder)
    else:
        return
    checked_init(train, tokenizer, weights=False)


def _check_training_sources(checked: CheckedJob, name: str) -> None:
    """The training tables that name sources, when they train on the job's own shards: the sources its inputs declare."""
    inputs, stop = checked.job.inputs, checked.train.stop
    check_sources(stop.sources, inputs, f"{name} [train.stop] key 'sources'")
    check_sources(stop.thresholds, inputs, f"{name} [train.stop] key 'thresholds'")
    if checked.ablate is not None:
        check_sources(checked.ablate.sources, inputs, f"{name} [ablate] key 'sources'")
        if checked.ablate.target != "mean":
            check_sources(checked.ablate.target, inputs, f"{name} [ablate] key 'target'")
        for variant, mix in checked.ablate.mixes.items():
            check_sources(mix, inputs, f"{name} [ablate] key 'mixes.{variant}'")


def run_check(args: argparse.Namespace) -> int:
    checked = validate(args.job)
    lines = []
    if checked.job is not None:
        from winnow.curate.readers.files import list_files

        job = checked.job
        files = [len(list_files(cfg)) for cfg in job.inputs]  # a wrong path fails here, naming the input
        inputs = ", ".join(f"{cfg.label} ({n} file{'s' * (n != 1)})" for cfg, n in zip(job.inputs, files))
        lines += [
            f"inputs:  {inputs}",
            f"stages:  {' -> '.join(s.kind for s in job.stages) or '(none)'}",
            f"output:  {job.job.output} ({', '.join(job.output.formats)})",
        ]
    t, a = checked.train, checked.ablate
    if t is not None:  # a study's runs train in its folder (the ablate line), not in [train] output
        where = "each run of the study" if a is not None else t.output
        lines.append(f"train:   {t.steps} steps of batch {t.data.batch_size} x {t.data.seq_len} tokens -> {where}")
    if a is not None:
        first = None if t is None else t.shards if isinstance(t.shards, str) else t.shards[0].path
        where = a.output or (first and f"{first.rstrip('/')}/{'replay' if 'replay' in a.kinds else 'ablate'}")
        lines.append(f"ablate:  {', '.join(a.kinds)}" + (f" -> {where}" if where else ""))
    if checked.unchecked:
        lines.append(f"not checked: {checked.unchecked}")
    print(f"{args.job}: ok")
    print("\n".join(f"  {line}" for line in lines))
    return 0
