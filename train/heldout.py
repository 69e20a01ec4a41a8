"""The sets a run reads, opened as ``build_run`` opens them: each training set's train split, each held-out set's
val split, and the rules that need held-out rows (``[train.stop]``, attribution, ``train.eval``).

No torch here: ``winnow check`` reads the data with the same calls, so a job training would refuse at once is
refused by check with training's message, without loading a model.
"""

from __future__ import annotations

import logging

from winnow.train.config import TrainConfig
from winnow.train.data.sets import eval_sets, training_sets
from winnow.train.data.tokenshards import split_sources
from winnow.train.errors import ConfigError, NoShardsError

log = logging.getLogger(__name__)


def check_data(cfg: TrainConfig) -> None:
    """Open the run's training and held-out sets as ``build_run`` does (nothing is written): a missing folder, one
    without shards, or held-out rules with no held-out rows to read are refused with training's message."""
    folders, _ = training_sets(cfg.shards, cfg.replay, cfg.data.mix_weights)
    per_source = not isinstance(cfg.shards, str) and any(entry.sources for entry in cfg.shards)
    views = cfg.mixing.active or per_source  # trained as per-source views: Parquet and token shards, no tars
    fmt = train_format(cfg, views=views)
    held_out_sets(cfg, folders, eval_sets(cfg.eval, folders, cfg.replay), None, train_format=fmt)


def train_format(cfg: TrainConfig, *, views: bool) -> str:
    """The format the training sets are read in: per-source views hold Parquet and token shards, no tars, so a
    WebDataset job is read as its Parquet shards there (the same rows)."""
    return "auto" if views and cfg.data.format == "webdataset" else cfg.data.format


def held_out_sets(
    cfg: TrainConfig, train: list[str], held_out: list[str], sources: list[str] | None, *, train_format: str
) -> tuple[list[str], list[str]]:
    """The held-out folders that have a val split, and every source name (training sets' first) so
    sources only evaluated still get an id before the trainer sizes its per-source sums."""
    names = list(sources or [])
    opts = dict(fmt=cfg.data.format, storage_options=cfg.data.storage_options)
    for folder in train:
        names += split_sources(str(folder), split="train", **{**opts, "fmt": train_format})
    kept, evaluated = [], []
    for folder in held_out:
        try:
            found = split_sources(str(folder), split="val", **opts)
            names += found
            evaluated += found
            kept.append(folder)
        except NoShardsError as err:  # damaged held-out shards are refused, as training's are
            if folder in cfg.eval:  # a folder the job file names for it (eval_sets keeps it as given): a wrong one
                raise ConfigError(
                    f"train.eval[{cfg.eval.index(folder)}] = {folder!r} holds no held-out rows to evaluate on ({err}); "
                    "name a job folder whose job has a split stage (val_fraction)"
                ) from None
            log.warning("no held-out evaluation on %s: %s", folder, err)
    if cfg.stop.active and not evaluated:
        raise ConfigError(
            f"train.stop: its rules read held-out losses, and {[str(f) for f in held_out]} hold no held-out rows, "
            "so they could never stop the run; add a split stage (val_fraction) to the job, name held-out data in "
            "train.eval, or remove [train.stop]"
        )
    if cfg.attribution.every and not evaluated:
        raise ConfigError(
            f"train.attribution.every = {cfg.attribution.every}: attribution measures what each source does to "
            f"held-out loss, and {[str(f) for f in held_out]} hold no held-out rows; add a split stage "
            "(val_fraction) to the job, name held-out data in train.eval, or set attribution.every = 0"
        )
    asked = [s for s in cfg.attribution.held_out if s not in evaluated]
    if cfg.attribution.every and asked:
        raise ConfigError(
            f"train.attribution.held_out names {asked[0]!r}, which has no held-out rows in "
            f"{[str(f) for f in held_out]} (held-out sets: {sorted(set(evaluated))}); give a source with "
            "a val split (the split stage's val_fraction), or leave held_out empty for all of them"
        )
    return kept, list(dict.fromkeys(names))
