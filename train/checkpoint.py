"""Atomic, checksummed checkpoints: write to a temporary folder, rename, keep the last N.

A checkpoint is ``checkpoints/step-00000100/`` holding ``state.pt`` (one ``torch.save`` of
every stateful part of the run) and ``meta.json`` (step, size and sha256 of ``state.pt``).
A folder only gets its final name once both files are complete and synced, so a crash or
preemption mid-write leaves at most a ``.tmp-*`` folder, which the next save removes.
Resuming walks checkpoints newest first and skips any whose checksum does not match.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from train.errors import CheckpointError, ConfigError

log = logging.getLogger(__name__)

STATE_FILE, META_FILE, PREFIX = "state.pt", "meta.json", "step-"


@dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    """When to checkpoint and how many to keep (``[train.checkpoint]``)."""

    every: int = 100  # steps between checkpoints; 0: only at the end and on SIGTERM/SIGINT
    keep_last: int = 3
    resume: bool = True  # start from the newest valid checkpoint in the run folder, if any

    def __post_init__(self) -> None:
        if not (isinstance(self.every, int) and self.every >= 0):
            raise ConfigError(f"train.checkpoint.every = {self.every!r} is invalid; allowed: an integer >= 0")
        if not (isinstance(self.keep_last, int) and self.keep_last >= 1):
            raise ConfigError(f"train.checkpoint.keep_last = {self.keep_last!r} is invalid; allowed: an integer >= 1")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointManager:
    """Saves and finds the run's checkpoints under ``folder``."""

    def __init__(self, folder: str | Path, *, keep_last: int = 3) -> None:
        self.folder = Path(folder)
        self.keep_last = keep_last

    def save(self, step: int, state: dict[str, Any]) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        for stale in self.folder.glob(".tmp-*"):  # a previous crash mid-write
            shutil.rmtree(stale, ignore_errors=True)
        final = self.folder / f"{PREFIX}{step:08d}"
        tmp = self.folder / f".tmp-{final.name}-{os.getpid()}"
        tmp.mkdir()
        state_path = tmp / STATE_FILE
        with open(state_path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        meta = {"format_version": 1, "step": step, "bytes": state_path.stat().st_size, "sha256": _sha256(state_path)}
        (tmp / META_FILE).write_text(json.dumps(meta))
        if final.exists():  # re-saving the same step (e.g. a signal right after a periodic save)
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(self.folder)
        self._prune()
        log.info("checkpoint saved: %s", final)
        return final

    def checkpoints(self) -> list[Path]:
        """Final-named checkpoint folders, newest first."""
        if not self.folder.is_dir():
            return []
        return sorted((p for p in self.folder.glob(f"{PREFIX}*") if p.is_dir()), reverse=True)

    def load(self, path: str | Path) -> dict[str, Any]:
        """Load one checkpoint after checking its size and checksum; CheckpointError if it is corrupt."""
        path = Path(path)
        try:
            meta = json.loads((path / META_FILE).read_text())
            state_path = path / STATE_FILE
            if state_path.stat().st_size != meta["bytes"] or _sha256(state_path) != meta["sha256"]:
                raise CheckpointError(f"checkpoint {path} fails its checksum (corrupt or truncated)")
            # weights_only=False: the state holds loader and RNG state (plain Python/numpy objects);
            # we only load files whose checksum we wrote ourselves
            return torch.load(state_path, map_location="cpu", weights_only=False)
        except CheckpointError:
            raise
        except (OSError, ValueError, KeyError, RuntimeError) as err:
            raise CheckpointError(f"checkpoint {path} cannot be read: {err}") from err

    def load_latest(self) -> tuple[Path, dict[str, Any]] | None:
        """The newest checkpoint that verifies; corrupt ones are logged and skipped."""
        for path in self.checkpoints():
            try:
                return path, self.load(path)
            except CheckpointError as err:
                log.warning("skipping checkpoint: %s", err)
        return None

    def _prune(self) -> None:
        for old in self.checkpoints()[self.keep_last:]:
            shutil.rmtree(old, ignore_errors=True)
