"""The counterfactual calibrated on a study: the baseline run's slopes as the prior, the measured variants as data.

A run's counterfactual (``train/attribution/counterfactual.py``) predicts what scaling training source
``a``'s share by ``r`` does to held-out loss ``b`` from one derivative, ``slope[a][b]``, and one response
shape. A study measures some of those changes (leave-one-out, shares x0.5 / x1.5). This module puts the
two together in an empirical-Bayes model, fitted by maximum marginal likelihood:

    measured[a, r, b] = h_p[a](r) · σ[a, b] + offset[b] + noise        h_p(r) = (r^p - 1) / p
    σ[a, b] ~ Normal(κ · slope[a, b], κ² · slope_se[a, b]² + τ²)

* ``σ[a, b]``: the cell's effect per unit of ``h`` (its slope by ln share at ``r = 1``);
* ``p[a]``: the response's shape (``p`` < 1: leaving a source out costs more than a line through the x0.5
  and x1.5 points says). A source measured left out and at another factor has its own; the others take
  the median of those (one source unlike the rest, random text, then moves no other source's shape);
* ``κ``, ``τ``: how the run's slopes relate to the measured effects: their scale, and the spread around it
  (a small ``τ``: the run's slopes carry the cells; a large one: the study's own runs do);
* ``offset[b]``: where the baseline's seeds sit against the variants' response curves. Every variant's delta
  on ``b`` is taken against the same baseline mean, so that mean's error is shared by all of them; the fit
  estimates it from the variants, and it is never part of a prediction of what a mix would do;
* ``noise``: each measured delta's own error (``compare.seed_noise``, two standard errors).

A prediction for a factor ``r`` is ``h_p[a](r) · E[σ | run, study]`` with an interval of two posterior
standard deviations; the mean over the held-out sets is the mean of the predictions.

The check is leave-one-variant-out: every variant's cells are predicted by a model fitted without that
variant's runs (the shapes, ``κ``, ``τ``, the offsets and the posterior of each cell all refitted), then compared
with the measurement as ``correlation.py`` compares the run's own counterfactual (signs and factor 2 above
the noise, Spearman over all cells). As the measurement holds its baseline's offset, the compared value is
the prediction plus the offset the other variants place the baseline at. Only variants that scale one
source are modelled: a random mix changes every share at once.

Shape legend: S training sources, B held-out sets, N measured cells.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from winnow.pipelines.ablate.correlation import above_noise_text, agreement, figures_text, rho_text

FACTORS = (0.0, 0.5, 1.5, 2.0)  # the predictions calibrated.json holds: left out, halved, x1.5, doubled
SCALED = ("leave_one_out", "weights")  # the variants that scale one source's share
# the response's shape: 0.002 (leaving a source out costs 500x its slope) to 3, finer where it bends most
_P_GRID = np.concatenate([np.geomspace(0.002, 0.05, 15)[:-1], np.round(np.arange(0.05, 3.0001, 0.05), 2)])
_TAU_GRID = np.geomspace(0.01, 10.0, 41)  # τ in units of the slopes' root mean square
_OFFSET_ROUNDS = 12  # at most this many alternations between the model and the baseline's offsets
_OFFSET_TOLERANCE = 1e-5  # nats: the offsets have settled when no one moves more than this


def response(r, p: float) -> np.ndarray:
    """``h_p(r) = (r^p - 1) / p``: 0 at ``r = 1``, slope 1 in ``ln r`` there, ``-1/p`` at ``r = 0``."""
    return (np.asarray(r, dtype=float) ** p - 1) / p


@dataclass(frozen=True, slots=True)
class Cells:
    """The measured cells of the study's one-source variants, as arrays (N,)."""

    source: np.ndarray  # index of the scaled source in the run's sources
    held: np.ndarray  # index of the held-out set
    factor: np.ndarray  # r
    measured: np.ndarray  # nats
    var: np.ndarray  # the measured delta's variance: (noise / 2)²
    variant: np.ndarray  # the variant's name

    def take(self, keep: np.ndarray) -> Cells:
        return Cells(*(getattr(self, f)[keep] for f in self.__slots__))


@dataclass(frozen=True, slots=True)
class Fit:
    """A fitted model: its parameters and each cell's posterior, (S, B)."""

    p: np.ndarray  # (S,) each source's response shape
    kappa: float
    tau: float
    offset: np.ndarray  # (B,)
    sigma: np.ndarray  # (S, B) posterior mean of σ
    sigma_sd: np.ndarray  # (S, B) posterior standard deviation

    def predict(self, factor, source, held) -> np.ndarray:
        """The predicted change (no offset) of the cells given as arrays of factor, source and held-out index."""
        return response(factor, self.p[source]) * self.sigma[source, held]


def _sums(cells: Cells, p_S: np.ndarray, S: int, B: int) -> tuple[np.ndarray, np.ndarray]:
    """Per (source, held-out) cell of the model: Σ h²/var and Σ h·y/var over its measured factors, each (S, B)."""
    h = response(cells.factor, p_S[cells.source])
    key = cells.source * B + cells.held
    hh = np.bincount(key, h * h / cells.var, S * B).reshape(S, B)
    hy = np.bincount(key, h * cells.measured / cells.var, S * B).reshape(S, B)
    return hh, hy


def _posterior(hh, hy, slope, se, kappa: float, tau: float) -> tuple[np.ndarray, np.ndarray]:
    prior_var = kappa**2 * se**2 + tau**2
    precision = 1 / prior_var + hh
    return (kappa * slope / prior_var + hy) / precision, 1 / np.sqrt(precision)


def _likelihood(cells: Cells, p_PS: np.ndarray, slope: np.ndarray, se: np.ndarray):
    """(negative log marginal likelihood, κ, τ), each (P,), of the measured cells (offsets removed) for each row
    of candidate shapes ``p_PS`` (P, S), at the best τ of the grid.

    Each (source, held-out) cell's measured factors are jointly Normal, ``κ·slope·h`` plus a rank-one
    covariance ``v·h·hᵀ`` (``v``: the prior's variance) and the diagonal noise, so the likelihood needs only
    per-cell sums (the Sherman-Morrison and matrix-determinant identities); ``κ`` is its generalised
    least-squares value for each τ, and every candidate and every τ of the grid is evaluated at once."""
    S, B = slope.shape
    P = p_PS.shape[0]
    seen = np.zeros((S, B), dtype=bool)
    seen[cells.source, cells.held] = True
    scale = float(np.sqrt(np.mean(slope[seen] ** 2))) or 1.0
    key = cells.source * B + cells.held
    yy = np.bincount(key, cells.measured**2 / cells.var, S * B).reshape(S, B)
    h = response(cells.factor, p_PS[:, cells.source])  # (P, N)
    keys = (np.arange(P)[:, None] * (S * B) + key).ravel()
    hh = np.bincount(keys, (h * h / cells.var).ravel(), P * S * B).reshape(P, 1, S, B)
    hy = np.bincount(keys, (h * cells.measured / cells.var).ravel(), P * S * B).reshape(P, 1, S, B)
    taus = _TAU_GRID[None, :, None, None] * scale  # (1, T, 1, 1)
    kappa = np.ones((P, len(_TAU_GRID), 1, 1))
    for _ in range(3):  # κ enters the prior's variance through slope_se: settle it
        shrink = 1 / (1 + (kappa**2 * se**2 + taus**2) * hh)
        den = (seen * slope**2 * hh * shrink).sum((2, 3), keepdims=True)
        kappa = np.divide((seen * slope * hy * shrink).sum((2, 3), keepdims=True), den, out=np.ones_like(den),
                          where=den > 0)  # fmt: skip
    v = kappa**2 * se**2 + taus**2
    resid_sq = yy - 2 * kappa * slope * hy + kappa**2 * slope**2 * hh  # Σ (y - κ s h)² / var
    resid_h = hy - kappa * slope * hh  # Σ h (y - κ s h) / var
    quad = resid_sq - v * resid_h**2 / (1 + v * hh)
    nll = 0.5 * ((seen * (np.log1p(v * hh) + quad)).sum((2, 3)) + float(np.log(cells.var).sum()))  # (P, T)
    t = nll.argmin(1)
    rows = np.arange(P)
    return nll[rows, t], kappa[rows, t, 0, 0], np.broadcast_to(taus[0, :, 0, 0], (P, len(_TAU_GRID)))[rows, t]


def _fit_shapes(cells: Cells, slope: np.ndarray, se: np.ndarray, q: float) -> tuple[np.ndarray, float, float]:
    """(p per source, κ, τ) maximising the marginal likelihood.

    A source measured left out and at another factor has a shape of its own: how much more leaving it out
    costs than scaling it is a property of the source (random text, whose absence the model has never
    seen, saturates nothing like prose does). Every other source takes the median of those shapes, or,
    with none, the one shape that fits all cells best. Cells measured at one factor alone (a study of
    leave-one-out variants) cannot tell a shape from a scale, and cells without a source left out cannot say
    how the response ends at ``r = 0`` (x0.5 and x1.5 differ from a line by a few hundredths for every shape):
    the shape is then the run's own, ``q``."""
    S = slope.shape[0]

    def best(candidates_PS: np.ndarray) -> int:
        return int(np.argmin(_likelihood(cells, candidates_PS, slope, se)[0]))

    factors = set(cells.factor.tolist()) - {1.0}
    if 0.0 not in factors or len(factors) < 2:
        p_S = np.full(S, q)
    else:
        p_S = np.full(S, _P_GRID[best(np.repeat(_P_GRID[:, None], S, 1))])
        own = [a for a in range(S) if {0.0} < set(cells.factor[cells.source == a].tolist()) - {1.0}]
        for a in own:
            candidates = np.repeat(p_S[None, :], len(_P_GRID), 0)
            candidates[:, a] = _P_GRID
            p_S[a] = _P_GRID[best(candidates)]
        if own:
            p_S[[a for a in range(S) if a not in own]] = float(np.median(p_S[own]))
    _, kappa, tau = _likelihood(cells, p_S[None, :], slope, se)
    return p_S, float(kappa[0]), float(tau[0])


def fit(cells: Cells, slope: np.ndarray, se: np.ndarray, q: float) -> Fit:
    """The model fitted to ``cells``; ``slope`` and ``se`` (S, B) are the baseline's counterfactual, ``q`` its
    response shape (``saturation``)."""
    S, B = slope.shape
    offset = np.zeros(B)
    weight = 1 / cells.var
    total = np.bincount(cells.held, weight, B)
    for _ in range(_OFFSET_ROUNDS):  # the model given the offsets, then the offsets given the model
        shifted = Cells(cells.source, cells.held, cells.factor, cells.measured - offset[cells.held], cells.var,
                        cells.variant)  # fmt: skip
        p_S, kappa, tau = _fit_shapes(shifted, slope, se, q)
        sigma, sd = _posterior(*_sums(shifted, p_S, S, B), slope, se, kappa, tau)
        resid = cells.measured - response(cells.factor, p_S[cells.source]) * sigma[cells.source, cells.held]
        moved = np.divide(np.bincount(cells.held, weight * resid, B), total, out=np.zeros(B), where=total > 0)
        settled = np.abs(moved - offset).max() <= _OFFSET_TOLERANCE
        offset = moved
        if settled:
            break
    return Fit(p=p_S, kappa=kappa, tau=tau, offset=offset, sigma=sigma, sigma_sd=sd)


def cells_of(frame: pl.DataFrame, sources: list[str], held: list[str]) -> Cells | None:
    """The one-source variants' cells of ``correlation.compare_with_counterfactual``'s frame, or None when there
    is nothing to calibrate on (no such variant, or no seed noise: one baseline seed)."""
    frame = frame.filter(  # a diverged run's NaN, or a noise nobody measured, is no evidence
        pl.col("kind").is_in(SCALED)
        & pl.col("varied").is_in(sources)
        & pl.col("source").is_in(held)
        & pl.col("measured").is_finite()
        & pl.col("noise").is_finite()
        & (pl.col("noise") > 0)
    )
    if frame.is_empty():
        return None
    return Cells(
        source=np.array([sources.index(s) for s in frame["varied"]]),
        held=np.array([held.index(s) for s in frame["source"]]),
        factor=np.round(frame["factor"].to_numpy().astype(float), 9),  # 0.5000000000000001 from share ratios is 0.5
        measured=frame["measured"].to_numpy().astype(float),
        var=(frame["noise"].to_numpy().astype(float) / 2) ** 2,
        variant=frame["variant"].to_numpy(),
    )


def cross_validated(cells: Cells, slope: np.ndarray, se: np.ndarray, q: float) -> np.ndarray:
    """Each cell's prediction (with the baseline offset the other variants give) from a model fitted without
    its variant's runs; NaN where the rest cannot be fitted (a study of one variant)."""
    out = np.full(len(cells.measured), np.nan)
    for name in np.unique(cells.variant):
        held_out = cells.variant == name
        if held_out.all():
            continue
        model = fit(cells.take(~held_out), slope, se, q)
        c = cells.take(held_out)
        out[held_out] = model.predict(c.factor, c.source, c.held) + model.offset[c.held]
    return out


def calibrate(
    frame: pl.DataFrame, slope: np.ndarray, se: np.ndarray, sources: list[str], held_out: list[str], q: float
) -> tuple[dict, pl.DataFrame] | None:
    """The calibrated counterfactual (``calibrated.json``) and ``frame`` with its leave-one-variant-out
    prediction per cell (column ``calibrated``; null where not modelled); None when there is nothing to
    calibrate on. ``slope``/``se``: (S, B + 1) with the mean over the held-out sets last, as the run records
    them; ``held_out`` ends with "mean"; ``q``: the run's response shape (its ``saturation``)."""
    held = [h for h in held_out if h != "mean"]
    slope, se = np.asarray(slope, dtype=float)[:, : len(held)], np.asarray(se, dtype=float)[:, : len(held)]
    cells = cells_of(frame, sources, held)
    if cells is None or not (np.isfinite(slope).all() and np.isfinite(se).all()):  # a run's slopes that diverged
        return None
    model = fit(cells, slope, se, q)
    checked = cross_validated(cells, slope, se, q)
    key = {(v, h): i for i, (v, h) in enumerate(zip(cells.variant, (held[j] for j in cells.held)))}
    column = [
        float(checked[key[(v, s)]]) if (v, s) in key and np.isfinite(checked[key[(v, s)]]) else None
        for v, s in zip(frame["variant"], frame["source"])
    ]
    frame = frame.with_columns(calibrated=pl.Series(column, dtype=pl.Float64))
    compared = frame.filter(pl.col("calibrated").is_not_null()).with_columns(predicted=pl.col("calibrated"))
    by_kind = {
        kind: agreement(compared.filter(pl.col("kind") == kind))
        for kind in compared["kind"].unique(maintain_order=True)
    }
    predicted, interval = {}, {}
    for r in FACTORS:
        h = response(r, model.p)[:, None]  # (S, 1)
        value, half = h * model.sigma, 2 * np.abs(h) * model.sigma_sd
        mean = value.mean(1, keepdims=True)
        mean_half = np.sqrt((half**2).sum(1, keepdims=True)) / len(held)
        predicted[f"{r:g}"] = np.concatenate([value, mean], 1).tolist()
        interval[f"{r:g}"] = np.concatenate([half, mean_half], 1).tolist()
    record = {
        "sources": list(sources),
        "held_out": [*held, "mean"],
        "factors": list(FACTORS),
        "predicted": predicted,
        "interval": interval,
        "sigma": model.sigma.tolist(),
        "sigma_sd": model.sigma_sd.tolist(),
        "shape": model.p.tolist(),
        "shape_at_edge": [s for s, p in zip(sources, model.p) if p in (_P_GRID[0], _P_GRID[-1])],
        "kappa": model.kappa,
        "tau": model.tau,
        "offset": dict(zip(held, model.offset.tolist())),
        "variants": int(len(np.unique(cells.variant))),
        "check": {**agreement(compared), "by_kind": by_kind if len(by_kind) > 1 else {}},
    }
    return record, frame


def check_text(record: dict) -> str:
    """The calibrated counterfactual's leave-one-variant-out check and its parameters, in a few lines."""
    # here, not at the top: the report package brings matplotlib, which `winnow check` of a study never needs
    from winnow.pipelines.report.counterfactual import offsets_text, shapes_text

    check = record["check"]
    kappa = record["kappa"]
    lines = [
        f"Calibrated on this study ({record['variants']} variants; each predicted by a fit without its own runs): "
        f"signs agree on {check['sign_agree']} of the {above_noise_text(check)}, sizes within a factor 2 on "
        f"{check['within_2x']}/{check['above_noise']}; Spearman {rho_text(check['spearman'])} over all "
        f"{check['n_cells']} cells",
    ]
    lines += [f"  {figures_text(kind, part)}" for kind, part in check["by_kind"].items()]
    if kappa > 0:
        scale = f"{1 / kappa:.2g}x the measured sizes"
    else:
        scale = "of the opposite sign to the measured effects" if kappa < 0 else "unrelated to the measured effects"
    edge = record.get("shape_at_edge") or []
    lines.append(
        f"  the response (r^p - 1)/p with p = {shapes_text(record)}"
        + (f" ({', '.join(edge)} at the edge of the range searched, 0.002 to 3)" if edge else "")
        + f"; the run's slopes are {scale} (κ = {kappa:.2f}, spread τ = {record['tau']:.3g}); the baseline seeds' "
        f"offset in every measured delta: {offsets_text(record)}"
    )
    return "\n".join(lines)
