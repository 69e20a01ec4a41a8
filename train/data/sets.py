"""Several data sets in one run: weighted training sets, a replay share, and held-out sets from other jobs.

``[train] shards`` is one job folder or a list of ``{path, weight}`` tables; ``replay = {from,
share}`` adds a job folder (usually the base run's data) at ``share`` of the training tokens and
scales the others to fill the rest. The weights become the loader's load-time mixing weights
(``train.data.mix_weights``). ``[train] eval`` lists the job folders whose ``val`` splits are
evaluated (default: every training folder), so a continued run keeps measuring the sources it
no longer trains on. ``HeldOut`` reads those val splits one after the other as one pass.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from winnow.train.errors import ConfigError


@dataclass(kw_only=True, slots=True)
class ShardSetConfig:
    """One training data set: a job output folder and its share of the training tokens (relative).

    ``sources`` (per-source weights within the set, relative) trains on those sources only, at those
    shares of the set's weight; the job's train shards are then split once per source under the
    run folder (``sources/``), as ``winnow ablate`` does.
    """

    path: str
    weight: float = 1.0
    sources: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (isinstance(self.weight, (int, float)) and math.isfinite(self.weight) and self.weight > 0):
            raise ConfigError(
                f"train.shards[].weight = {self.weight!r} for {self.path!r} is invalid; allowed: a finite number > 0"
            )
        weights = list(self.sources.values())
        if self.sources and not (
            all(isinstance(w, (int, float)) and math.isfinite(w) and w >= 0 for w in weights)
            and any(w > 0 for w in weights)
        ):
            raise ConfigError(
                f"train.shards[].sources = {self.sources!r} for {self.path!r} is invalid; "
                "allowed: finite non-negative weights per source, one of them > 0"
            )


@dataclass(kw_only=True, slots=True)
class ReplayConfig:
    """``replay = {from = "out/base", share = 0.05}``: mix the base data back in at ``share`` of the tokens.

    The TOML key ``from`` is a Python keyword; the job-file reader maps it onto ``path``.
    """

    path: str = field(metadata={"key": "from"})  # the base job folder (its train split is replayed)
    share: float  # the share of the tokens the base data makes up, 0 <= share < 1

    def __post_init__(self) -> None:
        if not (isinstance(self.share, (int, float)) and 0 <= self.share < 1):
            raise ConfigError(f"train.replay.share = {self.share!r} is invalid; allowed: 0 <= share < 1")


def same_place(folder: str) -> str:
    """A job folder as a key: local paths resolved (``out/a/`` and ``./out/a`` are one folder), URLs as written."""
    return folder.rstrip("/") if "://" in folder else str(Path(folder).resolve())


def training_sets(
    shards: str | list[ShardSetConfig] | None, replay: ReplayConfig | None, mix_weights: list[float]
) -> tuple[list[str], list[float]]:
    """(folders, token weights summing to 1) of the training data; a 0 replay share adds nothing."""
    if shards is None:
        raise ConfigError("train.shards is not set and the job has no [job] output to train on")
    sets = [ShardSetConfig(path=shards)] if isinstance(shards, str) else list(shards)
    if not sets:
        raise ConfigError("train.shards = [] is invalid; allowed: a job folder or a list of {path, weight} tables")
    folders = [s.path for s in sets]
    if len({same_place(f) for f in folders}) != len(folders):
        raise ConfigError(f"train.shards lists a folder twice: {folders}; give each data set once with its weight")
    if mix_weights and not isinstance(shards, str):
        raise ConfigError(
            "train.data.mix_weights and weights in train.shards are both set; keep the weights in train.shards"
        )
    weights = list(mix_weights) if mix_weights else [s.weight for s in sets]
    if len(weights) != len(folders):
        raise ConfigError(
            f"train.data.mix_weights = {mix_weights!r} is invalid; allowed: one weight per data set ({len(folders)})"
        )
    top = max(weights)
    if top > 0:  # relative weights: scaled by the largest first, so 1e308 each sums to 2, not inf
        weights = [w / top for w in weights]
    total = sum(weights)
    weights = [w / total for w in weights]
    if replay is not None and replay.share > 0:
        if same_place(replay.path) in {same_place(f) for f in folders}:
            raise ConfigError(f"train.replay.from = {replay.path!r} is also in train.shards; give its share once")
        weights = [w * (1 - replay.share) for w in weights] + [replay.share]
        folders = folders + [replay.path]
    return folders, weights


def eval_sets(eval_folders: list[str], train_folders: list[str], replay: ReplayConfig | None) -> list[str]:
    """The job folders whose val splits are evaluated: ``eval`` when given, else every training folder."""
    if eval_folders:
        places = [same_place(f) for f in eval_folders]
        return [f for i, f in enumerate(eval_folders) if places[i] not in places[:i]]  # each folder once, in order
    folders = list(train_folders)
    if replay is not None and same_place(replay.path) not in {
        same_place(f) for f in folders
    }:  # a 0 share still measures the base data
        folders.append(replay.path)
    return folders


class HeldOut:
    """One pass over the val splits of several job folders, one loader after the other.

    ``make(folder)`` builds that folder's val ``Loader``; iteration ends when the last one does.
    ``max_batches`` (``[train] eval_batches``) is shared out evenly, so a cap still reads every folder, and a
    val pass reads each shard's sources in turn (``pieces.interleave_order``), so it reads every source too.
    """

    def __init__(self, folders: list[str], make, *, max_batches: int | None = None) -> None:
        self.folders, self._make = list(folders), make
        self._per_folder = None if max_batches is None else max(1, max_batches // max(1, len(self.folders)))
        self._current = None

    def __iter__(self) -> Iterator:
        for folder in self.folders:
            self._current = self._make(folder)
            try:
                yield from itertools.islice(self._current, self._per_folder)
            finally:
                self.close()

    def close(self) -> None:
        if self._current is not None:
            self._current.close()
            self._current = None
