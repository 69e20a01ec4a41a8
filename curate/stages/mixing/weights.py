"""Target token counts per source: explicit weights, temperature sampling, UniMax.

Every scheme works on the tokens each source has available (``available``) and returns
how many tokens each source should contribute (``targets``). No source is asked for more
than ``max_epochs`` passes over its data; when a requested share cannot be met under that
cap the source is capped and the shortfall is reported, never silently spread elsewhere.
References: temperature sampling (Arivazhagan et al. 2019, p ∝ n^(1/T)); UniMax
(Chung et al. 2023, https://arxiv.org/abs/2304.09151): uniform up to an epoch cap.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from winnow.curate.errors import ConfigError

log = logging.getLogger(__name__)

SCHEMES = ("explicit", "temperature", "unimax")


@dataclass(frozen=True, slots=True)
class Targets:
    """What the mixture asks of each source, aligned with the source names given."""

    weights: np.ndarray  # requested share of the mixture (sums to 1 over sources with data)
    tokens: np.ndarray  # target tokens after the epoch cap
    budget: float  # the total token budget the weights were applied to
    capped: np.ndarray  # bool: the source hit its epoch cap below its requested share
    set_by: str | None = None  # the source whose epoch cap set a default budget (``total_tokens`` unset)


def requested_weights(
    names: Sequence[str], available: np.ndarray, *, scheme: str, weights: Mapping[str, float], temperature: float
) -> np.ndarray:
    """Normalized shares for ``explicit`` or ``temperature``; sources without data get 0."""
    if scheme == "explicit":
        w = np.array([float(weights.get(n, 0.0)) for n in names])
        missing = [n for n in names if n not in weights]
        if missing:
            log.warning("mix: sources %s have no weight in `weights` and are left out of the mixture", missing)
    elif scheme == "temperature":  # in logs: n^(1/T) overflows for a small T (1e9 tokens at T = 0.03)
        have = np.asarray(available, dtype=np.float64) > 0
        logs = np.full(len(names), -np.inf)
        logs[have] = np.log(np.asarray(available, dtype=np.float64)[have]) / temperature  # T = inf: all 0, equal
        w = np.exp(logs - logs[have].max()) if have.any() else np.zeros(len(names))
    else:
        raise ConfigError(f"scheme {scheme!r} has no requested weights; allowed: 'explicit', 'temperature'")
    w = np.where(available > 0, w, 0.0)
    peak = w.max(initial=0.0)
    if not peak > 0:
        raise ConfigError(
            f"mix: no source with data has a positive weight (sources {list(names)}, weights {dict(weights)})"
        )
    w = w / peak  # before the sum: weights near the float maximum (1e308 each) would add up to inf
    return w / w.sum()


def unimax_tokens(available: np.ndarray, budget: float, max_epochs: float) -> np.ndarray:
    """UniMax: spread ``budget`` uniformly, giving a source at most ``max_epochs`` passes.

    Sources are visited from the smallest up; each takes the smaller of its cap and an
    equal part of what is left, so the budget freed by small sources goes to larger ones.
    """
    out = np.zeros_like(available, dtype=np.float64)
    order = np.argsort(available, kind="stable")
    remaining = float(budget)
    live = [i for i in order if available[i] > 0]
    for k, i in enumerate(live):
        share = remaining / (len(live) - k)
        out[i] = min(available[i] * max_epochs, share)
        remaining -= out[i]
    return out


def plan_targets(
    names: Sequence[str],
    available: np.ndarray,
    *,
    scheme: str,
    weights: Mapping[str, float],
    temperature: float,
    max_epochs: float,
    total_tokens: float | None,
) -> Targets:
    """Target tokens per source for the configured scheme and budget."""
    available = np.asarray(available, dtype=np.float64)
    ceiling = available * max_epochs
    if scheme == "unimax":
        budget = float(total_tokens) if total_tokens is not None else float(available.sum())
        tokens = unimax_tokens(available, budget, max_epochs)
        spent = tokens.sum()
        w = tokens / spent if spent > 0 else tokens
        return Targets(
            weights=w, tokens=tokens, budget=budget, capped=(ceiling > 0) & (tokens >= ceiling * (1 - 1e-12))
        )
    w = requested_weights(names, available, scheme=scheme, weights=weights, temperature=temperature)
    set_by = None
    if total_tokens is None:
        # The largest budget at which no source needs more than its cap.
        live = np.flatnonzero(w > 0)
        binding = live[np.argmin(ceiling[live] / w[live])]
        budget = float(ceiling[binding] / w[binding])
        set_by = names[binding]
        _warn_small_budget(names, available, w * budget, set_by, max_epochs)
    else:
        budget = float(total_tokens)
    wanted = w * budget
    tokens = np.minimum(wanted, ceiling)
    capped = wanted > ceiling * (1 + 1e-12)
    if capped.any():
        log.warning(
            "mix: sources %s cannot reach their share of %d tokens within max_epochs=%s; they are capped",
            [n for n, c in zip(names, capped) if c],
            budget,
            max_epochs,
        )
    return Targets(weights=w, tokens=tokens, budget=budget, capped=capped, set_by=set_by)


def _warn_small_budget(
    names: Sequence[str], available: np.ndarray, tokens: np.ndarray, set_by: str, max_epochs: float
) -> None:
    """Warn when a default budget leaves out most of a source: a small source's cap sets it for all."""
    kept = np.divide(tokens, available, out=np.ones_like(tokens), where=available > 0)
    short = [(n, k) for n, k in zip(names, kept) if k < 0.5 and n != set_by]
    if short:
        log.warning(
            "mix: with total_tokens unset the budget is the largest no source needs more than max_epochs=%g "
            "passes for, and `%s` sets it: %s of their tokens; set the mix stage's total_tokens (smaller sources "
            "then repeat, up to max_epochs) or raise max_epochs to keep more (the rest are rejects "
            "mix:not_selected)",
            max_epochs,
            set_by,
            ", ".join(f"`{n}` keeps {k:.1%}" for n, k in short),
        )
