"""The training data path: job shards -> tokens -> packed batches with per-token source ids.

Exports are resolved lazily so that loader worker processes started with ``spawn`` or
``forkserver`` import only the reading and tokenizing modules, not torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {"Batch": "train.data.batch", "Loader": "train.data.loader", "LoaderConfig": "train.data.config",
            "RepeatBatch": "train.data.batch"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'train.data' has no attribute {name!r}")
