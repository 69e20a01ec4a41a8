"""Pipeline parallelism on ``torch.distributed.pipelining``: the layers split into stages over the ``pp`` ranks.

Stage s of S runs blocks ``stage_layers(n_layers, S)[s]``; the first stage also the embedding, the last
the final norm and the head, and the schedule calls the trainer's loss on the last stage's logits.
Rank r holds stage r (GPipe, 1F1B) or stages r, r + pp, ... (interleaved 1F1B). Only the activations
``x_BLD`` travel between stages; what else a MoE block reports is dealt with where it arises:

- its aux and z losses enter the backward of the stage that computed them: ``_RouterLossGrad`` is the
  identity on the activations whose backward also seeds ``d loss / d router_loss = 1 / n_micro``, the
  factor the one-process run puts on them, so no scalar has to travel;
- their values, the expert loads and the per-source routing counts go to the trainer's ``record``
  callback on the rank that holds the layer, into stage-local buffers that are summed over the ranks
  at log time (rows of layers held elsewhere stay zero);
- the per-token losses (hence the per-source sums) arise on the last stage: the schedule's ``target``
  carries the targets, source ids and loss mask there. Every pp rank reads the same batches, so each
  stage gets its micro-batch's document ids, source ids and mask as keyword arguments.

Micro-batches are the step's ``grad_accum`` loader batches, concatenated and split again by the
schedule; the trainer's loss is already a sum normalized by the step's token count, so the
schedule does not rescale gradients (``scale_grads=False``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleLoopedBFS,
)

from winnow.train.errors import ConfigError
from winnow.train.model.moe import MoEStats
from winnow.train.model.transformer import Transformer
from winnow.train.parallel.comm import CommTimer

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved_1f1b": ScheduleInterleaved1F1B}
# (first MoE layer's index, its stats and the following layers', source ids, loss mask) per stage forward
Record = Callable[[int, list[MoEStats], torch.Tensor, torch.Tensor], None]
# (logits_BLV, targets_BL, source_ids_BL, loss_mask_BL) -> the micro-batch's loss to differentiate; with
# ``run(inputs=True)`` also the keywords tokens_BL and doc_ids_BL (the micro-batch's inputs, on the last stage)
LossFn = Callable[..., torch.Tensor]


def check_pipeline_run(cfg, *, attribution: bool) -> None:
    """ConfigError for the parts of a ``[train]`` run that a pipeline-parallel run does not offer, and why."""
    why = None
    if attribution and cfg.attribution.split == "losses":
        why = (
            "train.attribution.split = 'losses': one backward per source cannot cross the stages; "
            "use split = 'tokens' (the default)"
        )
    elif attribution and cfg.activation_checkpointing:
        why = (
            "train.attribution with train.activation_checkpointing: a stage recomputes its forward in a backward "
            "that runs outside the micro-batch's source split; set activation_checkpointing = false"
        )
    if why is not None:
        raise ConfigError(f"{why} — not available with train.parallel pipeline parallelism (pp > 1)")


def stage_layers(n_layers: int, n_stages: int) -> list[range]:
    """Contiguous blocks per stage, the earlier stages one more where they do not divide evenly."""
    if n_layers < n_stages:
        raise ConfigError(
            f"train.model.n_layers = {n_layers} is fewer than the pipeline's {n_stages} stages; "
            "every stage needs at least one block: lower train.parallel.pp (or its stages per rank)"
        )
    base, extra = divmod(n_layers, n_stages)
    bounds = [0]
    for s in range(n_stages):
        bounds.append(bounds[-1] + base + (s < extra))
    return [range(lo, hi) for lo, hi in zip(bounds, bounds[1:])]


class _RouterLossGrad(torch.autograd.Function):
    """Identity on ``x``; its backward also gives ``router_loss`` the gradient ``scale`` (as if added to the loss).

    The trick Megatron-LM's ``MoEAuxLossAutoScaler`` uses: the router loss joins the stage's own
    backward, which the next stage's incoming gradient triggers anyway.
    """

    @staticmethod
    def forward(ctx, x, router_loss, scale):
        ctx.scale = scale
        ctx.save_for_backward(router_loss)
        return x

    @staticmethod
    def backward(ctx, grad):
        (router_loss,) = ctx.saved_tensors
        return grad, torch.full_like(router_loss, ctx.scale), None


class StageModule(nn.Module):
    """One stage's part of the transformer's forward: (tokens or activations) -> activations or logits."""

    def __init__(self, model: Transformer, layers: range, *, first: bool, last: bool, router_scale: float) -> None:
        super().__init__()
        self._owner = (model,)  # a tuple: the stage's modules are registered below, not the whole model
        self.embed = model.embed if first else None
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in layers})
        self.norm, self.head = (model.norm, model.head) if last else (None, None)
        self.first, self.last, self.router_scale = first, last, router_scale
        self.first_moe = sum(
            model.cfg.is_moe_layer(i) for i in range(layers.start)
        )  # global index of its first MoE layer
        self.record: Record | None = None  # set by ``Pipeline`` for each schedule step
        # likewise: (source_ids_BL) -> a context splitting the forward's weight gradients by source (attribution)
        self.split: Callable | None = None
        self.autocast: Callable = contextlib.nullcontext  # likewise: the forward's autocast (never the backward's)

    def forward(
        self, h: torch.Tensor, doc_ids_BL: torch.Tensor, source_ids_BL: torch.Tensor, loss_mask_BL: torch.Tensor
    ) -> torch.Tensor:
        split = self.split(source_ids_BL) if self.split is not None else contextlib.nullcontext()
        with self.autocast(), split:  # the split ops keep it for their backward (train.attribution.hooks)
            return self._forward(h, doc_ids_BL, source_ids_BL, loss_mask_BL)

    def _forward(self, h, doc_ids_BL, source_ids_BL, loss_mask_BL):
        model = self._owner[0]
        mask_B1LL = model.attention_mask(doc_ids_BL)
        x_BLD = model.embed(h) if self.first else h
        moe_stats = []
        for block in self.blocks.values():
            x_BLD, stats = block(x_BLD, mask_B1LL)
            if stats is not None:
                moe_stats.append(stats)
        if moe_stats and torch.is_grad_enabled():
            x_BLD = _RouterLossGrad.apply(x_BLD, model.router_loss(moe_stats, x_BLD), self.router_scale)
        if moe_stats and self.record is not None:
            self.record(self.first_moe, moe_stats, source_ids_BL, loss_mask_BL)
        return model.head(model.norm(x_BLD)) if self.last else x_BLD


def keep_stage(model: Transformer, layers: set[int], *, embed: bool, head: bool) -> None:
    """Drop the blocks (and the embedding or the norm and head) that other pipeline stages hold.

    The dropped entries become None, so the parameter names stay the one-process model's.
    """
    for i in range(len(model.blocks)):
        if i not in layers:
            model.blocks[i] = None
    if not embed:
        model.embed = None
    if not head:
        model.norm, model.head = None, None


class _TimedStage(PipelineStage):
    """A ``PipelineStage`` that tells compute from waiting: the time between its compute calls is send/recv.

    The schedules issue the point-to-point sends and receives and wait on them between the stage's
    ``forward_one_chunk`` / ``backward_one_chunk`` calls, so the gaps between those calls within a
    schedule step are the pipeline's communication as this rank sees it: transfers and the waits for
    the other stages (the bubble) together, as a blocking collective's time includes waiting for the
    slowest rank. Bytes are those of the activations and gradients this stage sends.
    """

    def __init__(self, *args, timer: CommTimer, clock: list[float], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.timer, self.clock = timer, clock  # clock[0]: when this rank's last compute ended (shared by its stages)

    def _compute(self, run):
        start = time.perf_counter()
        self.timer.add_interval(self.clock[0], start, 0, 0)
        try:
            return run()
        finally:
            self.clock[0] = time.perf_counter()

    def forward_one_chunk(self, *args, **kwargs):
        return self._compute(lambda: super(_TimedStage, self).forward_one_chunk(*args, **kwargs))

    def backward_one_chunk(self, *args, **kwargs):
        return self._compute(lambda: super(_TimedStage, self).backward_one_chunk(*args, **kwargs))

    def backward_weight_one_chunk(self, *args, **kwargs):
        return self._compute(lambda: super(_TimedStage, self).backward_weight_one_chunk(*args, **kwargs))

    def _count(self, ops: list[dist.P2POp]) -> list[dist.P2POp]:
        nbytes = sum(op.tensor.numel() * op.tensor.element_size() for op in ops)
        self.timer.add_interval(0.0, 0.0, nbytes, nbytes)
        return ops

    def get_fwd_send_ops(self, fwd_chunk_id: int) -> list[dist.P2POp]:
        return self._count(super().get_fwd_send_ops(fwd_chunk_id))

    def get_bwd_send_ops(self, bwd_chunk_id: int) -> list[dist.P2POp]:
        return self._count(super().get_bwd_send_ops(bwd_chunk_id))


class Pipeline:
    """This rank's stages of ``model`` (pruned to them in place) and the schedule that runs a step's micro-batches."""

    def __init__(
        self,
        model: Transformer,
        *,
        rank: int,
        size: int,
        group,
        schedule: str,
        n_microbatches: int,
        device: torch.device,
        timer: CommTimer,
        stages_per_rank: int = 1,
        wrap: Callable[[nn.Module], nn.Module] | None = None,
        seq_parts: int = 1,
    ) -> None:
        if schedule not in SCHEDULES:
            raise ConfigError(f"train.parallel.pp_schedule = {schedule!r} is invalid; allowed: {sorted(SCHEDULES)}")
        interleaved = schedule == "interleaved_1f1b"
        if interleaved != (stages_per_rank > 1):
            raise ConfigError(
                f"train.parallel.pp_stages_per_rank = {stages_per_rank} with pp_schedule = {schedule!r}: "
                "'interleaved_1f1b' needs 2 or more stages per rank, 'gpipe' and '1f1b' exactly 1"
            )
        n_stages = size * stages_per_rank
        if schedule != "gpipe" and n_microbatches < size:
            raise ConfigError(
                f"train.grad_accum = {n_microbatches} is fewer than train.parallel.pp = {size}: "
                f"{schedule!r} needs at least one micro-batch per pipeline rank; raise grad_accum"
            )
        if interleaved and n_microbatches % size:
            raise ConfigError(
                f"train.grad_accum = {n_microbatches} with pp_schedule = 'interleaved_1f1b' must be a "
                f"multiple of train.parallel.pp = {size}"
            )
        if model.cfg.tie_embeddings:
            raise ConfigError(
                "train.model.tie_embeddings = true with train.parallel.pp > 1: the embedding lives on the "
                "first stage and the head on the last; untie them (tie_embeddings = false)"
            )
        layers = stage_layers(model.cfg.n_layers, n_stages)
        mine = [rank + k * size for k in range(stages_per_rank)]  # torch's "loop" placement of virtual stages
        keep_stage(model, {i for s in mine for i in layers[s]}, embed=0 in mine, head=n_stages - 1 in mine)
        self.n_microbatches, self.is_last = n_microbatches, n_stages - 1 in mine
        self.modules = [
            StageModule(model, layers[s], first=s == 0, last=s == n_stages - 1, router_scale=1 / n_microbatches)
            for s in mine
        ]
        self._where = dict(indices=mine, n_stages=n_stages, device=device, group=group, timer=timer, wrap=wrap)
        self._cls, self._interleaved, self.dim, self.vocab = (
            SCHEDULES[schedule],
            interleaved,
            model.cfg.dim,
            model.cfg.padded_vocab,
        )
        self._seq_parts = seq_parts  # sequence parallel: the activations between stages are a tp rank's part
        self._submodules: list[nn.Module] | None = None  # the stage modules, wrapped (DDP) at the first step
        self._schedules: dict[tuple, object] = {}  # (rows, cols, micro-batches, logits dtype) -> its schedule
        self.shape: tuple[int, int] | None = None  # the last training step's micro-batch shape
        self._clock, self._loss_fn = [0.0], None

    def _schedule(self, rows: int, cols: int, n: int, logits_dtype: torch.dtype):
        """The schedule of ``n`` micro-batches of (rows, cols) tokens, built the first time that shape comes.

        Its stages have static shapes: (rows, cols) tokens in, (rows, cols, D) fp32 activations between
        stages (cols / tp of them under sequence parallel); static metadata spares torch's runtime shape inference, which would run the forward and
        the loss on uninitialized tensors (and so call the trainer's accounting with them). A sequence
        length warm-up brings a few shapes, each its own set of stages over the same modules. A group
        the configured schedule cannot take (1F1B with fewer micro-batches than pp ranks, interleaved
        with a number that pp does not divide) runs breadth-first: GPipe, or looped BFS for several
        stages per rank; the arithmetic, and so the gradients, are the same.
        """
        key = (rows, cols, n, logits_dtype)
        if key in self._schedules:
            return self._schedules[key]
        w = self._where
        if self._submodules is None:  # DDP over the dp ranks: the stage syncs it (FSDP2 was applied in place)
            self._submodules = [w["wrap"](module) if w["wrap"] else module for module in self.modules]
        meta = torch.device("meta")
        stages = []
        part = cols // self._seq_parts
        for submodule, s in zip(self._submodules, w["indices"]):
            x_in = (
                torch.zeros(rows, cols, dtype=torch.long, device=meta)
                if s == 0
                else torch.zeros(rows, part, self.dim, device=meta, requires_grad=True)
            )
            x_out = (
                torch.zeros(rows, cols, self.vocab, dtype=logits_dtype, device=meta)
                if s == w["n_stages"] - 1
                else torch.zeros(rows, part, self.dim, device=meta, requires_grad=True)
            )
            stages.append(
                _TimedStage(
                    submodule,
                    s,
                    w["n_stages"],
                    w["device"],
                    input_args=x_in,
                    output_args=x_out,
                    group=w["group"],
                    timer=w["timer"],
                    clock=self._clock,
                )
            )
        size = w["n_stages"] // len(stages)
        cls = self._cls
        if self._interleaved and (n < size or n % size):
            cls = ScheduleLoopedBFS
        elif cls is Schedule1F1B and n < size:
            cls = ScheduleGPipe
        schedule = cls(
            stages if self._interleaved else stages[0], n_microbatches=n, loss_fn=self._loss, scale_grads=False
        )
        self._schedules[key] = schedule
        return schedule

    def _loss(self, logits_BLV: torch.Tensor, target_BLC: torch.Tensor) -> torch.Tensor:
        targets_BL, source_ids_BL, loss_mask_BL, *inputs = target_BLC.unbind(-1)
        extra = dict(zip(("tokens_BL", "doc_ids_BL"), inputs))
        return self._loss_fn(logits_BLV, targets_BL, source_ids_BL, loss_mask_BL.bool(), **extra)

    def run(
        self,
        batches: list,
        *,
        loss: LossFn,
        record: Record | None,
        train: bool = True,
        autocast: Callable = contextlib.nullcontext,
        loss_scale: float = 1.0,
        split: Callable | None = None,
        inputs: bool = False,
    ) -> None:
        """One schedule step over ``batches`` (one per micro-batch, already on the device).

        ``loss`` runs on the last stage per micro-batch; ``record`` on every stage with MoE layers.
        ``loss_scale`` is fp16's loss scale: ``loss`` applies it to the data loss, the stages to
        their router losses (0: none). ``split(source_ids_BL)``: a context each stage's forward of a
        micro-batch runs in (attribution's per-source split of the weight gradients). ``inputs``: the
        schedule's target also carries each micro-batch's tokens and document ids to ``loss`` (keywords
        ``tokens_BL``, ``doc_ids_BL``): the last stage never sees the tokens otherwise.
        """
        if len(batches) != self.n_microbatches:
            raise ValueError(f"{len(batches)} batches for a schedule of {self.n_microbatches} micro-batches")
        device = self._where["device"].type
        with autocast():
            dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else torch.float32
        for module in self.modules:
            module.record, module.autocast, module.split = record, autocast, split
            module.router_scale = loss_scale / self.n_microbatches  # the whole step's factor, as in one process
        self._loss_fn = loss
        try:
            # one schedule step per run of equal-shape micro-batches (a warm-up's length may change mid-step);
            # the gradients accumulate over them (DDP and FSDP2 reduce sums of already-reduced parts)
            for group in _runs(batches):
                rows, cols = group[0].tokens.shape
                self._step(self._schedule(rows, cols, len(group), dtype), group, train=train, inputs=inputs)
                if train:
                    self.shape = (rows, cols)
        finally:
            for module in self.modules:
                module.record, module.split = None, None
            self._loss_fn = None

    def _step(self, schedule, batches: list, *, train: bool, inputs: bool = False) -> None:
        cat = {
            k: torch.cat([getattr(b, k) for b in batches])
            for k in ("tokens", "targets", "source_ids", "loss_mask", "doc_ids")
        }
        columns = [cat["targets"], cat["source_ids"], cat["loss_mask"]] + (
            [cat["tokens"], cat["doc_ids"]] if inputs else []
        )
        target = torch.stack([c.long() for c in columns], dim=-1)
        kwargs = {"doc_ids_BL": cat["doc_ids"], "source_ids_BL": cat["source_ids"], "loss_mask_BL": cat["loss_mask"]}
        args = (cat["tokens"],) if 0 in self._where["indices"] else ()
        self._clock[0] = time.perf_counter()
        try:
            if train:
                schedule.step(*args, target=target, return_outputs=False, **kwargs)
            else:
                schedule.eval(*args, target=target, **kwargs)
        finally:
            self._where["timer"].add_interval(self._clock[0], time.perf_counter(), 0, 0)  # the last wait

    def evaluate(
        self, batches: Iterable, *, loss: LossFn, rows: int, cols: int, autocast: Callable = contextlib.nullcontext
    ) -> None:
        """Forward-only schedule steps over held-out ``batches``, ``n_microbatches`` at a time.

        Each batch is padded (masked) to the last training micro-batch's shape when it fits, else to
        ``rows`` sequences of ``cols`` tokens, so the training stages serve; the last group is filled
        with fully masked copies. Every pp rank must pass the same batches.
        """
        group = []
        for batch in batches:
            group.append(batch)
            if len(group) == self.n_microbatches:
                self._evaluate_group(group, loss, rows, cols, autocast)
                group = []
        if group:
            self._evaluate_group(group, loss, rows, cols, autocast)

    def _evaluate_group(self, group: list, loss: LossFn, rows: int, cols: int, autocast: Callable) -> None:
        self.run(self.padded(group, rows, cols), loss=loss, record=None, train=False, autocast=autocast)

    def padded(self, group: list, rows: int, cols: int) -> list:
        """Up to ``n_microbatches`` batches padded to (rows, cols) (the training's shape where they fit it), the
        missing ones fully masked copies."""
        if self.shape and all(b.tokens.shape[0] <= self.shape[0] and b.tokens.shape[1] <= self.shape[1] for b in group):
            rows, cols = self.shape
        padded = [_pad(b, rows, cols) for b in group]
        while len(padded) < self.n_microbatches:
            filler = _pad(group[0], rows, cols)
            filler.loss_mask = torch.zeros_like(filler.loss_mask)
            padded.append(filler)
        return padded


def _runs(batches: list) -> list[list]:
    """``batches`` cut into runs of consecutive equal-shape batches."""
    runs: list[list] = []
    for batch in batches:
        if runs and runs[-1][0].tokens.shape == batch.tokens.shape:
            runs[-1].append(batch)
        else:
            runs.append([batch])
    return runs


def _pad(batch, rows: int, cols: int):
    """``batch`` grown to (rows, cols) with masked padding (at the end of each sequence: causal attention ignores it)."""
    B, L = batch.tokens.shape
    if B > rows or L > cols:
        raise ValueError(
            f"a held-out batch of shape ({B}, {L}) is larger than the pipeline's micro-batch ({rows}, {cols})"
        )

    def grow(t: torch.Tensor, value) -> torch.Tensor:
        out = t.new_full((rows, cols), value)
        out[:B, :L] = t
        return out

    return type(batch)(
        grow(batch.tokens, 0),
        grow(batch.targets, 0),
        grow(batch.source_ids, 0),
        grow(batch.loss_mask, False),
        grow(batch.doc_ids, -1),
        list(batch.origins),
    )
