"""``kind = "random_mixes"``: a regression from mixture weights to held-out loss, and the mix it proposes.

After RegMix (Liu et al. 2024, https://arxiv.org/abs/2407.01492): many short runs on mixtures
drawn around the baseline, one linear model per held-out source fitted to their final held-out
losses, ``loss_b(w) = sum_a w_a · beta[a, b]`` over token shares ``w`` (which sum to 1, so no
intercept; a small ridge keeps it defined when two sources move together), and the proposal:
the mean of the best ``top`` of many candidate mixtures drawn from the same Dirichlet, ranked by
the predicted target. A linear model's minimum is a corner (one source only, never measured), and
with a few runs the Dirichlet's tails reach far past them, so only candidates whose every share
lies within the range the fitted runs covered are ranked: the proposal interpolates (on the
shipped study, unrestricted top-100 averaging proposed 72% of a source no run had above 28%).
The fit reports in-sample R² and the leave-one-out (PRESS) error per source, so a user sees
whether the proposal rests on a model that predicts.
"""

from __future__ import annotations

import numpy as np

from winnow.pipelines.ablate.plan import dirichlet

RIDGE = 1e-4  # relative to the mean squared share: negligible unless two sources are collinear


def fit_mixes(results: list[dict], sources: list[str], *, steps: int | None = None) -> dict:
    """Least-squares ``beta`` (features x held-out sources) from the random-mix runs (and any baseline of the
    same length); rows are each run's normalised token shares over ``sources``."""
    runs = [
        r
        for r in results
        if r["kind"] == "random_mix"
        or (r["kind"] in ("baseline", "noise") and steps is not None and r["steps"] == steps)
    ]
    weights = np.array([[r["weights"].get(s, 0.0) for s in sources] for r in runs], dtype=float)
    weights /= weights.sum(axis=1, keepdims=True)
    losses = np.array([[r["held_out"][s] for s in sources] for r in runs], dtype=float)
    gram = weights.T @ weights
    gram += RIDGE * np.trace(gram) / len(sources) * np.eye(len(sources))
    inverse = np.linalg.inv(gram)
    beta = inverse @ weights.T @ losses  # (S features, S held-out)
    fitted = weights @ beta
    hat = np.einsum("ij,jk,ik->i", weights, inverse, weights)  # leverage of each run
    press = (losses - fitted) / (1 - hat)[:, None]  # leave-one-out residuals, closed form
    total = ((losses - losses.mean(axis=0)) ** 2).sum(axis=0)
    r2 = 1 - ((losses - fitted) ** 2).sum(axis=0) / np.where(total > 0, total, np.nan)
    return {
        "sources": sources,
        "runs": [r["name"] for r in runs],
        "beta": beta.tolist(),
        "share_range": {s: [float(weights[:, j].min()), float(weights[:, j].max())] for j, s in enumerate(sources)},
        "r2": dict(zip(sources, r2.tolist())),
        "cv_rmse": dict(zip(sources, np.sqrt((press**2).mean(axis=0)).tolist())),
        "spread": dict(zip(sources, losses.std(axis=0).tolist())),
    }


def target_of(losses: np.ndarray, sources: list[str], target: str) -> np.ndarray:
    """The target of (..., S) held-out losses: their mean, or one source's."""
    return losses.mean(axis=-1) if target == "mean" else losses[..., sources.index(target)]


def propose(
    fit: dict,
    base: dict[str, float],
    *,
    target: str,
    concentration: float,
    seed: int,
    candidates: int = 100_000,
    top: int = 100,
) -> dict[str, float]:
    """The proposed mix: the mean of the ``top`` candidates (Dirichlet around ``base``, within the fitted runs'
    share ranges) the fit predicts best."""
    sources = fit["sources"]
    alpha = concentration * np.array([base.get(s, 0.0) for s in sources])
    draws = dirichlet(alpha, candidates, seed, stream=1)
    low, high = np.array([fit["share_range"][s] for s in sources]).T
    inside = draws[((draws >= low) & (draws <= high)).all(axis=1)]
    draws = inside if len(inside) >= top else draws  # too few runs to span a region: rank them all
    predicted = target_of(draws @ np.asarray(fit["beta"]), sources, target)
    best = draws[np.argsort(predicted)[:top]].mean(axis=0)
    return {s: float(w) for s, w in zip(sources, best) if w > 0}


def summarize(fit: dict, results: list[dict], base: dict[str, float], target: str) -> dict:
    """``mixes.json``: the fit, the proposal, and the proposed run's measured target against the baseline's."""
    sources = fit["sources"]
    beta = np.asarray(fit["beta"])
    by_name = {r["name"]: r for r in results}
    baseline, proposed = by_name["baseline"], by_name.get("proposed")

    def measured(r: dict) -> float:
        return float(target_of(np.array([r["held_out"][s] for s in sources]), sources, target))

    def predicted(weights: dict[str, float]) -> float:
        w = np.array([weights.get(s, 0.0) for s in sources])
        return float(target_of(w / w.sum() @ beta, sources, target))

    noise = max([abs(measured(r) - measured(baseline)) for r in results if r["kind"] == "noise"], default=None)
    out = {
        "target": target,
        "fit": fit,
        "noise": noise,
        "baseline": {"weights": dict(base), "predicted": predicted(base), "measured": measured(baseline)},
    }
    if proposed is not None:
        out["proposed"] = {
            "weights": proposed["weights"],
            "predicted": predicted(proposed["weights"]),
            "measured": measured(proposed),
        }
        out["improvement"] = out["baseline"]["measured"] - out["proposed"]["measured"]
    return out
