"""The study's plan: one ``{"name", "kind", "seed", "weights"}`` per run, the baseline (and its noise seeds) first."""

from __future__ import annotations

from curate.errors import ConfigError
from pipelines.ablate.config import AblateConfig
from pipelines.ablate.layout import BASELINE


def variants(cfg: AblateConfig, base: dict[str, float], seed: int) -> list[dict]:
    """Every run of the study; ``base`` is the baseline's token share per source."""
    out = [{"name": BASELINE, "kind": "baseline", "seed": seed, "weights": dict(base)}]
    out += [{"name": f"baseline_seed{seed + k}", "kind": "noise", "seed": seed + k, "weights": dict(base)}
            for k in range(1, cfg.noise_seeds)]
    chosen = cfg.sources or list(base)
    unknown = [s for s in chosen + [s for mix in cfg.mixes.values() for s in mix] if s not in base]
    if unknown:
        raise ConfigError(f"ablate: unknown source {unknown[0]!r}; the shards hold {sorted(base)}")
    if cfg.kind == "leave_one_out":
        out += [{"name": f"without_{s}", "kind": "leave_one_out", "seed": seed,
                 "weights": {k: w for k, w in base.items() if k != s}} for s in chosen]
    elif cfg.kind == "weights":
        out += [{"name": f"{s}_x{f:g}", "kind": "weights", "seed": seed,
                 "weights": {k: w * (f if k == s else 1.0) for k, w in base.items() if k != s or f > 0}}
                for s in chosen for f in cfg.factors]
    else:
        out += [{"name": name, "kind": "mix", "seed": seed, "weights": {k: w for k, w in mix.items() if w > 0}}
                for name, mix in cfg.mixes.items()]
    return out
