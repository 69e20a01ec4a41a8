"""The ``[train.attribution]`` table: how often an attributed stretch closes, where attribution starts, the probe."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from train.errors import ConfigError


@dataclass(kw_only=True, slots=True)
class AttributionConfig:
    """When and how to attribute held-out loss changes to training sources; off unless ``every`` > 0."""

    every: int = 0  # steps per attributed stretch (K); 0 turns attribution off
    start: int = 0  # steps up to this one are not attributed (their momentum is reported as its own row)
    # the probe: this many held-out sequences per source, read once and evaluated at both ends of every
    # stretch; its two gradient evaluations per stretch cost about 2 · sources · heldout_rows / (every ·
    # batch rows) of the training, so fewer rows are cheaper and measure a noisier held-out loss
    heldout_rows: int = 4
    # how each source's gradient is taken: "tokens" splits every weight gradient by the source of the token
    # position it was computed at, inside the trainer's one backward (router losses go with the tokens they are
    # computed on; exact per-source losses when attention stays inside documents, model.doc_mask); "losses"
    # runs one more backward per source of its share of the loss (router losses their own row; S times the cost)
    split: Literal["tokens", "losses"] = "tokens"

    def __post_init__(self) -> None:
        for key, low in (("every", 0), ("start", 0), ("heldout_rows", 1)):
            value = getattr(self, key)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= low):
                raise ConfigError(f"train.attribution.{key} = {value!r} is invalid; allowed: an integer >= {low}")
        if self.split not in ("tokens", "losses"):
            raise ConfigError(f"train.attribution.split = {self.split!r} is invalid; allowed: 'tokens' or 'losses'")
