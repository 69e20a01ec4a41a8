"""The decoder-only Mixture-of-Experts transformer, in plain PyTorch.

Tensor names carry their shape as a suffix (torchtitan style). Legend:

    B  batch (sequences)            L  sequence length
    T  tokens in a flat batch (B·L) D  model width
    H  attention heads              G  key/value heads (grouped-query attention)
    C  head width (D // H)          F  feed-forward hidden width (per expert)
    E  routed experts               K  experts per token (top-k)
    A  routed assignments (T·K)     V  vocabulary
"""

from __future__ import annotations

import importlib

# Exports resolved on first use, so that importing a config (``winnow check``, ``winnow config``) loads no torch.
_EXPORTS = {
    "ModelConfig": "winnow.train.model.config",
    "cross_entropy_per_token": "winnow.train.model.loss",
    "distillation_per_token": "winnow.train.model.loss",
    "MoE": "winnow.train.model.moe",
    "MoEStats": "winnow.train.model.moe",
    "ModelOutput": "winnow.train.model.transformer",
    "Transformer": "winnow.train.model.transformer",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'winnow.train.model' has no attribute {name!r}")
