"""Stages from installed packages: the ``winnow.stages`` entry-point group.

A package adds stages by declaring, in its ``pyproject.toml``::

    [project.entry-points."winnow.stages"]
    "myorg.boilerplate" = "myorg_winnow.stages:BoilerplateFilter"

and a job file then uses ``kind = "myorg.boilerplate"`` like any built-in kind. The class must
be a ``curate.stages.Stage`` (or ``Barrier``) with a ``Config`` dataclass and its closed set of
``reasons``; the runner counts its rows, checks that it keeps or rejects every row with a
declared reason and writes its rejects exactly as for built-in stages. Only installed,
registered names are loaded: a job file can never name a module or an import path itself, so
running a job file runs only code the user installed. Built-in kinds cannot be replaced.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
from functools import cache

from winnow.curate.errors import ConfigError
from winnow.curate.stages.base import Stage, StageConfig

log = logging.getLogger(__name__)

GROUP = "winnow.stages"


@cache
def plugin_entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    """Registered kind -> entry point (looked up once per process)."""
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=GROUP)}


def load_plugin(kind: str, builtin: dict[str, str]) -> type[Stage] | None:
    """The class a package registered for ``kind``, checked; None when no package registers it."""
    ep = plugin_entry_points().get(kind)
    if ep is None:
        return None
    if kind in builtin:
        log.warning(
            "package %s registers stage kind %r, which is built in; the built-in stage is used",
            ep.dist.name if ep.dist else "?",
            kind,
        )
        return None
    where = f"stage kind {kind!r} (entry point {ep.value!r} of package {ep.dist.name if ep.dist else '?'})"
    try:
        cls = ep.load()
    except Exception as err:  # any import-time failure of someone else's package
        raise ConfigError(f"{where} cannot be imported: {type(err).__name__}: {err}") from err
    if not (isinstance(cls, type) and issubclass(cls, Stage)):
        raise ConfigError(f"{where} is {cls!r}, not a subclass of curate.stages.Stage")
    if not (dataclasses.is_dataclass(cls.Config) and issubclass(cls.Config, StageConfig)):
        raise ConfigError(f"{where}: its Config must be a dataclass subclassing curate.stages.StageConfig")
    if not all(isinstance(r, str) and ":" in r for r in cls.reasons):
        raise ConfigError(
            f"{where}: reasons must be full reason strings like 'myfilter:too_short', got {cls.reasons!r}"
        )
    return cls
