"""Paths read from data (a manifest's shard entries, a checkpoint's file list) stay inside their folder.

``train`` never imports ``curate`` (whose ``curate.names`` turns names into path components); the
trainer builds no path from a name, but it follows relative paths that a manifest or a checkpoint's
meta lists, and one of those may be hostile or damaged (``../../x``, ``/etc/passwd``).
"""

from __future__ import annotations

from pathlib import PurePosixPath


def inside(rel: object) -> bool:
    """Whether ``rel`` is a relative path that names something inside the folder it is relative to."""
    if not isinstance(rel, str) or not rel or "\\" in rel or "\x00" in rel:
        return False
    path = PurePosixPath(rel)
    return not path.is_absolute() and ".." not in path.parts and "://" not in rel
