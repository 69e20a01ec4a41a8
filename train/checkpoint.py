"""Atomic, checksummed checkpoints: write to a temporary folder, rename, keep the last N.

A checkpoint is ``checkpoints/step-00000100/`` holding ``shards/`` (a ``torch.distributed.checkpoint``
folder: the model's weights and the optimizer's moments, each rank writing its own shards, see
``train.dcp``), ``state.pt`` (one ``torch.save`` of every other stateful part of the run, written
by rank 0) and ``meta.json`` (step, and the size and sha256 of ``state.pt`` and of every shard
file). A folder only gets its final name once every file is complete and synced, so a crash or
preemption mid-write leaves at most a ``.tmp-step-*`` folder, which the next save removes. Only
folders of those names are checkpoints: anything else in ``checkpoints/`` is the user's, never read or removed.
Resuming walks checkpoints newest first and skips any whose checksums do not match.
Checkpoints from before the shards (weights inside ``state.pt``) still load.

Loading never runs code: ``torch.load(weights_only=True)`` accepts tensors and plain data
only (the state is built of nothing else), and the shards' metadata pickle is read by an
unpickler that builds DCP's records only, so a hostile checkpoint is refused with a
``CheckpointError`` naming the file. Pruning counts only checkpoints that verify, so a run that
restarts next to corrupt ones never deletes its own fresh checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Any, BinaryIO

import fsspec
import numpy as np
import torch

from winnow.train.config import CheckpointConfig  # noqa: F401 (defined there: no torch)
from winnow.train.errors import CheckpointError, checker
from winnow.train.paths import JSON_BYTES, inside, read_capped

_check = checker("train.checkpoint")

log = logging.getLogger(__name__)
_LOCAL = fsspec.filesystem("file")

STATE_FILE, META_FILE, PREFIX, SHARDS_DIR = "state.pt", "meta.json", "step-", "shards"
_RELISTS = 4  # listings of a checkpoint folder a live run keeps changing
# the names winnow gives a checkpoint and its temporary folder; anything else in the folder is the user's, never
# loaded, counted or deleted (a copy named step-00000100.bak, a step-best)
_NAME = re.compile(rf"{PREFIX}(\d{{8,}})")
_TMP_NAME = re.compile(rf"\.tmp-{PREFIX}\d{{8,}}(-\d+)?")  # -N: the process id an older writer added

# What checkpoints written before the RNG state became tensors hold besides tensors: NumPy
# arrays rebuilt from dtype, shape and bytes (no code runs; object arrays' items go through the
# same restricted unpickler). Allowed while loading only, never registered process-wide.
_LEGACY_SAFE = [
    np.ndarray,
    np.dtype,
    type(np.dtype(np.uint32)),
    np._core.multiarray._reconstruct,
    (np._core.multiarray._reconstruct, "numpy.core.multiarray._reconstruct"),
]


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


# Parameter names checkpoints of earlier versions hold (the experts' weights on the FFN itself,
# ``blocks.N.ffn.w13_ED2F``), and this model's (``blocks.N.ffn.experts.w13_ED2F``). Such checkpoints load as they are.
_EARLIER = re.compile(r"(blocks\.\d+\.ffn\.)(w13_ED2F|w2_EFD)\b")
_NOW = re.compile(r"(blocks\.\d+\.ffn\.)experts\.(w13_ED2F|w2_EFD)\b")


def earlier_names(keys) -> bool:
    """Whether any of ``keys`` (parameter names or state keys) is an earlier version's parameter name."""
    return any(_EARLIER.search(k) for k in keys if isinstance(k, str))


def renamed(obj: Any, *, earlier: bool = False) -> Any:
    """``obj`` (nested dicts and lists, e.g. a state: its keys and the optimizer's lists of names) with earlier
    versions' parameter names as this model's, or with ``earlier`` the other way; tensors are not copied."""
    pattern, repl = (_NOW, r"\1\2") if earlier else (_EARLIER, r"\1experts.\2")
    if isinstance(obj, str):
        return pattern.sub(repl, obj)
    if isinstance(obj, dict):
        return {renamed(k, earlier=earlier): renamed(v, earlier=earlier) for k, v in obj.items()}
    if isinstance(obj, list):
        return [renamed(v, earlier=earlier) for v in obj]
    return obj


def load_state_file(path: str | Path | BinaryIO, *, name: str | None = None) -> Any:
    """``torch.load`` of a file winnow wrote (checkpoint state, teacher, ``init_from``), refusing anything but data.

    A pickle that would import or call anything besides tensors and plain containers is a
    ``CheckpointError`` naming the file (``name`` when ``path`` is an open file); nothing in it runs.
    """
    try:
        with torch.serialization.safe_globals(_LEGACY_SAFE):
            return renamed(torch.load(path, map_location="cpu", weights_only=True))
    except pickle.UnpicklingError as err:
        lines = [line.strip() for line in str(err).splitlines() if "Unsupported global" in line or "but got" in line]
        if not lines:  # not a pickle of objects at all (a TOML or JSON file, text)
            raise _not_a_state(name or path, err) from err
        raise CheckpointError(
            f"{name or path}: refused: it holds pickled objects other than tensors and plain data, and "
            f"loading them could run code ({lines[0].split('. Please')[0]}); only load checkpoints winnow wrote"
        ) from err
    except (EOFError, KeyError, ValueError, RuntimeError, IndexError) as err:  # empty, text, a zip of other files
        raise _not_a_state(name or path, err) from err


def _not_a_state(where: object, err: BaseException) -> CheckpointError:
    detail = str(err).splitlines()[0][:200] if str(err) else ""
    return CheckpointError(
        f"{where}: not a checkpoint file winnow wrote, or a damaged one ({type(err).__name__}"
        f"{': ' + detail if detail else ''}); give a run folder of `winnow train`, one of its checkpoints, or a "
        "`winnow export` folder"
    )


def check_finite(weights: dict[str, Any], where: str, *, then: str) -> None:
    """``CheckpointError`` naming the tensors of ``weights`` (a model state) that hold NaN or infinite values.

    Weights that are not finite make every loss NaN: a run that diverged unnoticed, or a damaged
    file. ``where`` names the checkpoint; ``then`` says what to do instead.
    """
    bad = [
        (name, int(torch.isfinite(t).logical_not_().sum()), t.numel())
        for name, t in weights.items()
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all())
    ]
    if bad:
        listed = ", ".join(f"{name} ({n:,} of {total:,} values)" for name, n, total in bad[:3])
        more = f" and {len(bad) - 3} more tensors" if len(bad) > 3 else ""
        raise CheckpointError(f"{where}: its weights hold NaN or infinite values: {listed}{more}; {then}")


def has_shards(path: str | Path) -> bool:
    """Whether a checkpoint folder keeps its weights in ``shards/`` (else all is in ``state.pt``)."""
    return (Path(path) / SHARDS_DIR / ".metadata").is_file()


def merge_shards(state: dict, shards: dict) -> None:
    """Nest the shards' tensors into the plain state (``optimizer``: its ``state`` beside ``param_groups``)."""
    for key, value in shards.items():
        if isinstance(value, dict) and isinstance(state.get(key), dict):
            merge_shards(state[key], value)
        else:
            state[key] = value


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointManager:
    """Saves and finds the run's checkpoints under ``folder``."""

    def __init__(self, folder: str | Path, *, keep_last: int = 3, mode: int | None = None) -> None:
        self.folder = Path(folder)
        self.keep_last = keep_last
        self.mode = mode  # None: files and folders follow the umask
        self._verified: set[str] = set()  # checkpoints this process saved or checksummed
        self._corrupt: set[str] = set()

    def _open(self, path: Path):
        if self.mode is None:
            return open(path, "wb")
        return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, self.mode), "wb")

    def tmp_path(self, step: int) -> Path:
        """Where step ``step``'s checkpoint is written before it gets its name (the same on every rank)."""
        return self.folder / f".tmp-{PREFIX}{step:08d}"

    def begin(self, step: int) -> Path:
        """Rank 0, before anyone writes: a fresh, empty temporary folder (stale ones of earlier crashes go)."""
        tmp = self.tmp_path(step)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            for stale in self.folder.glob(".tmp-*"):  # a previous crash mid-write
                if _TMP_NAME.fullmatch(stale.name):
                    shutil.rmtree(stale, ignore_errors=True)
            # owner-only folder while private (the x bits of the file mode), so nothing is readable in between
            tmp.mkdir(mode=0o777 if self.mode is None else self.mode | (self.mode & 0o444) >> 2)
        except OSError as err:
            raise self.failed(step, err) from err
        return tmp

    def failed(self, step: int, err: Exception) -> CheckpointError:
        """The error to raise when writing step's checkpoint failed; its temporary folder goes."""
        try:  # a full disk often reaches here as a library's own error: the room left when it failed tells
            room = f" ({shutil.disk_usage(self.folder).free / 2**20:.1f} MiB were free on its device)"
        except OSError:
            room = ""
        shutil.rmtree(self.tmp_path(step), ignore_errors=True)
        return CheckpointError(
            f"cannot write checkpoint {self.folder / f'{PREFIX}{step:08d}'}: {err}{room}; the previous "
            "checkpoint stands (free disk space or fix the folder's permissions, then re-run to resume)"
        )

    def commit(self, step: int, state: dict[str, Any]) -> Path:
        """Rank 0, once every rank's shards are in ``tmp_path(step)``: write ``state``, checksum, rename, prune."""
        final = self.folder / f"{PREFIX}{step:08d}"
        tmp = self.tmp_path(step)
        try:
            self._write(tmp, step, state)
        except (OSError, RuntimeError) as err:  # torch.save reports a full disk as a RuntimeError
            raise self.failed(step, err) from err
        if final.exists():  # re-saving the same step (e.g. a signal right after a periodic save)
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(self.folder)
        self._verified.add(final.name)
        self._corrupt.discard(final.name)
        self._prune()
        log.info("checkpoint saved: %s", final)
        return final

    def save(self, step: int, state: dict[str, Any], *, shards: dict | None = None) -> Path:
        """One process: ``state`` into ``state.pt`` and the tensors of ``shards`` (if any) into ``shards/``."""
        tmp = self.begin(step)
        if shards is not None:
            from winnow.train import dcp

            try:
                dcp.save(shards, tmp / SHARDS_DIR)
            except (OSError, RuntimeError) as err:
                raise self.failed(step, err) from err
        return self.commit(step, state)

    def _write(self, tmp: Path, step: int, state: dict[str, Any]) -> None:
        state_path = tmp / STATE_FILE
        with self._open(state_path) as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        files = {}
        for path in sorted(p for p in (tmp / SHARDS_DIR).rglob("*") if p.is_file()):  # DCP synced them
            if self.mode is not None:
                os.chmod(path, self.mode)
            files[str(path.relative_to(tmp))] = {"bytes": path.stat().st_size, "sha256": _sha256(path)}
        if self.mode is not None and (tmp / SHARDS_DIR).is_dir():
            os.chmod(tmp / SHARDS_DIR, self.mode | (self.mode & 0o444) >> 2)
        meta = {
            "format_version": 2,
            "step": step,
            "bytes": state_path.stat().st_size,
            "sha256": _sha256(state_path),
            "files": files,
        }
        with self._open(tmp / META_FILE) as f:
            f.write(json.dumps(meta).encode())

    def checkpoints(self) -> list[Path]:
        """Final-named checkpoint folders (``step-`` and the step's digits, nothing else), newest step first."""
        if not self.folder.is_dir():
            return []
        found = ((p, _NAME.fullmatch(p.name)) for p in self.folder.glob(f"{PREFIX}*"))
        return [p for p, _ in sorted(((p, int(m[1])) for p, m in found if m and p.is_dir()), key=lambda x: -x[1])]

    def load(self, path: str | Path, *, full: bool = True) -> dict[str, Any]:
        """Load one checkpoint after checking its sizes and checksums; CheckpointError if it is corrupt.

        ``full``: the shards' tensors are read into the state as one-process tensors (``model``,
        ``optimizer.state``); otherwise they stay on disk for ``Parallel.load_shards`` to read
        each rank's part (``has_shards`` says whether there are any).
        """
        path = Path(path)
        try:
            meta = json.loads(
                read_capped(
                    _LOCAL, str(path / META_FILE), limit=JSON_BYTES, what="checkpoint meta", error=CheckpointError
                )
            )
            for name, expected in {STATE_FILE: meta, **meta.get("files", {})}.items():
                if not inside(name):
                    raise CheckpointError(
                        f"checkpoint {path}: its meta lists the file {name!r}, which is not inside "
                        "the checkpoint folder; the checkpoint is corrupt or not winnow's"
                    )
                file = path / name
                if file.stat().st_size != expected["bytes"] or _sha256(file) != expected["sha256"]:
                    raise CheckpointError(f"checkpoint {path} fails its checksum ({name}: corrupt or truncated)")
            state = load_state_file(path / STATE_FILE)
            if full and meta.get("files"):
                from winnow.train import dcp

                merge_shards(state, dcp.read_full(path / SHARDS_DIR))
        except CheckpointError:
            self._corrupt.add(path.name)
            raise
        # AttributeError: a meta.json (or an entry of it) that is JSON but not an object
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RuntimeError) as err:
            self._corrupt.add(path.name)
            raise CheckpointError(f"checkpoint {path} cannot be read: {err}") from err
        self._verified.add(path.name)
        return state

    def load_latest(self, *, full: bool = True) -> tuple[Path, dict[str, Any]] | None:
        """The newest checkpoint that verifies; corrupt ones are logged and skipped.

        A run training meanwhile (``winnow export`` of a live run) writes new checkpoints and prunes the ones
        listed: when none of those verified and the folder has changed, it is listed again (a few times).
        """
        listed: list[Path] = []
        for _ in range(_RELISTS):
            now = self.checkpoints()
            if now == listed:
                return None
            listed = now
            for path in now:
                try:
                    return path, self.load(path, full=full)
                except CheckpointError as err:
                    if path.exists():
                        log.warning("skipping checkpoint: %s", err)
                    else:  # pruned by the run while it was read: gone, not corrupt
                        self._corrupt.discard(path.name)
        return None

    def _looks_valid(self, path: Path) -> bool:
        """Verified here, or (without reading it whole) complete: its meta parses and the size matches."""
        if path.name in self._verified:
            return True
        if path.name in self._corrupt:
            return False
        try:
            meta = json.loads((path / META_FILE).read_text())
            return all(
                (path / name).stat().st_size == m["bytes"]
                for name, m in {STATE_FILE: meta, **meta.get("files", {})}.items()
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return False

    def _prune(self) -> None:
        """Keep the ``keep_last`` newest valid checkpoints; older ones of any kind go.

        Invalid checkpoints newer than those (e.g. an earlier run's, all corrupt) are left for
        inspection and never counted: counting them would delete the checkpoint just written.
        """
        found = self.checkpoints()
        valid = [p for p in found if self._looks_valid(p)]
        if not valid:
            return
        keep = valid[: self.keep_last]
        for old in found[found.index(keep[-1]) :]:  # the valid ones past keep_last, and anything older
            if old not in keep:
                shutil.rmtree(old, ignore_errors=True)


def _study_variant(folder: Path) -> bool:
    """Whether ``folder`` is a finished study variant's (``winnow ablate`` removes its checkpoints once trained)."""
    try:
        result = json.loads((folder / "result.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(result, dict) and result.get("name") not in (None, "baseline")


def load_checkpoint(path: str | Path, *, what: str = "checkpoint") -> tuple[Path, dict[str, Any]]:
    """(folder, state) of a run folder's newest valid checkpoint, or of one checkpoint folder (``step-N/``).

    ``what`` names the setting in the error when there is none, e.g. ``train.distill.teacher = '...'``.
    """
    folder = Path(path)
    if (folder / META_FILE).exists():
        return folder, CheckpointManager(folder.parent).load(folder)
    manager = CheckpointManager(folder / "checkpoints" if (folder / "checkpoints").is_dir() else folder)
    found = manager.load_latest()
    if found is None:
        study = _study_variant(folder)
        raise CheckpointError(
            f"{what}: no valid checkpoint in {folder} "
            + (
                "(a study's run: the study removes its checkpoints once trained unless [ablate] keep_checkpoints "
                "= true; re-run the study with it, or train this variant with `winnow train`)"
                if study
                else "(give a run folder or one of its checkpoints/step-N folders)"
            )
        )
    return found
