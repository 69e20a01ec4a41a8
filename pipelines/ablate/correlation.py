"""How well the baseline's attribution predicts the measured effect of each variant on each held-out source."""

from __future__ import annotations

import numpy as np
import polars as pl


def seed_noise(results: list[dict], sources: list[str]) -> dict[str, float]:
    """Per held-out source, the largest distance of a noise-seed baseline from the baseline (0 without one)."""
    baseline = results[0]["held_out"]
    return {s: max([abs(r["held_out"][s] - baseline[s]) for r in results if r["kind"] == "noise"], default=0.0)
            for s in sources}


def compare_with_attribution(results: list[dict], sources: list[str], matrix: np.ndarray,
                             base: dict[str, float]) -> dict:
    """First-order prediction of each variant's delta from the baseline's attribution, against the measured one.

    The attribution is linear in each source's token share, so a variant that scales source
    ``a``'s share by ``r_a`` (0 when left out; the others grow to fill) is predicted to change
    held-out loss on ``b`` by ``sum_a (r_a - 1) · A[a, b]``.
    """
    baseline = results[0]["held_out"]
    noise = seed_noise(results, sources)
    base_share = np.array([base.get(s, 0.0) for s in sources])
    cells = []
    for r in results:
        if r["kind"] in ("baseline", "noise"):
            continue
        w = np.array([r["weights"].get(s, 0.0) for s in sources])
        ratio = np.divide(w / w.sum(), base_share, out=np.ones_like(w), where=base_share > 0)
        predicted = (ratio - 1) @ matrix
        for j, s in enumerate(sources):
            if r["held_out"].get(s) is None or baseline.get(s) is None:
                continue
            measured = r["held_out"][s] - baseline[s]
            cells.append({"variant": r["name"], "kind": r["kind"], "source": s, "measured": measured,
                          "predicted": float(predicted[j]),
                          "noise": noise[s], "above_noise": abs(measured) > noise[s]})
    frame = pl.DataFrame(cells, schema={"variant": pl.String, "kind": pl.String, "source": pl.String,
                                        "measured": pl.Float64,
                                        "predicted": pl.Float64, "noise": pl.Float64, "above_noise": pl.Boolean})
    seeds = 1 + sum(r["kind"] == "noise" for r in results)
    ratio = _effect_to_noise(frame)
    by_kind = {kind: _agreement(frame.filter(pl.col("kind") == kind)) for kind in frame["kind"].unique(maintain_order=True)}
    return {**_agreement(frame), "by_kind": by_kind if len(by_kind) > 1 else {},
            "noise": noise, "seeds": seeds, "effect_to_noise": ratio,
            "noise_ok": bool(seeds >= 3 and ratio is not None and ratio >= NOISE_MARGIN), "cells": frame}


def _agreement(cells: pl.DataFrame) -> dict:
    """Spearman over the cells, and sign agreement on those above the seed noise."""
    ranks = cells.select(pl.col("measured").rank(), pl.col("predicted").rank()).to_numpy()
    spearman = float(np.corrcoef(ranks.T)[0, 1]) if cells.height > 2 else float("nan")
    strong = cells.filter(pl.col("above_noise"))
    agree = int((np.sign(strong["measured"].to_numpy()) == np.sign(strong["predicted"].to_numpy())).sum())
    return {"spearman": spearman, "n_cells": cells.height, "above_noise": strong.height, "sign_agree": agree}


NOISE_MARGIN = 3.0  # "well below": the median cell's effect is at least this many times its source's seed noise


def _effect_to_noise(cells: pl.DataFrame) -> float | None:
    """Median over cells of |measured delta| / the seed noise of its source (None without a noise estimate)."""
    noisy = cells.filter(pl.col("noise") > 0)
    if noisy.is_empty():
        return None
    return float((noisy["measured"].abs() / noisy["noise"]).median())
