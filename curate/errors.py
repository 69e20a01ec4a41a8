"""winnow's curation exceptions: one base class, a few families.

Messages say what was found, where (file, table, key, row), and what to do.
Third-party errors are translated with ``raise ... from err`` so the cause stays visible.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator


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


class DiskFullError(OutputError):
    """The device (or the quota) holding an output has no room left for what a command writes."""


# A full device reaches winnow as an OSError from Python and Arrow, and as other types with the
# kernel's message from Rust and C++ libraries (safetensors, PyTorch's zip writer).
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_FULL_TEXTS = ("no space left on device", "disk quota exceeded", "os error 28)", "os error 122)")


def error_chain(err: BaseException | None) -> Iterator[BaseException]:
    """``err``, then the error it was raised from or during, and so on (each once)."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def disk_full(err: BaseException | None) -> bool:
    """Whether ``err``, or an error it was raised from or during, says the device or the quota is full."""
    return any(
        isinstance(e, OSError) and e.errno in _FULL_ERRNOS or any(text in str(e).lower() for text in _FULL_TEXTS)
        for e in error_chain(err)
    )


def no_space(folder: str | os.PathLike, err: BaseException, *, then: str) -> DiskFullError:
    """The error for ``err`` (``disk_full``) while writing under ``folder``: where, how much room is left, and
    ``then``, what running the command again does."""
    local = str(folder)
    if "://" in local:  # an object store's quota: the store's own message says more than a local path could
        return DiskFullError(f"the store refused a write under {local} (full, or over quota: {err}); {then}")
    usage = disk_usage(local)
    files = _free_inodes(local)
    if files is not None and usage.free > 2**20:  # bytes left, but no file can be created: its inodes ran out
        return DiskFullError(
            f"no file can be created on the device holding {local}: its inodes (file entries) ran out, "
            f"{files} left, with {_mib(usage.free)} free (`df -i` shows them): remove files there or give the "
            f"output another place; {then}"
        )
    return DiskFullError(
        f"no space left on the device holding {local} ({_mib(usage.free)} free of {_mib(usage.total)}): "
        f"free space there or give the output another place; {then}"
    )


def _free_inodes(folder: str) -> int | None:
    """How few inodes the device holding ``folder`` has left: a number when they ran out (< 16), else None."""
    try:
        st = os.statvfs(_nearest_existing(folder))
    except OSError:
        return None
    return st.f_favail if st.f_files and st.f_favail < 16 else None


def disk_usage(folder: str | os.PathLike) -> shutil._ntuple_diskusage:
    """``shutil.disk_usage`` of the device that holds (or will hold) the local ``folder``: its nearest existing
    ancestor's."""
    return shutil.disk_usage(_nearest_existing(folder))


def _nearest_existing(folder: str | os.PathLike) -> str:
    probe = os.path.abspath(folder)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    return probe


def _mib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


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
