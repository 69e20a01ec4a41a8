"""winnow's curation exceptions: one base class, a few families.

Messages say what was found, where (file, table, key, row), and what to do.
Third-party errors are translated with ``raise ... from err`` so the cause stays visible.
"""

from __future__ import annotations


class WinnowError(Exception):
    """Base of every error winnow raises on purpose."""


class ConfigError(WinnowError):
    """A job file or a component config is invalid (unknown key, wrong type, bad value)."""


class InputError(WinnowError):
    """An input cannot be opened or listed at all (per-row problems become rejects instead)."""


class StageError(WinnowError):
    """A stage broke its contract (unknown reason, lost rows) or failed on a batch."""


class OutputError(WinnowError):
    """Outputs cannot be written, or a previous run's outputs are inconsistent."""


class FolderInUseError(OutputError):
    """Another winnow run holds the folder's lock (``curate.lock``): nothing of the folder may be touched."""


class MissingDependencyError(WinnowError, ImportError):
    """An optional dependency a component needs is not installed; the message gives the install command."""


def require(module: str, *, extra: str | None = None, package: str | None = None, feature: str):
    """Import an optional dependency, or fail with the command that installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as err:
        hint = f"pip install 'winnow[{extra}]'" if extra else f"pip install {package or module}"
        raise MissingDependencyError(
            f"{feature} needs the package {package or module!r}; install it with: {hint}"
        ) from err
