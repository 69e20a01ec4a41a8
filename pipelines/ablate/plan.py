"""The study's plan: one ``{"name", "kind", "seed", "weights"}`` per run, the baseline (and its noise seeds) first.

Each kind of variant is one small plan function (``PLANNERS``). The mix kinds give their weights;
the curation kinds (``drop``, ``settings``, ``order``) give the ``change`` to the job (see
``curation.py``) and the ``[ablate]`` key that asked for it, and get their weights, the shares
their own curated shards hold, when the data is prepared (``prepare.py``).

``variants`` also refuses, before anything trains, a plan with a run that cannot be trained: a
weight on a source with no train rows, weights that sum to 0, a stage, key or value the job does
not have or its config refuses; the message names the variant and the ``[ablate]`` key to change.
"""

from __future__ import annotations

import difflib
import re
import sys
from dataclasses import dataclass

import numpy as np

from winnow.curate.errors import ConfigError
from winnow.pipelines.ablate.config import CURATION_KINDS, AblateConfig, name_number
from winnow.pipelines.ablate.curation import CurationJob
from winnow.pipelines.ablate.layout import BASELINE


@dataclass(frozen=True, slots=True)
class PlanContext:
    """What a plan function reads: the [ablate] table, the baseline's shares, the seed, the sources to vary, the job."""

    cfg: AblateConfig
    base: dict[str, float]
    seed: int
    chosen: list[str]
    job: CurationJob | None = None


def variants(
    cfg: AblateConfig,
    base: dict[str, float],
    seed: int,
    *,
    sources: list[str] | None = None,
    job: CurationJob | None = None,
) -> list[dict]:
    """Every run of the study; ``base`` is the baseline's token share per source with train rows,
    ``sources`` every source of the job (default: those of ``base``), ``job`` the curation job the
    curation kinds change."""
    sources = list(sources or base)
    out = _baselines(cfg, base, seed)
    chosen = cfg.sources or list(base)
    named = [("ablate.sources", s) for s in chosen] + [
        (f"ablate.mixes.{m}", s) for m, mix in cfg.mixes.items() for s in mix
    ]
    unknown = next(((key, s) for key, s in named if s not in sources), None)
    if unknown is not None:
        key, source = unknown
        close = difflib.get_close_matches(source, sources, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{key}: unknown source {source!r}{hint}; the shards hold {sorted(sources)}")
    if cfg.target != "mean" and cfg.target not in base:
        raise ConfigError(
            f"ablate.target = {cfg.target!r} is invalid; allowed: 'mean' or a source with train rows ({sorted(base)})"
        )
    missing = [s for s in chosen if s not in base]
    if missing and {"leave_one_out", "weights"} & set(cfg.kinds):
        name = (
            f"without_{missing[0]}" if "leave_one_out" in cfg.kinds else f"{missing[0]}_x{name_number(cfg.factors[0])}"
        )
        raise ConfigError(
            f"ablate: variant {name!r} (ablate.sources) varies source {missing[0]!r}, which has no train "
            f"rows in the curated shards (only {sorted(base)} do); drop it from ablate.sources"
        )
    context = PlanContext(cfg, base, seed, chosen, job)
    for kind in cfg.kinds:
        planned = PLANNERS[kind](context)
        out += planned + (_reseeded(planned, seed, cfg.variant_seeds) if kind in SEEDED else [])
    _names_once(out)
    for v in out:
        if v["kind"] not in CURATION_KINDS_PLANNED:  # their weights come with their curated shards
            check_runnable(v, base)
    return out


def _baselines(cfg: AblateConfig, base: dict[str, float], seed: int) -> list[dict]:
    """The baseline and its noise seeds."""
    return [{"name": BASELINE, "kind": "baseline", "seed": seed, "weights": dict(base)}] + [
        {"name": f"baseline_seed{seed + k}", "kind": "noise", "seed": seed + k, "weights": dict(base)}
        for k in range(1, cfg.noise_seeds)
    ]


def curation_variants(cfg: AblateConfig, seed: int, job: CurationJob | None) -> list[dict]:
    """The variants of the kinds that re-curate the job, planned (and so checked against it) before any data exists."""
    context = PlanContext(cfg, {}, seed, [], job)
    return _names_once([v for kind in cfg.kinds if kind in CURATION_KINDS for v in PLANNERS[kind](context)])


def curated_runs(cfg: AblateConfig, seed: int, job: CurationJob | None) -> list[dict]:
    """The runs of a study that varies the curation whose data is known before any is curated: the baseline and its
    noise seeds (on the job's own curation), each curation variant and its seeds (on its change's); the mix kinds'
    runs need the baseline's shares. Their weights are not known yet."""
    planned = curation_variants(cfg, seed, job)
    return _baselines(cfg, {}, seed) + planned + _reseeded(planned, seed, cfg.variant_seeds)


def _names_once(planned: list[dict]) -> list[dict]:
    """``planned``, refused naming the key when two variants share a name (each names its folder)."""
    names = [v["name"] for v in planned]
    later = next((i for i, name in enumerate(names) if name in names[:i]), None)
    if later is None:
        return planned
    twice, first = planned[later], planned[names.index(names[later])]
    # a named mix can be renamed: its key is the one to change, whichever variant came first
    key = next((_key(v) for v in (twice, first) if v["kind"] == "mix"), _key(twice))
    if first.get("change") is not None and first.get("change") == twice.get("change"):
        raise ConfigError(f"{key}: the same change is listed twice ({twice['name']!r}); list each variant once")
    raise ConfigError(f"{key}: the name {twice['name']!r} is taken by another variant of the study; rename it")


def _leave_one_out(c: PlanContext) -> list[dict]:
    return [
        {
            "name": f"without_{s}",
            "kind": "leave_one_out",
            "seed": c.seed,
            "varied": s,
            "weights": {k: w for k, w in c.base.items() if k != s},
        }
        for s in c.chosen
    ]


def _weights(c: PlanContext) -> list[dict]:
    if len(c.base) < 2:  # its share times any factor renormalises to the whole mixture again
        raise ConfigError(
            f"ablate.kind = 'weights' varies a source's share against the others', and the job has one source with "
            f"train rows ({sorted(c.base)}): every variant would train the baseline's mix; study a job of several sources"
        )
    tiny = next(((s, f) for s in c.chosen for f in c.cfg.factors if 0 < c.base[s] * f < sys.float_info.min), None)
    if tiny is not None:  # training refuses a weight of 0 (or one a subnormal number holds with lost digits)
        s, f = tiny
        raise ConfigError(
            f"ablate.factors = {c.cfg.factors!r} is invalid: variant {s}_x{name_number(f)} scales {s}'s share "
            f"{c.base[s]:.3g} to {c.base[s] * f!r}, below the smallest normal number; allowed: factors of at least "
            f"{sys.float_info.min / c.base[s]:.3g} for {s}, or 0 (leave it out)"
        )
    return [
        {
            "name": f"{s}_x{name_number(f)}",
            "kind": "weights",
            "seed": c.seed,
            "varied": s,
            "weights": {k: w * (f if k == s else 1.0) for k, w in c.base.items() if k != s or f > 0},
        }
        for s in c.chosen
        for f in c.cfg.factors
    ]


def _mixes(c: PlanContext) -> list[dict]:
    return [
        {"name": name, "kind": "mix", "seed": c.seed, "weights": {k: w for k, w in mix.items() if w > 0}}
        for name, mix in c.cfg.mixes.items()
    ]


def _random_mixes(c: PlanContext) -> list[dict]:
    cfg, base = c.cfg, c.base
    if len(base) < 2:  # every mixture of one source is that source alone
        raise ConfigError(
            f"ablate.kind = 'random_mixes' draws mixtures of the job's sources, and the job has one source with "
            f"train rows ({sorted(base)}): every mixture would train the baseline's mix; study a job of several sources"
        )
    if cfg.n_mixes <= len(base):
        raise ConfigError(
            f"ablate.n_mixes = {cfg.n_mixes} is invalid; allowed: more than the {len(base)} sources "
            "with train rows (the regression fits one coefficient per source)"
        )
    return [
        {"name": f"mix_{i:02d}", "kind": "random_mix", "seed": c.seed, "weights": w}
        | ({"steps": cfg.mix_steps} if cfg.mix_steps else {})
        for i, w in enumerate(draw_mixes(base, cfg.n_mixes, cfg.concentration, c.seed))
    ]


def _job(c: PlanContext, kind: str) -> CurationJob:
    if c.job is None:
        raise ConfigError(
            f"ablate.kind = {c.cfg.kind!r}: {kind!r} re-curates the job, and the study names none; "
            "allowed: [ablate] job = '<the job file>', or [[inputs]] and [[stages]] in the study file"
        )
    return c.job


def _curation(c: PlanContext, name: str, kind: str, key: str, change: dict, describe: str) -> dict:
    """One curation variant; its job is built (and validated) here, so a bad change fails before anything runs."""
    _job(c, kind).variant(change, "unused", key=key)
    return {
        "name": name,
        "kind": kind,
        "seed": c.seed,
        "weights": {},
        "change": change,
        "key": key,
        "describe": describe,
    }


def _drop(c: PlanContext) -> list[dict]:
    job, out = _job(c, "drop"), []
    for i, entry in enumerate(c.cfg.drop):
        key = f"ablate.drop[{i}]"
        refs = entry if isinstance(entry, list) else [entry]
        if not refs:
            raise ConfigError(f"{key} = [] is invalid; allowed: a stage, or a list of one or more stages")
        found = sorted({job.index(ref, key) for ref in refs})
        ids = [job.stage_ids[k] for k in found]
        out.append(
            _curation(
                c,
                "drop_" + "+".join(job.name(k) for k in found),
                "drop",
                key,
                {"drop": ids},
                "without " + ", ".join(ids),
            )
        )
    return out


def _settings(c: PlanContext) -> list[dict]:
    job, out = _job(c, "settings"), []
    for dotted, values in c.cfg.settings.items():
        key = f"ablate.settings.{dotted!r}"
        index, path, current = job.setting(dotted, key)
        sid = job.stage_ids[index]
        for value in values:
            if value == current:  # the job's own value: that variant is the baseline
                continue
            change = {"set": {"stage": sid, "key": path, "value": value}}
            out.append(
                _curation(
                    c,
                    f"{job.name(index)}.{path}_{_text(value)}",
                    "setting",
                    f"{key} = {value!r}",
                    change,
                    f"{sid} {path} = {value!r} (job: {current!r})",
                )
            )
    return out


def _order(c: PlanContext) -> list[dict]:
    job = _job(c, "order")
    index = job.order_stage("ablate.kind 'order'")
    config = job.job.stages[index].config
    what = {
        "shuffled": f"{job.stage_ids[index]} by = 'random' (the same rows shuffled; job: by = {config.by!r})",
        "reversed": f"{job.stage_ids[index]} direction reversed (job: {config.direction!r})",
    }
    return [_curation(c, f"order_{o}", "order", f"ablate.orders {o!r}", {"order": o}, what[o]) for o in c.cfg.orders]


def _text(value) -> str:
    """A value as part of a variant name: short, and only characters a folder name can hold anywhere."""
    if isinstance(value, bool):
        text = str(value).lower()
    elif isinstance(value, float | int):
        text = f"{value:g}"
    elif isinstance(value, list):
        text = "+".join(_text(v) for v in value)
    elif isinstance(value, dict):
        text = "+".join(f"{k}-{_text(v)}" for k, v in sorted(value.items()))
    else:
        text = str(value)
    return re.sub(r"[^A-Za-z0-9._+-]", "_", text)[:48] or "_"


def _reseeded(planned: list[dict], seed: int, n: int) -> list[dict]:
    """Each variant again with seeds ``seed + 1 .. seed + n - 1``: ``group`` names the variant they repeat."""
    return [
        {**v, "name": f"{v['name']}_seed{seed + k}", "seed": seed + k, "group": v["name"]}
        for k in range(1, n)
        for v in planned
    ]


#: the kinds whose variants ``variant_seeds`` repeats (random mixes are many runs already, each a fit point)
SEEDED = ("leave_one_out", "weights", "mixes", *CURATION_KINDS)
#: the ``kind`` of a planned curation variant (``drop``, ``setting``, ``order``)
CURATION_KINDS_PLANNED = ("drop", "setting", "order")

#: kind -> its variants (after the baseline and noise seeds), in plan order
PLANNERS = {
    "leave_one_out": _leave_one_out,
    "weights": _weights,
    "mixes": _mixes,
    "random_mixes": _random_mixes,
    "drop": _drop,
    "settings": _settings,
    "order": _order,
}


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
    return variant.get("key") or {
        "leave_one_out": "ablate.sources",
        "weights": "ablate.factors",
        "random_mix": "ablate.concentration",
        "proposed": "ablate.target",
    }.get(variant["kind"], f"ablate.mixes.{variant['name']}")


def check_runnable(variant: dict, base: dict[str, float]) -> None:
    """A variant trains only on sources with train rows, with weights that sum to more than 0."""
    key = _key(variant)
    empty = [s for s, w in variant["weights"].items() if w > 0 and s not in base]
    if empty:
        raise ConfigError(
            f"ablate: variant {variant['name']!r} ({key}) gives weight to source {empty[0]!r}, which has "
            f"no train rows in the curated shards (only {sorted(base)} do); drop it from {key}"
        )
    if not sum(w for w in variant["weights"].values() if w > 0) > 0:
        raise ConfigError(
            f"ablate: variant {variant['name']!r} ({key}) has mix weights that sum to 0: it would train "
            f"on nothing; change {key} so at least one source with train rows keeps a weight"
        )
