"""The ``[train.attribution]`` table: how often an attributed stretch closes, where attribution starts, the probe."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from winnow.train.errors import checker

_check = checker("train.attribution")


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
    # the counterfactual: what scaling one source's share by r (the others renormalised) would do to each held-out loss
    factors: list[float] = field(default_factory=lambda: [0.0, 0.5, 1.5, 2.0])  # the r predicted for; 0 = left out
    horizon: float = 6.0  # an update's weight falls by e per this many steps at the peak learning rate
    saturation: float = 0.5  # q: a prediction is (r^q - 1) / q times the slope at r = 1 (1 = linear in the share)
    counterfactual_rows: int = 32  # held-out rows per source of the probe the counterfactual is read with at the end
    held_out: list[str] = field(default_factory=list)  # held-out sets the counterfactual must cover; [] = all

    def __post_init__(self) -> None:
        _check(
            len(set(self.held_out)) == len(self.held_out), "held_out", self.held_out, "held-out set names, each once"
        )
        for key, low in (("every", 0), ("start", 0), ("heldout_rows", 1)):
            value = getattr(self, key)
            _check(
                isinstance(value, int) and not isinstance(value, bool) and value >= low,
                key,
                value,
                f"an integer >= {low}",
            )
        rows = self.counterfactual_rows
        _check(
            isinstance(rows, int) and not isinstance(rows, bool) and rows >= 4,
            "counterfactual_rows",
            rows,
            "an integer >= 4 (its interval comes from 4 groups of the rows)",
        )
        _check(
            bool(self.factors)
            and all(isinstance(f, (int, float)) and f >= 0 and f != 1 for f in self.factors)
            and len(set(self.factors)) == len(self.factors),
            "factors",
            self.factors,
            "share factors >= 0 other than 1, each once (0 = left out; a factor below 0 would make the source's "
            "weight negative)",
        )
        _check(_number(self.horizon) and self.horizon > 0, "horizon", self.horizon, "a number of steps > 0")
        _check(
            _number(self.saturation) and 0 < self.saturation <= 1,
            "saturation",
            self.saturation,
            "0 < q <= 1 (1: linear in the share; smaller: leaving a source out costs more than the slope says)",
        )
        _check(self.split in ("tokens", "losses"), "split", self.split, "'tokens' or 'losses'")


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
