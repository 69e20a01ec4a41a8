"""How well the baseline's counterfactual predicts each variant's measured effect, in sign, size and rank.

The counterfactual (``train/attribution/counterfactual.py``) gives, per training source ``a`` and
held-out set ``b``, the slope of ``b``'s held-out loss by ``ln`` of ``a``'s share; a variant that
scales one source's share by ``r`` against the others (0: left out; ``[ablate] factors``) is predicted
as ``(r^q - 1)/q · slope[a][b]``. Any other mix (named or random mixes) is predicted to first order,
``Σ_a slope[a][b] · ln(r_a)`` over the sources' share ratios (the slopes sum to about 0, so only the
ratios' differences count); a mix that leaves a source out has no first-order prediction and is
left out here. The slope is the mean over the baseline seeds that recorded one, and its standard
error their spread (one seed: the run's own interval).

A cell's measured delta is the mean over the variant's seeds minus the mean over the baseline's,
and its noise two standard errors of that, the seeds' spread pooled over the baseline and the variants
(``compare.seed_noise``). On the cells above the noise the comparison counts the predicted signs that
agree, and the predictions within a factor 2 of the measurement (the same sign, and 0.5 to 2 times its
size); the Spearman rank correlation runs over all cells.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from winnow.pipelines.ablate.compare import baselines as _baselines
from winnow.pipelines.ablate.compare import finite_loss as _finite_loss
from winnow.pipelines.ablate.compare import mean_held_out as _mean_held_out
from winnow.pipelines.ablate.compare import noise_of, seed_noise, seed_sd
from winnow.pipelines.ablate.plan import CURATION_KINDS_PLANNED

_SCHEMA = {
    "variant": pl.String,
    "kind": pl.String,
    "varied": pl.String,
    "factor": pl.Float64,
    "source": pl.String,
    "seeds": pl.Int64,
    "measured": pl.Float64,
    "predicted": pl.Float64,
    "interval": pl.Float64,
    "noise": pl.Float64,
    "above_noise": pl.Boolean,
}


def slope_of(
    counterfactuals: list, interval: str = "auto"
) -> tuple[np.ndarray, np.ndarray, list[str], list[str], float]:
    """The mean slope over the baseline seeds' counterfactuals (dicts: ``sources``, ``held_out``, ``slope``,
    ``slope_se``, ``saturation``), its standard error (``interval``: "seeds", their spread; "run", the runs' own
    errors; "auto", the spread when there are two or more), the training sources, the held-out sets and ``q``."""
    first = counterfactuals[0]
    slopes = np.array([np.asarray(c["slope"], dtype=float) for c in counterfactuals])
    if len(slopes) >= 2 and interval != "run":
        error = slopes.std(0, ddof=1) / np.sqrt(len(slopes))
    else:
        error = np.sqrt(
            np.mean([np.asarray(c["slope_se"], dtype=float) ** 2 for c in counterfactuals], 0) / len(counterfactuals)
        )
    return slopes.mean(0), error, list(first["sources"]), list(first["held_out"]), float(first["saturation"])


def _response(r: float, q: float) -> float:
    return (r**q - 1) / q


def _prediction(
    ratio: np.ndarray,
    slope: np.ndarray,
    error: np.ndarray,
    q: float,
    sources: list[str],
    varied_source: str | None = None,
) -> tuple[str | None, float | None, np.ndarray | None, np.ndarray | None]:
    """(varied source, factor, predicted (B,), interval (B,)) of a mix given as share ratios to the baseline's.

    ``varied_source`` is the source a leave-one-out or weights variant scaled; without it, a mix where one source's
    ratio differs and the others' agree is read as that source scaled (of two sources either could be: such a
    mix is predicted as a mix, from its log ratios)."""
    varied = np.flatnonzero(~np.isclose(ratio, np.median(ratio)))
    if varied_source in sources:
        varied = np.array([sources.index(varied_source)])
    if len(varied) == 1 and (len(ratio) > 2 or varied_source in sources):  # one scaled, the others moved alike
        a = int(varied[0])
        others = np.delete(ratio, a).mean()
        r = float(ratio[a] / others)
        f = _response(r, q)
        return sources[a], r, f * slope[a], 2 * abs(f) * error[a]
    if (ratio <= 0).any():
        return None, None, None, None
    logs = np.log(ratio)
    return None, None, logs @ slope, 2 * np.sqrt((logs[:, None] ** 2 * error**2).sum(0))


def compare_with_counterfactual(
    results: list[dict], counterfactuals: list[dict], base: dict[str, float], *, interval: str = "auto"
) -> dict:
    """Each variant's predicted delta per held-out set against the measured one, and how well they agree."""
    slope, error, sources, held_out, q = slope_of(counterfactuals, interval)
    held = [h for h in held_out if h != "mean"]
    reference = {s: _mean_held_out(_baselines(results), s) for s in held}
    base_share = np.array([base.get(s, 0.0) for s in sources])
    steps = {r.get("steps") for r in _baselines(results)}
    groups: dict[str, list[dict]] = {}
    for r in results:
        # an adaptive run has no fixed mix to predict from; a curation variant changes the data, not the mix; a run
        # of another length (a random mix's mix_steps) is a point of the mixing regression, not a comparable one
        if r["kind"] not in ("baseline", "noise", "adaptive", *CURATION_KINDS_PLANNED) and r.get("steps") in steps:
            groups.setdefault(r.get("group", r["name"]), []).append(r)
    repeats = max([len(g) for g in groups.values()], default=1)
    noise = seed_noise(results, held, repeats)  # the summary's: a variant of the most seeds
    sds = seed_sd(results, held)
    cells, compared = [], {}
    for name, runs in groups.items():
        w = np.array([runs[0]["weights"].get(s, 0.0) for s in sources])
        if w.sum() <= 0:
            continue
        ratio = np.divide(w / w.sum(), base_share, out=np.ones_like(w), where=base_share > 0)
        varied, factor, predicted, interval = _prediction(ratio, slope, error, q, sources, runs[0].get("varied"))
        if predicted is None:
            continue
        compared[name] = runs
        for j, s in enumerate(held):
            mean = _mean_held_out(runs, s)
            if mean is None or reference[s] is None:
                continue
            measured = mean - reference[s]
            seeds = sum(_finite_loss(r, s) is not None for r in runs)  # a diverged seed measures nothing
            own = noise_of(*sds[s], seeds) or 0.0  # each cell's own seeds: a one-seed mix is noisier
            cells.append(
                {
                    "variant": name,
                    "kind": runs[0]["kind"],
                    "varied": varied,
                    "factor": factor,
                    "source": s,
                    "seeds": seeds,
                    "measured": measured,
                    "predicted": float(predicted[j]),
                    "interval": float(interval[j]),
                    "noise": own,
                    "above_noise": abs(measured) > own,
                }
            )
    frame = pl.DataFrame(cells, schema=_SCHEMA)
    seeds = len(_baselines(results))
    ratio = _effect_to_noise(frame)
    by_kind = {
        kind: agreement(frame.filter(pl.col("kind") == kind)) for kind in frame["kind"].unique(maintain_order=True)
    }
    return {
        **agreement(frame),
        "by_kind": by_kind if len(by_kind) > 1 else {},
        "predictor": "counterfactual",
        "saturation": q,
        "counterfactual_runs": len(counterfactuals),
        "noise": noise,
        "noise_rule": "2 standard errors of a delta (the seeds' sd pooled over the baseline and the variants)",
        "seeds": seeds,
        "variant_seeds": repeats,
        "effect_to_noise": ratio,
        "noise_ok": bool(seeds >= 3 and ratio is not None and ratio >= NOISE_MARGIN),
        "measurement": split_half(compared, _baselines(results), held),
        "cells": frame,
    }


def _spearman(a: np.ndarray, b: np.ndarray) -> float | None:
    """The rank correlation of ``a`` and ``b``; None where there is none (fewer than 3 values, or one side constant):
    ``correlation.json`` stays JSON, where NaN is not."""
    if len(a) < 3:
        return None
    ranks = pl.DataFrame({"a": a, "b": b}).select(pl.all().rank()).to_numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = float(np.corrcoef(ranks.T)[0, 1])
    return rho if np.isfinite(rho) else None


def rho_text(rho: float | None) -> str:
    """A Spearman correlation as the tables print it, or why there is none."""
    return f"{rho:.3f}" if rho is not None else "none (under 3 cells, or one side constant)"


def split_half(groups: dict[str, list[dict]], base_runs: list[dict], held: list[str]) -> dict | None:
    """How well the study's measurement agrees with itself, which caps how well any prediction can agree with it.

    Each variant's seeds and the baseline's are split in two halves, every cell is measured on each half (the
    half's variant mean minus the half's baseline mean), and the two sets of cells are rank-correlated; the
    figure is the mean over rotations of the seeds (``split_half``). By the Spearman-Brown formula the cells
    measured on all seeds have a reliability of about ``2r / (1 + r)``, and a perfect prediction would reach
    about its square root (``ceiling``): a Spearman near the ceiling is as good as this study can show, one far
    below it is the prediction's. None when the baseline or no variant has two seeds, or fewer than 3 cells."""
    split = {name: sorted(runs, key=lambda r: r["seed"]) for name, runs in groups.items() if len(runs) >= 2}
    base = sorted(base_runs, key=lambda r: r["seed"])
    if len(base) < 2 or not split:
        return None

    def halves(runs: list[dict], k: int) -> tuple[list[dict], list[dict]]:
        turned = runs[k % len(runs) :] + runs[: k % len(runs)]
        return turned[: len(runs) // 2], turned[len(runs) // 2 :]

    rhos = []
    for kb in range(len(base)):
        base_a, base_b = ({s: _mean_held_out(half, s) for s in held} for half in halves(base, kb))
        for kv in range(max(len(r) for r in split.values())):
            a, b = [], []
            for runs in split.values():
                runs_a, runs_b = halves(runs, kv)
                for s in held:
                    values = [_mean_held_out(runs_a, s), base_a[s], _mean_held_out(runs_b, s), base_b[s]]
                    if None not in values:
                        a.append(values[0] - values[1])
                        b.append(values[2] - values[3])
            rhos.append(_spearman(np.array(a), np.array(b)))
    rhos = [r for r in rhos if r is not None]
    if not rhos:
        return None
    r = float(np.mean(rhos))
    whole = 2 * r / (1 + r) if r > -1 else float("nan")
    return {
        "split_half": r,
        "splits": len(rhos),
        "ceiling": float(np.sqrt(whole)) if whole > 0 else 0.0,
        **spread(list(split.values()), base, held),
    }


def spread(groups: list[list[dict]], base_runs: list[dict], held: list[str]) -> dict:
    """How much the variants' seeds spread against the baseline's: per held-out set, the standard deviation of the
    variants' runs about their own means (pooled over the variants of two or more seeds) over the baseline seeds'
    (``spread_by_set``), and its median over the sets (``spread``). The noise pools both; far from 1, the seeds'
    spread depends on the mix, and a variant's own seeds weigh as much as the baseline's."""
    by_set = {}
    for s in held:
        values = [np.array([r["held_out"][s] for r in runs if r["held_out"].get(s) is not None]) for runs in groups]
        values = [v for v in values if len(v) >= 2 and np.isfinite(v).all()]
        base = np.array([r["held_out"][s] for r in base_runs if r["held_out"].get(s) is not None])
        if not values or len(base) < 2 or not np.isfinite(base).all() or base.std(ddof=1) == 0:
            continue
        pooled = np.sqrt(sum(((v - v.mean()) ** 2).sum() for v in values) / sum(len(v) - 1 for v in values))
        by_set[s] = float(pooled / base.std(ddof=1))
    return {"spread": float(np.median(list(by_set.values()))), "spread_by_set": by_set} if by_set else {}


def figures_text(name: str, part: dict) -> str:
    """One predictor's (or one kind of variant's) agreement figures in a line: signs, within 2x, Spearman."""
    return (
        f"{name}: signs {part['sign_agree']}/{part['above_noise']}, within 2x {part['within_2x']}/"
        f"{part['above_noise']}, Spearman {rho_text(part['spearman'])} over {part['n_cells']} cells"
    )


def measurement_text(measurement: dict) -> str:
    """One line on how well the study's measured cells agree with themselves (``correlation.split_half``)."""
    return (
        f"The measurement itself: the cells measured on two halves of the seeds agree at Spearman "
        f"{measurement['split_half']:.2f}, so a perfect prediction would reach about {measurement['ceiling']:.2f} "
        "against all seeds' cells." + _spread_text(measurement.get("spread"))
    )


def _spread_text(ratio: float | None) -> str:
    """A sentence when the variants' seeds spread far more or far less than the baseline's (``spread``)."""
    if ratio is None or 1 / SPREAD_MARGIN < ratio < SPREAD_MARGIN:
        return ""
    return (
        f" Its variants' seeds spread {ratio:.1f}x as much as the baseline's (the median over the held-out sets): "
        "the noise pools both, and a variant's delta is only as sure as its own seeds; more seeds per variant "
        "([ablate] variant_seeds) narrow it."
    )


def agreement(cells: pl.DataFrame) -> dict:
    """Spearman over the cells; on those above the seed noise, the signs that agree and the sizes within 2x."""
    spearman = _spearman(cells["measured"].to_numpy(), cells["predicted"].to_numpy())
    strong = cells.filter(pl.col("above_noise"))
    measured, predicted = strong["measured"].to_numpy(), strong["predicted"].to_numpy()
    same = np.sign(measured) == np.sign(predicted)
    with np.errstate(divide="ignore", invalid="ignore"):
        size = np.abs(predicted) / np.abs(measured)
    within = same & (size >= 0.5) & (size <= 2)
    return {
        "spearman": spearman,
        "n_cells": cells.height,
        "above_noise": strong.height,
        "sign_agree": int(same.sum()),
        "within_2x": int(within.sum()),
        "noise_measured": "noise" not in cells.columns or bool((cells["noise"] > 0).any()),
    }


def above_noise_text(summary: dict) -> str:
    """What ``above_noise`` counts: the cells above the seed noise, or, with no noise measured (one seed of the
    baseline and of each variant), every cell that moved at all."""
    if summary.get("noise_measured", True):
        return f"{summary['above_noise']} cells above the seed noise"
    return f"{summary['above_noise']} cells that moved (no seed noise measured: [ablate] noise_seeds = 1)"


SPREAD_MARGIN = 1.5  # the variants' seeds spreading this much more (or less) than the baseline's is said
NOISE_MARGIN = 2.0  # "well below": the median variant's effect is at least twice its noise (so >= 4 standard errors)


def _effect_to_noise(cells: pl.DataFrame) -> float | None:
    """Median over the variants of |effect| / its seed noise (None without a noise estimate). A variant's effect is
    the one it is designed to move: the varied source's own held-out loss, or for a mix of several changes its
    largest one. A study of small changes (shares x 1.5) has most of its cross cells within the noise by nature;
    they still count in the agreement figures, not here."""
    noisy = cells.filter(pl.col("noise") > 0).with_columns(ratio=pl.col("measured").abs() / pl.col("noise"))
    if noisy.is_empty():
        return None
    own = noisy.filter(pl.col("varied") == pl.col("source")).group_by("variant").agg(pl.col("ratio").first())
    rest = (
        noisy.filter(~pl.col("variant").is_in(own["variant"].implode())).group_by("variant").agg(pl.col("ratio").max())
    )
    return float(pl.concat([own, rest])["ratio"].median())
