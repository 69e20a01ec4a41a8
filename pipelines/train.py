"""``winnow train JOB.toml`` and ``winnow plan``: build a run from a job's ``[train]`` table, or size one."""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path

import torch

from curate.atomic import write_json_atomic
from curate.errors import ConfigError
from pipelines.cleanup import removed_on_failure
from pipelines.jobfile import build_config, check_top_level, read_toml
from pipelines.provenance import write_provenance
from train.adaptive import AdaptiveMix, MixingConfig
from train.config import TrainConfig
from train.data import Loader
from train.data.sets import HeldOut, ShardSetConfig, eval_sets, training_sets
from train.data.tokenshards import shards_tokenizer, split_sources
from train.errors import ShardError
from train.init import load_init
from train.model import ModelConfig, Transformer
from train.parallel import Parallel, shutdown
from train.progress import TrainProgress
from train.tokenizer import load_tokenizer
from train.trainer import Trainer

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train the MoE model on a job's shards ([train] table)")
    p.add_argument("job", type=Path, help="the job file (TOML) with a [train] table")
    p.add_argument("--shards", help="train on this folder or URL instead of [train] shards: a `winnow curate` "
                   "output, or any folder of Parquet files with a `text` (and optional `source`) column")
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
        raise ConfigError(f"{job}: no [train] table, so there is nothing to say how to train; add one (a [train] header "
                          "with e.g. steps = 300; `winnow config show train` lists its keys)")
    table = dict(raw["train"])
    table.update({k: v for k, v in overrides.items() if v is not None and k != "output"})
    table.setdefault("shards", (raw.get("job") or {}).get("output"))
    first = table["shards"][0].get("path") if isinstance(table["shards"], list) and table["shards"] and \
        isinstance(table["shards"][0], dict) else table["shards"]
    table.setdefault("output", default_run_folder(first if isinstance(first, str) else None))
    replay = table.get("replay")
    if isinstance(replay, dict):  # `from` is a Python keyword: ReplayConfig names the field `path`
        if "path" in replay or "from" not in replay:
            raise ConfigError(f"{job} [train] key 'replay': needs 'from' (the base job folder) and 'share'; "
                              f"got keys {sorted(replay)}")
        table["replay"] = {("path" if k == "from" else k): v for k, v in replay.items()}
    if overrides.get("output") is not None:
        table["output"] = overrides["output"]
    return build_config(TrainConfig, table, f"{job} [train]")


def default_run_folder(shards: str | None) -> str:
    if shards is None:
        return "out/train"
    if "://" not in str(shards) and (Path(shards) / "manifest.json").is_file():
        return str(Path(shards) / "train")
    return str(Path("out") / (str(shards).rstrip("/").rsplit("/", 1)[-1] or "data") / "train")


def build_trainer(cfg: TrainConfig, *, train_data: list[str] | None = None, sources: list[str] | None = None,
                  progress: bool = False) -> Trainer:
    """Tokenizer, loaders, model (and teacher) from the config, composed into a ``Trainer``.

    ``train_data`` replaces ``cfg.shards`` for the train split only (several folders mixed by
    ``train.data.mix_weights``; held-out data stays ``cfg.shards``); ``sources`` fixes the source ids.
    Otherwise the training sets are ``cfg.shards`` and ``cfg.replay`` with their weights, and the
    held-out sets ``cfg.eval`` (default: the training folders); see ``train/data/sets.py``.
    ``progress`` shows the progress bar (``train/progress.py``) on rank 0.
    """
    if train_data is None:
        folders, _ = training_sets(cfg.shards, cfg.replay, cfg.data.mix_weights)
        held_out = eval_sets(cfg.eval, folders, cfg.replay)  # the job folders: per-source views hold no val split
        shards = _adaptive_sets(cfg) if cfg.mixing.active else cfg.shards
        sets = _per_source_sets(shards, Path(cfg.output))
        views = sets is not cfg.shards  # per-source sets: Parquet and token shards, no WebDataset tars
        folders, weights = training_sets(sets, cfg.replay, cfg.data.mix_weights)
    else:
        folders, weights, held_out = list(train_data), cfg.data.mix_weights, eval_sets(cfg.eval, [cfg.shards], None)
        views = True
    # under torchrun: join the process group; each data-parallel rank reads its own part of the loader's global
    # order (the tensor- and pipeline-parallel ranks of one dp rank read the same batches)
    parallel = Parallel.from_env(cfg.parallel, device=cfg.device, n_experts=cfg.model.n_experts)
    device, world = parallel.world.device, parallel.world
    torch.manual_seed(cfg.seed)
    run_dir = Path(cfg.output)
    run_dir.mkdir(parents=True, exist_ok=True)
    # no [train.tokenizer]: the one the job's token shards were written with (byte-level without any);
    # the job folder decides even when train_data replaces it (ablation variants' per-source views)
    job_folder = cfg.shards if isinstance(cfg.shards, str) else folders[0]
    tokenizer = load_tokenizer(cfg.tokenizer if cfg.tokenizer is not None else shards_tokenizer(job_folder, cfg.data.storage_options))
    if world.is_main:  # one writer per run folder
        tokenizer.save(run_dir)
    model_cfg = dataclasses.replace(cfg.model, vocab_size=tokenizer.vocab_size)
    init = None
    if cfg.init_from is not None:
        init = load_init(cfg.init_from, optimizer=cfg.init_optimizer, storage_options=cfg.data.storage_options)
        init.check(model_cfg, tokenizer)
    fmt = "auto" if views and cfg.data.format == "webdataset" else cfg.data.format  # the same rows, as Parquet
    held_out, names = _held_out_sets(cfg, folders, held_out, sources, train_format=fmt)
    train_cfg = dataclasses.replace(cfg.data, mix_weights=list(weights) if len(folders) > 1 else [], format=fmt)
    data = Loader(train_cfg, folders if len(folders) > 1 else folders[0], split="train", tokenizer=tokenizer,
                  rank=world.dp_rank, world_size=world.dp_size, sources=names)
    if world.is_main:
        write_json_atomic(run_dir / "config.json", dataclasses.asdict(cfg))  # the report reads it during the run
        save_views(data, run_dir)

    # Held-out batches are read inline: a few batches per eval, and forking loader workers
    # after training has started its thread pools is how forked children deadlock.
    # one folder at a time: no load-time mixing; and the same batches in every run whatever its seed,
    # shuffling or sequence-length warm-up, so held-out losses compare across runs (step 0 of a continued
    # run is its base's last evaluation exactly; a study's seeds differ in training only)
    val_cfg = dataclasses.replace(cfg.data, num_workers=0, mix_weights=[], shuffle_window=0, seq_len_warmup_steps=0)

    def val_data():
        return HeldOut(held_out, lambda folder: Loader(val_cfg, folder, split="val", tokenizer=tokenizer, sources=data.sources),
                       max_batches=cfg.eval_batches)

    teacher = load_teacher(cfg.distill.teacher, cfg.data.storage_options) if cfg.distill else None
    mixer = (build_mixer(cfg.mixing, data, tokenizer, device, storage_options=cfg.data.storage_options)
             if cfg.mixing.active else None)
    model = Transformer(model_cfg, activation_checkpointing=cfg.activation_checkpointing,
                        experts=parallel.expert_shard(model_cfg.n_experts), tensor=parallel.tensor_shard(model_cfg))
    return Trainer(cfg, model=model, data=data, sources=data.sources, run_dir=run_dir,
                   device=device, val_data=val_data if held_out else None, teacher=teacher, parallel=parallel, init=init,
                   progress=TrainProgress(total=cfg.steps, enabled=progress, every=cfg.metrics.log_every), mixer=mixer)


def _adaptive_sets(cfg: TrainConfig) -> list[ShardSetConfig]:
    """Adaptive mixing reweights sources, so every training set is trained as one set per source: a job folder,
    or a ``[train] shards`` entry without ``sources``, starts from the shares its train shards hold (split once
    under ``<run>/sources/set-<i>/``, where ``_per_source_sets`` finds the split again)."""
    from pipelines.ablate.sources import split_by_source

    entries = [ShardSetConfig(path=cfg.shards)] if isinstance(cfg.shards, str) else list(cfg.shards)
    out = []
    for i, entry in enumerate(entries):
        if not entry.sources:
            _, shares = split_by_source(entry.path, Path(cfg.output) / "sources" / f"set-{i}")
            entry = dataclasses.replace(entry, sources=shares)
        out.append(entry)
    return out


def build_mixer(cfg: MixingConfig, data: Loader, tokenizer, device: torch.device, *,
                storage_options: dict | None = None) -> AdaptiveMix:
    """The adaptive mix over the loader's training sets, scored against ``cfg.reference``; a ConfigError names
    the key when the reference cannot score this run's data (other tokenizer, vocabulary or sources)."""
    found = load_init(cfg.reference, key="train.mixing.reference", storage_options=storage_options)
    where, state = found.where, found.state
    found.check_tokenizer(tokenizer)
    reference_cfg = ModelConfig(**found.model_config())  # any size: only the vocabulary must be this run's
    if reference_cfg.vocab_size != tokenizer.vocab_size:
        raise ConfigError(f"{where}: the reference model has a vocabulary of {reference_cfg.vocab_size}, this run's "
                          f"tokenizer {tokenizer.vocab_size}; train the reference with this run's tokenizer")
    held = data.set_sources
    many = next((names for names in held if len(names) != 1), None)
    if many is not None:  # the replay set: every [train] shards entry was split per source
        raise ConfigError(f"train.mixing.adaptive = {cfg.adaptive!r} reweights sources, but the replay set holds "
                          f"{many} at a fixed share; drop train.replay and list its job folder under [train] shards, "
                          "e.g. shards = [{path = 'out/job'}, {path = 'out/base'}]: the mix then moves its sources too")
    names = [n[0] for n in held]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None:
        raise ConfigError(f"train.mixing.adaptive = {cfg.adaptive!r} reweights sources, but source {twice!r} is in "
                          "two [train] shards entries; give each source once (an entry's sources = {...} picks them)")
    unknown = [names[0] for names in held if names[0] not in state.get("sources", [])]
    if unknown:
        raise ConfigError(f"{where}: the reference run was trained on sources {state.get('sources')}, without "
                          f"{unknown[0]!r}, which this run trains on; use a reference trained on this run's sources")
    reference = Transformer(reference_cfg)
    reference.load_state_dict(state["model"])
    return AdaptiveMix(cfg, reference=reference, set_sources=[data.sources.index(names[0]) for names in held],
                       weights=data.mix_weights, n_sources=len(data.sources), device=device)


def _per_source_sets(shards, run_dir: Path):
    """``[train] shards`` with each entry that has per-source weights replaced by one set per source
    (split once under ``<run>/sources/set-<i>/``, reused while the job's manifest is unchanged)."""
    if isinstance(shards, str) or not any(entry.sources for entry in shards):
        return shards
    from pipelines.ablate.sources import split_by_source

    out = []
    for i, entry in enumerate(shards):
        if not entry.sources:
            out.append(entry)
            continue
        folders, _ = split_by_source(entry.path, run_dir / "sources" / f"set-{i}")
        missing = [s for s, w in entry.sources.items() if w > 0 and s not in folders]
        if missing:
            raise ConfigError(f"train.shards[{i}].sources: {missing[0]!r} has no train rows in {entry.path} "
                              f"(sources there: {sorted(folders)})")
        total = sum(entry.sources.values())
        out += [ShardSetConfig(path=folders[s], weight=entry.weight * w / total) for s, w in entry.sources.items() if w > 0]
    return out


def _held_out_sets(cfg: TrainConfig, train: list[str], held_out: list[str], sources: list[str] | None, *,
                   train_format: str) -> tuple[list[str], list[str]]:
    """The held-out folders that have a val split, and every source name (training sets' first) so
    sources only evaluated still get an id before the trainer sizes its per-source sums."""
    names = list(sources or [])
    opts = dict(fmt=cfg.data.format, storage_options=cfg.data.storage_options)
    for folder in train:
        names += split_sources(str(folder), split="train", **{**opts, "fmt": train_format})
    kept = []
    for folder in held_out:
        try:
            names += split_sources(str(folder), split="val", **opts)
            kept.append(folder)
        except ShardError as err:
            log.warning("no held-out evaluation on %s: %s", folder, err)
    return kept, list(dict.fromkeys(names))


def run_inputs(cfg: TrainConfig, trainer: Trainer) -> dict:
    """``write_provenance`` keywords for a run: every job folder it reads and what it was initialized from."""
    folders, _ = training_sets(cfg.shards, cfg.replay, cfg.data.mix_weights) if not isinstance(cfg.shards, str) \
        else ([cfg.shards], None)
    if cfg.replay is not None and cfg.replay.path not in folders:
        folders.append(cfg.replay.path)
    data = list(dict.fromkeys(folders + list(cfg.eval)))
    extra = {"init_from": trainer.init.provenance()} if trainer.init is not None else {}
    if cfg.mixing.active:  # the run its excess losses were measured against
        extra["mixing_reference"] = cfg.mixing.reference
    return {"data": data, "extra": extra or None}


def load_teacher(path: str, storage_options: dict | None = None) -> Transformer:
    """A trained model from a run folder (its newest checkpoint that verifies) or one checkpoint, local or fsspec."""
    found = load_init(path, key="train.distill.teacher", storage_options=storage_options)
    model = Transformer(ModelConfig(**found.model_config()))
    model.load_state_dict(found.state["model"])
    return model.eval()


def save_views(data: Loader, run_dir: Path) -> None:
    """Record the view made of each folder without a manifest beside the run, and say so."""
    views = [v for v in data.views if v is not None]
    if views:
        path = run_dir / "data_view.json"
        write_json_atomic(path, views)
        for v in views:
            print(f"{v['view_of']}: no manifest.json, so winnow made its view of the folder: {len(v['shards'])} "
                  f"Parquet file(s), {sum(s['rows'] for s in v['shards'])} rows, sources {v['sources']} (saved in {path})")


def model_line(trainer: Trainer) -> str:
    """The model's size and the peak FLOP/s its MFU is measured against, with where that figure comes from."""
    total, active = trainer.model.num_params()
    return (f"model: {total / 1e6:.2f}M parameters, {active / 1e6:.2f}M active; MFU basis {trainer.peak_flops:.3g} "
            f"FLOP/s ({trainer.peak_basis})")


def run_train(args: argparse.Namespace) -> int:
    cfg = load_train_config(args.job, steps=args.steps, output=args.output, shards=args.shards)
    with removed_on_failure(cfg.output), build_trainer(cfg, progress=not args.quiet) as trainer:
        write_provenance(cfg.output, job_file=args.job, **run_inputs(cfg, trainer))
        print(model_line(trainer))
        summary = trainer.fit()
    shutdown()
    if not trainer.parallel.is_main:
        return 0
    state = "preempted (re-run the same command to resume)" if summary["preempted"] else \
        f"stopped early ({summary['stopped']})" if summary.get("stopped") else "done"
    print(f"training {state} at step {summary['step']}: {summary['tokens_seen']} tokens, skipped {summary['skipped']}")
    print(f"metrics:     {Path(cfg.output) / 'metrics.jsonl'}")
    if summary["mixing"]:
        mean = summary["mixing"]["mix_weights_mean"]
        print("adaptive mix, mean over the run: " + ", ".join(f"{k}={w:.3f}" for k, w in mean.items()))
    print(f"checkpoint:  {summary['checkpoint']}")
    return 0
