"""Which rows of one source make up its share of the mixture, and how many times each.

A source asked for ``target`` tokens out of ``available`` takes ``floor(target / available)``
whole passes over its rows, then a partial pass over its most preferred rows until the
target is met (to the nearest document). Preference is a seeded random order, the score
order (``top``), or importance resampling without replacement (``importance``: Gumbel-top-k
over log-weights, which draws rows with probability proportional to ``exp(dsir_weight)``
without replacement, as in DSIR, https://arxiv.org/abs/2302.03169). No row gets more than
``max_copies`` copies.

The preference order is a sort key (``preference_keys``, most preferred first, ties by the
row's position), so the partial pass is "every row before a cut-off key": the plan finds every
source's key at once (``curate.stages.mixing.cuts``) and each task compares its own rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from winnow.curate.stages.mixing.hashing import unit

SELECTIONS = ("random", "top", "importance")


def preference_keys(select: str) -> list[pl.Expr]:
    """Sort keys ``_k1`` (, ``_k2``) of a row's preference, ascending = most preferred, from ``_h`` and ``_score``.

    NaN and null scores count as the least preferred; ``+ 0.0`` folds -0.0 into 0.0, so sorting
    and comparing agree on every key.
    """
    u = unit("_h")
    if select == "random":
        return [u.alias("_k1")]
    score = pl.col("_score")
    score = pl.when(score.is_null() | score.is_nan()).then(float("-inf")).otherwise(score)
    if select == "top":
        return [(-score + 0.0).alias("_k1"), u.alias("_k2")]  # ties in score fall back to the seeded random order
    # Gumbel-top-k: key = log w + G with G = -log(-log u) draws without replacement ∝ w.
    gumbel = -(-(u.clip(1e-300, 1.0 - 1e-16).log())).log()
    return [(-(score + gumbel) + 0.0).alias("_k1")]


@dataclass(frozen=True, slots=True)
class Share:
    """What one source gives the mixture: every row ``passes`` times, plus ``rest`` tokens of a partial pass (None: no partial pass)."""

    passes: int
    rest: float | None


def share(available: float, rows: int, target: float, max_copies: int) -> Share:
    """Whole passes and the partial pass's token target for a source with ``available`` tokens in ``rows`` rows."""
    if rows == 0 or available <= 0 or target <= 0:
        return Share(0, None)
    passes = min(int(target // available), max_copies)
    rest = target - passes * available
    return Share(passes, None if passes >= max_copies or rest <= 0 else rest)
