"""Paths and files read from data: listed paths stay inside their folder, whole files are read under a cap.

``train`` never imports ``curate`` (whose ``curate.names`` turns names into path components); the
trainer builds no path from a name, but it follows relative paths that a manifest or a checkpoint's
meta lists, and one of those may be hostile or damaged (``../../x``, ``/etc/passwd``).
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath


def inside(rel: object) -> bool:
    """Whether ``rel`` is a relative path that names something inside the folder it is relative to."""
    if not isinstance(rel, str) or not rel or "\\" in rel or "\x00" in rel:
        return False
    path = PurePosixPath(rel)
    return not path.is_absolute() and ".." not in path.parts and "://" not in rel


MiB = 1 << 20
JSON_BYTES = 1024 * MiB  # a manifest, a checkpoint's meta.json, a tokenizer's files


def read_capped(fs, path: str, *, limit: int, what: str, error: type[Exception]) -> bytes:
    """The bytes of ``path`` on ``fs``, refusing anything but a regular file and anything over ``limit`` bytes.

    A link to ``/dev/zero`` read whole runs until the OOM killer ends the run; this reads at most
    ``limit + 1`` bytes and raises ``error`` naming ``what``, the file and the cap instead.
    FileNotFoundError passes through, for the caller's own "missing" message.
    """
    info = fs.info(path)
    if info.get("type") != "file":
        raise error(f"{what} {path} is not a regular file (a folder, device, FIFO or socket); give the file itself")
    if info.get("size") is not None and info["size"] > limit:
        raise error(
            f"{what} {path} is {info['size']} bytes, over winnow's cap of {limit} for it; is it the right file?"
        )
    pieces, held = [], 0
    with fs.open(path, "rb") as fh:  # in pieces: a large cap must not be one allocation of its size
        while held <= limit and (piece := fh.read(min(limit + 1 - held, 64 << 20))):
            pieces.append(piece)
            held += len(piece)
    data = b"".join(pieces)
    if len(data) > limit:
        raise error(f"{what} {path} holds more than winnow's cap of {limit} bytes for it; is it the right file?")
    return data


def replace_file(path: Path, data: bytes) -> None:
    """Write ``path`` whole under a temporary name beside it (fsync'd), then rename it over the old file.

    A kill leaves the old file and at most a ``.<name>.tmp-<pid>`` (``replace_leftover``); a write that fails
    (a full disk) names ``path``. (``curate.atomic`` does the same for curation; ``train`` does not import it.)
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        if err.filename is None:  # a write that failed (a full disk) names no file: this one
            raise OSError(err.errno, err.strerror, str(path)) from err
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def replace_leftover(name: str, finals: set[str]) -> bool:
    """Whether ``name`` is the temporary file a killed ``replace_file`` of one of ``finals`` left."""
    return any(name.startswith(f".{final}.tmp-") and name.rsplit("-", 1)[-1].isdigit() for final in finals)
