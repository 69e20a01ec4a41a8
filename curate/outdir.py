"""Owning the output folder: winnow cleans only a folder it made, and says so when it cannot write one.

A job's output folder gets a marker file, ``.winnow-output``, before anything else is
written into it. A re-run that starts afresh (another job, a finished one) clears winnow's
own entries (``OWN_ENTRIES``) only in a folder carrying the marker; a folder without it
that holds entries under those names — the user's own ``shards/my.parquet`` — is refused
with a message, never emptied. Other files (a README of the user's) are never touched, so
such a folder is adopted. Folders an older winnow wrote (a ``manifest.json`` with winnow's
keys, or a ``_work/fingerprint``) are recognised and adopted.

Output paths are local folders: a URL (``s3://...``) is refused before any path is made
from it (``Path("s3://b/x")`` would be the local folder ``s3:/b/x``). ``[output] mode``
restricts every file the job wrote (folders get the matching search bits) once it ends;
otherwise files follow the umask like any other program's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from curate.atomic import write_json_atomic
from curate.errors import OutputError

MARKER = ".winnow-output"
#: Entries a winnow job writes in its output folder; a fresh run removes these and nothing else.
OWN_ENTRIES = ("_work", "shards", "rejects", "artifacts", "manifest.json")


def claim(out: Path, job_name: str) -> bool:
    """Make ``out`` winnow's: create it with its marker, or check the marker is there.

    Returns whether the folder already held a previous run's outputs. Raises ``OutputError``
    when ``out`` is a file, cannot be written, or holds data winnow did not write.
    """
    if out.exists() and not out.is_dir():
        raise OutputError(f"output {out} is a file, not a folder; give a folder path (it is created if missing)")
    marker = out / MARKER
    existing = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if existing and all(name.startswith(f".{MARKER}.") and name.endswith(".tmp") for name in existing):
        for name in existing:  # a run killed while writing the marker itself: the folder is still new
            (out / name).unlink()
        existing = []
    if existing and not marker.exists() and not _written_by_old_winnow(out):
        # Entries under names winnow writes (shards/, rejects/, ...) would be cleared or mixed with
        # this job's: refuse. Anything else (the user's README, notes) is never touched, so it may stay.
        clash = [name for name in existing if name in OWN_ENTRIES]
        if clash:
            raise OutputError(
                f"output folder {out} holds files winnow did not write ({', '.join(clash)}); winnow clears only "
                f"folders it made (they carry {MARKER}). Choose a new or empty folder with --output, or move them away"
            )
    try:
        out.mkdir(parents=True, exist_ok=True)
        if not marker.exists():
            write_json_atomic(marker, {"written_by": "winnow", "job": job_name})
    except OSError as err:
        raise OutputError(
            f"cannot write the output folder {out}: {err.strerror or err}; choose a folder you can write "
            f"(--output or [job] output) or fix its permissions"
        ) from err
    return bool(existing)


def clear_own_entries(out: Path, *, only: tuple[str, ...] = OWN_ENTRIES) -> None:
    """Remove a previous run's outputs (``only`` some of them) from a folder winnow owns (``claim`` checked the marker)."""
    import shutil

    for name in only:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def _written_by_old_winnow(out: Path) -> bool:
    if (out / "_work" / "fingerprint").is_file():
        return True
    try:
        manifest = json.loads((out / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and {"format_version", "shards", "stages"} <= set(manifest)


def restrict_mode(out: Path, mode: int) -> None:
    """Give every file under ``out`` the permission bits ``mode``, and folders those bits plus search."""
    folder_mode = mode | ((mode & 0o444) >> 2)  # r on a folder needs x to be of any use
    for root, dirs, files in os.walk(out):
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                os.chmod(path, mode)
        for name in dirs:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                os.chmod(path, folder_mode)
    os.chmod(out, folder_mode)
