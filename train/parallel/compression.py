"""Gradient compression as DDP communication hooks whose per-rank state checkpoints keep: top-k with error
feedback (Deep Gradient Compression), below, and torch's PowerSGD (``PowerSGDCompression``).

DGC (Lin et al. 2018, https://arxiv.org/abs/1712.01887) has each rank send, per tensor, only the
entries of its accumulated gradient with the largest magnitudes and keep the rest for later steps:

    g ← g · min(1, clip / ‖g‖)    local clipping, before the accumulation (see below)
    u ← m·u + g                    momentum correction: the velocity accumulates, not the gradient
    v ← v + u                      local gradient accumulation (error feedback)
    send the top k = ⌈density·n⌉ of |v| as values and indices; there v ← v - sent (0 but for the
    values' rounding) and u ← 0 (momentum factor masking; not with ``precondition = "adam"``, below)

Every rank all-gathers every rank's values and indices and scatter-adds them in rank order: the
sum of the sparse messages divided by the ranks is the step's gradient, the same bits on every
rank. What a rank does not send stays in ``v`` and is sent once it has grown large enough, so no
gradient is lost, only delayed. A message holds the entries sorted by their index in the flattened
model, each index as its low 16 bits, with the count of entries in each block of 65,536 positions
ahead of them: 2 bytes an index rather than 4 or 8, with nothing lost. Values go as
``value_dtype``: ``float32`` as they are, or ``bfloat16`` at half the bytes, the rounding of each
sent value kept in the residual like the entries not sent. The density starts at
``warmup_density`` and decreases exponentially to ``density`` over ``warmup_steps`` exchanges (the
paper's warm-up, per step rather than per epoch); ``TopKConfig.density_at``.

Adam preconditioning (``precondition = "adam"``): fed to AdamW, the exchanged gradient arrives in
spikes, a coordinate's withheld sum at once every so many steps; AdamW's second moment grows with the
spikes' squares and its step over those steps shrinks (to about √K of K steps' worth for an entry
sent every K-th step). With preconditioning each rank applies AdamW's per-coordinate scaling to its
own gradient before the accumulation,

    s ← β2·s + (1 - β2)·g²         this rank's second moment (the optimizer's β2 and eps)
    g ← (1 - m)·g / (√(s / (1 - β2^t)) + eps)

so the velocity ``u`` is AdamW's first moment of the direction, ``m / √v̂``, and the optimizer after the
exchange only applies the learning rate and the decoupled weight decay: ``p ← p·(1 - lr·wd) - lr·g``
(``train.optim.PreconditionedAdamW``). What accumulates in ``v`` is then the step itself,
``v ← v + lr_t·u`` with the learning rate of the step it comes from (error feedback on the update, as in
Stich et al. 2018, https://arxiv.org/abs/1809.07599), and what is sent is divided by the sending step's
learning rate, which the optimizer multiplies back: an entry withheld through the warm-up or the decay
moves the weights by what its own steps would have, not by the learning rate of the step that happens
to send it (under a schedule that falls tenfold, a withheld gradient would otherwise count up to ten
times too much or too little). The velocity is not masked here: like AdamW's first moment it goes on
decaying after a send, so each gradient is applied at its whole weight, ``(1 - m)·Σ m^j = 1``, however
its part of the sum was split over sends
(masking would drop the momentum of the entries sent most often, the ones that matter most). The
ranks' second moments differ (each sees its own batch), which changes what each contributes but not
the agreement of the step: every rank applies the same exchanged sum.

Clipping: gradient clipping after the exchange would scale what earlier steps withheld as well,
and the clipped part would be lost; as in the paper, each rank clips its own gradient before
accumulating it, and the trainer measures the exchanged gradient's norm without clipping it again.
The trainer's loss makes each rank's bucket its own batch's mean gradient (DDP averages them); if
the ranks' gradients were independent with equal spread, the global norm would be 1/√N of a rank's,
so a rank clips at ``grad_clip · √N`` (the paper's ``N^(-1/2)`` on a rank's share of the sum).

The hook sees DDP's buckets one by one; the clipping needs the norm of the whole local gradient,
so the buckets wait until the last one arrives (``GradBucket.is_last``; DDP launches buckets in
order) and the whole model's top-k goes out in one ``all_gather``. The state (``u``, ``v`` and ``s`` per
parameter, and the exchange count that drives the warm-up) is per rank; checkpoints keep each
rank's through DCP (``shards`` / ``load_shards``), so a resumed run continues exactly.

A step whose gradient is not finite on any rank (a flag travels with each message) leaves the
state as it was and gives every rank a NaN gradient, which the trainer's ``skip_nonfinite`` skips.
"""

# no `from __future__ import annotations`: DDP checks the comm hook's annotations at runtime
import logging
import math
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from winnow.train.parallel.comm import CommTimer
from winnow.train.parallel.config import TopKConfig

log = logging.getLogger(__name__)
_ALIGN = 8  # bytes: each part of a message starts on a multiple, so it can be viewed as its dtype
_BLOCK_BITS = 16  # an index is sent as its low 16 bits; its block of 2^16 positions by a count per block
_VALUE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _padded(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


class RankState:
    """A compression's per-rank state in checkpoints, through DCP (``shards`` / ``load_shards``).

    A subclass names its ``prefix``, its ``kinds`` of per-parameter tensors, and gives
    ``state_dict()`` (``{"step": int, kind: {name: tensor}}``, and any other counts as ints),
    ``load_state_dict()`` and ``world`` (the data-parallel ranks).
    """

    prefix: str
    kinds: tuple[str, ...]
    label: str  # what the state is, in messages
    world: int

    def shards(self, *, dp_rank: int, tp_rank: int, tp_size: int) -> dict:
        """This rank's state as DCP entries: its own keys (``<prefix>.<tp>.<dp>.<kind>.<name>``) and the shared count."""
        state = self.state_dict()
        out = {f"{self.prefix}.ranks": torch.tensor([self.world, tp_size])}
        out |= {f"{self.prefix}.{key}": torch.tensor(value) for key, value in state.items() if key not in self.kinds}
        for kind in self.kinds:
            for name, tensor in state[kind].items():
                out[f"{self.prefix}.{tp_rank}.{dp_rank}.{kind}.{name}"] = tensor
        return out

    def load_shards(self, folder: Path, *, dp_rank: int, tp_rank: int, tp_size: int) -> None:
        """Read the state a checkpoint's ranks saved (``shards``); a collective of every rank.

        Saved on N data-parallel ranks and resumed on M, rank j takes the sum of saved ranks
        ``i ≡ j (mod M)`` times M/N: the withheld gradient (their mean over the ranks) stays
        the same. A checkpoint without the state (trained uncompressed) or split over another
        ``tp`` degree starts it afresh, as a fresh run does.
        """
        from winnow.train import dcp

        saved = dcp.SafeReader(str(folder)).read_metadata().state_dict_metadata
        if f"{self.prefix}.ranks" not in saved:
            log.info("the checkpoint has no %s: it starts afresh", self.label)
            return
        # the state's counts it saved (``step``, ...), and the ranks it was saved on
        counts = {key: torch.tensor(0) for key in saved if key.count(".") == 1 and key.startswith(f"{self.prefix}.")}
        counts[f"{self.prefix}.ranks"] = torch.tensor([0, 0])
        dcp.load(counts, folder)
        saved_dp, saved_tp = counts[f"{self.prefix}.ranks"].tolist()
        wanted = {}
        if saved_tp == tp_size:
            rows = range(dp_rank, saved_dp, self.world)
            heads = tuple(f"{self.prefix}.{tp_rank}.{i}." for i in rows)
            wanted = {
                key: torch.zeros(meta.size, dtype=meta.properties.dtype)
                for key, meta in saved.items()
                if key.startswith(heads)
            }
        else:
            log.warning(
                "the checkpoint's %s was split over tp = %d ranks, this run has %d: it starts afresh",
                self.label,
                saved_tp,
                tp_size,
            )
        dcp.load(wanted, folder)  # a collective, even where this rank wants nothing
        state = {key.split(".", 1)[1]: int(value) for key, value in counts.items() if value.ndim == 0}
        state |= {kind: {} for kind in self.kinds}
        for key, tensor in wanted.items():
            kind, name = key.split(".", 4)[3:]
            into = state[kind]
            into[name] = into[name] + tensor if name in into else tensor
        factor = self.world / saved_dp
        for kind in self.kinds:  # the ranks' mean: summed over N/M saved ranks, times M/N
            state[kind] = {name: t * factor if factor != 1 else t for name, t in state[kind].items()}
        self.load_state_dict(state)


class TopKCompression(RankState):
    """One rank's DGC state and its DDP hook (``register`` it on the ``DistributedDataParallel``)."""

    prefix, kinds, label = "compression", ("velocity", "residual", "moment"), "top-k compression state"
    clips_locally = True  # each rank clips its own gradient before the exchange (the trainer does not clip again)

    def __init__(
        self,
        cfg: TopKConfig,
        model: nn.Module,
        *,
        group,
        timer: CommTimer,
        grad_clip: float = 0.0,
        adam: tuple[float, float] = (0.95, 1e-8),
    ) -> None:
        self.cfg, self.group, self.timer = cfg, group, timer
        self.beta2, self.eps = adam  # the optimizer's, for precondition = "adam"
        self.world = dist.get_world_size(group)
        self.clip = grad_clip * math.sqrt(self.world) if grad_clip > 0 else math.inf
        self._names = {id(p): name for name, p in model.named_parameters()}
        self._device = next(model.parameters()).device
        self.step = 0  # exchanges so far: where the warm-up stands
        self.velocity: dict[str, torch.Tensor] = {}  # u, flat, per parameter
        self.residual: dict[str, torch.Tensor] = {}  # v, flat, per parameter
        self.moment: dict[str, torch.Tensor] = {}  # s, Adam's second moment of this rank's gradient (precondition)
        self._optimizer: torch.optim.Optimizer | None = None  # with precondition: whose learning rate (``follow``)
        self._groups: dict[str, int] = {}  # each parameter's group in it
        self._rescale = False  # a residual loaded from a checkpoint that kept it unscaled (see load_state_dict)
        self._waiting: list[tuple[torch.Tensor, list[nn.Parameter], torch.futures.Future]] = []

    @property
    def preconditions(self) -> bool:
        """Whether what goes through the hook is AdamW's step direction (``precondition = "adam"``)."""
        return self.cfg.precondition == "adam"

    def register(self, ddp: nn.parallel.DistributedDataParallel) -> None:
        ddp.register_comm_hook(self, _topk_hook)
        log.info("DDP with top-k compression, density %g", self.cfg.density)

    def follow(self, optimizer: torch.optim.Optimizer) -> None:
        """Scale what accumulates by each step's learning rate, read from ``optimizer``'s groups (over the model
        this hook was made for; with ``precondition = "adam"``, see the module docstring). Until then the learning
        rate counts as 1."""
        self._optimizer = optimizer  # its groups are read at each step: loading its state replaces them
        self._groups = {
            self._names[id(p)]: i for i, group in enumerate(optimizer.param_groups) for p in group["params"]
        }

    def _lr(self, name: str) -> float:
        i = self._groups.get(name) if self.preconditions else None
        return 1.0 if i is None else float(self._optimizer.param_groups[i]["lr"])

    # ---- the exchange -------------------------------------------------------------------------
    def hook(self, bucket: dist.GradBucket) -> torch.futures.Future:
        """Hold the bucket until the step's last one; then exchange them all.

        The last bucket's future is the exchange's own continuation, so DDP's backward ends only once
        the callback on the communication thread has returned (a test that then destroys the process
        group does not race the thread's last references to it).
        """
        future = torch.futures.Future()
        self._waiting.append((bucket.buffer(), bucket.parameters(), future))
        if bucket.is_last():
            waiting, self._waiting = self._waiting, []
            try:
                return self._exchange(waiting)
            except Exception as err:  # noqa: BLE001 - DDP would otherwise wait for the futures forever
                for _, _, fut in waiting:
                    fut.set_exception(err)
        return future

    def _exchange(self, waiting: list) -> torch.futures.Future:
        """Send every bucket's top entries; returns the last bucket's future (the others are set with it)."""
        buffers = [buffer for buffer, _, _ in waiting]
        norm = torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(b, dtype=torch.float32) for b in buffers])
        )
        finite = bool(torch.isfinite(norm))
        scale = min(1.0, self.clip / (float(norm) + 1e-6)) if finite else 1.0  # torch's clip_grad_norm_ factor
        density = self.cfg.density_at(self.step)
        self.step += 1
        bias = 1 - self.beta2**self.step  # Adam's bias correction of the second moment
        value_dtype = _VALUE_DTYPES[self.cfg.value_dtype]
        # per parameter: (name, new u, new v, new s or None, its top-k indices, the values sent, lr)
        parts, offset = [], 0
        values, indices = [], []
        for buffer, params, _ in waiting:
            for p, g in zip(params, buffer.split([p.numel() for p in params])):
                n = p.numel()
                name = self._names[id(p)]
                g, s = g * scale if scale < 1 else g, None
                lr = self._lr(name)
                if self.cfg.precondition == "adam":
                    g, s = self._precondition(name, g, bias)
                u, v = self._accumulate(name, g, lr)
                top = v.abs().topk(min(n, max(1, math.ceil(density * n))), sorted=False).indices
                if lr > 0:  # the optimizer multiplies what arrives by this step's learning rate
                    sent = (v[top] / lr).to(value_dtype)
                else:  # a step at learning rate 0 moves nothing: what it would send waits
                    sent = torch.zeros(top.numel(), dtype=value_dtype, device=v.device)
                parts.append((name, u, v, s, top, sent, lr))
                values.append(sent)
                indices.append(top + offset)
                offset += n
        dtype = buffers[0].dtype
        message, layout = self._pack(torch.cat(values), torch.cat(indices), offset, finite)
        gathered = message.new_empty(self.world * message.numel())
        uncompressed = sum(b.numel() * b.element_size() for b in buffers)
        start_time = time.perf_counter()
        work = dist.all_gather_single(gathered, message, group=self.group, async_op=True)

        def done(fut) -> torch.Tensor:
            try:
                fut.value()
                self.timer.add_interval(start_time, time.perf_counter(), message.numel(), uncompressed)
                flat = self._combine(gathered.view(self.world, -1), layout, dtype, value_dtype, offset, parts)
                # into the bucket's own buffer: DDP (torch 2.13, CPU) reads a result from the start of
                # its storage, so a view of ``flat`` at an offset would hand every bucket the first's values
                results = [
                    buffer.copy_(part.view_as(buffer))
                    for (buffer, _, _), part in zip(waiting, flat.split([b.numel() for b, _, _ in waiting]))
                ]
            except Exception as err:  # noqa: BLE001 - the hook's futures must complete either way
                for _, _, future in waiting[:-1]:
                    future.set_exception(err)
                raise
            for (_, _, future), result in zip(waiting[:-1], results, strict=False):
                future.set_result(result)
            return results[-1]

        return work.get_future().then(done)

    def _precondition(self, name: str, g: torch.Tensor, bias: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Adam's step direction from this rank's gradient, and the new second moment (a new tensor, as below).

        ``(1 - m) · g / (√(s / bias) + eps)`` with ``s ← β2·s + (1 - β2)·g²``: the velocity ``u`` then
        settles at Adam's ``m̂ / (√v̂ + eps)`` and the optimizer after the exchange only scales it by the
        learning rate (``train.optim.PreconditionedAdamW``).
        """
        s = self.moment.get(name)
        if s is None:
            s = self.moment[name] = torch.zeros_like(g)
        s = torch.addcmul(s * self.beta2, g, g, value=1 - self.beta2)
        direction = g / (s.div(bias).sqrt_().add_(self.eps))
        return direction.mul_(1 - self.cfg.momentum) if self.cfg.momentum else direction, s

    def _accumulate(self, name: str, g: torch.Tensor, lr: float) -> tuple[torch.Tensor, torch.Tensor]:
        """The new velocity and residual of one parameter (new tensors: a step that is not committed leaves the old);
        the residual gains the velocity times ``lr``."""
        v = self.residual.get(name)
        if v is None:
            v = self.residual[name] = torch.zeros_like(g)
        elif self._rescale:  # kept in gradient units: at the learning rate it would have been sent at
            v = v * lr
        if self.cfg.momentum == 0:
            return g, torch.add(v, g, alpha=lr)
        u = self.velocity.get(name)
        if u is None:
            u = self.velocity[name] = torch.zeros_like(g)
        u = u * self.cfg.momentum + g
        return u, torch.add(v, u, alpha=lr)

    @staticmethod
    def _pack(
        values: torch.Tensor, indices: torch.Tensor, total: int, finite: bool
    ) -> tuple[torch.Tensor, tuple[int, int, int, int]]:
        """One byte message of the entries (``indices`` into the flattened model of ``total`` positions): the
        count per block of 2^16 positions (int32), each index's low 16 bits (int16, less 2^15), the values in
        index order, then the finite flag; each part aligned. Every rank's message has the same length."""
        order = indices.argsort()
        indices, values = indices[order], values[order]
        blocks = -(-total >> _BLOCK_BITS)
        counts = torch.bincount(indices >> _BLOCK_BITS, minlength=blocks).to(torch.int32)
        low = ((indices & ((1 << _BLOCK_BITS) - 1)) - (1 << (_BLOCK_BITS - 1))).to(torch.int16)
        pieces = [counts.view(torch.uint8), low.view(torch.uint8), values.view(torch.uint8)]
        sizes = [_padded(piece.numel()) for piece in pieces]
        message = torch.zeros(sum(sizes) + _ALIGN, dtype=torch.uint8, device=values.device)
        at = 0
        for piece, size in zip(pieces, sizes, strict=True):
            message[at : at + piece.numel()] = piece
            at += size
        message[-1] = int(finite)
        return message, (blocks, sizes[0], sizes[1], sizes[2])

    def _combine(
        self, rows: torch.Tensor, layout: tuple[int, int, int, int], dtype, value_dtype, total: int, parts: list
    ) -> torch.Tensor:
        """Every rank's message scatter-added into the mean gradient; commits this rank's state when all are finite."""
        blocks, count_bytes, low_bytes, value_bytes = layout
        k = sum(top.numel() for *_, top, _, _ in parts)
        if not bool(rows[:, -1].all()):  # some rank's gradient overflowed: nothing is committed, the step is skipped
            return torch.full((total,), float("nan"), dtype=dtype, device=rows.device)
        flat = torch.zeros(total, dtype=dtype, device=rows.device)
        first = torch.arange(blocks, device=rows.device) << _BLOCK_BITS
        for row in rows:  # rank by rank: within one message the indices are distinct, so the sum is deterministic
            counts = row[:count_bytes].view(torch.int32)[:blocks]
            low = row[count_bytes : count_bytes + low_bytes].view(torch.int16)[:k]
            at = count_bytes + low_bytes
            val = row[at : at + value_bytes].view(value_dtype)[:k]
            idx = first.repeat_interleave(counts.long(), output_size=k) + (low.long() + (1 << (_BLOCK_BITS - 1)))
            flat.index_add_(0, idx, val.to(dtype))
        flat.div_(self.world)
        self._rescale = False
        for name, u, v, s, top, sent, lr in parts:
            v[top] -= sent.to(v.dtype) * lr  # zero where the value went exactly; its rounding otherwise
            self.residual[name] = v
            if s is not None:
                self.moment[name] = s
            if self.cfg.momentum:
                if s is None:
                    u[top] = 0  # momentum factor masking: a sent entry's velocity does not push it again
                self.velocity[name] = u
        return flat

    # ---- state ----------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """This rank's state: the exchange count and each parameter's velocity, residual and second moment;
        ``scaled``: the residual holds learning-rate-scaled steps (a checkpoint without it kept gradients)."""
        return {
            "step": self.step,
            "scaled": 1,
            "velocity": dict(self.velocity),
            "residual": dict(self.residual),
            "moment": dict(self.moment),
        }

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
        self._rescale = self.preconditions and not int(state.get("scaled", 0))
        self.velocity = {k: v.to(self._device, copy=True) for k, v in state["velocity"].items()}
        self.residual = {k: v.to(self._device, copy=True) for k, v in state["residual"].items()}
        self.moment = {k: v.to(self._device, copy=True) for k, v in state.get("moment", {}).items()}


def _topk_hook(state: TopKCompression, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    return state.hook(bucket)


class PowerSGDCompression(RankState):
    """torch's PowerSGD hook (Vogels et al. 2019) with its state kept through checkpoints.

    torch's ``PowerSGDState`` holds each rank's error feedback and the warm-start ``Q`` matrices
    per DDP bucket, and DDP lays its buckets out again after a process's first step, so that
    state could not be restored: a resumed run restarted PowerSGD cold. Here it is moved to
    per-parameter tensors (checkpoints hold those) and back into a bucket of any layout the first
    time the bucket is seen with its parameters, following the hook's own layout: a bucket's error
    is its flat gradient buffer; its ``Q`` memory holds an ``m x r`` block per compressed gradient
    (viewed as ``n x m``; ``r = min(n, m, rank)``), grouped by shape in order of first appearance.
    Each gradient is compressed on its own, so the bucket it travels in changes no value, and a
    resumed run continues exactly.
    """

    prefix, kinds, label = "powersgd", ("error", "q"), "PowerSGD state"
    clips_locally = preconditions = False  # the trainer clips the exchanged gradient; AdamW steps as usual

    def __init__(self, cfg, model: nn.Module, *, group, timer: CommTimer) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

        self._psgd = psgd
        self.state = psgd.PowerSGDState(
            process_group=group,
            matrix_approximation_rank=cfg.powersgd_rank,
            start_powerSGD_iter=cfg.powersgd_start_iter,
            use_error_feedback=True,
            warm_start=True,
            random_seed=0,
        )
        self.world, self.timer = dist.get_world_size(group), timer
        self._names = {id(p): name for name, p in model.named_parameters()}
        self._layouts: dict[int, list[tuple[str, torch.Size]]] = {}  # bucket index -> its gradients' names, shapes
        self._parked: dict[str, dict[str, torch.Tensor]] = {"error": {}, "q": {}}  # per parameter, bucket to come

    @property
    def step(self) -> int:
        return self.state.iter

    def register(self, ddp: nn.parallel.DistributedDataParallel) -> None:
        ddp.register_comm_hook(self, _powersgd_hook)
        log.info(
            "DDP with PowerSGD rank %d from iteration %d",
            self.state.matrix_approximation_rank,
            self.state.start_powerSGD_iter,
        )

    def hook(self, bucket: dist.GradBucket) -> torch.futures.Future:
        """torch's hook on the bucket, its state placed for the bucket's parameters; counts the bytes sent."""
        layout = [(self._names[id(p)], g.shape) for p, g in zip(bucket.parameters(), bucket.gradients(), strict=True)]
        buffer = bucket.buffer()
        if self._layouts.get(bucket.index()) != layout:
            self._place(bucket.index(), layout, buffer.device)
        uncompressed = sent = buffer.numel() * buffer.element_size()
        if self.state.iter >= self.state.start_powerSGD_iter:  # before that the hook is a plain all-reduce
            sent = sum(self._values_sent(shape) for _, shape in layout) * buffer.element_size()
        start = time.perf_counter()

        def done(fut) -> torch.Tensor:
            self.timer.add_interval(start, time.perf_counter(), sent, uncompressed)
            value = fut.value()
            return value[0] if isinstance(value, list) else value

        return self._psgd.powerSGD_hook(self.state, bucket).then(done)

    # ---- the hook's layout ----------------------------------------------------------------------
    def _rank(self, shape: torch.Size) -> int:
        """The rank ``r`` of a gradient's factors, 0 where the hook sends it whole (``_should_compress``)."""
        n = shape[0] if len(shape) else 1
        m = math.prod(shape) // n if n else 0
        r = min(n, m, self.state.matrix_approximation_rank)
        return r if n and self._psgd._should_compress(n, m, r, self.state.min_compression_rate)[0] else 0

    def _values_sent(self, shape: torch.Size) -> int:
        """Values the hook sends for a gradient: its factors ``P`` and ``Q``, or the whole gradient."""
        r = self._rank(shape)
        return (shape[0] + math.prod(shape) // shape[0]) * r if r else math.prod(shape)

    def _q_size(self, shape: torch.Size, *, p: bool = False) -> int:
        """Values of a gradient's ``Q`` (``m x r``), or with ``p`` its ``P`` (``n x r``); 0 when sent whole."""
        r = self._rank(shape)
        return (shape[0] if p else math.prod(shape) // shape[0]) * r if r else 0

    def _q_slices(self, layout: list[tuple[str, torch.Size]]) -> dict[str, slice]:
        """Where each compressed gradient's ``Q`` lies in its bucket's ``Q`` memory (the hook's shape groups)."""
        groups: dict[tuple[int, int], list[tuple[str, int]]] = {}
        for name, shape in layout:
            if size := self._q_size(shape):
                groups.setdefault((shape[0], math.prod(shape) // shape[0]), []).append((name, size))
        slices, at = {}, 0
        for members in groups.values():
            for name, size in members:
                slices[name] = slice(at, at + size)
                at += size
        return slices

    def _per_parameter(self, index: int, layout: list[tuple[str, torch.Size]]) -> dict[str, dict[str, torch.Tensor]]:
        """Bucket ``index``'s error feedback and ``Q`` as views per parameter (``layout``: the bucket's)."""
        out: dict[str, dict[str, torch.Tensor]] = {"error": {}, "q": {}}
        if (error := self.state.error_dict.get(index)) is not None:
            parts = error.split([math.prod(shape) for _, shape in layout])
            out["error"] = {name: part for (name, _), part in zip(layout, parts, strict=True)}
        if (q := self.state.q_memory_dict.get(index)) is not None:
            out["q"] = {name: q[at] for name, at in self._q_slices(layout).items()}
        return out

    def _park(self, index: int) -> None:
        """Bucket ``index``'s state to its parameters (torch's copy dropped)."""
        for kind, parts in self._per_parameter(index, self._layouts.pop(index)).items():
            self._parked[kind].update(parts)
        for memory in (self.state.error_dict, self.state.q_memory_dict, self.state.p_memory_dict):
            memory.pop(index, None)

    def _place(self, index: int, layout: list[tuple[str, torch.Size]], device: torch.device) -> None:
        """Give bucket ``index`` (seen with ``layout`` for the first time) its parameters' state.

        Every bucket that held one of them is parked first. Such a bucket has not run this step (DDP
        lays buckets out between steps, so a bucket that has run kept its layout and its
        parameters), so its state is the last step's, complete.
        """
        names = {name for name, _ in layout}
        for other, held in list(self._layouts.items()):
            if other == index or names.intersection(name for name, _ in held):
                self._park(other)
        self._layouts[index] = layout
        error, q = self._parked["error"], self._parked["q"]
        if all(name in error for name in names):
            self.state.error_dict[index] = torch.cat([error.pop(name).reshape(-1) for name, _ in layout]).to(device)
        slices = self._q_slices(layout)
        if slices and all(name in q for name in slices):
            self.state.q_memory_dict[index] = torch.cat([q.pop(name) for name in slices]).to(device)
            p_size = sum(self._q_size(shape, p=True) for _, shape in layout)
            self.state.p_memory_dict[index] = self.state.q_memory_dict[index].new_empty(p_size)

    # ---- state ----------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """This rank's state per parameter: the iteration count, each gradient's error feedback and ``Q``."""
        state = {"step": self.state.iter, "error": dict(self._parked["error"]), "q": dict(self._parked["q"])}
        for index, layout in self._layouts.items():
            for kind, parts in self._per_parameter(index, layout).items():
                state[kind].update((name, part.clone()) for name, part in parts.items())
        return state

    def load_state_dict(self, state: dict) -> None:
        self.state.iter = int(state["step"])
        for kind in ("error_dict", "p_memory_dict", "q_memory_dict"):
            getattr(self.state, kind).clear()
        self._layouts.clear()
        self._parked = {kind: {k: v.detach().clone() for k, v in state[kind].items()} for kind in self.kinds}


def _powersgd_hook(state: PowerSGDCompression, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    return state.hook(bucket)
