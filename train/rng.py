"""Every random generator's state as tensors and plain data, so a checkpoint loads with ``weights_only=True``.

``np.random.get_state()`` returns a NumPy array, which only a full (code-running) unpickler
can read back; its key is stored here as an int64 tensor instead.
"""

from __future__ import annotations

import random

import numpy as np
import torch


def rng_state() -> dict:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        "torch": torch.get_rng_state(),
        "numpy": {
            "name": name,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    saved = state["numpy"]
    if isinstance(saved, dict):
        np.random.set_state(
            (
                saved["name"],
                saved["keys"].numpy().astype(np.uint32),
                saved["pos"],
                saved["has_gauss"],
                saved["cached_gaussian"],
            )
        )
    else:  # a checkpoint written before the state became weights-only safe: NumPy's own tuple
        np.random.set_state(saved)
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
