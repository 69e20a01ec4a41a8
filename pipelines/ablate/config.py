"""The ``[ablate]`` table of a study job file: which variants of the mix or of the curation to train, and how."""

from __future__ import annotations

import difflib
import math
import sys
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from winnow.curate.errors import ConfigError
from winnow.curate.workdir import is_url

KINDS = ("leave_one_out", "weights", "mixes", "random_mixes", "replay", "drop", "settings", "order")
#: the kinds whose variants re-curate the job (their own shards); the others re-mix the baseline's shards
CURATION_KINDS = ("drop", "settings", "order")
#: order variants: the job's curriculum against the same rows shuffled, or its direction reversed
ORDERS = ("shuffled", "reversed")


#: Run names the study gives its own runs: a [ablate] mixes entry may not take one.
RESERVED_NAMES = ("baseline", "proposed", "doremi", "counterfactual")
#: [ablate] keys only some kinds read -> those kinds: set with none of them, the key would be ignored
READ_BY = {"sources": ("leave_one_out", "weights"), "factors": ("weights",)}


def name_number(x: float) -> str:
    """A factor or share as part of a variant's name (and so of its folder's)."""
    return f"{x:g}"


@dataclass(kw_only=True, slots=True)
class AblateConfig:
    """The ``[ablate]`` table: which variants of the mix to train and how."""

    # the mix: leave_one_out, weights, mixes, random_mixes or replay; the curation: drop, settings or order;
    # or a list of them (one baseline, all their variants)
    kind: str | list[str] = "leave_one_out"
    sources: list[str] = field(default_factory=list)  # leave_one_out / weights: sources to vary; [] = all
    factors: list[float] = field(default_factory=lambda: [0.5, 2.0])  # weights: multipliers of a source's weight
    mixes: dict[str, dict[str, float]] = field(default_factory=dict)  # mixes: variant name -> {source: weight}
    n_mixes: int = 16  # random_mixes: mixtures drawn from a Dirichlet around the baseline's shares
    concentration: float = 8.0  # random_mixes: Dirichlet alpha = concentration x baseline share (higher: closer)
    mix_steps: int | None = None  # random_mixes: steps of each random-mix run; None: the study's steps
    target: str = "mean"  # random_mixes: what the proposed mix minimises: "mean" held-out loss, or a source's
    shares: list[float] = field(default_factory=lambda: [0.0, 0.01, 0.05, 0.25])  # replay: [train] replay shares
    output: str | None = None  # the study folder; None: <[job] output>/ablate
    steps: int | None = None  # steps per run; None: [train] steps
    noise_seeds: int = 1  # baseline runs, seeds seed, seed+1, ...: 2 or more measure the run-to-run noise (1: one)
    # leave_one_out / weights / mixes: each variant is also trained with seeds seed+1.., and its measured
    # delta is the mean over its seeds minus the mean over the baseline seeds (less noise per cell)
    variant_seeds: int = 1
    attribution_every: int = 10  # first-order attribution on the baseline run every N steps (0: off)
    attribution_seeds: int = 1  # baseline seeds whose attribution is averaged (<= noise_seeds): less sampling noise
    # the counterfactual's interval in the comparison: "seeds" (the attributed seeds' spread: needs 2 or more),
    # "run" (the baseline run's own, from its probe and batches), "auto" (seeds when there are 2 or more)
    interval: Literal["auto", "seeds", "run"] = "auto"
    parallel: int = 1  # runs trained at once, one process each (one GPU each when there are GPUs)
    executor: Literal["local", "ray"] = "local"  # local processes, or Ray tasks (RAY_ADDRESS for a cluster)
    threads: int = 0  # torch threads per run; 0: this machine's cores / parallel
    # one more run per method, its mix moved with the finished baseline as [train.mixing]'s reference: "doremi" (by
    # excess loss against the baseline's model), "counterfactual" (from the baseline's counterfactual); "": none
    adaptive: str | list[str] = ""
    adaptive_every: int = 5  # steps between the adaptive runs' weight updates
    adaptive_step_size: float = 1.0  # doremi: its exponentiated-gradient step per nat of excess loss
    counterfactual_step_size: float = 0.0  # counterfactual: its step per nat of its own slope (0: the start's mix)
    counterfactual_max_factor: float = 2.0  # counterfactual: its start moves each share by at most this factor
    job: str | None = None  # drop / settings / order: the curation job file they change; None: this file's own
    # one variant per entry: the job without that stage (kind, id "04.filter.fineweb" or [[stages]] number) or
    # without every stage of a list (["filter.gopher_quality", "filter.fineweb"])
    drop: list[str | int | list[str | int]] = field(default_factory=list)  # drop: stages left out, one variant each
    settings: dict[str, list[Any]] = field(
        default_factory=dict
    )  # settings: "<stage>.<key>" -> values, one variant each
    orders: list[str] = field(default_factory=lambda: list(ORDERS))  # order: "shuffled" (same rows), "reversed"
    eval_every: int | None = None  # held-out evaluations of every run (curves); None: steps // 10 with order, else 0
    # a finished run's checkpoints (a study keeps its results, not its models); the baseline's are always kept:
    # adaptive runs read its model, and it is the run to export or continue
    keep_checkpoints: bool = False

    def __post_init__(self) -> None:
        def check(ok: bool, key: str, value: object, allowed: str) -> None:
            if not ok:
                raise ConfigError(f"ablate.{key} = {value!r} is invalid; allowed: {allowed}")

        def one_name_each(values: list[float], key: str, names: str) -> None:
            """Each value names a run (``name_number``): two that print alike would give one name to two runs."""
            printed = sorted({name_number(x) for x in values})
            check(
                len(printed) == len(values),
                key,
                values,
                f"{key} that differ in their first 6 significant digits (each names its {names}"
                + "/".join(printed)
                + " here, and two of them would give one name)",
            )

        check(
            self.output is None or (bool(self.output.strip()) and (not is_url(self.output))),
            "output",
            self.output,
            "a local folder for the study (not a URL: its runs are written to local disk), or no key",
        )
        kinds = [self.kind] if isinstance(self.kind, str) else self.kind
        wrong = next((k for k in kinds if k not in KINDS), None) if all(isinstance(k, str) for k in kinds) else None
        close = difflib.get_close_matches(wrong.replace("-", "_"), KINDS, n=1) if wrong else []
        check(
            bool(kinds) and all(k in KINDS for k in kinds) and len(set(kinds)) == len(kinds),
            "kind",
            self.kind,
            (f"(did you mean {close[0]!r}?) " if close else "")
            + " or ".join(repr(k) for k in KINDS)
            + ", or a list of them without repeats",
        )
        check(
            all(math.isfinite(f) and f >= 0 and f != 1 for f in self.factors)
            and bool(self.factors)
            and len(set(self.factors)) == len(self.factors),
            "factors",
            self.factors,
            "finite non-negative numbers other than 1, each once",
        )
        check(
            all(f == 0 or f >= sys.float_info.min for f in self.factors),
            "factors",
            self.factors,
            f"0 or factors of at least {sys.float_info.min:g} (a smaller one scales a source's share to 0, which "
            "training refuses, or to a subnormal number, which has lost its precision)",
        )
        one_name_each(self.factors, "factors", "variants, <source>_x")
        check(len(set(self.sources)) == len(self.sources), "sources", self.sources, "source names, each once")
        check("mixes" not in kinds or bool(self.mixes), "mixes", self.mixes, "at least one mix when kind = 'mixes'")
        check(
            "mixes" in kinds or not self.mixes,
            "mixes",
            self.mixes,
            "empty unless kind includes 'mixes' (add it to ablate.kind)",
        )
        check(
            not {"leave_one_out", "weights"} <= set(kinds) or 0 not in self.factors,
            "factors",
            self.factors,
            "factors other than 0 beside kind 'leave_one_out' (a share times 0 is leaving the source out, trained once)",
        )
        check(
            len(self.shares) >= 2
            and len(set(self.shares)) == len(self.shares)
            and all(0 <= x < 1 for x in self.shares),
            "shares",
            self.shares,
            "two or more distinct replay shares in [0, 1)",
        )
        one_name_each(self.shares, "shares", "run, replay_")
        for key, readers in READ_BY.items():
            value = getattr(self, key)
            default = next(f for f in fields(self) if f.name == key).default_factory()
            check(
                value == default or bool(set(readers) & set(kinds)),
                key,
                value,
                f"no such key unless kind includes {' or '.join(map(repr, readers))}, the kinds that read it "
                f"(kind {' and '.join(map(repr, kinds))} would ignore it): remove the key, or add one of those "
                "kinds to ablate.kind",
            )
        check(
            "replay" not in kinds or len(kinds) == 1,
            "kind",
            self.kind,
            "'replay' on its own (its runs continue a base run; the other kinds vary one job)",
        )
        for name, mix in self.mixes.items():
            check(
                name not in ("", *RESERVED_NAMES)
                and all(math.isfinite(w) and w >= 0 for w in mix.values())
                and any(w > 0 for w in mix.values())
                and math.isfinite(sum(mix.values())),  # the shares are weight / sum: 1e308 twice would read as 0
                f"mixes.{name}" if name else 'mixes.""',
                mix,
                f"a non-empty name other than {', '.join(map(repr, RESERVED_NAMES))} (the study's own runs) and "
                "finite non-negative weights, one of them > 0, whose sum is finite",
            )
        check(self.steps is None or self.steps >= 1, "steps", self.steps, "an integer >= 1")
        check(self.n_mixes >= 2, "n_mixes", self.n_mixes, "an integer >= 2 (more than the sources to fit well)")
        check(self.concentration > 0, "concentration", self.concentration, "a number > 0")
        check(self.mix_steps is None or self.mix_steps >= 1, "mix_steps", self.mix_steps, "an integer >= 1")
        check(self.noise_seeds >= 1, "noise_seeds", self.noise_seeds, "an integer >= 1 (1: no extra seed)")
        check(
            1 <= self.attribution_seeds <= self.noise_seeds,
            "attribution_seeds",
            self.attribution_seeds,
            f"an integer from 1 to noise_seeds ({self.noise_seeds})",
        )
        check(self.interval in ("auto", "seeds", "run"), "interval", self.interval, "'auto', 'seeds' or 'run'")
        check(
            self.interval != "seeds" or self.attribution_seeds >= 2,
            "attribution_seeds",
            self.attribution_seeds,
            "2 or more with interval = 'seeds' (the interval is the attributed seeds' spread), or interval = 'run'",
        )
        check(self.variant_seeds >= 1, "variant_seeds", self.variant_seeds, "an integer >= 1 (1: seed only)")
        check(self.attribution_every >= 0, "attribution_every", self.attribution_every, "an integer >= 0")
        check(
            "counterfactual" not in self.adaptive_methods or self.attribution_every > 0,
            "attribution_every",
            self.attribution_every,
            "> 0 with adaptive = 'counterfactual' (that run starts from the baseline's counterfactual, which the "
            "baseline's attribution makes)",
        )
        check(self.parallel >= 1, "parallel", self.parallel, "an integer >= 1")
        check(isinstance(self.keep_checkpoints, bool), "keep_checkpoints", self.keep_checkpoints, "true or false")
        check(self.executor in ("local", "ray"), "executor", self.executor, "'local' or 'ray'")
        check(self.threads >= 0, "threads", self.threads, "an integer >= 0 (0: cores / parallel)")
        check(
            all(m in ("doremi", "counterfactual") for m in self.adaptive_methods)
            and len(set(self.adaptive_methods)) == len(self.adaptive_methods),
            "adaptive",
            self.adaptive,
            "'' (no adaptive run), 'doremi', 'counterfactual', or a list of them",
        )
        check(
            self.counterfactual_step_size >= 0,
            "counterfactual_step_size",
            self.counterfactual_step_size,
            "a number >= 0 (0: the mix the baseline's counterfactual favours, throughout)",
        )
        check(
            self.counterfactual_max_factor > 1 and math.isfinite(self.counterfactual_max_factor),
            "counterfactual_max_factor",
            self.counterfactual_max_factor,
            "a number > 1 (the largest factor the start moves a share by)",
        )
        check(
            not self.adaptive or "replay" not in kinds,
            "adaptive",
            self.adaptive,
            "'' with kind = 'replay' (the adaptive run re-mixes the job's sources)",
        )
        check(self.adaptive_every >= 1, "adaptive_every", self.adaptive_every, "an integer >= 1")
        check(self.adaptive_step_size > 0, "adaptive_step_size", self.adaptive_step_size, "a number > 0")
        for key, kind in (("drop", "drop"), ("settings", "settings")):
            given = bool(getattr(self, key))
            check(
                given == (kind in kinds),
                key,
                getattr(self, key),
                f"at least one entry when kind includes {kind!r}"
                if not given
                else f"empty unless kind includes {kind!r} (add it to ablate.kind)",
            )
        for key, values in self.settings.items():
            check(
                isinstance(values, list) and bool(values),
                f"settings.{key!r}",
                values,
                "a list of one or more values, one variant each",
            )
        check(
            bool(self.orders) and len(set(self.orders)) == len(self.orders) and all(o in ORDERS for o in self.orders),
            "orders",
            self.orders,
            " and/or ".join(repr(o) for o in ORDERS) + ", without repeats",
        )
        check(
            self.eval_every is None or self.eval_every >= 0,
            "eval_every",
            self.eval_every,
            "an integer >= 0 (0: evaluate at the end only)",
        )

    @property
    def adaptive_methods(self) -> tuple[str, ...]:
        return tuple(m for m in ([self.adaptive] if isinstance(self.adaptive, str) else self.adaptive) if m)

    @property
    def kinds(self) -> tuple[str, ...]:
        return (self.kind,) if isinstance(self.kind, str) else tuple(self.kind)

    @property
    def curates(self) -> bool:
        """Whether the study re-curates the job (it then curates the baseline too)."""
        return bool(set(CURATION_KINDS) & set(self.kinds))

    def eval_steps(self, steps: int) -> int:
        """Steps between held-out evaluations of every run: ``eval_every``, or its default for a study of ``steps``."""
        if self.eval_every is not None:
            return self.eval_every
        return max(1, steps // 10) if "order" in self.kinds else 0
