"""winnow's training exceptions: one base class, a few families.

``train`` never imports ``curate`` (the shard format is the only contract between them),
so it keeps its own small hierarchy; ``pipelines`` catches both bases.
"""

from __future__ import annotations


class TrainError(Exception):
    """Base of every error the trainer and loader raise on purpose."""


class ConfigError(TrainError):
    """A ``[train]`` table or a component config is invalid; the message names the key."""


class ShardError(TrainError):
    """A shard is missing, corrupt, truncated, has the wrong columns or fails its checksum."""


class NoShardsError(ShardError):
    """A folder has no shards for a split (a job without a split stage has no held-out rows): not damage."""


class CheckpointError(TrainError):
    """A checkpoint is missing, corrupt or incompatible with the run."""


class Diverged(TrainError):
    """Steps in a row came out non-finite: the run trains nothing more (``[train.alerts] max_nonfinite``)."""


class Interrupted(TrainError):
    """A stop signal arrived where the run could not reach a consistent point to checkpoint; it ended without one."""


class MissingDependencyError(TrainError, ImportError):
    """An optional dependency is not installed; the message gives the install command."""


def require(module: str, *, package: str | None = None, feature: str):
    """Import an optional dependency, or fail with the command that installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingDependencyError(
            f"{feature} needs the package {package or module!r}; install it with: pip install {package or module}"
        ) from err


def checker(table: str):
    """``check(ok, key, value, allowed)``: raise a ``ConfigError`` naming ``table.key``, its value and what is
    allowed, unless ``ok``. Each config module makes one for its table."""

    def check(ok: bool, key: str, value: object, allowed: str) -> None:
        if not ok:
            raise ConfigError(f"{table}.{key} = {value!r} is invalid; allowed: {allowed}")

    return check
