"""Adaptive mixing (``[train.mixing]``): the training mix reweighted online during the run.

Two methods. ``"doremi"``: by each source's excess loss against a reference run. ``"counterfactual"``:
along the run's own counterfactual, the predicted change of held-out loss per unit of log-share
(``train/attribution/counterfactual.py``), toward the sources whose larger share would lower the
held-out loss most; it needs no reference run, only ``[train.attribution]``.

``"doremi"``:

After DoReMi (Xie et al. 2023, https://arxiv.org/abs/2305.10429, Algorithm 1), applied online to
the run's own sampling weights instead of to a proxy model's loss. Every ``every`` steps the
step's batch is also scored by a reference model (a finished run, typically trained on the
baseline mix: ``reference``). A source's excess loss is the mean over its tokens in that batch
of ``max(loss - reference loss, 0)``: what the model could still learn of it. The weights take
an exponentiated-gradient step toward the sources with the most excess,

    alpha <- normalize(alpha * exp(step_size * excess));  alpha <- (1 - smoothing) alpha + smoothing / k

and the loader draws the next sequences by them (``MixSchedule.reweight``). The excess is summed
over the data-parallel ranks first, so every rank moves to the same weights at the same step and
the global batch order stays one. A source absent from an update's batch keeps its last excess
(a zero would shrink a source only because it was already rare). The run logs the weights at
every log step (``mix_weights``) and DoReMi's output mix, their mean over the updates
(``mix_weights_mean``), and resumes them exactly from a checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from train.errors import CheckpointError, ConfigError
from train.model import cross_entropy_per_token

METHODS = ("doremi", "counterfactual")


@dataclass(kw_only=True, slots=True)
class MixingConfig:
    """The ``[train.mixing]`` table: reweight the training sources during the run (off by default)."""

    # "doremi": excess loss against `reference`; "counterfactual": down the run's predicted held-out loss (needs
    # [train.attribution]); "": the configured weights throughout
    adaptive: Literal["", "doremi", "counterfactual"] = ""
    reference: str | None = None  # doremi: a finished run folder (its newest checkpoint) or one checkpoint folder
    every: int = 5  # steps between updates (doremi: one more forward of the step's batch; counterfactual: the probe's)
    # how far one update moves the log-weights: per nat of excess (doremi), per nat of predicted held-out loss per
    # unit of log-share (counterfactual)
    step_size: float = 1.0
    smoothing: float = 1e-3  # DoReMi's c: the share of the uniform mix kept in the weights (no source starves)
    target: str = "mean"  # counterfactual: the held-out loss it lowers: "mean" over the held-out sets, or one set's

    def __post_init__(self) -> None:
        def check(ok: bool, key: str, value: object, allowed: str) -> None:
            if not ok:
                raise ConfigError(f"train.mixing.{key} = {value!r} is invalid; allowed: {allowed}")

        check(self.adaptive in ("",) + METHODS, "adaptive", self.adaptive, "'' (off) or " + ", ".join(map(repr, METHODS)))
        check(self.adaptive != "doremi" or bool(self.reference), "reference", self.reference,
              "a finished run folder or checkpoint (the model the excess loss is measured against)")
        check(isinstance(self.target, str) and bool(self.target), "target", self.target,
              "'mean' or the name of a held-out set")
        check(isinstance(self.every, int) and self.every >= 1, "every", self.every, "an integer >= 1")
        check(self.step_size > 0 and math.isfinite(self.step_size), "step_size", self.step_size, "a number > 0")
        check(0 <= self.smoothing < 1, "smoothing", self.smoothing, "0 <= value < 1")

    @property
    def active(self) -> bool:
        return bool(self.adaptive)


class AdaptiveMix:
    """DoReMi-style weights over the training sets, one source each.

    ``set_sources[i]`` is the source id set ``i`` holds; ``weights`` the starting mix (one per set).
    Call ``add`` on the micro-batches of a step ``due`` says is an update step, then ``update``
    once the step is taken (``discard`` when it is skipped); ``update`` returns the new weights.
    """

    def __init__(self, cfg: MixingConfig, *, reference: torch.nn.Module, set_sources: list[int], weights: list[float],
                 n_sources: int, device: torch.device) -> None:
        if len(set(set_sources)) != len(set_sources) or len(weights) != len(set_sources):
            raise ConfigError("train.mixing.adaptive: each training set must hold exactly one source, a different one "
                              f"each (set sources {set_sources}); give [train] shards as one table with per-source "
                              "weights, e.g. shards = [{path = 'out/job', sources = {a = 1, b = 1}}]")
        self.cfg, self.device = cfg, device
        # the model that scores; None on a pipeline stage that never scores (the trainer drops it there)
        self.reference: torch.nn.Module | None = reference.eval()
        self.set_sources = torch.tensor(set_sources, dtype=torch.long)
        w = torch.tensor(weights, dtype=torch.float64)
        self.weights = w / w.sum()
        self.excess = torch.zeros(len(set_sources), dtype=torch.float64)  # each set's last measured excess
        self.weight_sum = torch.zeros(len(set_sources), dtype=torch.float64)  # over the updates: their mean
        self.updates = 0
        self._sums = torch.zeros(2, n_sources, dtype=torch.float64, device=device)  # (excess, tokens) per source id

    def due(self, step: int) -> bool:
        """Whether the step after ``step`` updates the weights."""
        return (step + 1) % self.cfg.every == 0

    @torch.no_grad()
    def add(self, loss_BL: torch.Tensor, tokens_BL: torch.Tensor, doc_ids_BL: torch.Tensor | None,
            targets_BL: torch.Tensor, source_ids_BL: torch.Tensor, loss_mask_BL: torch.Tensor) -> None:
        """One micro-batch: the model's per-token loss ``loss_BL`` against the reference's on the same tokens."""
        reference_BL = cross_entropy_per_token(self.reference(tokens_BL, doc_ids_BL).logits_BLV.float(), targets_BL)
        excess_BL = (loss_BL.detach().float() - reference_BL).clamp_min(0) * loss_mask_BL
        ids = source_ids_BL.clamp_min(0).reshape(-1)
        keep = ((source_ids_BL >= 0) & loss_mask_BL.bool()).reshape(-1).double()
        self._sums[0].index_add_(0, ids, excess_BL.reshape(-1).double() * keep)
        self._sums[1].index_add_(0, ids, keep)

    def update(self, reduce=lambda t: t) -> list[float]:
        """The step was taken: move the weights (``reduce`` sums over data-parallel ranks); returns them."""
        sums = reduce(self._sums).cpu()[:, self.set_sources]
        self._sums.zero_()
        seen = sums[1] > 0
        self.excess[seen] = sums[0][seen] / sums[1][seen]
        logits = self.weights.log() + self.cfg.step_size * self.excess
        alpha = torch.softmax(logits, dim=0)
        self.weights = (1 - self.cfg.smoothing) * alpha + self.cfg.smoothing / len(alpha)
        self.weight_sum += self.weights
        self.updates += 1
        return self.weights.tolist()

    def discard(self) -> None:
        """The step was skipped: forget what its batch measured."""
        self._sums.zero_()

    def report(self, names: list[str]) -> dict:
        """The current weights and their mean over the updates, by source name."""
        by_name = [names[int(i)] for i in self.set_sources]
        mean = self.weight_sum / self.updates if self.updates else self.weights
        return {"mix_weights": dict(zip(by_name, self.weights.tolist())),
                "mix_weights_mean": dict(zip(by_name, mean.tolist())),
                "excess_loss": dict(zip(by_name, self.excess.tolist()))}

    def state_dict(self) -> dict:
        return {"weights": self.weights.tolist(), "excess": self.excess.tolist(), "weight_sum": self.weight_sum.tolist(),
                "updates": self.updates, "set_sources": self.set_sources.tolist(), "method": "doremi"}

    def load_state_dict(self, state: dict) -> None:
        if state.get("method", "doremi") != "doremi":
            raise CheckpointError(f"the checkpoint's adaptive mix is {state['method']!r}, this run's 'doremi'; resume "
                                  "with the same [train.mixing]")
        if state["set_sources"] != self.set_sources.tolist():
            raise CheckpointError(f"the checkpoint's adaptive mix is over sources {state['set_sources']}, this run's over "
                                  f"{self.set_sources.tolist()}; resume with the same [train] shards")
        self.weights = torch.tensor(state["weights"], dtype=torch.float64)
        self.excess = torch.tensor(state["excess"], dtype=torch.float64)
        self.weight_sum = torch.tensor(state["weight_sum"], dtype=torch.float64)
        self.updates = int(state["updates"])


class CounterfactualMix:
    """Weights over the training sets, one source each, moved down the run's own counterfactual.

    Every ``every`` steps (once attribution has started) the attribution component reads each source's slope
    (the derivative of every held-out loss by the source's log-share, ``SourceAttribution.slope``: one pass of
    its probe, summed over the ranks, so every rank takes the same step) and the log-weights take a step down
    the target's slope, ``alpha <- softmax(log alpha - step_size · slope)``, mixed with ``smoothing`` of the
    uniform mix; the loader draws the next sequences by them. The same interface as ``AdaptiveMix``.
    """

    reference = None  # nothing to score the batch with: the probe is the attribution's

    def __init__(self, cfg: MixingConfig, *, set_sources: list[int], weights: list[float], names: list[str]) -> None:
        if len(set(set_sources)) != len(set_sources) or len(weights) != len(set_sources):
            raise ConfigError("train.mixing.adaptive = 'counterfactual': each training set must hold exactly one "
                              f"source, a different one each (set sources {set_sources})")
        self.cfg, self.names = cfg, list(names)
        self.set_sources = torch.tensor(set_sources, dtype=torch.long)
        w = torch.tensor(weights, dtype=torch.float64)
        self.weights = w / w.sum()
        self.slope = torch.zeros(len(set_sources), dtype=torch.float64)  # the target's slope per set, last read
        self.weight_sum = torch.zeros(len(set_sources), dtype=torch.float64)
        self.updates = 0
        self.attribution = None  # the trainer's SourceAttribution (``attach``)

    def attach(self, attribution) -> None:
        """The attribution component whose counterfactual the weights follow (the trainer's)."""
        if attribution is None:
            raise ConfigError("train.mixing.adaptive = 'counterfactual' follows the run's counterfactual: turn on "
                              "[train.attribution] (every = 10, say), with held-out data")
        held_out = attribution.sources
        if self.cfg.target != "mean" and self.cfg.target not in held_out:
            raise ConfigError(f"train.mixing.target = {self.cfg.target!r} is invalid; allowed: 'mean' or a held-out "
                              f"set of this run ({sorted(held_out)})")
        self.attribution = attribution

    def due(self, step: int) -> bool:
        return (step + 1) % self.cfg.every == 0 and self.attribution is not None and self.attribution.started(step)

    def add(self, *args) -> None:
        """Nothing to score per micro-batch: the update reads the probe."""

    def update(self, reduce=lambda t: t) -> list[float]:
        """The step was taken: read the slope and move the weights; returns them."""
        slope_SB, held_out = self.attribution.slope()
        if slope_SB is None:  # no attributed step yet
            return self.weights.tolist()
        if self.cfg.target == "mean":
            target = slope_SB.mean(1)
        else:
            target = slope_SB[:, held_out.index(self.cfg.target)] if self.cfg.target in held_out else None
        if target is None:  # the target set has no probe rows: nothing to follow
            return self.weights.tolist()
        self.slope = torch.as_tensor(target, dtype=torch.float64)[self.set_sources]
        logits = self.weights.log() - self.cfg.step_size * self.slope
        alpha = torch.softmax(logits, dim=0)
        self.weights = (1 - self.cfg.smoothing) * alpha + self.cfg.smoothing / len(alpha)
        self.weight_sum += self.weights
        self.updates += 1
        return self.weights.tolist()

    def discard(self) -> None:
        """The step was skipped: the next due step reads the slope again."""

    def report(self, names: list[str]) -> dict:
        by_name = [names[int(i)] for i in self.set_sources]
        mean = self.weight_sum / self.updates if self.updates else self.weights
        return {"mix_weights": dict(zip(by_name, self.weights.tolist())),
                "mix_weights_mean": dict(zip(by_name, mean.tolist())),
                "mix_slope": dict(zip(by_name, self.slope.tolist()))}

    def state_dict(self) -> dict:
        return {"weights": self.weights.tolist(), "slope": self.slope.tolist(), "weight_sum": self.weight_sum.tolist(),
                "updates": self.updates, "set_sources": self.set_sources.tolist(), "method": "counterfactual"}

    def load_state_dict(self, state: dict) -> None:
        if state.get("method") != "counterfactual" or state["set_sources"] != self.set_sources.tolist():
            raise CheckpointError(f"the checkpoint's adaptive mix ({state.get('method', 'doremi')}, sources "
                                  f"{state['set_sources']}) is not this run's (counterfactual, sources "
                                  f"{self.set_sources.tolist()}); resume with the same [train.mixing] and shards")
        self.weights = torch.tensor(state["weights"], dtype=torch.float64)
        self.slope = torch.tensor(state["slope"], dtype=torch.float64)
        self.weight_sum = torch.tensor(state["weight_sum"], dtype=torch.float64)
        self.updates = int(state["updates"])
