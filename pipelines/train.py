"""``winnow train JOB.toml`` and ``winnow plan``: build a run from a job's ``[train]`` table, or size one."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import logging
import os
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

from winnow.curate.atomic import write_json_atomic
from winnow.curate.errors import ConfigError
from winnow.curate.lock import FolderLock
from winnow.curate.names import path_name
from winnow.curate.workdir import is_url, local_path
from winnow.pipelines.cleanup import removed_on_failure
from winnow.pipelines.jobfile import build_config, check_top_level, read_toml
from winnow.pipelines.provenance import write_provenance
from winnow.train.config import TrainConfig
from winnow.train.data.sets import ShardSetConfig, eval_sets, same_place, training_sets
from winnow.train.data.shards import job_manifest, split_rows
from winnow.train.errors import ShardError
from winnow.train.runfolder import CURATED_ENTRIES, RUN_FILES, archive_previous, claim_run_folder

if TYPE_CHECKING:  # torch's modules are imported where a run is built: `winnow check` and `config` load none
    from winnow.train.data import Loader
    from winnow.train.trainer import Trainer

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train the MoE model on a job's shards ([train] table)")
    p.add_argument("job", type=Path, help="the job file (TOML) with a [train] table")
    p.add_argument(
        "--shards",
        help="train on this folder or URL instead of [train] shards: a `winnow curate` "
        "output, or any folder of Parquet files with a `text` (and optional `source`) column",
    )
    p.add_argument("--steps", type=int, help="override [train] steps")
    p.add_argument("--output", help="override [train] output (the run folder)")
    p.set_defaults(func=run_train)


def load_train_config(job: Path, **overrides) -> TrainConfig:
    """The job's ``[train]`` table as a ``TrainConfig``; ``shards`` defaults to the job's output folder.

    The run folder defaults to ``<shards>/train`` for a folder ``winnow curate`` wrote, and to
    ``out/<folder name>/train`` for any other (winnow writes nothing into data it did not make).
    """
    raw = read_toml(job)
    check_top_level(raw, Path(job).name)
    if "train" not in raw:
        raise ConfigError(
            f"{job}: no [train] table, so there is nothing to say how to train; add one (a [train] header "
            "with e.g. steps = 300; `winnow config show train` lists its keys)"
        )
    table = dict(raw["train"])
    table.update({k: v for k, v in overrides.items() if v is not None and k != "output"})
    job_table = raw.get("job") if isinstance(raw.get("job"), dict) else {}
    job_output = job_table.get("output")
    if job_output is None and isinstance(job_table.get("name"), str) and job_table["name"]:
        job_output = f"out/{path_name(job_table['name'])}"  # where `winnow curate` writes a job without an output
    table.setdefault("shards", job_output)
    first = (
        table["shards"][0].get("path")
        if isinstance(table["shards"], list) and table["shards"] and isinstance(table["shards"][0], dict)
        else table["shards"]
    )
    table.setdefault("output", default_run_folder(first if isinstance(first, str) else None))
    replay = table.get("replay")
    if isinstance(replay, dict):  # `from` is a Python keyword: ReplayConfig names the field `path`
        if "path" in replay or "from" not in replay:
            raise ConfigError(
                f"{job} [train] key 'replay': needs 'from' (the base job folder) and 'share'; got keys {sorted(replay)}"
            )
        table["replay"] = {("path" if k == "from" else k): v for k, v in replay.items()}
    if overrides.get("output") is not None:
        table["output"] = overrides["output"]
    if table["shards"] is None or table["shards"] == []:
        raise ConfigError(
            f"{job} [train]: no data to train on; set train.shards (a job folder winnow curate wrote, or a list of "
            "them), give --shards, or add the [job] table whose output holds the curated shards"
        )
    _local_urls(table)
    cfg = build_config(TrainConfig, table, f"{job} [train]")
    refuse_shard_folder(cfg.output, cfg, f"{job} [train] key 'output'")
    return cfg


def _local_urls(table: dict) -> None:
    """``file://`` and ``~`` folders in the [train] keys that name folders, as the local paths they are (read as a
    path, ``file:///a`` named a folder ``file:`` in the current one, and ``~/a`` a folder ``~``)."""

    def local(value):
        return str(local_path(value)) if isinstance(value, str) and value.startswith(("file:", "~")) else value

    for key in ("output", "shards"):
        if key in table:
            table[key] = local(table[key])
    for key, entries in (("shards", table.get("shards")), ("eval", table.get("eval"))):
        if isinstance(entries, list):
            table[key] = [
                {**e, "path": local(e["path"])} if isinstance(e, dict) and "path" in e else local(e) for e in entries
            ]
    if isinstance(table.get("replay"), dict) and "path" in table["replay"]:
        table["replay"] = {**table["replay"], "path": local(table["replay"]["path"])}


def refuse_shard_folder(folder: str | Path, cfg: TrainConfig, key: str) -> None:
    """``ConfigError`` naming ``key`` when ``folder`` (a run's or a study's) is a curated job folder the run reads
    (``train.shards``, ``eval``, ``replay.from``), even before it is curated: the run's checkpoints and metrics
    would land among the shards, or inside its own entries (``shards/`` and the like: ``winnow curate`` clears
    them). Any curated folder's entries are refused where run folders are claimed, too
    (``train.runfolder.check_run_folder``)."""
    folders, _ = training_sets(cfg.shards, cfg.replay, cfg.data.mix_weights)
    here = same_place(str(folder))
    for path in eval_sets(cfg.eval, folders, cfg.replay):
        job = same_place(str(path))
        if job == here:
            raise ConfigError(
                f"{key} = {str(folder)!r} is a curated job folder the run reads ({path}); a run writes its "
                "checkpoints and metrics into a folder of its own: leave the key out (its default is a folder "
                "inside the job folder) or name another folder"
            )
        inside = next((e for e in CURATED_ENTRIES if here.startswith(f"{job}/{e}/") or here == f"{job}/{e}"), None)
        if inside is not None:
            raise ConfigError(
                f"{key} = {str(folder)!r} lies in {inside} of the job folder {path}, which `winnow curate` clears and "
                f"rewrites; give the run a folder beside it, e.g. {str(path).rstrip('/')}/train"
            )


def check_held_out_sources(cfg: TrainConfig) -> None:
    """The keys naming held-out sources (``[train.stop] sources`` and ``thresholds``, ``[train.attribution]
    held_out``) name sources the held-out sets' manifests hold: refused before step 1, not at the first
    evaluation. Sets without a local ``manifest.json`` (a URL, a folder of Parquet files) are not read."""
    folders, _ = training_sets(cfg.shards, cfg.replay, cfg.data.mix_weights)
    held: set[str] = set()
    for folder in eval_sets(cfg.eval, folders, cfg.replay):
        if "://" in folder or not (Path(folder) / "manifest.json").is_file():
            return
        try:
            held |= set(split_rows(job_manifest(folder), "val"))
        except (OSError, ShardError):
            return  # unreadable: the loader says what is wrong with it
    named = [("train.stop.sources", s) for s in cfg.stop.sources]
    named += [(f"train.stop.thresholds.{s}", s) for s in cfg.stop.thresholds]
    named += [("train.attribution.held_out", s) for s in cfg.attribution.held_out]
    for key, source in named:
        if source not in held:
            close = difflib.get_close_matches(source, sorted(held), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"{key}: no held-out rows of source {source!r}{hint}; the held-out sets hold {sorted(held) or 'none'}"
            )


def refuse_study_folder(output: str | Path) -> None:
    """``ConfigError`` when ``winnow train`` is pointed at a folder ``winnow ablate`` owns (``ablate.layout.
    study_owns``: a study's root, a variant's folder, or a folder in its ``variants/``, ``sources/``, ``curated/``
    or ``ablation/``): training there would move the study's run aside and leave its result beside another
    run's checkpoints."""
    if is_url(output):
        return
    from winnow.pipelines.ablate.layout import study_owns

    root = study_owns(output)
    if root is not None:
        raise ConfigError(
            f"train.output = {str(output)!r} is {'a study' if root == Path(output).resolve() else 'inside a study'} "
            f"(`winnow ablate` wrote {root}); training there would replace the study's runs; give the run a folder "
            "of its own, or re-run the study with `winnow ablate`"
        )


def default_run_folder(shards: str | None) -> str:
    if shards is None:
        return "out/train"
    if "://" not in str(shards) and (Path(shards) / "manifest.json").is_file():
        return str(Path(shards) / "train")
    return str(Path("out") / path_name(str(shards).rstrip("/").rsplit("/", 1)[-1] or "data") / "train")


def build_trainer(
    cfg: TrainConfig, *, train_data: list[str] | None = None, sources: list[str] | None = None, progress: bool = False
) -> Trainer:
    """``_build_trainer`` holding the run folder's lock (``curate.lock``) while the trainer lives.

    One run per run folder: a second ``winnow train`` into it is refused, naming the first, before it
    reads or writes anything there (the first rank of a torchrun job holds it for all).
    """
    lock = FolderLock(cfg.output, what="run folder").acquire() if os.environ.get("RANK", "0") == "0" else None
    try:
        trainer = _build_trainer(cfg, train_data=train_data, sources=sources, progress=progress)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    if lock is not None:
        weakref.finalize(trainer, lock.release)  # released once the trainer is gone (or at exit)
    return trainer


def _build_trainer(
    cfg: TrainConfig, *, train_data: list[str] | None = None, sources: list[str] | None = None, progress: bool = False
) -> Trainer:
    """The run ``cfg`` describes (``train.build.build_run``), its training sets split per source first where
    ``[train] shards`` or adaptive mixing asks for it; rank 0 records the config and the folders' views.

    ``train_data`` replaces ``cfg.shards`` for the train split only (several folders mixed by
    ``train.data.mix_weights``; held-out data stays ``cfg.shards``); ``sources`` fixes the source ids.
    ``progress`` shows the progress bar (``train/progress.py``) on rank 0.
    """
    from winnow.train.build import build_run

    check_resumable(cfg)
    _check_locations(cfg)
    claim_run_folder(cfg.output)  # before the per-source views are split into it
    sets = None
    if train_data is None:
        sets = _per_source_sets(_adaptive_sets(cfg) if cfg.mixing.active else cfg.shards, Path(cfg.output))
    trainer = build_run(cfg, train_sets=sets, train_data=train_data, sources=sources, progress=progress)
    if cfg.checkpoint.resume:
        try:  # other data, tokenizer or sources are refused here, before the run's records are rewritten
            trainer.resume()
        except BaseException:
            trainer.close()
            raise
    if trainer.parallel.is_main:  # one writer per run folder; the report reads config.json during the run
        folder = Path(cfg.output)
        if not trainer.step:  # afresh over an earlier run: all it left goes to previous-<k>/ before these records
            archive_previous(folder, RUN_FILES)
        if _records_follow(cfg, trainer.step, folder / "config.json"):
            trainer.data.tokenizer.save(folder)
            vocab = trainer.data.tokenizer.vocab_size  # the model's, whatever [train.model] said
            recorded = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_size=vocab))
            write_json_atomic(folder / "config.json", dataclasses.asdict(recorded))
        save_views(trainer.data, folder)
    return trainer


#: Keys that may differ on a resume without changing what was trained so far (``steps`` does change what follows:
#: the learning-rate schedule is the new length's, so it is named).
_RESUME_FREE = ("output", "checkpoint.resume", "model.vocab_size")


def _records_follow(cfg: TrainConfig, step: int, config_file: Path) -> bool:
    """Whether the run's records should take ``cfg`` at a resume from ``step``: say which settings changed (the run
    continues with them), and keep the records of a finished run that ``steps`` would end before it reached."""
    if not step:
        return True
    try:
        saved = json.loads(config_file.read_text())
    except (OSError, ValueError) as err:
        log.warning(
            "resuming from step %d, but %s cannot be read (%s): the settings the run was trained with are unknown, "
            "so a change of them cannot be named; the run continues with this job's, and config.json records them",
            step,
            config_file,
            getattr(err, "strerror", None) or err,
        )
        return True
    if cfg.steps < step:
        log.warning(
            "train.steps = %d is below the step the run's checkpoint reached (%d): nothing is trained, and the run's "
            "records keep its own settings; give more steps to train on",
            cfg.steps,
            step,
        )
        return False
    changed = [
        f"{key} ({_short(before)} -> {_short(after)}"
        + ("; the learning-rate schedule follows the new length from here" if key == "steps" else "")
        + ")"
        for key, before, after in _differences(saved, json.loads(json.dumps(dataclasses.asdict(cfg), default=str)))
        if not key.startswith(_RESUME_FREE)
    ]
    if changed:
        log.warning(
            "resuming from step %d with settings other than those it was trained with: %s; the run continues with "
            "them and config.json records them (set [train.checkpoint] resume = false, or a new train.output, to "
            "start a run of its own)",
            step,
            ", ".join(changed),
        )
    return True


def flat_keys(value: object, prefix: str = "") -> dict[str, object]:
    """A config dict's leaves under dotted keys (``{"optim": {"lr": 1}}`` -> ``{"optim.lr": 1}``)."""
    if isinstance(value, dict):
        out: dict[str, object] = {}
        for k, v in value.items():
            out |= flat_keys(v, f"{prefix}{k}.")
        return out
    return {prefix.rstrip("."): value}


def _differences(before: dict, after: dict) -> list[tuple[str, object, object]]:
    """Dotted keys whose values differ between two config dicts (keys only one of them has are left out)."""
    old, new = flat_keys(before), flat_keys(after)
    return [(k, old[k], new[k]) for k in sorted(old.keys() & new.keys()) if old[k] != new[k]]


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_locations(cfg: TrainConfig, *, exist: bool = True) -> None:
    """Every folder [train] names is a path, or a URL whose fsspec driver is installed: said up front, naming the key.
    ``exist``: the held-out and replay folders are there already (not curated by the same job file first)."""
    from winnow.curate.workdir import check_url, is_url

    named = [("train.shards", s) for s in ([cfg.shards] if isinstance(cfg.shards, str) else [])]
    named += [
        (f"train.shards[{i}].path", s.path) for i, s in enumerate(cfg.shards or []) if not isinstance(cfg.shards, str)
    ]
    named += [("train.eval", e) for e in cfg.eval] + [("train.init_from", cfg.init_from)]
    named += [("train.replay.from", cfg.replay.path if cfg.replay else None)]
    named += [("train.distill.teacher", cfg.distill.teacher if cfg.distill else None)]
    named += [("train.mixing.reference", cfg.mixing.reference)]
    for key, where in named:
        if isinstance(where, str) and not where.strip():
            raise ConfigError(f"{key} = {where!r} is invalid; allowed: a folder path or URL")
        if isinstance(where, str) and is_url(where):
            check_url(where, key, cfg.data.storage_options)
        elif (
            exist and key in ("train.eval", "train.replay.from") and isinstance(where, str) and not Path(where).exists()
        ):
            raise ConfigError(f"{key} = {where!r} does not exist; give a job folder `winnow curate` wrote")


def check_resumable(cfg: TrainConfig) -> None:
    """A run that resumes is the run its folder holds: refuse, before anything is written, a [train.model] other than
    the one its ``config.json`` records beside its checkpoints (the checkpoint would not fit the model)."""
    folder = Path(cfg.output)
    checkpoints = folder / "checkpoints"
    if not cfg.checkpoint.resume or not checkpoints.is_dir() or not any(checkpoints.iterdir()):
        return
    try:
        saved = json.loads((folder / "config.json").read_text())["model"]
        mine = dataclasses.asdict(cfg.model)
        # keys both know: a key added or removed since that run was written is not a difference of the model
        differ = [k for k in sorted(saved.keys() & mine.keys()) if k != "vocab_size" and saved[k] != mine[k]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return  # no readable record of the earlier run: the checkpoint's own checks decide
    if differ:
        detail = ", ".join(f"{k} (the run's {saved.get(k)!r}, this config's {mine.get(k)!r})" for k in differ)
        raise ConfigError(
            f"train.output = {cfg.output!r} holds checkpoints of a run whose [train.model], as its config.json "
            f"records it, differs in {detail}; resume with the same [train.model], choose a new train.output, or set "
            "[train.checkpoint] resume = false to start over (the earlier run is moved to previous-<k>/); if "
            "config.json was edited by hand, restore it: the checkpoints hold their own model"
        )


def _adaptive_sets(cfg: TrainConfig) -> list[ShardSetConfig]:
    """Adaptive mixing reweights sources, so every training set is trained as one set per source: a job folder,
    or a ``[train] shards`` entry without ``sources``, starts from the shares its train shards hold (split once
    under ``<run>/sources/set-<i>/``, where ``_per_source_sets`` finds the split again)."""
    from winnow.pipelines.ablate.sources import split_by_source

    entries = [ShardSetConfig(path=cfg.shards)] if isinstance(cfg.shards, str) else list(cfg.shards)
    out = []
    for i, entry in enumerate(entries):
        if not entry.sources:
            _, shares = split_by_source(entry.path, Path(cfg.output) / "sources" / f"set-{i}")
            entry = dataclasses.replace(entry, sources=shares)
        out.append(entry)
    return out


def check_set_sources(shards) -> None:
    """Each ``[train] shards`` entry's ``sources`` names sources with train rows in its job folder's manifest (a
    folder without a manifest is checked when it is split)."""
    if isinstance(shards, str) or shards is None:
        return
    for i, entry in enumerate(shards):
        wanted = [s for s, w in entry.sources.items() if w > 0]
        if not wanted or not (Path(entry.path) / "manifest.json").is_file():
            continue
        manifest = job_manifest(entry.path)
        trained = {
            s for e in manifest["shards"] if e.get("split", "train") == "train" for s in (e.get("sources") or {})
        }
        if missing := [s for s in wanted if s not in trained]:
            raise ConfigError(
                f"train.shards[{i}].sources: {missing[0]!r} has no train rows in {entry.path} "
                f"(sources there: {sorted(trained)})"
            )


def _per_source_sets(shards, run_dir: Path):
    """``[train] shards`` with each entry that has per-source weights replaced by one set per source
    (split once under ``<run>/sources/set-<i>/``, reused while the job's manifest is unchanged)."""
    if isinstance(shards, str) or not any(entry.sources for entry in shards):
        return shards
    from winnow.pipelines.ablate.sources import split_by_source

    check_set_sources(shards)  # before anything is split into the run folder
    out = []
    for i, entry in enumerate(shards):
        if not entry.sources:
            out.append(entry)
            continue
        folders, _ = split_by_source(entry.path, run_dir / "sources" / f"set-{i}")
        missing = [s for s, w in entry.sources.items() if w > 0 and s not in folders]
        if missing:
            raise ConfigError(
                f"train.shards[{i}].sources: {missing[0]!r} has no train rows in {entry.path} "
                f"(sources there: {sorted(folders)})"
            )
        total = sum(entry.sources.values())
        out += [
            ShardSetConfig(path=folders[s], weight=entry.weight * w / total) for s, w in entry.sources.items() if w > 0
        ]
    return out


def run_inputs(cfg: TrainConfig, trainer: Trainer) -> dict:
    """``write_provenance`` keywords for a run: every job folder it reads and what it was initialized from."""
    folders, _ = (
        training_sets(cfg.shards, cfg.replay, cfg.data.mix_weights)
        if not isinstance(cfg.shards, str)
        else ([cfg.shards], None)
    )
    if cfg.replay is not None and cfg.replay.path not in folders:
        folders.append(cfg.replay.path)
    data = list(dict.fromkeys(folders + list(cfg.eval)))
    extra = {}
    if trainer.init is not None:  # a resumed run was initialized when it started: that record stands
        started = _recorded(Path(cfg.output) / "provenance.json", "init_from") if trainer.step else None
        extra["init_from"] = started or trainer.init.provenance()
    if cfg.mixing.active:  # the run its excess losses were measured against
        extra["mixing_reference"] = cfg.mixing.reference
    return {"data": data, "extra": extra or None}


def _recorded(path: Path, key: str):
    """``key`` of the JSON object in ``path``, or None (no file, not JSON, no such key)."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found.get(key) if isinstance(found, dict) else None


def save_views(data: Loader, run_dir: Path) -> None:
    """Record the view made of each folder without a manifest beside the run, and say so."""
    views = [v for v in data.views if v is not None]
    if views:
        path = run_dir / "data_view.json"
        write_json_atomic(path, views)
        for v in views:
            print(
                f"{v['view_of']}: no manifest.json, so winnow made its view of the folder: {len(v['shards'])} "
                f"Parquet file(s), {sum(s['rows'] for s in v['shards'])} rows, sources {v['sources']} (saved in {path})"
            )


def model_line(trainer: Trainer) -> str:
    """The model's size and the peak FLOP/s its MFU is measured against, with where that figure comes from."""
    total, active = trainer.model.cfg.param_counts()
    return (
        f"model: {total / 1e6:.2f}M parameters, {active / 1e6:.2f}M active; MFU basis {trainer.peak_flops:.3g} "
        f"FLOP/s ({trainer.peak_basis})"
    )


def run_train(args: argparse.Namespace) -> int:
    cfg = load_train_config(args.job, steps=args.steps, output=args.output, shards=args.shards)
    refuse_study_folder(cfg.output)
    check_held_out_sources(cfg)
    with removed_on_failure(cfg.output), build_trainer(cfg, progress=not args.quiet) as trainer:
        write_provenance(cfg.output, job_file=args.job, **run_inputs(cfg, trainer))
        print(model_line(trainer))
        summary = trainer.fit()
    from winnow.train.parallel import shutdown

    shutdown()
    if not trainer.parallel.is_main:
        return 0
    state = (
        "preempted (re-run the same command to resume)"
        if summary["preempted"]
        else f"stopped early ({summary['stopped']})"
        if summary.get("stopped")
        else "done"
    )
    print(f"training {state} at step {summary['step']}: {summary['tokens_seen']} tokens, skipped {summary['skipped']}")
    print(f"metrics:     {Path(cfg.output) / 'metrics.jsonl'}")
    if summary["mixing"]:
        mean = summary["mixing"]["mix_weights_mean"]
        print("adaptive mix, mean over the run: " + ", ".join(f"{k}={w:.3f}" for k, w in mean.items()))
    print(f"checkpoint:  {summary['checkpoint']}")
    if cfg.attribution.every and not summary["preempted"]:
        from winnow.pipelines.report.counterfactual import text
        from winnow.pipelines.report.training import load_run

        found = load_run(cfg.output).counterfactual
        print(
            "\n"
            + (
                text(found)
                if found is not None
                else "attribution: the run ended before its first attributed stretch closed; nothing to predict from"
            )
        )
    return 0
