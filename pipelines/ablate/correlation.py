"""How well the baseline's attribution predicts the measured effect of each variant on each held-out source."""

from __future__ import annotations

import numpy as np
import polars as pl

from pipelines.ablate.compare import baselines as _baselines
from pipelines.ablate.compare import mean_held_out as _mean_held_out
from pipelines.ablate.compare import seed_noise
from pipelines.ablate.plan import CURATION_KINDS_PLANNED


def compare_with_attribution(results: list[dict], sources: list[str], matrix: np.ndarray,
                             base: dict[str, float]) -> dict:
    """First-order prediction of each variant's delta from the baseline's attribution, against the measured one.

    The attribution is linear in each source's token share, so a variant that scales source
    ``a``'s share by ``r_a`` (0 when left out; the others grow to fill) is predicted to change
    held-out loss on ``b`` by ``sum_a (r_a - 1) · A[a, b]``. The measured delta of a variant is the
    mean over its seeds (``[ablate] variant_seeds``) minus the mean over the baseline's seeds.
    """
    reference = {s: _mean_held_out(_baselines(results), s) for s in sources}
    base_share = np.array([base.get(s, 0.0) for s in sources])
    groups: dict[str, list[dict]] = {}
    for r in results:
        # an adaptive run has no fixed mix to predict from; a curation variant changes the data, not the mix
        if r["kind"] not in ("baseline", "noise", "adaptive", *CURATION_KINDS_PLANNED):
            groups.setdefault(r.get("group", r["name"]), []).append(r)
    repeats = max([len(g) for g in groups.values()], default=1)
    noise = seed_noise(results, sources, repeats)
    cells = []
    for name, runs in groups.items():
        w = np.array([runs[0]["weights"].get(s, 0.0) for s in sources])
        ratio = np.divide(w / w.sum(), base_share, out=np.ones_like(w), where=base_share > 0)
        predicted = (ratio - 1) @ matrix
        for j, s in enumerate(sources):
            mean = _mean_held_out(runs, s)
            if mean is None or reference[s] is None:
                continue
            measured = mean - reference[s]
            cells.append({"variant": name, "kind": runs[0]["kind"], "source": s, "seeds": len(runs),
                          "measured": measured, "predicted": float(predicted[j]),
                          "noise": noise[s], "above_noise": abs(measured) > noise[s]})
    frame = pl.DataFrame(cells, schema={"variant": pl.String, "kind": pl.String, "source": pl.String,
                                        "seeds": pl.Int64, "measured": pl.Float64, "predicted": pl.Float64,
                                        "noise": pl.Float64, "above_noise": pl.Boolean})
    seeds = len(_baselines(results))
    ratio = _effect_to_noise(frame)
    by_kind = {kind: _agreement(frame.filter(pl.col("kind") == kind)) for kind in frame["kind"].unique(maintain_order=True)}
    return {**_agreement(frame), "by_kind": by_kind if len(by_kind) > 1 else {},
            "noise": noise, "noise_rule": "2 standard errors of a delta (baseline seeds' sd)",
            "seeds": seeds, "variant_seeds": repeats, "effect_to_noise": ratio,
            "noise_ok": bool(seeds >= 3 and ratio is not None and ratio >= NOISE_MARGIN), "cells": frame}


def _agreement(cells: pl.DataFrame) -> dict:
    """Spearman over the cells, and sign agreement on those above the seed noise."""
    ranks = cells.select(pl.col("measured").rank(), pl.col("predicted").rank()).to_numpy()
    spearman = float(np.corrcoef(ranks.T)[0, 1]) if cells.height > 2 else float("nan")
    strong = cells.filter(pl.col("above_noise"))
    agree = int((np.sign(strong["measured"].to_numpy()) == np.sign(strong["predicted"].to_numpy())).sum())
    return {"spearman": spearman, "n_cells": cells.height, "above_noise": strong.height, "sign_agree": agree}


NOISE_MARGIN = 2.0  # "well below": the median cell's |delta| is at least twice its noise (so >= 4 standard errors)


def _effect_to_noise(cells: pl.DataFrame) -> float | None:
    """Median over cells of |measured delta| / the seed noise of its source (None without a noise estimate)."""
    noisy = cells.filter(pl.col("noise") > 0)
    if noisy.is_empty():
        return None
    return float((noisy["measured"].abs() / noisy["noise"]).median())
