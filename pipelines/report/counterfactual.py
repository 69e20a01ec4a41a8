"""The counterfactual in words: what leaving a source out, or scaling its share, is predicted to do.

Reads the ``{"step", "counterfactual"}`` record (``train/attribution/counterfactual.py``) and turns it
into the sentences the report page and the terminal lead with, sorted by size: "Leaving out `docs`
would raise held-out loss on `code` by 0.12 ± 0.03 nats: it helps", and "can't tell" where the
interval holds 0. Where a study measured the same change, the measurement goes beside the prediction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Real

import numpy as np

MEAN = "mean"  # the column averaging the held-out sets


@dataclass(slots=True)
class Counterfactual:
    """Predicted change of held-out loss (nats) per (training source, held-out set) for each share factor."""

    step: int
    sources: list[str]  # training sources (rows)
    held_out: list[str]  # held-out sets (columns), "mean" last
    factors: list[float]
    predicted: dict[float, np.ndarray]  # factor -> (S, B) nats
    interval: dict[float, np.ndarray]  # factor -> (S, B) half-widths (two standard errors)
    steps: tuple[int, int] | None = None
    saturation: float | None = None
    horizon: float | None = None
    slope: np.ndarray | None = None  # (S, B): held-out loss by ln(share), nats
    slope_se: np.ndarray | None = None
    measured: dict[tuple[str, float], dict[str, tuple[float, float]]] = field(default_factory=dict)
    # (source, factor) -> {held-out set: (measured change, its noise)}, from a study
    calibrated: dict | None = None  # calibrated on a study (calibrated.json): its parameters and check

    def cell(self, factor: float, source: str, held_out: str) -> tuple[float, float]:
        i, j = self.sources.index(source), self.held_out.index(held_out)
        return float(self.predicted[factor][i, j]), float(self.interval[factor][i, j])


def step_span(x: object) -> tuple[int, int] | None:
    """A record's ``steps`` (the first and last step it covers), or None when it is not two integers."""
    if isinstance(x, list) and len(x) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in x):
        return x[0], x[1]
    return None


def parse(record: dict) -> Counterfactual | None:
    """A ``counterfactual`` record, or None when it is not one this report can read."""
    value = record.get("counterfactual")
    if not isinstance(value, dict):
        return None
    try:
        sources, held_out = list(value["sources"]), list(value["held_out"])
        predicted = {float(k): np.asarray(v, dtype=float) for k, v in value["predicted"].items()}
        interval = {float(k): np.asarray(v, dtype=float) for k, v in value["interval"].items()}
    except (KeyError, TypeError, ValueError):
        return None
    shape = (len(sources), len(held_out))
    if any(m.shape != shape for m in (*predicted.values(), *interval.values())) or predicted.keys() != interval.keys():
        return None
    steps = value.get("steps")
    return Counterfactual(
        step=int(record.get("step", 0)),
        sources=sources,
        held_out=held_out,
        factors=sorted(predicted),
        predicted=predicted,
        interval=interval,
        steps=step_span(steps),
        saturation=value.get("saturation"),
        horizon=value.get("horizon"),
        slope=_matrix(value.get("slope"), shape),
        slope_se=_matrix(value.get("slope_se"), shape),
        calibrated=value if _is_calibrated(value, len(sources)) else None,
    )


_CHECK_COUNTS = ("n_cells", "above_noise", "sign_agree", "within_2x")


def _is_calibrated(value: dict, n_sources: int) -> bool:
    """Whether a record holds what ``calibrate.py`` writes beside its predictions: the check and the fit."""
    check, offset, shape = value.get("check"), value.get("offset"), value.get("shape")

    def number(x) -> bool:
        return isinstance(x, Real) and not isinstance(x, bool) and math.isfinite(x)

    return (
        isinstance(value.get("variants"), int)
        and isinstance(check, dict)
        and all(isinstance(check.get(k), int) for k in _CHECK_COUNTS)
        and (check.get("spearman") is None or number(check.get("spearman")))
        and isinstance(check.get("by_kind", {}), dict)
        and isinstance(offset, dict)
        and all(number(v) for v in offset.values())
        and (number(shape) or (isinstance(shape, list) and len(shape) == n_sources and all(number(v) for v in shape)))
        and number(value.get("kappa"))
        and number(value.get("tau"))
    )


def shapes_text(record: dict) -> str:
    """A calibrated record's response shape, ``0.50`` (one for the study), or ``code 0.45, docs 0.60`` (one per
    source, as studies calibrated by earlier versions of winnow hold)."""
    shape = record["shape"]
    if not isinstance(shape, list):
        return f"{shape:.2f}"
    return ", ".join(f"{s} {p:.2f}" for s, p in zip(record["sources"], shape))


def curvatures_text(record: dict) -> str:
    """A calibrated record's mixing-law curvature per held-out set, ``code +3.9, docs +0.6`` (per nat)."""
    return ", ".join(f"{k} {v:+.1f}" for k, v in record.get("curvature", {}).items()) or "none recorded"


def offsets_text(record: dict) -> str:
    """A calibrated record's baseline offset per held-out set, ``code -0.033, docs -0.008`` (nats)."""
    return ", ".join(f"{k} {v:+.3f}" for k, v in record["offset"].items())


def calibrated_record(value: dict) -> Counterfactual | None:
    """A study's ``calibrated.json`` as a counterfactual, or None when it is not what ``calibrate.py`` writes."""
    cf = parse({"counterfactual": value})
    if cf is None or cf.calibrated is None:
        return None
    finite = all(np.isfinite(m).all() for m in (*cf.predicted.values(), *cf.interval.values()))
    return cf if finite else None


def lead(run_cf: Counterfactual | None, study) -> Counterfactual | None:
    """The counterfactual a page or terminal leads with: a study's calibrated one when it has one, else the run's;
    either with the study's measurements beside its predictions."""
    calibrated = calibrated_record(study.calibrated) if study is not None and study.calibrated else None
    cf = calibrated or run_cf
    if cf is not None and study is not None and study.cells is not None:
        attach_measured(cf, study.cells, study.effects)
    return cf


def _matrix(value, shape: tuple[int, int]) -> np.ndarray | None:
    try:
        found = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        return None
    return found if found.shape == shape else None


def _verb(factor: float) -> str:
    if factor == 0:
        return "Leaving out"
    if factor == 2:
        return "Doubling"
    if factor == 0.5:
        return "Halving"
    return f"Scaling by {factor:g} the share of"


def _where(held_out: str) -> str:
    return "on the mean of the held-out sets" if held_out == "mean" else f"on `{held_out}`"


def _nats(x: float, decimals: int = 3) -> str:
    """``decimals`` decimals, or below a thousandth ``decimals - 1`` significant digits (a verdict on
    "0.000 ± 0.000" reads as noise)."""
    return f"{x:.{decimals}f}" if x == 0 or abs(x) >= 5e-4 else f"{x:.{decimals - 2}e}"


def _verdict_size(value: float, half: float) -> str:
    """``|value| ± half`` for a verdict (``|value| > half``): with as many decimals as it takes, up to six, for the
    printed interval to leave out 0 as the verdict's does ("0.004 ± 0.004" would read as can't tell)."""
    decimals = 3
    while decimals < 6 and float(_nats(abs(value), decimals)) <= float(_nats(half, decimals)):
        decimals += 1
    return f"{_nats(abs(value), decimals)} ± {_nats(half, decimals)} nats"


def sentence(cf: Counterfactual, factor: float, source: str, held_out: str) -> str:
    """One prediction in words: its direction, size and interval, and what it says about the source."""
    value, half = cf.cell(factor, source, held_out)
    subject = f"{_verb(factor)} `{source}`"
    if value == 0 and half == 0:  # no gradient of it in the attributed steps: nothing of it to scale
        return f"{subject}: nothing to predict {_where(held_out)} (`{source}` gave no training tokens in the attributed steps)"
    if abs(value) <= half:
        text = f"{subject}: can't tell {_where(held_out)} ({'+' if value >= 0 else '-'}{_nats(abs(value))} ± {_nats(half)} nats)"
    else:
        direction = "raise" if value > 0 else "lower"
        # less of the source and a higher loss (or more of it and a lower one): the source helps
        helps = (value > 0) == (factor < 1)
        size = _verdict_size(value, half)
        text = f"{subject} would {direction} held-out loss {_where(held_out)} by {size}: it {'helps' if helps else 'hurts'}"
    found = cf.measured.get((source, factor), {}).get(held_out)
    if found is not None:
        text += f" (measured: {found[0]:+.3f} ± {found[1]:.3f})"
    return text


def sentences(cf: Counterfactual, *, factors: tuple[float, ...] = (0.0, 2.0)) -> list[tuple[str, list[str]]]:
    """Per held-out set, the mean first: leaving each source out, largest first; for the mean also the other
    ``factors`` the record has (doubling, by default)."""
    order = ["mean", *[h for h in cf.held_out if h != "mean"]]
    out = []
    for held_out in order:
        if held_out not in cf.held_out:
            continue
        chosen = [f for f in (factors if held_out == "mean" else factors[:1]) if f in cf.predicted] or cf.factors[:1]
        items = [(abs(cf.cell(f, s, held_out)[0]), f, s) for f in chosen for s in cf.sources]
        items.sort(key=lambda item: (chosen.index(item[1]), -item[0]))
        out.append((held_out, [sentence(cf, f, s, held_out) for _, f, s in items]))
    return out


def text(cf: Counterfactual) -> str:
    """The terminal's lead: the sentences per held-out set."""
    steps = f"steps {cf.steps[0]}-{cf.steps[1]}" if cf.steps else f"step {cf.step}"
    basis = (
        f"calibrated on the study's {cf.calibrated['variants']} variants; ± two posterior standard deviations"
        if cf.calibrated
        else f"counterfactual at {steps}; ± two standard errors"
    )
    lines = [f"What a change of the mix would do ({basis}; predicted change of each held-out loss, nats):"]
    if cf.calibrated and cf.measured:
        lines.append(
            "  (a measurement holds the baseline seeds' own offset, which a prediction leaves out: "
            f"{offsets_text(cf.calibrated)})"
        )
    for held_out, said in sentences(cf):
        lines.append(f"  {'mean over the held-out sets' if held_out == 'mean' else held_out}:")
        lines += [f"    {s}" for s in said]
    return "\n".join(lines)


def attach_measured(cf: Counterfactual, cells, effects=None) -> None:
    """Put a study's measurements (``attribution_vs_ablation.csv``: one row per variant and held-out set) beside
    the predictions they test: each variant that scaled one source by one of the record's factors. The mean over
    the held-out sets is the study's own (``effects.csv``: its noise from the seeds' mean losses, as the effects
    table gives it) where ``effects`` has the variant, else the cells' mean with their noises as independent."""
    variant_of = {}
    for row in cells.iter_rows(named=True):
        varied, factor = row.get("varied"), row.get("factor")
        if varied is None or factor is None:
            continue
        match = next((f for f in cf.factors if abs(f - factor) < 1e-6), None)
        if match is None or varied not in cf.sources or row["source"] not in cf.held_out:
            continue
        cf.measured.setdefault((varied, match), {})[row["source"]] = (float(row["measured"]), float(row["noise"]))
        variant_of[(varied, match)] = row.get("variant")
    own = {}
    if effects is not None and {"variant", "mean_delta", "mean_noise"} <= set(effects.columns):
        own = {r["variant"]: (r["mean_delta"], r["mean_noise"]) for r in effects.iter_rows(named=True)}
    sets = [h for h in cf.held_out if h != MEAN]
    for key, found in cf.measured.items():
        if MEAN not in cf.held_out or not all(h in found for h in sets):
            continue
        delta, noise = own.get(variant_of.get(key), (None, None))
        if delta is not None and noise is not None:
            found[MEAN] = (float(delta), float(noise))
        else:
            values = np.array([found[h] for h in sets])
            found[MEAN] = (float(values[:, 0].mean()), float(np.sqrt((values[:, 1] ** 2).sum()) / len(sets)))
