"""The sharded half of a checkpoint: a ``torch.distributed.checkpoint`` (DCP) folder, written by every rank.

Each rank writes the shards it holds (FSDP2's DTensor shards, its experts, one copy of what is
replicated) and DCP records every tensor's global shape and where each piece lies; loading into
another layout's state dict reads just the pieces each rank needs (resharding), and
``read_full`` rebuilds the one-process tensors without any process group (``winnow export``,
``init_from``, a teacher, a one-process resume).

Only tensors go into a DCP folder: DCP stores anything else as a pickle it loads with code
execution allowed. Its ``.metadata`` file is a pickle too, so ``SafeReader`` reads it with an
unpickler that builds only DCP's own metadata records, torch sizes, dtypes and layouts, and
refuses anything else with a ``CheckpointError`` (the tensor files themselves are read by DCP
with ``torch.load(weights_only=True)``).
"""

from __future__ import annotations

import contextlib
import pickle
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, StorageMeta

from winnow.train.checkpoint import earlier_names, renamed
from winnow.train.errors import CheckpointError

_METADATA_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
_PATHS = ("PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath")


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP metadata records and nothing else (no functions, no modules' other globals)."""

    def find_class(self, module: str, name: str):
        if "." not in name:
            if module in _METADATA_MODULES:
                obj = getattr(__import__(module, fromlist=[name]), name, None)
                if isinstance(obj, type):
                    return obj
            if module == "torch" and (
                name == "Size" or isinstance(getattr(torch, name, None), (torch.dtype, torch.memory_format))
            ):
                return getattr(torch, name)
            if module == "torch.serialization" and name == "_get_layout":  # maps "torch.strided" to the layout
                return torch.serialization._get_layout
            if module == "pathlib" and name in _PATHS:
                import pathlib

                return getattr(pathlib, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint's metadata")


class SafeReader(FileSystemReader):
    """DCP's file reader with the metadata read by ``_MetadataUnpickler``."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = Path(self.path) / ".metadata"
        try:
            with open(path, "rb") as f:
                metadata = _MetadataUnpickler(f).load()
        except (pickle.UnpicklingError, AttributeError, EOFError, ValueError, TypeError) as err:
            raise CheckpointError(
                f"{path}: refused: not a checkpoint's metadata, and loading it could run code "
                f"({err}); only load checkpoints winnow wrote"
            ) from err
        if not isinstance(metadata, Metadata):
            raise CheckpointError(f"{path}: refused: holds {type(metadata).__name__}, not DCP metadata")
        if any(isinstance(m, BytesStorageMetadata) for m in metadata.state_dict_metadata.values()):
            raise CheckpointError(
                f"{path}: refused: holds pickled objects besides tensors (winnow writes tensors only)"
            )
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def only_tensors(state: dict, where: str = "") -> None:
    """Internal check before a save: everything in a DCP folder must be a tensor (see the module docstring)."""
    for key, value in state.items():
        if isinstance(value, dict):
            only_tensors(value, f"{where}{key}.")
        elif not isinstance(value, torch.Tensor):
            raise TypeError(f"DCP state {where}{key} is a {type(value).__name__}, not a tensor")


def _alone() -> bool:
    return not (torch.distributed.is_available() and torch.distributed.is_initialized())


@contextlib.contextmanager
def _quiet_alone():
    """DCP warns that it assumes one process whenever there is no process group: that is the intent here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def save(state: dict, folder: Path, *, process_group=None) -> None:
    """Every rank calls this with its own shards (a collective when a process group is up).

    A failed write on any rank raises on every rank: the first rank's own error (an ``OSError``
    such as a full disk), else a ``RuntimeError`` with DCP's report.
    """
    only_tensors(state)
    try:
        with _quiet_alone():
            dcp.save(
                state, storage_writer=dcp.FileSystemWriter(str(folder)), process_group=process_group, no_dist=_alone()
            )
    except CheckpointException as err:  # a BaseException: would slip past the callers' error handling
        first = next(iter(err.failures.values()), (None, None))[0]
        if isinstance(first, OSError):
            raise first from err
        raise RuntimeError(f"writing the checkpoint's shards failed: {first!r}") from err


def load(state: dict, folder: Path, *, process_group=None) -> None:
    """Fill ``state`` (this layout's tensors, DTensor shards included) in place from ``folder``; every rank calls it.

    A folder an earlier version wrote under its own parameter names (``train.checkpoint.renamed``) is read
    into the same tensors under those names."""
    reader = SafeReader(str(folder))
    if earlier_names(reader.read_metadata().state_dict_metadata):
        state = renamed(state, earlier=True)
    with _quiet_alone():
        dcp.load(state, storage_reader=reader, process_group=process_group, no_dist=_alone())


def read_full(folder: Path) -> dict:
    """The whole folder as one-process tensors (nested as saved), read by this process alone."""
    reader = SafeReader(str(folder))
    metadata = reader.read_metadata()
    state: dict = {}
    for key, meta in metadata.state_dict_metadata.items():
        path = (metadata.planner_data or {}).get(key, (key,))
        node = state
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = torch.empty(meta.size, dtype=meta.properties.dtype)
    with _quiet_alone():
        dcp.load(state, storage_reader=SafeReader(str(folder)), no_dist=True)
    return renamed(state)
