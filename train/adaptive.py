"""Adaptive mixing (``[train.mixing]``): the training mix reweighted during the run.

Two methods. ``"doremi"``: online, by each source's excess loss against a reference run.
``"counterfactual"``: from a finished run's counterfactual (``train/attribution/counterfactual.py``,
its record in the reference's ``metrics.jsonl``): the run starts at the mix its slopes favour for
the ``target`` held-out loss, every source's share moved by at most ``max_factor``, and then follows
its own counterfactual (``[train.attribution]`` on), a step of ``step_size`` per nat of slope every
``every`` steps.

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

import torch

from winnow.train.config import MixingConfig  # noqa: F401 (defined there: no torch)
from winnow.train.errors import CheckpointError, ConfigError
from winnow.train.hooks import TrainHook
from winnow.train.model import cross_entropy_per_token


class _Mix(TrainHook):
    """What both adaptive mixes share: weights over the training sets, one source each, moved by a per-set signal
    (``signal``: the attribute, state key and, as ``signal_report``, report key it is kept under)."""

    name = "mixing"
    method = ""
    signal = ""
    signal_report = ""

    def _start(self, set_sources: list[int], weights: list[float]) -> None:
        self.set_sources = torch.tensor(set_sources, dtype=torch.long)
        w = torch.tensor(weights, dtype=torch.float64)
        self.weights = w / w.sum()
        setattr(self, self.signal, torch.zeros(len(set_sources), dtype=torch.float64))  # per set, last measured
        self.weight_sum = torch.zeros(len(set_sources), dtype=torch.float64)  # over the updates: their mean
        self.updates = 0

    def _move(self, logits: torch.Tensor) -> list[float]:
        """``softmax(logits)`` mixed with ``smoothing`` of the uniform mix become the weights; returns them."""
        alpha = torch.softmax(logits, dim=0)
        self.weights = (1 - self.cfg.smoothing) * alpha + self.cfg.smoothing / len(alpha)
        self.weight_sum += self.weights
        self.updates += 1
        return self.weights.tolist()

    def report(self) -> dict:
        """The current weights, their mean over the updates and the signal, by source name."""
        by_name = [self.names[int(i)] for i in self.set_sources]
        mean = self.weight_sum / self.updates if self.updates else self.weights
        return {
            "mix_weights": dict(zip(by_name, self.weights.tolist())),
            "mix_weights_mean": dict(zip(by_name, mean.tolist())),
            self.signal_report: dict(zip(by_name, getattr(self, self.signal).tolist())),
        }

    def state_dict(self) -> dict:
        return {
            "weights": self.weights.tolist(),
            self.signal: getattr(self, self.signal).tolist(),
            "weight_sum": self.weight_sum.tolist(),
            "updates": self.updates,
            "set_sources": self.set_sources.tolist(),
            "method": self.method,
        }

    def _restore(self, state: dict) -> None:
        self.weights = torch.tensor(state["weights"], dtype=torch.float64)
        setattr(self, self.signal, torch.tensor(state[self.signal], dtype=torch.float64))
        self.weight_sum = torch.tensor(state["weight_sum"], dtype=torch.float64)
        self.updates = int(state["updates"])


class AdaptiveMix(_Mix):
    """DoReMi-style weights over the training sets, one source each: a trainer hook (``train.hooks``).

    ``set_sources[i]`` is the source id set ``i`` holds; ``weights`` the starting mix (one per set).
    On a step ``due`` says is an update step, ``add`` takes each micro-batch's losses, then ``update``
    (once the step is applied; ``discard`` when it is skipped) moves the weights and ``data`` (the
    loader, ``reweight``) draws the next batches by them; ``reduce`` sums over the data-parallel ranks.
    ``names`` are the run's source names, by id (for ``report``).
    """

    inputs = True  # a pipeline's last stage scores the micro-batch's tokens
    method, signal, signal_report = "doremi", "excess", "excess_loss"

    def __init__(
        self,
        cfg: MixingConfig,
        *,
        reference: torch.nn.Module,
        set_sources: list[int],
        weights: list[float],
        n_sources: int,
        device: torch.device,
        data=None,
        names: list[str] | None = None,
        reduce=lambda t: t,
    ) -> None:
        if len(set(set_sources)) != len(set_sources) or len(weights) != len(set_sources):
            raise ConfigError(
                "train.mixing.adaptive: each training set must hold exactly one source, a different one "
                f"each (set sources {set_sources}); give [train] shards as one table with per-source "
                "weights, e.g. shards = [{path = 'out/job', sources = {a = 1, b = 1}}]"
            )
        self.cfg, self.device = cfg, device
        # the model that scores; None on a pipeline stage that never scores (the trainer drops it there)
        self.reference: torch.nn.Module | None = reference.eval()
        self._start(set_sources, weights)  # self.excess: each set's last measured excess loss
        self._sums = torch.zeros(2, n_sources, dtype=torch.float64, device=device)  # (excess, tokens) per source id
        self.data, self.names, self.reduce = data, names or [str(i) for i in range(n_sources)], reduce
        self._due = False

    def due(self, step: int) -> bool:
        """Whether the step after ``step`` updates the weights."""
        return (step + 1) % self.cfg.every == 0

    # ---- the hook --------------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        self._due = self.due(step)

    def loss(
        self, batch, logits_BLV: torch.Tensor, loss_BL: torch.Tensor, plain_BL: torch.Tensor, n_tokens: int
    ) -> torch.Tensor:
        if self._due:  # the plain cross-entropy, comparable with the reference's
            self.add(plain_BL, batch.tokens, batch.doc_ids, batch.targets, batch.source_ids, batch.loss_mask)
        return loss_BL

    def end_step(self, applied: bool, clip_coef: float) -> None:
        if not self._due:
            return
        if applied:  # the next batches are drawn by the new weights
            self.data.reweight(self.update(self.reduce))
        else:
            self.discard()

    @torch.no_grad()
    def add(
        self,
        loss_BL: torch.Tensor,
        tokens_BL: torch.Tensor,
        doc_ids_BL: torch.Tensor | None,
        targets_BL: torch.Tensor,
        source_ids_BL: torch.Tensor,
        loss_mask_BL: torch.Tensor,
    ) -> None:
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
        return self._move(self.weights.log() + self.cfg.step_size * self.excess)

    def discard(self) -> None:
        """The step was skipped: forget what its batch measured."""
        self._sums.zero_()

    def load_state_dict(self, state: dict | None) -> None:
        if not state:
            raise CheckpointError(
                "the checkpoint was trained without [train.mixing] adaptive; resume without it, "
                "or start a new run (another output)"
            )
        if state.get("method", "doremi") != "doremi":
            raise CheckpointError(
                f"the checkpoint's adaptive mix is {state['method']!r}, this run's 'doremi'; resume "
                "with the same [train.mixing]"
            )
        if state["set_sources"] != self.set_sources.tolist():
            raise CheckpointError(
                f"the checkpoint's adaptive mix is over sources {state['set_sources']}, this run's over "
                f"{self.set_sources.tolist()}; resume with the same [train] shards"
            )
        self._restore(state)


def proposal(
    slope_SB, held_out: list[str], sources: list[str], weights: dict[str, float], *, target: str, max_factor: float
) -> dict[str, float]:
    """The mix a run's counterfactual favours for ``target``: each source's log-share moved against its slope
    (the slopes sum to about 0, so only their differences count), the largest move ``ln max_factor``, within the
    range of factors the first-order prediction is checked over; sources without a weight keep none."""
    column = [h for h in held_out if h != "mean"]
    slope = torch.as_tensor(slope_SB, dtype=torch.float64)
    g = slope[:, [held_out.index(h) for h in column]].mean(1) if target == "mean" else slope[:, held_out.index(target)]
    names = [s for s in sources if weights.get(s, 0) > 0]
    g = g[[sources.index(s) for s in names]]
    centred = g - g.mean()
    top = float(centred.abs().max())
    step = -centred / top * math.log(max_factor) if top > 0 else torch.zeros_like(centred)
    w = torch.tensor([weights[s] for s in names], dtype=torch.float64) * step.exp()
    return dict(zip(names, (w / w.sum()).tolist()))


class CounterfactualMix(_Mix):
    """Weights over the training sets, one source each, from the counterfactual: a trainer hook (``train.hooks``).

    ``weights`` is the start (``proposal`` of the reference run's counterfactual). Every ``every`` steps once
    attribution has started (``attach``: the run's ``SourceAttribution``), the slope of the target at the
    current parameters (its probe, summed over the ranks: the same on every rank) moves the log-weights,
    ``alpha <- softmax(log alpha - step_size · slope)``, mixed with ``smoothing`` of the uniform mix, and the
    loader draws the next sequences by them.
    """

    method, signal, signal_report = "counterfactual", "slope", "mix_slope"

    def __init__(
        self,
        cfg: MixingConfig,
        *,
        set_sources: list[int],
        weights: list[float],
        data=None,
        names: list[str] | None = None,
    ) -> None:
        if len(set(set_sources)) != len(set_sources) or len(weights) != len(set_sources):
            raise ConfigError(
                "train.mixing.adaptive = 'counterfactual': each training set must hold exactly one "
                f"source, a different one each (set sources {set_sources})"
            )
        self.cfg, self.data = cfg, data
        self.names = names or [str(i) for i in range(max(set_sources) + 1)]
        self._start(set_sources, weights)  # self.slope: the target's slope per set, last read
        self.attribution = None
        self._due = False

    def attach(self, attribution) -> None:
        """The attribution component whose counterfactual the weights follow (the run's own)."""
        if attribution is None and self.cfg.step_size > 0:
            raise ConfigError(
                "train.mixing.adaptive = 'counterfactual' with step_size > 0 follows the run's own "
                "counterfactual: turn on [train.attribution] (every = 10, say), or set step_size = 0 "
                "to train at the reference's mix throughout"
            )
        if attribution is not None and self.cfg.target != "mean" and self.cfg.target not in attribution.sources:
            raise ConfigError(
                f"train.mixing.target = {self.cfg.target!r} is invalid; allowed: 'mean' or a held-out "
                f"set of this run ({sorted(attribution.sources)})"
            )
        self.attribution = attribution

    def begin_step(self, step: int) -> None:
        self._due = (
            self.cfg.step_size > 0
            and self.attribution is not None
            and (step + 1) % self.cfg.every == 0
            and self.attribution.started(step)
        )

    def end_step(self, applied: bool, clip_coef: float) -> None:
        if self._due and applied:  # the next batches are drawn by the new weights
            self.data.reweight(self.update())

    def update(self) -> list[float]:
        """Read the slope at the current parameters and move the weights; returns them."""
        slope_SB, held_out = self.attribution.slope()
        target = None
        if slope_SB is not None and self.cfg.target == "mean":
            target = slope_SB.mean(1)
        elif slope_SB is not None and self.cfg.target in held_out:
            target = slope_SB[:, held_out.index(self.cfg.target)]
        if target is None:  # no split step yet, or no probe rows of the target: nothing to follow
            return self.weights.tolist()
        self.slope = torch.as_tensor(target, dtype=torch.float64)[self.set_sources]
        return self._move(self.weights.log() - self.cfg.step_size * self.slope)

    def load_state_dict(self, state: dict | None) -> None:
        if not state or state.get("method") != "counterfactual" or state["set_sources"] != self.set_sources.tolist():
            raise CheckpointError(
                "the checkpoint's adaptive mix is not this run's (counterfactual, sources "
                f"{self.set_sources.tolist()}); resume with the same [train.mixing] and shards"
            )
        self._restore(state)
