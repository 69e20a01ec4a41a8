"""Forgetting and gain of a continued run, per source, and whether each held-out loss has flattened.

A run started with ``[train] init_from`` evaluates at step 0, before any update (``Trainer.fit``),
so for every held-out source the change from that first evaluation to the last one is what the
continued training did to it: a rise is forgetting (an old source the run no longer sees enough
of), a fall is gain (the new domain, or transfer). The flattening slope is a least-squares line
through the last few evaluations with a 95% t interval: an interval that holds 0 means the source
no longer measurably pays for more steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from winnow.pipelines.report import plots
from winnow.pipelines.report.training import TrainingRun

# two-sided 95% Student t quantiles for 1..30 degrees of freedom; the normal one beyond
_T975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)
SLOPE_PER = 100  # slopes are in nats per this many steps


@dataclass(slots=True)
class SourceChange:
    """One held-out source of a continued run: loss at step 0 and now, and its recent slope."""

    source: str
    start: float
    now: float
    trained_tokens: int
    slope: float | None = None  # nats per SLOPE_PER steps over the last evaluations
    slope_lo: float | None = None
    slope_hi: float | None = None

    @property
    def change(self) -> float:
        return self.now - self.start

    @property
    def verdict(self) -> str:
        return "forgot" if self.change > 0 else "gained"

    @property
    def flattened(self) -> bool | None:
        """True when the slope's interval holds 0 (None: too few evaluations to tell)."""
        if self.slope_lo is None:
            return None
        return self.slope_lo <= 0 <= self.slope_hi


def slope_interval(steps: np.ndarray, losses: np.ndarray) -> tuple[float, float, float] | None:
    """Least-squares slope (per ``SLOPE_PER`` steps) and its 95% interval; None under 3 points."""
    ok = np.isfinite(losses)
    x, y = steps[ok].astype(float) / SLOPE_PER, losses[ok]
    n = len(x)
    if n < 3 or np.ptp(x) == 0:
        return None
    xc = x - x.mean()
    slope = float((xc * (y - y.mean())).sum() / (xc**2).sum())
    resid = y - y.mean() - slope * xc
    se = math.sqrt(float((resid**2).sum()) / (n - 2) / float((xc**2).sum()))
    t = _T975[n - 3] if n - 2 <= len(_T975) else 1.96
    return slope, slope - t * se, slope + t * se


def source_changes(run: TrainingRun, *, last: int = 5) -> list[SourceChange]:
    """Per held-out source, when the run has an evaluation at step 0 (a continued run); else []."""
    if not run.evals or run.evals[0]["step"] != 0 or len(run.evals) < 2:
        return []
    tokens: dict[str, int] = {}
    for record in run.logs:
        for source, figures in (record.get("per_source") or {}).items():
            tokens[source] = tokens.get(source, 0) + int(figures.get("tokens") or 0)
    first, final = run.evals[0]["eval"].get("per_source") or {}, run.evals[-1]["eval"].get("per_source") or {}
    rows = []
    for source in first:
        if first.get(source) is None or final.get(source) is None:
            continue
        row = SourceChange(source, float(first[source]), float(final[source]), tokens.get(source, 0))
        steps, losses = run.eval_column(source)
        fit = slope_interval(steps[1:][-last:], losses[1:][-last:])  # step 0 is before training: not on the line
        if fit is not None:
            row.slope, row.slope_lo, row.slope_hi = fit
        rows.append(row)
    return rows


def table_rows(rows: list[SourceChange]) -> tuple[list[str], list[list[object]]]:
    header = [
        "source",
        "trained tokens",
        "held-out at step 0",
        "held-out now",
        "change",
        "",
        f"slope per {SLOPE_PER} steps (95% interval)",
        "flattened",
    ]
    body = []
    for r in rows:
        slope = "" if r.slope is None else f"{r.slope:+.4f} [{r.slope_lo:+.4f}, {r.slope_hi:+.4f}]"
        flat = {None: "too few evals", True: "yes", False: "no, still moving"}[r.flattened]
        body.append([r.source, r.trained_tokens, r.start, r.now, f"{r.change:+.4f}", r.verdict, slope, flat])
    return header, body


def plot(run: TrainingRun, rows: list[SourceChange]) -> bytes:
    """Left: change of held-out loss since step 0 per source (up = forgetting); right: the held-out curves."""
    colors = plots.palette([r.source for r in rows])
    fig, (bars, curves) = plots._subplots(1, 2, figsize=(11, 3.8))
    names = [r.source for r in rows]
    bars.bar(names, [r.change for r in rows], color=[colors[n] for n in names])
    bars.axhline(0, color="gray", linewidth=0.8)
    bars.set(title="held-out loss change since step 0 (up: forgetting, down: gain)", ylabel="nats")
    for r in rows:
        steps, losses = run.eval_column(r.source)
        curves.plot(steps, losses, marker="o", markersize=3, color=colors[r.source], label=r.source)
    curves.set(title="held-out loss per source (step 0 = the base model)", xlabel="step", ylabel="loss")
    plots.legend(curves, fontsize=8)
    return plots._png(fig)
