"""Atomic writes: a file another process reads, or whose presence marks work done, is never half-written.

Each helper writes under a temporary name in the target's own folder (so the rename stays
on one file system), flushes the data to disk (``fsync``), and renames it into place; a
crash leaves either the old file, no file, or a ``.<name>.*.tmp`` that nothing reads.

This module is the one implementation for ``curate`` and ``pipelines`` (which may import
``curate``). ``train`` may not import ``curate``; it renames whole folders into place instead.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from pathlib import Path
from typing import Any

from winnow.curate.crashpoints import crash_point


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same folder, fsync'd, then renamed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    short = path.name.encode()[:200].decode(errors="ignore")  # the temporary name within the 255 bytes allowed
    tmp = path.parent / f".{short}.{secrets.token_hex(6)}.tmp"
    # O_EXCL on a fresh random name, mode 0o666 less the process umask at this moment (mkstemp
    # would make it 0600, which is not what a published file should have)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        crash_point(path.name, "before")
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        if err.filename is None:  # a write or fsync that failed (a full disk) names no file: this one
            raise OSError(err.errno, err.strerror, str(path)) from err
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    crash_point(path.name, "after")


def atomic_leftover(name: str, finals: tuple[str, ...]) -> bool:
    """Whether ``name`` is the temporary file a killed ``write_bytes_atomic`` of one of ``finals`` left."""
    return any(re.fullmatch(rf"\.{re.escape(final[:200])}\.[0-9a-f]{{12}}\.tmp", name) for final in finals)


def write_text_atomic(path: Path, text: str) -> None:
    """``write_bytes_atomic`` for UTF-8 text."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: Path, data: Any, *, indent: int | None = 1) -> None:
    """``write_bytes_atomic`` for a JSON document (``default=str`` for paths and the like)."""
    write_text_atomic(path, json.dumps(data, indent=indent, default=str))


def rename_into_place(tmp: Path, final: Path) -> None:
    """Publish a finished temporary file or folder under its final name (same folder), durably."""
    crash_point(Path(final).name, "before")
    os.replace(tmp, final)
    _fsync_dir(Path(final).parent)
    crash_point(Path(final).name, "after")


def _fsync_dir(folder: Path) -> None:
    # The rename itself is durable only once the folder's entry is on disk; not every OS
    # (or file system) lets a folder be opened for fsync, and then there is nothing to do.
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
