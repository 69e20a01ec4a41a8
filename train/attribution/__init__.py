"""Per-source attribution: which training source moved which source's held-out loss, adding up to what was measured."""

from __future__ import annotations

import importlib

# Exports resolved on first use, so that importing a config (``winnow check``, ``winnow config``) loads no torch.
_EXPORTS = {
    "AttributionConfig": "winnow.train.attribution.config",
    "SourceAttribution": "winnow.train.attribution.estimator",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'winnow.train.attribution' has no attribute {name!r}")
