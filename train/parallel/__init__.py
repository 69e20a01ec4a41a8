"""Distributed training on torch.distributed: DDP / FSDP2, expert parallelism, PowerSGD and top-k compression, launched by torchrun."""

from __future__ import annotations

import importlib

# Exports resolved on first use, so that importing a config (``winnow check``, ``winnow config``) loads no torch.
_EXPORTS = {
    "Parallel": "winnow.train.parallel.runtime",
    "ParallelConfig": "winnow.train.parallel.config",
    "World": "winnow.train.parallel.mesh",
    "exit_process": "winnow.train.parallel.mesh",
    "init_world": "winnow.train.parallel.mesh",
    "shutdown": "winnow.train.parallel.mesh",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'winnow.train.parallel' has no attribute {name!r}")
