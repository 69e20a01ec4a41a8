"""The study's plan: one ``{"name", "kind", "seed", "weights"}`` per run, the baseline (and its noise seeds) first.

``variants`` also refuses, before anything trains, a plan with a run that cannot be trained: a
weight on a source with no train rows, or weights that sum to 0; the message names the variant
and the ``[ablate]`` key to change.
"""

from __future__ import annotations

import numpy as np

from curate.errors import ConfigError
from pipelines.ablate.config import AblateConfig
from pipelines.ablate.layout import BASELINE


def variants(cfg: AblateConfig, base: dict[str, float], seed: int, *, sources: list[str] | None = None) -> list[dict]:
    """Every run of the study; ``base`` is the baseline's token share per source with train rows,
    ``sources`` every source of the job (default: those of ``base``)."""
    sources = list(sources or base)
    out = [{"name": BASELINE, "kind": "baseline", "seed": seed, "weights": dict(base)}]
    out += [{"name": f"baseline_seed{seed + k}", "kind": "noise", "seed": seed + k, "weights": dict(base)}
            for k in range(1, cfg.noise_seeds)]
    chosen = cfg.sources or list(base)
    unknown = [s for s in chosen + [s for mix in cfg.mixes.values() for s in mix] if s not in sources]
    if unknown:
        raise ConfigError(f"ablate: unknown source {unknown[0]!r}; the shards hold {sorted(sources)}")
    if cfg.target != "mean" and cfg.target not in base:
        raise ConfigError(f"ablate.target = {cfg.target!r} is invalid; allowed: 'mean' or a source with train rows "
                          f"({sorted(base)})")
    missing = [s for s in chosen if s not in base]
    if missing and {"leave_one_out", "weights"} & set(cfg.kinds):
        name = f"without_{missing[0]}" if "leave_one_out" in cfg.kinds else f"{missing[0]}_x{cfg.factors[0]:g}"
        raise ConfigError(f"ablate: variant {name!r} (ablate.sources) varies source {missing[0]!r}, which has no train "
                          f"rows in the curated shards (only {sorted(base)} do); drop it from ablate.sources")
    for kind in cfg.kinds:
        planned = PLANNERS[kind](cfg, base, seed, chosen)
        out += planned + (_reseeded(planned, seed, cfg.variant_seeds) if kind in SEEDED else [])
    names = [v["name"] for v in out]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None:
        raise ConfigError(f"ablate.mixes.{twice}: the name {twice!r} is taken by another variant of the study; rename it")
    for v in out:
        check_runnable(v, base)
    return out


def _leave_one_out(cfg: AblateConfig, base: dict[str, float], seed: int, chosen: list[str]) -> list[dict]:
    return [{"name": f"without_{s}", "kind": "leave_one_out", "seed": seed,
             "weights": {k: w for k, w in base.items() if k != s}} for s in chosen]


def _weights(cfg: AblateConfig, base: dict[str, float], seed: int, chosen: list[str]) -> list[dict]:
    return [{"name": f"{s}_x{f:g}", "kind": "weights", "seed": seed,
             "weights": {k: w * (f if k == s else 1.0) for k, w in base.items() if k != s or f > 0}}
            for s in chosen for f in cfg.factors]


def _mixes(cfg: AblateConfig, base: dict[str, float], seed: int, chosen: list[str]) -> list[dict]:
    return [{"name": name, "kind": "mix", "seed": seed, "weights": {k: w for k, w in mix.items() if w > 0}}
            for name, mix in cfg.mixes.items()]


def _random_mixes(cfg: AblateConfig, base: dict[str, float], seed: int, chosen: list[str]) -> list[dict]:
    if cfg.n_mixes <= len(base):
        raise ConfigError(f"ablate.n_mixes = {cfg.n_mixes} is invalid; allowed: more than the {len(base)} sources "
                          "with train rows (the regression fits one coefficient per source)")
    return [{"name": f"mix_{i:02d}", "kind": "random_mix", "seed": seed, "weights": w}
            | ({"steps": cfg.mix_steps} if cfg.mix_steps else {})
            for i, w in enumerate(draw_mixes(base, cfg.n_mixes, cfg.concentration, seed))]


def _reseeded(planned: list[dict], seed: int, n: int) -> list[dict]:
    """Each variant again with seeds ``seed + 1 .. seed + n - 1``: ``group`` names the variant they repeat."""
    return [{**v, "name": f"{v['name']}_seed{seed + k}", "seed": seed + k, "group": v["name"]}
            for k in range(1, n) for v in planned]


#: the kinds whose variants ``variant_seeds`` repeats (random mixes are many runs already, each a fit point)
SEEDED = ("leave_one_out", "weights", "mixes")

#: kind -> its variants (after the baseline and noise seeds), in plan order
PLANNERS = {"leave_one_out": _leave_one_out, "weights": _weights, "mixes": _mixes, "random_mixes": _random_mixes}


def draw_mixes(base: dict[str, float], n: int, concentration: float, seed: int) -> list[dict[str, float]]:
    """``n`` mixtures from Dirichlet(concentration x baseline share), seeded: the same study draws the same mixes."""
    names = list(base)
    alpha = concentration * np.array([base[s] for s in names])
    draws = dirichlet(alpha, n, seed)
    return [{s: float(w) for s, w in zip(names, row) if w > 0} for row in draws]


def dirichlet(alpha: np.ndarray, n: int, seed: int, stream: int = 0) -> np.ndarray:
    """(n, len(alpha)) Dirichlet draws from a generator of its own (``stream`` separates uses of one seed)."""
    return np.random.default_rng([seed, 20, stream]).dirichlet(alpha, size=n)


def _key(variant: dict) -> str:
    return {"leave_one_out": "ablate.sources", "weights": "ablate.factors", "random_mix": "ablate.concentration",
            "proposed": "ablate.target"}.get(variant["kind"], f"ablate.mixes.{variant['name']}")


def check_runnable(variant: dict, base: dict[str, float]) -> None:
    """A variant trains only on sources with train rows, with weights that sum to more than 0."""
    key = _key(variant)
    empty = [s for s, w in variant["weights"].items() if w > 0 and s not in base]
    if empty:
        raise ConfigError(f"ablate: variant {variant['name']!r} ({key}) gives weight to source {empty[0]!r}, which has "
                          f"no train rows in the curated shards (only {sorted(base)} do); drop it from {key}")
    if not sum(w for w in variant["weights"].values() if w > 0) > 0:
        raise ConfigError(f"ablate: variant {variant['name']!r} ({key}) has mix weights that sum to 0: it would train "
                          f"on nothing; change {key} so at least one source with train rows keeps a weight")
