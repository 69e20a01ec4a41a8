"""The counterfactual: what scaling one training source's share by ``r`` would do to each held-out loss.

The decomposition (``estimator.py``) says where a run's held-out change came from; its cells add
up, and they are large where sources pull against each other. It does not say what another mix
would do: without source ``a`` the others' steps grow to fill the gap (Adam is blind to the
gradient's scale), and the run would have relaxed back from pushes it no longer gets. The
counterfactual answers that question directly:

* ``slope[a][b]``: the derivative of held-out loss ``b`` at the end of the run by ``ln`` of source
  ``a``'s share (the others renormalised), read as ``⟨h_b, Σ_t w_t · dΔθ_t/dε_a⟩``: the held-out
  gradient at the end, and each step's derivative by the share (``split.py``: first and second
  moment) with a weight that decays with the learning rate spent since (``horizon``);
* a prediction for a factor ``r``: ``(r^q - 1)/q · slope`` (``q = saturation``; ``r = 0`` leaves the
  source out: ``-slope/q``, a loss that responds more to losing a source than a line through the
  slope says);
* its interval: two standard errors, from the held-out rows' draw (the probe in groups) and the
  training batches' draw (the sum over the odd steps against the sum over the even ones).

Shape legend: S training sources, B held-out sets, G probe groups per held-out set.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

GROUPS = 4  # the probe's rows per held-out set in this many groups: their spread is the probe's error
MEAN = "mean"  # the column averaging the held-out sets


def response(r: float, q: float) -> float:
    """The predicted change for share factor ``r`` in units of the slope: ``(r^q - 1)/q`` (``ln r`` as q → 0)."""
    return (r**q - 1) / q


def slope_and_error(
    dots_HSBG: np.ndarray, groups_BG: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(slope, standard error, the probe's part of it), each (S, B).

    ``dots_HSBG``: ⟨each source's weighted share derivative summed over the odd (h = 0) and the even (h = 1)
    steps, each held-out group's loss gradient⟩. The slope is the sum over the halves and the mean over the
    groups (``groups_BG``: which hold rows; a held-out set with fewer rows than groups uses those it has). Its
    error has two parts: the groups' spread (the held-out rows' draw), and the halves' difference (the
    training batches' draw: two independent halves of the sum differ by about one standard error of it)."""
    _, S, B, G = dots_HSBG.shape
    has = np.ones((B, G), dtype=bool) if groups_BG is None else np.asarray(groups_BG, dtype=bool)
    n = has.sum(1)  # (B,)

    def group_mean(x_SBG: np.ndarray) -> np.ndarray:
        return np.where(has, x_SBG, 0.0).sum(-1) / np.maximum(n, 1)

    whole = dots_HSBG.sum(0)
    slope = group_mean(whole)
    spread = np.where(has, (whole - slope[..., None]) ** 2, 0.0).sum(-1) / np.maximum(n - 1, 1)
    probe = np.where(n > 1, np.sqrt(spread / np.maximum(n, 1)), 0.0)
    batches = np.abs(group_mean(dots_HSBG[0] - dots_HSBG[1]))
    return slope, np.sqrt(probe**2 + batches**2), probe


def with_mean(values_SB: np.ndarray, errors_SB: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (S, B + 1) slope and error with the mean over the held-out sets appended (errors as independent)."""
    B = values_SB.shape[1]
    mean = values_SB.mean(1, keepdims=True)
    err = np.sqrt((errors_SB**2).sum(1, keepdims=True)) / B
    return np.concatenate([values_SB, mean], 1), np.concatenate([errors_SB, err], 1)


def record(
    *,
    sources: list[str],
    held_out: list[str],
    slope_SB: np.ndarray,
    error_SB: np.ndarray,
    factors: Sequence[float],
    saturation: float,
    steps: tuple[int, int],
    horizon: float,
    rows: int,
    probe_error_SB: np.ndarray | None = None,
) -> dict:
    """The ``counterfactual`` object of ``metrics.jsonl`` (see docs/design.md)."""
    slope, error = with_mean(slope_SB, error_SB)
    predicted, interval = {}, {}
    for r in factors:
        f = response(float(r), saturation)
        predicted[f"{float(r):g}"] = (f * slope).tolist()
        interval[f"{float(r):g}"] = (2 * abs(f) * error).tolist()
    out = {
        "sources": list(sources),
        "held_out": [*held_out, MEAN],
        "slope": slope.tolist(),
        "slope_se": error.tolist(),
        "factors": [float(f) for f in factors],
        "predicted": predicted,
        "interval": interval,
        "saturation": saturation,
        "horizon": horizon,
        "probe_rows": rows,
        "steps": list(steps),
    }
    if probe_error_SB is not None:
        out["slope_se_probe"] = probe_error_SB.tolist()
    return out


def read_record(run: str, storage_options: dict | None = None) -> dict | None:
    """The last counterfactual record in a run folder's ``metrics.jsonl`` (local or fsspec), or None."""
    import json

    import fsspec

    path = f"{str(run).rstrip('/')}/metrics.jsonl"
    try:
        with fsspec.open(path, "rt", **(storage_options or {})) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return None
    for line in reversed(lines):
        if '"counterfactual"' in line:
            try:
                return json.loads(line)["counterfactual"]
            except (json.JSONDecodeError, KeyError):
                continue
    return None
