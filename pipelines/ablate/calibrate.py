"""The counterfactual calibrated on a study: the baseline run's slopes as the prior, the measured variants as data.

A run's counterfactual (``train/attribution/counterfactual.py``) predicts what scaling training source
``a``'s share by ``r`` does to held-out loss ``b`` from one derivative, ``slope[a][b]``, and one response
shape. A study measures some of those changes (leave-one-out, shares x0.5 / x1.5). This module puts the
two together in a mixing law per held-out set (after Ye et al. 2024, "Data Mixing Laws": a loss is an
exponential of a linear function of the mix), fitted to every one-source variant at once:

    measured[v, b] = offset[b] + (exp(λ[b] · u[v, b]) - 1) / λ[b] + noise
    u[v, b] = Σ_j g[j, b] · s_j · h_p(s'_j / s_j)        h_p(x) = (x^p - 1) / p
    g[j, b] ~ Normal(κ · slope[j, b] / s_j, κ² · (slope_se[j, b] / s_j)² + τ²)        λ[b] ≥ 0, ~ Normal(0, 3²)

* ``s_j``, ``s'_j``: source ``j``'s share in the baseline and in variant ``v``. Every variant moves every
  share (the others are renormalised), so each held-out set's law links all variants: leaving a prose source
  out raises the share of random text, and the law charges that to random text's ``g``, learnt from its own
  variants too;
* ``g[j, b]``: the loss's slope by share ratio, per unit of share. At the baseline the slope by ``ln`` of
  ``a``'s share is ``s_a · (g[a, b] - Σ_j s_j g[j, b])``: the run's ``slope[a][b]`` (with Σ_j s_j g[j, b] = 0),
  which is where the prior comes from;
* ``p``: how share ratios bend (``p`` < 1: losing a source costs more than a line through x0.5 and x1.5 says),
  one for the study, the value of ``_P_GRID`` that fits the measurements best. A study with no source left
  out, or with one factor only, cannot tell a shape from a scale: it keeps the run's own (``saturation``);
* ``λ[b]``: the law's curvature: 0 is linear in ``u``; above 0 the loss has a floor ``1/λ`` below the
  baseline's (the law's ``c`` + ``k · exp(t · s)`` with ``k`` > 0) and rises faster than it falls. A curvature
  below 0 would let a loss fall ever faster as a share moves, without end: it is not allowed;
* ``κ``, ``τ``: the run's slopes' scale against the measured ones, fitted from all cells, and the prior's
  spread, the root mean square of the fitted ``g`` (a prior as wide as the slopes themselves: where a study
  measured a cell its runs carry it, where it did not the run's direction does);
* ``offset[b]``: where the baseline's seeds sit against the law. Every variant's delta on ``b`` is taken
  against the same baseline mean, so that mean's error is shared by all of them; the fit estimates it, and it
  is never part of a prediction of what a mix would do;
* ``noise``: each measured delta's own error (``compare.seed_noise``, two standard errors).

Each held-out set's law is fitted by maximum a posteriori (Levenberg-Marquardt; a few starting curvatures,
the best kept), its parameters' covariance the inverse Gauss-Newton Hessian there. A prediction for a factor
``r`` is the law at that variant's shares without the offset, with an interval of two posterior standard
deviations (the delta method); the mean over the held-out sets is the mean of the predictions.

The check is leave-one-variant-out: every variant's cells are predicted by the law fitted without that
variant's runs (``p``, ``κ``, ``τ`` and every held-out set's parameters refitted), then compared with the
measurement as ``correlation.py`` compares the run's own counterfactual (signs and factor 2 above the noise,
Spearman over all cells). As the measurement holds its baseline's offset, the compared value is the
prediction plus the offset the other variants place the baseline at. Only variants that scale one source are
modelled: a random mix's shares are not in the frame this module reads.

Shape legend: S training sources, B held-out sets, N measured cells, K = S + 2 parameters per held-out set.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from winnow.pipelines.ablate.correlation import above_noise_text, agreement, figures_text, rho_text

FACTORS = (0.0, 0.5, 1.5, 2.0)  # the predictions calibrated.json holds: left out, halved, x1.5, doubled
SCALED = ("leave_one_out", "weights")  # the variants that scale one source's share
_P_GRID = (0.1, 0.25, 0.5, 0.75, 1.0, 1.5)  # the share ratio's shape: from strong saturation to none and beyond
_CURVATURE_SD = 3.0  # λ's prior (per nat, λ ≥ 0): a floor a third of a nat or more below the baseline
_OFFSET_SD = 1.0  # nats: the baseline's offset is free within any plausible range
_STARTS = (0.0, 5.0, 20.0)  # starting curvatures (per nat): the objective is not convex in λ
_ROUNDS = 12  # alternations between the laws and the prior's κ and τ at most
_SETTLED = 0.01  # κ has settled when a round moves it by less than this fraction
_STEPS = 200  # Levenberg-Marquardt iterations at most


def response(r, p: float) -> np.ndarray:
    """``h_p(r) = (r^p - 1) / p``: 0 at ``r = 1``, slope 1 there, ``-1/p`` at ``r = 0``."""
    return (np.asarray(r, dtype=float) ** p - 1) / p


def scaled_shares(base: np.ndarray, source: np.ndarray, factor: np.ndarray) -> np.ndarray:
    """(N, S) every share when source ``source[n]``'s weight is scaled by ``factor[n]``, the others renormalised."""
    den = 1 - base[source] + factor * base[source]
    shares = base[None, :] / den[:, None]
    shares[np.arange(len(source)), source] = factor * base[source] / den
    return shares


def features(shares: np.ndarray, base: np.ndarray, p: float) -> np.ndarray:
    """(N, S) ``s_j · h_p(s'_j / s_j)``: each share's change, bent by ``p``, in units of share."""
    return base * response(shares / base, p)


def _law(lam: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(exp(λu) - 1)/λ`` and its derivatives by ``u`` and by ``λ`` (their series where λu is near 0)."""
    z = np.clip(lam * u, -60.0, 60.0)
    small = np.abs(z) < 1e-6
    safe = np.where(small, 1.0, lam)
    value = np.where(small, u + lam * u * u / 2, np.expm1(z) / safe)
    by_lam = np.where(small, u * u / 2 + lam * u**3 / 3, (z * np.exp(z) - np.expm1(z)) / safe**2)
    return value, np.exp(z), by_lam


def _residuals(theta, X, y, sd, mu, psi) -> tuple[np.ndarray, np.ndarray]:
    """The standardised residuals (data, then priors) of one held-out set's law and their Jacobian (·, K)."""
    N, S = X.shape
    g, lam, off = theta[:S], theta[S], theta[S + 1]
    value, by_u, by_lam = _law(lam, X @ g)
    r = np.concatenate([(off + value - y) / sd, (g - mu) / psi, [lam / _CURVATURE_SD, off / _OFFSET_SD]])
    J = np.zeros((N + S + 2, S + 2))
    J[:N, :S] = by_u[:, None] * X / sd[:, None]
    J[:N, S] = by_lam / sd
    J[:N, S + 1] = 1 / sd
    J[N : N + S, :S] = np.diag(1 / psi)
    J[N + S, S] = 1 / _CURVATURE_SD
    J[N + S + 1, S + 1] = 1 / _OFFSET_SD
    return r, J


def _solve(X, y, sd, mu, psi, starts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, float]:
    """(θ = [g (S), λ, offset], its covariance (K, K), χ² of the data) at the posterior's mode, by
    Levenberg-Marquardt from each of ``starts``; the lowest objective wins."""
    best = None
    for theta in starts:
        r, J = _residuals(theta, X, y, sd, mu, psi)
        cost, damp = r @ r, 1e-3
        for _ in range(_STEPS):
            A = J.T @ J
            moved = theta + np.linalg.solve(A + damp * np.diag(np.diag(A)), -J.T @ r)
            moved[-2] = max(moved[-2], 0.0)  # λ ≥ 0: a loss with a floor, 1/λ below the baseline's
            r2, J2 = _residuals(moved, X, y, sd, mu, psi)
            if (cost2 := r2 @ r2) < cost:
                settled = cost - cost2 <= 1e-10 * (1 + cost)
                theta, r, J, cost, damp = moved, r2, J2, cost2, max(damp / 3, 1e-9)
                if settled:
                    break
            elif (damp := damp * 4) > 1e8:
                break
        if best is None or cost < best[1]:
            best = theta, cost, J, r
    theta, _, J, r = best
    return theta, np.linalg.pinv(J.T @ J), float(r[: len(y)] @ r[: len(y)])


@dataclass(frozen=True, slots=True)
class Cells:
    """The measured cells of the study's one-source variants, as arrays (N,) and the variants' shares (N, S)."""

    source: np.ndarray  # index of the scaled source in the run's sources
    held: np.ndarray  # index of the held-out set
    factor: np.ndarray  # r
    measured: np.ndarray  # nats
    var: np.ndarray  # the measured delta's variance: (noise / 2)²
    variant: np.ndarray  # the variant's name
    shares: np.ndarray  # (N, S) the variant's shares

    def take(self, keep: np.ndarray) -> Cells:
        return Cells(*(getattr(self, f)[keep] for f in self.__slots__))


@dataclass(frozen=True, slots=True)
class Fit:
    """A fitted law per held-out set: its parameters (B, K) and their covariance (B, K, K)."""

    p: float
    kappa: float
    tau: float
    base: np.ndarray  # (S,) the baseline's shares
    theta: np.ndarray  # (B, K): g (S), λ, offset
    cov: np.ndarray  # (B, K, K)
    chi2: float  # of the measured cells

    @property
    def offset(self) -> np.ndarray:
        return self.theta[:, -1]

    @property
    def curvature(self) -> np.ndarray:
        return self.theta[:, -2]

    def predict(self, shares: np.ndarray, held: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(change, posterior sd), each (N,), of held-out sets ``held`` under ``shares`` (N, S); no offset."""
        S = len(self.base)
        X = features(shares, self.base, self.p)
        theta = self.theta[held]
        value, by_u, by_lam = _law(theta[:, S], (X * theta[:, :S]).sum(1))
        grad = np.concatenate([by_u[:, None] * X, by_lam[:, None], np.zeros((len(value), 1))], 1)
        return value, np.sqrt(np.maximum(np.einsum("ni,nij,nj->n", grad, self.cov[held], grad), 0))

    def slopes(self) -> tuple[np.ndarray, np.ndarray]:
        """(S, B) the calibrated slope by ``ln`` of each source's share at the baseline, as the run's, and its sd:
        ``s_a · (g[a] - Σ_j s_j g[j])``."""
        S = len(self.base)
        C = np.diag(self.base) - np.outer(self.base, self.base)  # (S, S): row a is s_a (e_a - s)
        value = C @ self.theta[:, :S].T
        var = np.einsum("ai,bij,aj->ab", C, self.cov[:, :S, :S], C)
        return value, np.sqrt(np.maximum(var, 0))


def _fit_shape(cells: Cells, slope, se, base, p: float, prior: bool) -> Fit:
    """Each held-out set's law for shape ``p``, alternating with the prior's κ and τ (``prior`` False: none)."""
    S, B = slope.shape
    X = features(cells.shares, base, p)
    m, m_se = slope / base[:, None], se / base[:, None]  # the run's slopes per unit of share
    kappa, g, theta = 1.0, m, None
    for _ in range(_ROUNDS if prior else 1):
        tau = float(np.sqrt(np.mean(g**2))) or 1.0
        psi = np.sqrt(kappa**2 * m_se**2 + tau**2) if prior else np.full((S, B), 1e6)
        mu = kappa * m if prior else m
        solved = []
        for b in range(B):
            k = cells.held == b
            # the first round tries each starting curvature; later ones start where the last ended, and afresh
            starts = [np.concatenate([mu[:, b], [lam, 0.0]]) for lam in (_STARTS if theta is None else _STARTS[:1])]
            starts += [] if theta is None else [theta[b]]
            solved.append(_solve(X[k], cells.measured[k], np.sqrt(cells.var[k]), mu[:, b], psi[:, b], starts))
        theta = np.array([s[0] for s in solved])
        g = theta[:, :S].T
        w = 1 / psi**2
        den = float((w * m * m).sum())
        moved = float((w * g * m).sum()) / den if den > 0 else 0.0
        settled = abs(moved - kappa) <= _SETTLED * abs(kappa)
        kappa = moved
        if settled:
            break
    cov = np.array([s[1] for s in solved])
    return Fit(p, kappa, tau if prior else float("inf"), base, theta, cov, sum(s[2] for s in solved))


def fit(cells: Cells, slope: np.ndarray, se: np.ndarray, base: np.ndarray, q: float, prior: bool = True) -> Fit:
    """The laws fitted to ``cells``; ``slope`` and ``se`` (S, B) are the baseline's counterfactual, ``base`` its
    shares, ``q`` its response shape (``saturation``), kept where the study cannot tell a shape from a scale."""
    factors = set(cells.factor.tolist()) - {1.0}
    grid = _P_GRID if 0.0 in factors and len(factors) >= 2 else (q,)
    return min((_fit_shape(cells, slope, se, base, p, prior) for p in grid), key=lambda f: f.chi2)


def base_shares(base: dict[str, float], sources: list[str]) -> np.ndarray | None:
    """(S,) the baseline's shares of ``sources`` from its weights, or None when one of them has no weight."""
    share = np.array([float(base.get(s, 0.0)) for s in sources])
    return share / share.sum() if (share > 0).all() else None


def cells_of(frame: pl.DataFrame, sources: list[str], held: list[str], base: np.ndarray) -> Cells | None:
    """The one-source variants' cells of ``correlation.compare_with_counterfactual``'s frame (``base``: the
    baseline's shares of ``sources``), or None when there is nothing to calibrate on (no such variant, or no
    seed noise: one baseline seed)."""
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
    source = np.array([sources.index(s) for s in frame["varied"]])
    factor = np.round(frame["factor"].to_numpy().astype(float), 9)  # 0.5000000000000001 from share ratios is 0.5
    return Cells(
        source=source,
        held=np.array([held.index(s) for s in frame["source"]]),
        factor=factor,
        measured=frame["measured"].to_numpy().astype(float),
        var=(frame["noise"].to_numpy().astype(float) / 2) ** 2,
        variant=frame["variant"].to_numpy(),
        shares=scaled_shares(base, source, factor),
    )


def cross_validated(
    cells: Cells, slope: np.ndarray, se: np.ndarray, base: np.ndarray, q: float, prior: bool = True
) -> np.ndarray:
    """Each cell's prediction (with the baseline offset the other variants give) from the laws fitted without
    its variant's runs; NaN where the rest cannot be fitted (a study of one variant)."""
    out = np.full(len(cells.measured), np.nan)
    for name in np.unique(cells.variant):
        held_out = cells.variant == name
        if held_out.all():
            continue
        model = fit(cells.take(~held_out), slope, se, base, q, prior)
        c = cells.take(held_out)
        out[held_out] = model.predict(c.shares, c.held)[0] + model.offset[c.held]
    return out


def calibrate(
    frame: pl.DataFrame,
    slope: np.ndarray,
    se: np.ndarray,
    sources: list[str],
    held_out: list[str],
    q: float,
    base: dict[str, float],
) -> tuple[dict, pl.DataFrame] | None:
    """The calibrated counterfactual (``calibrated.json``) and ``frame`` with its leave-one-variant-out
    prediction per cell (column ``calibrated``; null where not modelled); None when there is nothing to
    calibrate on. ``slope``/``se``: (S, B + 1) with the mean over the held-out sets last, as the run records
    them; ``held_out`` ends with "mean"; ``q``: the run's response shape (its ``saturation``); ``base``: the
    baseline's weights by source."""
    held = [h for h in held_out if h != "mean"]
    slope, se = np.asarray(slope, dtype=float)[:, : len(held)], np.asarray(se, dtype=float)[:, : len(held)]
    share = base_shares(base, sources)
    if share is None or not (np.isfinite(slope).all() and np.isfinite(se).all()):
        return None  # a source the baseline never trained on, or a run's slopes that diverged
    cells = cells_of(frame, sources, held, share)
    if cells is None:
        return None
    model = fit(cells, slope, se, share, q)
    checked = cross_validated(cells, slope, se, share, q)
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
    S, B = slope.shape
    predicted, interval = {}, {}
    source, held_index = np.repeat(np.arange(S), B), np.tile(np.arange(B), S)  # every cell, (S · B,)
    for r in FACTORS:
        value, sd = model.predict(scaled_shares(share, source, np.full(S * B, r)), held_index)
        value, half = value.reshape(S, B), 2 * sd.reshape(S, B)
        mean = value.mean(1, keepdims=True)
        mean_half = np.sqrt((half**2).sum(1, keepdims=True)) / B  # each held-out set's law is fitted on its own
        predicted[f"{r:g}"] = np.concatenate([value, mean], 1).tolist()
        interval[f"{r:g}"] = np.concatenate([half, mean_half], 1).tolist()
    sigma, sigma_sd = model.slopes()
    record = {
        "sources": list(sources),
        "held_out": [*held, "mean"],
        "factors": list(FACTORS),
        "predicted": predicted,
        "interval": interval,
        "sigma": sigma.tolist(),
        "sigma_sd": sigma_sd.tolist(),
        "shape": model.p,
        "shape_at_edge": model.p in (_P_GRID[0], _P_GRID[-1]),
        "curvature": dict(zip(held, model.curvature.tolist())),
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
    from winnow.pipelines.report.counterfactual import curvatures_text, offsets_text, shapes_text

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
    lines.append(
        f"  a mixing law per held-out set, share ratios bent by p = {shapes_text(record)}"
        + (" (at the edge of the shapes tried, 0.1 to 1.5)" if record.get("shape_at_edge") else "")
        + f", curvature {curvatures_text(record)}; the run's slopes are {scale} (κ = {kappa:.2f}, spread "
        f"τ = {record['tau']:.3g} per unit of share); the baseline seeds' offset in every measured delta: "
        f"{offsets_text(record)}"
    )
    return "\n".join(lines)
