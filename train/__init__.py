"""winnow's training side: the model, the data path, the trainer and its parts."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[list[str], Callable[[str], object]]:
    """``(__all__, __getattr__)`` of a package whose exports (name -> module) are imported on first use (PEP 562):
    importing one of its configs loads none of the torch modules beside it (``winnow check``, loader workers)."""

    def __getattr__(name: str) -> object:
        if name in exports:
            return getattr(importlib.import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return sorted(exports), __getattr__
