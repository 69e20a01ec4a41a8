"""Per-source attribution of what training actually did to each source's held-out loss.

Training is cut into stretches of ``every`` steps. At both ends of a stretch the held-out probe
(fixed batches per source, ``probe.py``) is evaluated, so each held-out source ``b`` has a measured
change ``ℓ_b(θ1) - ℓ_b(θ0)``. The loss change along any path is the line integral of its gradient
``h_b``; along the chord θ0 → θ1 Simpson's rule gives

    ℓ_b(θ1) - ℓ_b(θ0) ≈ w_b · (θ1 - θ0),   w_b = (h_b(θ0) + 4·h_b((θ0+θ1)/2) + h_b(θ1)) / 6

and ``θ1 - θ0`` is split exactly into what each training source's gradients moved the parameters
by through the optimizer (``split.py``: AdamW's momentum, bias correction, learning rate, clipping),
plus weight decay, router losses, momentum from before the stretches began and rounding. So

    matrix[a][b] = w_b · Δθ_a          (nats; negative = training on a lowered b's held-out loss)
    unattributed[b] = w_b · (Δθ_wd + Δθ_router + Δθ_before + rounding)
    measured[b] = Σ_a matrix[a][b] + unattributed[b] + residual[b]

where ``residual`` is the quadrature's error (curvature beyond a cubic along the chord), reported,
not hidden. Each source's gradient is its share of the step's loss (its tokens' loss over the
step's token count), taken from the trainer's own forward pass, so the parts add up to the
gradient the optimizer used. Records are cumulative over the stretches.
Shape legend: S sources.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import torch

from winnow.train.attribution import counterfactual
from winnow.train.attribution.config import AttributionConfig
from winnow.train.attribution.hooks import GradSplit, Splitter
from winnow.train.attribution.pieces import local
from winnow.train.attribution.probe import HeldoutProbe
from winnow.train.attribution.split import PARTS, MomentSplit
from winnow.train.errors import CheckpointError, ConfigError

log = logging.getLogger(__name__)


def _dots(rows: Sequence[torch.Tensor], weights: Sequence[torch.Tensor], counts: Sequence[float]) -> np.ndarray:
    """Σ over parameters of counts[p]·⟨rows[p][r], weights[p][b]⟩: (R, S) for per-parameter (R, ...) and (S, ...)
    stacks (``counts``: how much this rank's piece of each parameter counts, ``pieces.py``).

    One float32 product per parameter (blocked sums: relative error ~1e-6 on the demo's largest,
    0.5M elements), the parameters added in float64: a float64 copy of every stack cost ~0.3 s per
    stretch on the demo's 3.5M parameters x 4 sources, more than the products themselves."""
    total = np.zeros((rows[0].shape[0], weights[0].shape[0]))
    for r, w, c in zip(rows, weights, counts):
        d = (r.reshape(r.shape[0], -1).float() @ w.reshape(w.shape[0], -1).float().T).double().cpu().numpy()
        total += d if c == 1.0 else d * c
    return total


class SourceAttribution:
    """Accumulates the source x source attribution over a run, with what is measured and what is not attributed."""

    def __init__(
        self,
        cfg: AttributionConfig,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        sources: Sequence[str],
        val_data: Callable[[], Iterable],
        device: torch.device,
        parallel=None,
        micro_batch_shape: tuple[int, int] | None = None,
        autocast: Callable | None = None,
    ) -> None:
        if (
            parallel is not None
            and cfg.every
            and not isinstance(optimizer, torch.optim.AdamW)
            and (parallel.fsdp or parallel.experts or parallel.tp_layouts)
        ):
            raise ConfigError(
                "train.attribution with train.optim.name = 'lamb' and dp_shard, ep or tp > 1: LAMB's "
                "trust ratio is one scalar per whole parameter and each rank holds a piece; use "
                "train.optim.name = 'adamw'"
            )
        self.cfg, self.model, self.device = cfg, model, device
        self.sources = list(sources)
        self._val_data = val_data
        distributed = parallel is not None and parallel.world.distributed
        self._reduce = parallel.reduce_sum if distributed else None
        self._rank = parallel.world.rank if parallel is not None else 0
        # each source's losses backward through a collective (expert all-to-all) on every rank alike
        self._every_source = distributed and parallel.world.ep_size > 1
        # pipeline parallel: the probe runs through the stages, in micro-batches of the training's shape
        self._pipeline = parallel.pipeline if parallel is not None else None
        # (the stages' buffers have the training's dtype: there the probe runs under its autocast)
        self._micro_shape, self._parallel, self._autocast = micro_batch_shape, parallel, autocast
        self.split = MomentSplit(optimizer, len(self.sources), model=model, parallel=parallel, horizon=cfg.horizon)
        # the per-source split of the weight gradients, hooked onto the model from here (``hooks.py``)
        self.splitter = Splitter(model, parallel.dispatches if parallel is not None else None)
        self.pieces = self.split.pieces
        self.params = self.split.params
        self._probe: HeldoutProbe | None = None
        S = len(self.sources)
        self.total = {
            "matrix": np.zeros((S, S)),
            "unattributed": np.zeros(S),
            "measured": np.zeros(S),
            "residual": np.zeros(S),
            **{k: np.zeros(S) for k in (*PARTS, "rounding")},
        }
        self.steps_covered = 0
        self.first_step: int | None = None  # the first attributed step
        self.open_at: int | None = None  # the step a stretch began after (None: no stretch open)
        self._theta0: list[torch.Tensor] = []
        self._h0: list[torch.Tensor] = []  # per parameter (S, ...): held-out gradients at θ0
        self._loss0 = np.zeros(S)
        self._splitting = False

    # ---- the schedule ------------------------------------------------------------------------
    def begin_step(self, step: int) -> bool:
        """Before optimizer step ``step + 1``: open a stretch when one is due; True if the step is attributed."""
        if step < self.cfg.start:
            self._splitting = False
            return False
        if self.open_at is None:
            self._open(step)
        self._splitting = True
        return True

    def started(self, step: int) -> bool:
        """Whether steps up to ``step`` have been split (so the counterfactual holds something)."""
        return step >= self.cfg.start and self.split.cf_steps > 0

    def due(self, step: int) -> bool:
        """Whether the stretch closes after step ``step`` (just finished)."""
        return self.open_at is not None and step - self.open_at >= self.cfg.every

    # ---- the training side -------------------------------------------------------------------
    def micro_batch(self, source_ids_BL: torch.Tensor, *, loss_scale: float = 1.0):
        """Context for one micro-batch's forward and backward: with ``split = "tokens"`` the model's layers
        add each source's part of every weight gradient to the split (``loss_scale``: the factor the
        backward's loss carries beyond the data loss's mean, e.g. the data-parallel ``grad_scale``)."""
        if not self._splitting or self.cfg.split != "tokens":
            return contextlib.nullcontext()
        return self.splitter.active(
            GradSplit(
                source_ids_BL.to(self.device),
                len(self.sources),
                self.split.buffers(),
                scale=1.0 / loss_scale,
                written=self.split.written,
                sums=self.split.sums,
                partial=self.split.partial,
                seq_part=self.pieces.seq_part,
            )
        )

    def add_micro_batch(self, weighted_loss_BL: torch.Tensor, source_ids_BL: torch.Tensor) -> None:
        """With ``split = "losses"``: per-source gradients of one micro-batch's data loss
        (``weighted_loss_BL``: each token's loss times its loss mask over the step's token count), before
        the trainer's own backward; the graph is kept for it."""
        if not self._splitting or self.cfg.split != "losses":
            return
        present = source_ids_BL[weighted_loss_BL.detach() != 0].unique().tolist()
        if self._every_source:  # the same backwards on every rank, whichever sources its batch holds
            present = range(len(self.sources))
        inputs = self.pieces.inputs()
        for s in present:
            if not 0 <= s < len(self.sources):
                continue
            loss = (weighted_loss_BL * (source_ids_BL == s)).sum()
            self.split.add_grads(s, torch.autograd.grad(loss, inputs, retain_graph=True, allow_unused=True))

    def before_optimizer_step(self) -> None:
        if self._splitting:
            self.split.before_step()

    def after_optimizer_step(self, clip_coef: float) -> None:
        if self._splitting:
            self.split.after_step(clip_coef)
            self.steps_covered += 1

    def skip_step(self) -> None:
        """The step was not applied (non-finite or spike): its gradients moved nothing."""
        self.split.drop_step()

    # ---- stretches --------------------------------------------------------------------------
    def _evaluate(self, probe: HeldoutProbe | None = None) -> tuple[np.ndarray, list[torch.Tensor]]:
        """Each probe's mean held-out loss and, per parameter, the (probes, ...) gradients on this rank's pieces."""
        if probe is None:
            if self._probe is None:
                self._probe = HeldoutProbe(
                    self._val_data, len(self.sources), self.cfg.heldout_rows, self.device, seq_part=self.pieces.seq_part
                )
                if self._probe.missing:
                    log.warning(
                        "attribution: no held-out tokens for %s; their columns stay 0",
                        ", ".join(self.sources[s] for s in self._probe.missing),
                    )
            probe = self._probe
        if self._pipeline is not None:
            losses_S, grads = self._evaluate_staged(probe)
        else:
            losses_S, grads = probe.evaluate(self.model, self.pieces.inputs(), self.splitter)
        return losses_S.numpy(), self.pieces.heldout(grads)

    def _evaluate_staged(self, probe: HeldoutProbe):
        from winnow.train.attribution.staged import evaluate_staged

        was_training = self.model.training
        self.model.eval()  # as the one-process probe: no dropout, no router noise
        try:
            found = evaluate_staged(
                self._pipeline,
                probe.pools,
                self.pieces.inputs(),
                n_sources=probe.n_sources,
                shape=self._pipeline.shape or self._micro_shape,
                reduce_pp=self._parallel.reduce_pp,
                device=self.device,
                autocast=self._autocast,
                splitter=self.splitter,
            )
        finally:
            self.model.train(was_training)
            for p in self.params:  # the schedule's backward accumulated the probe's gradients there
                p.grad = None
        return found

    @torch.no_grad()
    def _snapshot(self) -> list[torch.Tensor]:
        return [local(p).detach().float().clone() for p in self.params]

    def _open(self, step: int) -> None:
        self.split.begin_stretch()
        self.first_step = step + 1 if self.first_step is None else self.first_step
        self._theta0 = self._snapshot()
        self._loss0, self._h0 = self._evaluate()
        self.open_at = step

    def close(self, step: int) -> dict:
        """Close the stretch after step ``step``; returns the ``metrics.jsonl`` record (cumulative) and
        opens the next stretch at the current parameters."""
        theta1 = self._snapshot()
        loss1, h1 = self._evaluate()
        with torch.no_grad():
            for p, a, b in zip(self.params, self._theta0, theta1):
                local(p).copy_((a + b) / 2)
        try:
            _, h_mid = self._evaluate()
        finally:
            with torch.no_grad():
                for p, b in zip(self.params, theta1):
                    local(p).copy_(b)
        # in place in the midpoint's gradients (needed no more): no (S, ...) temporaries per parameter
        weights = [m.mul_(4).add_(a).add_(b).div_(6) for a, m, b in zip(self._h0, h_mid, h1)]
        disp_S, parts = self.split.parts()
        pieces, S = self.pieces, len(self.sources)
        # each rank's dots over its pieces (``pieces.py``): the per-source and router parts are partial sums
        # of the ranks' own tokens, the rest whole on each copy (stacked: one product per parameter); one
        # all-reduce adds them up
        partial = np.concatenate(
            [
                _dots(disp_S, weights, pieces.partial_w),
                _dots([d[None] for d in parts["router"]], weights, pieces.partial_w),
            ]
        )
        whole = _dots(
            [
                torch.stack(per)
                for per in zip(
                    [b - a for a, b in zip(self._theta0, theta1)], parts["weight_decay"], parts["momentum_before"]
                )
            ],
            weights,
            pieces.global_w,
        )
        summed = pieces.sum(torch.from_numpy(np.concatenate([partial, whole])).to(self.device)).cpu().numpy()
        matrix, router, (total, decay, before) = summed[:S], summed[S], summed[S + 1 :]
        interval = {
            "matrix": matrix,
            "router": router,
            "measured": loss1 - self._loss0,
            "weight_decay": decay,
            "momentum_before": before,
        }
        interval["rounding"] = total - matrix.sum(0) - router - interval["weight_decay"] - interval["momentum_before"]
        interval["unattributed"] = total - matrix.sum(0)
        interval["residual"] = interval["measured"] - total
        for key, value in interval.items():
            self.total[key] += value
        record = self._record(step, interval)
        self._theta0, self._h0, self._loss0 = theta1, h1, loss1
        self.split.begin_stretch()
        self.open_at = step
        return record

    # ---- the counterfactual ------------------------------------------------------------------
    def counterfactual(self, step: int) -> dict | None:
        """The ``{"step", "counterfactual"}`` record at the current parameters (``counterfactual.py``), read with a
        probe of ``counterfactual_rows`` held-out rows per source in groups; None before any attributed stretch."""
        if self.first_step is None or not self.split.cf_steps:
            return None
        S, G = len(self.sources), counterfactual.GROUPS
        big = HeldoutProbe(self._val_data, S, self.cfg.counterfactual_rows, self.device, seq_part=self.pieces.seq_part)
        grouped = big.grouped(G)
        _, grads = self._evaluate(grouped)
        for p in self.params:  # the probe's backward may leave gradients on the parameters (pipeline schedule)
            p.grad = None
        halves = [c.reshape(2 * S, *c.shape[2:]) for c in self.split.counterfactual()]  # (odd | even steps) x S
        dots = self.pieces.sum(torch.from_numpy(_dots(halves, grads, self.pieces.partial_w)).to(self.device))
        present = [
            b for b in range(S) if big.pools[b] and (not self.cfg.held_out or self.sources[b] in self.cfg.held_out)
        ]
        dots = dots.cpu().numpy().reshape(2, S, S, G)[:, :, present]
        has = np.array([[bool(grouped.pools[b * G + g]) for g in range(G)] for b in present]).reshape(len(present), G)
        slope, error, probe_error = counterfactual.slope_and_error(dots, has)
        cf = counterfactual.record(
            sources=self.sources,
            held_out=[self.sources[b] for b in present],
            slope_SB=slope,
            error_SB=error,
            probe_error_SB=probe_error,
            factors=self.cfg.factors,
            saturation=self.cfg.saturation,
            steps=(self.first_step, step),
            horizon=self.cfg.horizon,
            rows=self.cfg.counterfactual_rows,
        )
        return {"step": step, "counterfactual": cf}

    def slope(self) -> tuple[np.ndarray | None, list[str]]:
        """Each source's counterfactual slope (S, B) at the current parameters, read with the stretches' probe,
        summed over the ranks (the same on every rank), and the held-out sets it covers; None before any split step."""
        if not self.split.cf_steps:
            return None, []
        _, grads = self._evaluate()
        for p in self.params:
            p.grad = None
        S = len(self.sources)
        whole = [c.sum(0) for c in self.split.counterfactual()]
        dots = self.pieces.sum(torch.from_numpy(_dots(whole, grads, self.pieces.partial_w)).to(self.device))
        present = [b for b in range(S) if self._probe.pools[b]]
        return dots.cpu().numpy()[:, present], [self.sources[b] for b in present]

    def _record(self, step: int, interval: dict) -> dict:
        t = self.total
        measured = t["measured"]
        explained = np.where(np.abs(measured) > 0, t["matrix"].sum(0) / np.where(measured == 0, 1, measured), np.nan)
        attribution = {
            "sources": self.sources,
            "matrix": t["matrix"].tolist(),
            "unattributed": t["unattributed"].tolist(),
            "measured": measured.tolist(),
            "residual": t["residual"].tolist(),
            "unattributed_parts": {k: t[k].tolist() for k in (*PARTS, "rounding")},
            "attributed_share": [None if np.isnan(x) else float(x) for x in explained],
            "diagonal": np.diag(t["matrix"]).tolist(),
            "row_sums": t["matrix"].sum(axis=1).tolist(),
            "steps": [self.first_step, step],
            "steps_covered": self.steps_covered,
            "quadrature": "simpson",
            "interval": {
                "steps": [self.open_at + 1, step],
                "matrix": interval["matrix"].tolist(),
                "unattributed": interval["unattributed"].tolist(),
                "measured": interval["measured"].tolist(),
                "residual": interval["residual"].tolist(),
            },
        }
        log.info(
            "attribution at step %d: measured held-out change %s, attributed %s, residual %s",
            step,
            np.round(measured, 4).tolist(),
            np.round(t["matrix"].sum(0), 4).tolist(),
            np.round(t["residual"], 4).tolist(),
        )
        return {"step": step, "attribution": attribution}

    # ---- checkpoints -----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything but the probe's batches (read again from the held-out split on resume).

        When ranks hold pieces of the parameters (FSDP2, expert or tensor parallel) the open stretch's
        pieces stay out: the totals (the same on every rank) are kept, and a resumed run opens a new
        stretch at its first step, the momentum it resumes with reported as ``momentum_before``."""
        state = {
            "sources": self.sources,
            "total": {k: v.tolist() for k, v in self.total.items()},
            "steps_covered": self.steps_covered,
            "first_step": self.first_step,
            "open_at": None,
        }
        if self.pieces.whole:
            state.update(
                open_at=self.open_at,
                theta0=[t.cpu() for t in self._theta0],
                h0=[h.cpu() for h in self._h0],
                loss0=self._loss0.tolist(),
                split=self.split.state_dict(self._reduce),
            )
        return state

    def load_state_dict(self, state: dict) -> None:
        if list(state["sources"]) != self.sources:
            raise CheckpointError(f"attribution state has sources {state['sources']}, this run has {self.sources}")
        self.total = {k: np.asarray(v, dtype=np.float64) for k, v in state["total"].items()}
        self.steps_covered = int(state["steps_covered"])
        self.first_step = state["first_step"]
        if state["open_at"] is None or not self.pieces.whole:  # no open stretch to continue: the next step opens one
            self.open_at = None
            return
        self.open_at = state["open_at"]
        self._theta0 = [t.to(self.device) for t in state["theta0"]]
        self._h0 = [h.to(self.device) for h in state["h0"]]
        self._loss0 = np.asarray(state["loss0"], dtype=np.float64)
        self.split.load_state_dict(state["split"], rank=self._rank)
