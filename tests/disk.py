"""A small device of its own for a test: a tmpfs of a chosen size mounted on a folder (root only).

A full disk is a kernel state, not an exception a test may raise itself: the libraries that write
(Arrow, safetensors, PyTorch's zip writer) each report it their own way, which is what is tested.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


class SmallDisk:
    """``folder``, on a tmpfs of ``size`` bytes; ``resize`` gives it more room (the files stay)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def resize(self, size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(self.folder)], check=True)


@contextlib.contextmanager
def small_disk(folder: Path, size: str) -> Iterator[SmallDisk]:
    """Mount a ``size`` tmpfs (``"256k"``) on ``folder`` (made here); skip where mounting is not allowed."""
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (root and CAP_SYS_ADMIN are needed): {done.stderr.strip()}")
    try:
        yield SmallDisk(folder)
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)
