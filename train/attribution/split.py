"""The optimizer's actual update, split exactly into the part each training source caused.

AdamW's first moment is linear in the gradients it has seen, ``m_t = β1·m_{t-1} + (1-β1)·c_t·g_t``
with ``c_t`` the step's clipping factor, and the step it applies is ``-lr_t/(1-β1^t) · m_t / d_t``
with ``d_t = sqrt(v_t/(1-β2^t)) + eps`` the same for every part. So with ``g_t = Σ_a g_{a,t} + r_t``
(``r``: router losses, and whatever else the data loss does not explain) a first moment per source,
``m_{a,t}``, sharing the optimizer's second moment, splits each step exactly:

    Δθ_t = Σ_a -lr_t/(1-β1^t)·m_{a,t}/d_t        (training on source a)
         + -lr_t/(1-β1^t)·m_{r,t}/d_t             (router losses)
         + -lr_t/(1-β1^t)·β1^k·m_before/d_t       (momentum carried from steps before the stretch began)
         + -lr_t·wd·θ_{t-1}                       (decoupled weight decay)

LAMB multiplies each tensor's Adam update (weight decay included) by a trust ratio, one scalar per
tensor and step, so the same parts scaled by it split LAMB's step as exactly. The displacement of
each part is summed over a stretch of steps; what the formulas miss (floating-point rounding) is
the difference to the parameters' real change and is reported, never folded into a part.
Under data parallelism each rank's source and router parts come from its own gradients: partial
sums, linear, added over the ranks by the caller; weight decay and the carried momentum are global.
Each rank keeps the moments of the pieces it holds (``pieces.py``: FSDP2 shards, its experts, its
tensor-parallel slices); an FSDP2 shard's per-source gradients are summed over the ranks first.
Shape legend: S sources.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from winnow.train.attribution.pieces import Pieces, local
from winnow.train.errors import ConfigError

PARTS = ("weight_decay", "router", "momentum_before")  # the unattributed rows, besides rounding
_TINY = torch.finfo(torch.float32).tiny


def _largest(tensors: Sequence[torch.Tensor]) -> float:
    """The largest magnitude in any of ``tensors`` (0 for none)."""
    return max((float(t.abs().max()) for t in tensors if t.numel()), default=0.0)


class MomentSplit:
    """Per-source first moments and per-part displacements of one optimizer's parameters."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        n_sources: int,
        *,
        pieces=None,
        model=None,
        parallel=None,
        horizon: float | None = None,
    ) -> None:
        self.optimizer, self.S = optimizer, n_sources
        self.params: list[torch.Tensor] = []
        self._group: list[int] = []  # index into param_groups: loading optimizer state replaces the group dicts
        for gi, group in enumerate(optimizer.param_groups):
            if "betas" not in group:
                raise ConfigError(
                    f"train.attribution needs an Adam-family optimizer; {type(optimizer).__name__} "
                    "has no first moment to split"
                )
            for p in group["params"]:
                self.params.append(p)
                self._group.append(gi)
        self.lamb = not isinstance(optimizer, torch.optim.AdamW)
        self.pieces = pieces if pieces is not None else Pieces(self.params, model=model, parallel=parallel)
        S = n_sources
        z = self._zeros
        # this step's per-source gradients, summed over its micro-batches, at the size the forward uses
        self.grad_S = [
            torch.zeros(S, *shape, dtype=torch.float32, device=p.device)
            for p, shape in zip(self.params, self.pieces.full_shapes())
        ]
        self._keys: list[int] | None = None  # what the model's split knows each parameter by (made on first use)
        self.written: set[int] = set()  # keys of the parameters whose grad_S holds this step's parts (others: 0)
        self.sums: dict[int, torch.Tensor] = {}  # by key: Σ_s grad_S[s], where the backward took it (``GradSplit``)
        self.partial: set[int] = set()  # keys whose gradient this step had rows of no source (``GradSplit``)
        # per parameter: whether all of its gradient came through the sources' parts when last checked (None:
        # check this step), so its router part is rounding and is not formed; and whether m_router is nonzero
        self._captured: list[bool | None] = [None] * len(self.params)
        self._router_live = [False] * len(self.params)
        self._by_key: dict[int, torch.Tensor] | None = None  # the buffers by key (``buffers()``)
        self._tmp: dict[int, tuple[torch.Tensor, ...]] = {}  # per parameter: three scratch tensors
        self.m_S, self.disp_S = z(S), z(S)  # per-source first moment; displacement since the stretch began
        self.m_router, self.disp_router = z(), z()
        self.m_before, self.disp_before = z(), z()
        self.disp_wd = z()
        # the counterfactual (module docstring): each source's part of the second moment, and the step's derivative
        # by each source's share summed with decaying weights, odd and even steps apart (their difference is what
        # the batches' draw adds); kept as cf_S / cf_scale so a step's decay is one scalar, not a pass over the
        # buffers (folded in before the scale would underflow)
        self.horizon = horizon
        self.v_S, self.cf_S = (z(S), z(2, S)) if horizon else ([], [])
        self.cf_scale = 1.0
        self.v_scale = 1.0  # v_S is kept divided by β2^(steps): its decay is a scalar too
        self.cf_steps = 0  # steps summed into cf_S
        self.cf_log = 0.0  # ln of the decay so far: a step summed at cf_log = x weighs exp(x_now - x) now
        self._old: list[torch.Tensor] | None = None  # LAMB: the parameters before the step
        self._steps: list[float] = []
        self.started = False  # whether the moments have been split since the optimizer's first attributed step
        self._before = False  # whether any momentum from before the first stretch is carried (else skip its rows)

    @property
    def _hyper(self) -> list[dict]:
        groups = self.optimizer.param_groups
        return [groups[gi] for gi in self._group]

    def _zeros(self, *lead: int) -> list[torch.Tensor]:
        """Per parameter a zero (*lead, *piece) buffer: this rank's piece of it."""
        return [
            torch.zeros(*lead, *shape, dtype=torch.float32, device=p.device)
            for p, shape in zip(self.params, self.pieces.local_shapes())
        ]

    @property
    def keys(self) -> list[int]:
        if self._keys is None:
            self._keys = self.pieces.keys()
        return self._keys

    def buffers(self) -> dict[int, torch.Tensor]:
        """The per-source gradient buffers by the key the model's split looks them up with: one dict for the
        whole run, in which the split may replace a buffer by a step's first part instead of copying it."""
        if self._by_key is None:
            self._by_key = dict(zip(self.keys, self.grad_S))
        return self._by_key

    def _grad(self, i: int) -> torch.Tensor:
        return self.buffers()[self.keys[i]]

    # ---- one step --------------------------------------------------------------------------
    def add_grads(self, source: int, grads: Sequence[torch.Tensor | None]) -> None:
        """Add one micro-batch's gradient of source ``source``'s share of the step's data loss."""
        buffers = self.buffers()
        for key, g in zip(self.keys, grads):
            if g is None:
                continue
            buf = buffers[key]
            if key not in self.written:
                buf.zero_()
                self.written.add(key)
                self.sums[key] = torch.zeros_like(buf[0])
            buf[source].add_(g.float())
            self.sums[key].add_(g.float())

    @torch.no_grad()
    def before_step(self) -> None:
        """Weight decay uses the parameters the step starts from; call right before ``optimizer.step()``."""
        self._steps = [float(self.optimizer.state.get(p, {}).get("step", 0)) for p in self.params]
        if self.lamb:
            self._old = [local(p).detach().clone() for p in self.params]
            return
        for p, h, wd in zip(self.params, self._hyper, self.disp_wd):
            if p.grad is not None and h["weight_decay"]:
                wd.add_(local(p).detach().float(), alpha=-h["lr"] * h["weight_decay"])

    @torch.no_grad()
    def after_step(self, clip_coef: float) -> None:
        """Advance every moment by the step just taken and add each part's displacement.

        The bulk of the work, S times the optimizer's, is memory-bound: two torch ops over the (S, ...)
        moments and displacements (a lerp, an addcdiv: six passes), the rest in (...) scratch tensors
        reused step after step. The ops run on torch's own threads, which spin for some milliseconds
        after each parallel op: a kernel on threads of its own (numba, tried) found the second core
        busy there and streamed at half the bandwidth (12-14 ms against 6-7 ms on the demo's 3.5M
        parameters x 4 sources). The sources' sum the router part needs comes from the backward
        (``sums``), where the parts are still in cache; a parameter all of whose gradient came through the
        sources' parts (checked once a stretch) forms no router part in steps whose rows all have a source
        (``partial``: the keys that had rows of no source), and its router moment is not stepped while it is
        0. torch's
        AdamW divides by ``sqrt(v)/sqrt(1-β2^t) + eps``; the same quotient is taken here as
        ``sqrt(1-β2^t)·m / (sqrt(v) + sqrt(1-β2^t)·eps)``, ``v`` clamped to the smallest normal float
        (0 where a weight never had a gradient: ``sqrt(0)`` takes a slow path on CPU, ~5x a normal one)."""
        pieces = self.pieces
        if self.horizon:
            self._decay()
        for i, (p, h) in enumerate(zip(self.params, self._hyper)):
            state = self.optimizer.state.get(p, {})
            if "exp_avg_sq" not in state or float(state["step"]) == self._steps[i]:
                continue  # the optimizer did not step this parameter (no gradient)
            beta1, beta2 = h["betas"]
            t = float(state["step"])
            root2 = (1 - beta2**t) ** 0.5
            v = local(state["exp_avg_sq"])
            key = self.keys[i]
            g_S = self._grad(i) if key in self.written else None  # None: no source's tokens reached it
            sum_S = self.sums.get(key) if g_S is not None else None
            if pieces.sharded[i]:  # FSDP2: the shard's global per-source gradient (a collective: every rank)
                g_S, sum_S = pieces.reduce_grads(i, g_S if g_S is not None else self._grad(i).zero_()), None
            # the parts are partial sums over the D ranks holding this piece with other data; the gradient is whole
            ranks = pieces.data_ranks[i]
            scale = h["lr"] / (1 - beta1**t) * root2
            if i not in self._tmp:
                self._tmp[i] = tuple(torch.empty_like(v, dtype=torch.float32) for _ in range(3))
            denom, router, root = self._tmp[i]
            torch.clamp_min(v.float(), _TINY, out=root).sqrt_()  # sqrt(v): the counterfactual reads it too
            torch.add(root, root2 * h["eps"], out=denom)
            if p.grad is None:
                router = None
            elif g_S is None:
                router.copy_(local(p.grad))
            elif self._captured[i] and key not in self.partial:
                router = None  # every row had a source and nothing else reached the gradient: the part is 0
            else:  # what the sources' gradients (as clipped) leave of this rank's share of the gradient
                if sum_S is None:
                    sum_S = torch.sum(g_S, 0, out=router)
                grad = local(p.grad).float()
                torch.add(grad, sum_S, alpha=-clip_coef * ranks, out=router)
                if self._captured[i] is None and key not in self.partial:  # once per stretch: rounding only?
                    self._captured[i] = bool(router.abs().max() <= 1e-5 * grad.abs().max())
            if router is not None and ranks != 1:
                router.div_(ranks)
            m_S = self.m_S[i]
            if g_S is None:
                m_S.mul_(beta1)
            elif clip_coef == 1.0:
                m_S.lerp_(g_S, 1 - beta1)  # one pass: β1·m + (1-β1)·g
            else:
                m_S.mul_(beta1).add_(g_S, alpha=(1 - beta1) * clip_coef)
            if router is None:
                if self._router_live[i]:
                    self.m_router[i].mul_(beta1)
            else:
                self.m_router[i].lerp_(router, 1 - beta1)
                self._router_live[i] = True
            if self._before:
                self.m_before[i].mul_(beta1)
            if self.lamb:
                old = self._old[i].float()
                adam = local(state["exp_avg"]).float() / (1 - beta1**t) / (denom / root2) + h["weight_decay"] * old
                w_norm, u_norm = old.norm(), adam.norm()
                trust = float(w_norm / u_norm) if w_norm > 0 and u_norm > 0 else 1.0
                scale *= trust
                self.disp_wd[i].add_(old, alpha=-h["lr"] * trust * h["weight_decay"])
            self.disp_S[i].addcdiv_(m_S, denom, value=-scale)
            if self.horizon:
                self._counterfactual_step(i, state, g_S, denom, root, scale, clip_coef, beta2)
            if self._router_live[i]:
                self.disp_router[i].addcdiv_(self.m_router[i], denom, value=-scale)
            if self._before:
                self.disp_before[i].addcdiv_(self.m_before[i], denom, value=-scale)
        self.drop_step()

    def _decay(self) -> None:
        """Every earlier step's weight times ``exp(-lr/(lr_peak·horizon))``, and the second moments' parts times
        β2, each as one scalar (folded into the buffers before it would underflow)."""
        group = self.optimizer.param_groups[0]
        peak = group.get("initial_lr", group["lr"])
        decay = -group["lr"] / (peak * self.horizon) if peak > 0 else 0.0
        self.cf_scale *= math.exp(decay)
        self.cf_log += decay
        self.v_scale *= group["betas"][1]
        for name in ("cf", "v"):
            scale = getattr(self, f"{name}_scale")
            if scale < 1e-20:
                for buf in getattr(self, f"{name}_S"):
                    buf.mul_(scale)
                setattr(self, f"{name}_scale", 1.0)
        self.cf_steps += 1

    def _counterfactual_step(
        self,
        i: int,
        state: dict,
        g_S: torch.Tensor | None,
        denom: torch.Tensor,
        root: torch.Tensor,
        scale: float,
        clip_coef: float,
        beta2: float,
    ) -> None:
        """Parameter ``i``'s sources' parts of the second moment, and the step's derivative by each share
        (``root``: sqrt(v), the scratch this overwrites)."""
        v_S, cf_S = self.v_S[i], self.cf_S[i]
        p = self.params[i]
        if g_S is not None and p.grad is not None:  # g · c·g_a: the clipped gradient times the source's clipped part
            v_S.addcmul_(local(p.grad).float().unsqueeze(0), g_S, value=(1 - beta2) * clip_coef / self.v_scale)
        scale /= self.cf_scale
        cf_S = cf_S[self.cf_steps % 2]
        cf_S.addcdiv_(self.m_S[i], denom, value=-scale)
        # + scale · m · v_a / (sqrt(v) · d²): the second moment's part (denom = sqrt(v) + sqrt(1-β2^t)·eps = d)
        k = torch.div(local(state["exp_avg"]).float(), root.mul_(denom).mul_(denom), out=root)
        cf_S.addcmul_(v_S, k.unsqueeze(0), value=scale * self.v_scale)

    def counterfactual(self) -> list[torch.Tensor]:
        """Per parameter (2, S, ...): each source's share derivative of the displacement, summed with decaying
        weights over the odd and over the even steps (their sum is the whole)."""
        return [buf * self.cf_scale for buf in self.cf_S]

    def drop_step(self) -> None:
        """Forget this step's gradients (after it was applied, or when it was skipped): the next parts overwrite them."""
        self.written.clear()
        self.sums.clear()
        self.partial.clear()
        self._old = None

    # ---- stretches -----------------------------------------------------------------------------
    @torch.no_grad()
    def begin_stretch(self) -> None:
        """Zero the displacements; at the very first stretch the optimizer's momentum so far is 'before'."""
        if not self.started:
            for p, before in zip(self.params, self.m_before):
                state = self.optimizer.state.get(p, {})
                if "exp_avg" in state:
                    before.copy_(local(state["exp_avg"]).float())
            self.started = True
            self._before = any(bool(b.any()) for b in self.m_before)
        elif self._before and _largest(self.m_before) <= 1e-7 * _largest(self.m_S):
            # the momentum from before has decayed (β1 a step) to a rounding-level share of the moments: its
            # rows would add nothing from here on but two passes a step (what is left goes to rounding)
            for before in self.m_before:
                before.zero_()
            self._before = False
        for bufs in (self.disp_S, self.disp_router, self.disp_before, self.disp_wd):
            for b in bufs:
                b.zero_()
        self._captured = [None] * len(self.params)  # checked again on the stretch's first step

    def parts(self) -> tuple[list[torch.Tensor], dict[str, list[torch.Tensor]]]:
        """Per parameter: (S, ...) source displacements, and the unattributed parts' displacements."""
        return self.disp_S, {
            "weight_decay": self.disp_wd,
            "router": self.disp_router,
            "momentum_before": self.disp_before,
        }

    def moments(self) -> list[torch.Tensor]:
        """Per parameter the sum of the split first moments (equals the optimizer's ``exp_avg`` on one rank)."""
        return [m_S.sum(0) + r + b for m_S, r, b in zip(self.m_S, self.m_router, self.m_before)]

    # ---- checkpoints ---------------------------------------------------------------------------
    _STATE = ("m_S", "disp_S", "m_router", "disp_router", "m_before", "disp_before", "disp_wd", "v_S", "cf_S")
    _LOCAL = ("m_S", "disp_S", "m_router", "disp_router", "v_S", "cf_S")  # partial sums of each rank's gradients

    def state_dict(self, reduce=None) -> dict:
        """Tensors on CPU; ``reduce`` (a sum over ranks) turns the ranks' partial sums into totals."""
        out = {}
        for key in self._STATE:
            bufs = getattr(self, key)
            if reduce is not None and key in self._LOCAL:
                bufs = [reduce(b.clone()) for b in bufs]
            out[key] = [b.detach().cpu() for b in bufs]
        out["started"] = self.started
        out["cf_scale"], out["cf_steps"], out["cf_log"], out["v_scale"] = (
            self.cf_scale,
            self.cf_steps,
            self.cf_log,
            self.v_scale,
        )
        return out

    def load_state_dict(self, state: dict, *, rank: int = 0) -> None:
        self.started = bool(state["started"])
        self.cf_scale, self.cf_steps = float(state.get("cf_scale", 1.0)), int(state.get("cf_steps", 0))
        self.cf_log, self.v_scale = float(state.get("cf_log", 0.0)), float(state.get("v_scale", 1.0))
        for key in self._STATE:
            for buf, saved in zip(getattr(self, key), state.get(key, ())):
                if key in self._LOCAL and rank != 0:
                    buf.zero_()  # the totals live on rank 0; the sum over ranks is unchanged
                else:
                    buf.copy_(saved.to(buf.device))
        self._before = any(bool(b.any()) for b in self.m_before)
        self._router_live = [bool(m.any()) for m in self.m_router]
        self._captured = [None] * len(self.params)
