"""The training data path: job shards -> tokens -> packed batches with per-token source ids.

Exports are resolved lazily so that loader worker processes started with ``spawn`` or
``forkserver`` import only the reading and tokenizing modules, not torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Batch": "winnow.train.data.batch",
    "Loader": "winnow.train.data.loader",
    "LoaderConfig": "winnow.train.data.config",
    "RepeatBatch": "winnow.train.data.batch",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'winnow.train.data' has no attribute {name!r}")
