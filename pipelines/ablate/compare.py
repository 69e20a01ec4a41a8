"""The study's comparison: what each variant did to held-out loss, with the seed noise, and what its curation kept.

One ``Effect`` per variant (its seeds together), measured against the baseline's seeds:

* ``delta[source]``: the mean held-out loss over the variant's seeds minus the mean over the
  baseline's (negative: the variant did better), with its noise, two standard errors of that
  difference, ``2 · sd · sqrt(1/n_variant + 1/n_baseline)``; ``sd`` is the seeds' standard deviation
  about their own run's mean, pooled over the baseline and every variant of two or more seeds
  (``pooled_sd``: a delta's error is both sides', and a study's variants measure the seeds' spread as
  well as its baseline does); ``mean``: the same for the mean over the held-out sources;
* ``curve``, when the runs evaluated periodically: the area under the mean held-out curve (the
  mean loss over the run, trapezoid rule) against the baseline's, with its noise, and the first
  evaluated step at which the variant's mean curve reaches the baseline's final mean loss (a
  curriculum promises to get there sooner);
* ``curation``, for a variant that re-curates the job: train rows and tokens it kept and its
  rejects by reason, against the baseline's.

A difference within its noise is "can't tell"; with one baseline seed there is no noise estimate.
Runs of other lengths than the baseline (random mixes with ``mix_steps``: points of the mixing
regression) are not compared here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

BASELINE_KINDS = ("baseline", "noise")


def baselines(results: list[dict]) -> list[dict]:
    return [r for r in results if r["kind"] in BASELINE_KINDS]


def finite_loss(run: dict, source: str) -> float | None:
    """A run's held-out loss on ``source``; None where it has none, or a diverged run's NaN or infinity (never
    averaged into a delta or ranked)."""
    value = run["held_out"].get(source)
    return float(value) if isinstance(value, (int, float)) and np.isfinite(value) else None


def mean_held_out(runs: list[dict], source: str) -> float | None:
    values = [v for v in (finite_loss(r, source) for r in runs) if v is not None]
    return float(np.mean(values)) if values else None


def variant_groups(results: list[dict]) -> dict[str, list[dict]]:
    """The variants' runs by variant (its seeds together), those of the baseline's length only: a random mix of
    another length (``mix_steps``) is a point of the mixing regression, not a run to compare."""
    base = baselines(results)
    steps = base[0].get("steps") if base else None
    groups: dict[str, list[dict]] = {}
    for r in results:
        if r["kind"] not in BASELINE_KINDS and r.get("steps") == steps:
            groups.setdefault(r.get("group", r["name"]), []).append(r)
    return groups


def pooled_sd(base: np.ndarray, groups: list[np.ndarray]) -> float | None:
    """The seeds' standard deviation about their own run's mean, pooled over the baseline's seeds ``base`` and
    each variant's of two or more (``groups``; one with a non-finite value, a diverged seed, is left out);
    None without two finite baseline seeds, the study's switch for a noise estimate (``noise_seeds``)."""
    if len(base) < 2 or not np.isfinite(base).all():
        return None
    parts = [base, *(v for v in groups if len(v) >= 2 and np.isfinite(v).all())]
    squares = sum(float(((v - v.mean()) ** 2).sum()) for v in parts)
    return float(np.sqrt(squares / sum(len(v) - 1 for v in parts)))


def noise_of(sd: float | None, n_base: int, repeats: int) -> float | None:
    """Two standard errors of (mean of ``repeats`` runs) - (mean of ``n_base`` baseline seeds), the seeds'
    standard deviation ``sd`` (``pooled_sd``); None without one."""
    if sd is None:
        return None
    return 2 * sd * float(np.sqrt(1 / repeats + 1 / n_base))


def _values(runs: list[dict], source: str) -> np.ndarray:
    return np.array([v for v in (finite_loss(r, source) for r in runs) if v is not None], dtype=float)


def seed_sd(results: list[dict], sources: list[str]) -> dict[str, tuple[float | None, int]]:
    """Per held-out source, the seeds' pooled standard deviation (``pooled_sd``) and the number of baseline seeds."""
    runs, groups = baselines(results), list(variant_groups(results).values())
    out = {}
    for s in sources:
        base = _values(runs, s)
        out[s] = pooled_sd(base, [_values(g, s) for g in groups]), len(base)
    return out


def seed_noise(results: list[dict], sources: list[str], variant_seeds: int = 1) -> dict[str, float]:
    """Per held-out source, two standard errors of a measured delta (the mean of ``variant_seeds`` runs of a
    variant minus the mean of the ``n`` baseline seeds): ``2 · sd · sqrt(1/variant_seeds + 1/n)``, ``sd``
    pooled over the baseline's and the variants' seeds (``pooled_sd``); 0 without a second baseline seed
    (no estimate)."""
    return {s: noise_of(sd, n, variant_seeds) or 0.0 for s, (sd, n) in seed_sd(results, sources).items()}


@dataclass(frozen=True, slots=True)
class Measured:
    """A variant's difference from the baseline (nats; negative: lower loss) and its noise (None: not estimated)."""

    value: float
    noise: float | None

    @property
    def verdict(self) -> str:
        if not np.isfinite(self.value):
            return "diverged"
        if self.noise is None:
            return "no noise estimate"
        if abs(self.value) <= self.noise:
            return "can't tell"
        return "lower" if self.value < 0 else "higher"

    def text(self) -> str:
        noise = f" ± {self.noise:.3f}" if self.noise is not None else ""
        return f"{self.value:+.3f}{noise} nats ({self.verdict})"


@dataclass(frozen=True, slots=True)
class Curve:
    """A variant's mean held-out loss over training (mean over its seeds and the held-out sources)."""

    steps: list[int]
    loss: list[float]
    area: Measured  # mean loss over the run (area under the curve / its length), minus the baseline's
    first_step: int | None  # first evaluated step at or below the baseline's final mean loss; None: never


@dataclass(frozen=True, slots=True)
class Curation:
    """What a curated job kept for training, and how its rejects differ from the baseline's."""

    rows: int
    tokens: int
    unit: str  # "tokens" with token shards, else "bytes" (UTF-8 bytes of text)
    rows_change: float  # fraction of the baseline's
    tokens_change: float
    rejected: dict[str, int]  # reason -> rows, the whole job
    rejected_change: dict[str, int]  # reason -> this job's rows minus the baseline's (reasons that differ)
    reused: dict | None  # the baseline's phases and plans its curation adopted


@dataclass(frozen=True, slots=True)
class Effect:
    """One variant against the baseline: the held-out deltas per source with their noise, the curve, the curation."""

    variant: str
    kind: str
    describe: str  # what differs from the baseline
    seeds: int
    held_out: dict[str, float]  # mean over the variant's seeds
    delta: dict[str, Measured]  # per held-out source
    mean: Measured  # of the mean over the held-out sources
    curve: Curve | None = None
    curation: Curation | None = None

    def sentence(self) -> str:
        """One line a user reads: the cost (curation) and the effect, noise included."""
        parts = []
        if self.curation is not None and self.kind != "baseline":
            c = self.curation
            changed = ", ".join(f"{r} {n:+d}" for r, n in list(c.rejected_change.items())[:4])
            parts.append(
                f"kept {c.tokens_change:+.1%} {c.unit} and {c.rows_change:+.1%} rows"
                + (f" (rejects {changed})" if changed else "")
            )
        parts.append(f"mean held-out loss {self.mean.text()}")
        if self.curve is not None:
            reach = (
                f"reaches the baseline's final loss at step {self.curve.first_step}"
                if self.curve.first_step is not None
                else "never reaches the baseline's final loss"
            )
            parts.append(f"area under the held-out curve {self.curve.area.text()}; {reach}")
        return f"{self.variant} ({self.describe}, {self.seeds} seed(s)): " + "; ".join(parts)

    def row(self, sources: list[str]) -> dict:
        """A flat table row (``effects.csv``)."""
        c, curve, own = self.curation, self.curve, self.kind != "baseline"  # the baseline: deltas 0, no verdict
        row = {
            "variant": self.variant,
            "kind": self.kind,
            "change": self.describe,
            "seeds": self.seeds,
            "mean_held_out": float(np.mean(list(self.held_out.values()))) if self.held_out else None,
            "mean_delta": self.mean.value,
            "mean_noise": self.mean.noise,
            "verdict": self.mean.verdict if own else None,
            "area_delta": curve.area.value if curve else None,
            "area_noise": curve.area.noise if curve else None,
            "area_verdict": curve.area.verdict if curve and own else None,
            "first_step_at_baseline_final": curve.first_step if curve else None,
            "train_rows": c.rows if c else None,
            "rows_change": c.rows_change if c else None,
            "train_tokens": c.tokens if c else None,
            "tokens_unit": c.unit if c else None,
            "tokens_change": c.tokens_change if c else None,
            "rejects_change": "; ".join(f"{r} {n:+d}" for r, n in c.rejected_change.items()) if c else None,
        }
        for s in sources:
            d = self.delta.get(s)
            row |= {f"delta_{s}": d.value if d else None, f"noise_{s}": d.noise if d else None}
        return row

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class _Reference:
    """The baseline's seeds, as every variant is measured against them."""

    per_source: dict[str, np.ndarray]  # held-out loss of each seed
    means: np.ndarray  # mean over the held-out sources, per seed
    areas: np.ndarray | None  # mean loss over the run, per seed (None: not every seed has a curve)
    final: float  # mean over seeds of the final mean held-out loss
    sd: dict[str, float | None]  # the seeds' pooled standard deviation (``pooled_sd``): per source, "mean", "area"


def effects(results: list[dict], sources: list[str], curation: dict[str, dict] | None = None) -> list[Effect]:
    """The baseline (its seeds' mean, every delta 0) and then one ``Effect`` per variant, in plan order."""
    curation = curation or {}
    base_runs = baselines(results)
    sources = [s for s in sources if any(r["held_out"].get(s) is not None for r in base_runs)]  # those held out
    groups = variant_groups(results)
    curves = [_curve(r, sources) for r in base_runs]
    means = np.array([_mean(r["held_out"], sources) for r in base_runs], dtype=float)
    means = means[np.isfinite(means)]  # a diverged baseline seed measures nothing
    areas = np.array([_area(c) for c in curves]) if all(c is not None for c in curves) else None
    runs_of = list(groups.values())
    sd = {s: pooled_sd(_values(base_runs, s), [_values(g, s) for g in runs_of]) for s in sources}
    sd["mean"] = pooled_sd(means, [np.array([_mean(r["held_out"], sources) for r in g]) for g in runs_of])
    if areas is not None:
        group_curves = [[_curve(r, sources) for r in g] for g in runs_of]
        sd["area"] = pooled_sd(areas, [np.array([_area(c) for c in g]) for g in group_curves if None not in g])
    reference = _Reference(
        per_source={s: _values(base_runs, s) for s in sources},
        means=means,
        areas=areas,
        final=float(np.mean(means)),
        sd=sd,
    )
    first = base_runs[0]["name"]
    base_summary = curation.get(first)
    out = [
        _effect(
            first,
            "baseline",
            "the job as curated" if base_summary else "the curated mix",
            base_runs,
            sources,
            reference,
            base_summary,
            base_summary,
        )
    ]
    for name, runs in groups.items():
        out.append(
            _effect(
                name,
                runs[0]["kind"],
                runs[0].get("describe") or _weights_text(runs[0]),
                runs,
                sources,
                reference,
                curation.get(name),
                base_summary,
            )
        )
    return out


def _effect(
    name: str,
    kind: str,
    describe: str,
    runs: list[dict],
    sources: list[str],
    ref: _Reference,
    summary: dict | None,
    base_summary: dict | None,
) -> Effect:
    held = {s: mean_held_out(runs, s) for s in sources}
    delta = {
        s: Measured(held[s] - float(ref.per_source[s].mean()), noise_of(ref.sd[s], len(ref.per_source[s]), len(runs)))
        for s in sources
        if held[s] is not None and len(ref.per_source[s])
    }
    means = np.array([_mean(r["held_out"], sources) for r in runs], dtype=float)
    finite = means[np.isfinite(means)]  # a diverged seed is left out; every seed diverged: the verdict says so
    mean = Measured(
        float(finite.mean() - ref.means.mean()) if len(finite) else float("nan"),
        noise_of(ref.sd["mean"], len(ref.means), max(len(finite), 1)),
    )
    own = [_curve(r, sources) for r in runs]
    curve = None
    if ref.areas is not None and all(c is not None for c in own) and len({tuple(c[0]) for c in own}) == 1:
        steps = own[0][0]
        loss = np.mean([c[1] for c in own], axis=0)
        reached = [step for step, value in zip(steps, loss) if value <= ref.final]
        area = float(np.mean([_area(c) for c in own]))
        curve = Curve(
            steps=list(steps),
            loss=loss.tolist(),
            first_step=reached[0] if reached else None,
            area=Measured(area - float(ref.areas.mean()), noise_of(ref.sd.get("area"), len(ref.areas), len(runs))),
        )
    return Effect(
        variant=name,
        kind=kind,
        describe=describe,
        seeds=len(runs),
        held_out={k: v for k, v in held.items() if v is not None},
        delta=delta,
        mean=mean,
        curve=curve,
        curation=_curation(summary, base_summary) if summary is not None else None,
    )


def _mean(held_out: dict, sources: list[str]) -> float:
    values = [held_out[s] for s in sources if held_out.get(s) is not None]
    return float(np.mean(values)) if values else float("nan")


def _curve(run: dict, sources: list[str]) -> tuple[list[int], np.ndarray] | None:
    """(steps, mean held-out loss) of a run's evaluations that cover every source; None without two of them."""
    points = [
        (p["step"], _mean(p["held_out"], sources))
        for p in run.get("curve") or []
        if all(p["held_out"].get(s) is not None for s in sources)
    ]
    if len(points) < 2:
        return None
    return [s for s, _ in points], np.array([v for _, v in points])


def _area(curve: tuple[list[int], np.ndarray]) -> float:
    """The mean loss over the evaluated stretch of a run: the area under its curve over the stretch's length."""
    steps, loss = np.asarray(curve[0], dtype=float), curve[1]
    return float(np.sum((loss[1:] + loss[:-1]) / 2 * np.diff(steps)) / (steps[-1] - steps[0]))


def _curation(summary: dict, base: dict | None) -> Curation:
    base = base or summary
    rejected = summary["rejected"]
    reasons = sorted(set(rejected) | set(base["rejected"]))
    change = {r: rejected.get(r, 0) - base["rejected"].get(r, 0) for r in reasons}
    return Curation(
        rows=summary["rows"],
        tokens=summary["tokens"],
        unit=summary["unit"],
        rows_change=summary["rows"] / base["rows"] - 1 if base["rows"] else 0.0,
        tokens_change=summary["tokens"] / base["tokens"] - 1 if base["tokens"] else 0.0,
        rejected=dict(rejected),
        rejected_change={r: n for r, n in sorted(change.items(), key=lambda kv: -abs(kv[1])) if n},
        reused=summary.get("reused"),
    )


def _weights_text(run: dict) -> str:
    weights = (run.get("mixing") or {}).get("mix_weights_mean") or run["weights"]
    total = sum(weights.values()) or 1.0
    return "mix " + " ".join(f"{k}={w / total:.3f}" for k, w in weights.items())
