"""``Parallel``: everything the trainer asks of the distributed setup, behind one object.

The trainer stays layout-agnostic: it lets ``Parallel`` apply the layout to the model, turn local token counts
and losses into global ones, clip on the global gradient norm, reduce its accounting, write
metrics and checkpoints on rank 0 only, and save/load the one-process state from any layout.
``Parallel.local(device)`` is the one-process case, where every call is the plain operation.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from winnow.train.checkpoint import CheckpointManager
from winnow.train.metrics import MetricsConfig, MetricsWriter
from winnow.train.parallel import checkpoint as ckpt
from winnow.train.parallel.comm import CommTimer
from winnow.train.parallel.config import ParallelConfig
from winnow.train.parallel.data_parallel import wrap_ddp
from winnow.train.parallel.expert_parallel import expert_parameters, sync_expert_grads
from winnow.train.parallel.mesh import World, init_world
from winnow.train.parallel.precision import AgreedGradScaler
from winnow.train.parallel.reduce import Reducer
from winnow.train.parallel.tensor_parallel import (
    sequence_parallel_parameters,
    sync_sequence_parallel_grads,
)

log = logging.getLogger(__name__)


class _NoMetrics:
    """Metrics sink of ranks other than 0: rank 0 writes the (globally reduced) records."""

    def write(self, record: dict) -> None:
        del record

    def close(self) -> None:
        return None


class Parallel:
    """The run's layout (``ParallelConfig``) on its ``World``; built once per process."""

    def __init__(self, cfg: ParallelConfig, world: World) -> None:
        self.cfg, self.world = cfg, world
        self.comm = CommTimer()
        self.reducer = Reducer(world, self.comm)
        self.experts: list[str] = []  # names of parameters sharded over the ep group
        self._expert_params: list[nn.Parameter] = []
        self.tp_layouts: dict[str, tuple[int, int]] = {}  # parameters split over the tp group -> (dim, parts)
        self._tp_params: list[nn.Parameter] = []
        self._sp_params: list[nn.Parameter] = []  # sequence parallel: norm scales with per-rank partial gradients
        self._reduce_load = False
        self.dispatches: dict = {}  # id(MoE.experts) -> its ExpertDispatch (expert parallelism)
        self.pipeline = None  # train.parallel.pipeline.Pipeline of this rank's stages, once ``parallelize`` built it
        self.compression = None  # under DDP: train.parallel.compression's TopKCompression or PowerSGDCompression

    @classmethod
    def local(cls, device: torch.device) -> Parallel:
        return cls(ParallelConfig(), World(rank=0, size=1, local_rank=0, device=device))

    @classmethod
    def from_env(cls, cfg: ParallelConfig, *, device: str = "auto", n_experts: int = 0) -> Parallel:
        """Join the ``torchrun`` launch described by the environment (one process when there is none)."""
        return cls(cfg, init_world(cfg, device=device, n_experts=n_experts))

    @property
    def is_main(self) -> bool:
        return self.world.is_main

    @property
    def fsdp(self) -> bool:
        return self.world.dims.dp_shard > 1

    @property
    def grad_scale(self) -> float:
        """Factor on the data loss that undoes the wrappers' gradient averaging over the data-parallel ranks."""
        return float(self.world.dp_size)

    # ---- model ------------------------------------------------------------------------------
    def parallelize(
        self,
        model: nn.Module,
        *,
        grad_accum: int = 1,
        activation_checkpointing: bool = False,
        compile: bool = False,
        seed: int = 0,
        grad_clip: float = 0.0,
        adam: tuple[float, float] = (0.95, 1e-8),
    ) -> nn.Module:
        """Apply this run's layout to the plain ``model`` in place; returns the module to call forward on.

        A model built on the meta device is then given memory for this rank's parts only and initialised
        (``Transformer.init_weights`` with ``seed``, each parameter's part taken by ``write_part``), so
        every layout starts from the one-process model's weights without any rank holding them whole.

        Under pipeline parallelism ``model`` is first cut to this rank's stages and ``self.pipeline``
        runs them, ``grad_accum`` micro-batches per step (as in torchtitan, each stage is then a model
        of its own for the other parallelisms). Then ``train.parallel.parallelize``: TP/SP, EP,
        activation checkpointing, compile, FSDP2. DDP, when the data-parallel ranks replicate, wraps the model
        last (the stages at their first step): its ``dp`` group leaves out the tp ranks, which hold
        different parts and share their batches. ``grad_clip`` (the trainer's max norm): top-k compression
        (``compression = "topk"``, a hook on that DDP) clips each rank's gradient before accumulating it;
        ``adam``: the optimizer's β2 and eps, with which it preconditions it (``topk.precondition = "adam"``).
        """
        from winnow.train.parallel.parallelize import parallelize

        world = self.world
        self._reduce_load = getattr(model.cfg, "load_balance", None) == "bias" and world.dp_size > 1
        stages = None
        if world.pp_size > 1:
            stages = self._pipeline(model, grad_accum).modules
        layout = parallelize(
            model,
            world,
            self.cfg,
            self.comm,
            activation_checkpointing=activation_checkpointing,
            compile=compile,
            stages=stages,
        )
        self.experts, self.tp_layouts, self.dispatches = layout.experts, layout.tp_layouts, layout.dispatches
        if any(p.is_meta for p in model.parameters()):  # FSDP2 shards with offload live on the CPU
            model.to_empty(device="cpu" if self.cfg.cpu_offload else world.device)
            model.init_weights(seed, write=self.write_part)
        self._find_split_parameters(model)
        if self.fsdp or world.dp_size == 1 or self.pipeline is not None:
            return model
        if self.cfg.compression == "topk":
            from winnow.train.parallel.compression import TopKCompression

            self.compression = TopKCompression(
                self.cfg.topk, model, group=world.dp_group, timer=self.comm, grad_clip=grad_clip, adam=adam
            )
        elif self.cfg.powersgd_rank:
            from winnow.train.parallel.compression import PowerSGDCompression

            self.compression = PowerSGDCompression(self.cfg, model, group=world.dp_group, timer=self.comm)
        return wrap_ddp(model, world, self.cfg, self.comm, ignore=self.experts, compression=self.compression)

    @torch.no_grad()
    def write_part(self, name: str, param: nn.Parameter, full: torch.Tensor) -> None:
        """Copy this rank's part of the one-process tensor ``full`` into parameter ``name``: its experts, its
        tensor-parallel part, its FSDP2 shard."""
        part = ckpt.shard_of(param, ckpt.part(name, full, self.world, self.experts, self.tp_layouts))
        (param.to_local() if hasattr(param, "to_local") else param).copy_(part)

    def _pipeline(self, model: nn.Module, grad_accum: int):
        """This rank's pipeline stages of ``model`` (which keeps only their layers), under DDP over the ``dp``
        ranks when they replicate (FSDP2 shards the stage modules in ``parallelize``)."""
        from winnow.train.parallel.pipeline import Pipeline

        world = self.world
        ddp = world.dp_size > 1 and not self.fsdp
        wrap = (lambda stage: wrap_ddp(stage, world, self.cfg, self.comm, ignore=self.experts)) if ddp else None
        seq_parts = world.tp_size if self.cfg.sequence_parallel else 1
        self.pipeline = Pipeline(
            model,
            rank=world.pp_rank,
            size=world.pp_size,
            group=world.pp_group,
            schedule=self.cfg.pp_schedule,
            n_microbatches=grad_accum,
            device=world.device,
            timer=self.comm,
            stages_per_rank=self.cfg.pp_stages_per_rank,
            wrap=wrap,
            seq_parts=seq_parts,
        )
        return self.pipeline

    def _find_split_parameters(self, model: nn.Module) -> None:
        """The parameters split over ``ep`` (experts) and over ``tp``, and the norms under sequence parallelism
        (FSDP2 replaced them by DTensors: found by name)."""
        self._expert_params = expert_parameters(model, self.experts)
        self._tp_params = expert_parameters(model, list(self.tp_layouts))
        if self.cfg.sequence_parallel and self.world.tp_size > 1:
            self._sp_params = sequence_parallel_parameters(model)

    def grad_sync(self, net: nn.Module, *, last: bool):
        """Context for one micro-batch's forward and backward: DDP all-reduces only on the ``last`` one.

        The micro-batches before it accumulate their gradients locally (``no_sync``), so a step
        with k micro-batches communicates once, not k times. FSDP2 keeps reduce-scattering every
        micro-batch: skipping it would hold full unsharded gradients, the memory FSDP is for.
        """
        if last or not isinstance(net, DistributedDataParallel):
            return contextlib.nullcontext()
        return net.no_sync()

    def grad_scaler(self) -> torch.amp.GradScaler:
        """fp16's loss scaler; across ranks one whose overflow check every rank agrees on (``precision``)."""
        device = self.world.device.type
        if not self.world.distributed:
            return torch.amp.GradScaler(device)
        return AgreedGradScaler(device, timer=self.comm)

    def global_tokens(self, local_tokens: int) -> int:
        """Loss tokens of the step over every rank: the denominator of the global-batch mean."""
        return self.reducer.sum_int(local_tokens)

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> torch.Tensor:
        """Finish the expert gradients, then clip every gradient by the global norm; returns the norm.

        Under top-k compression each rank clipped its own gradient before the exchange: the norm is
        measured, not applied again to what went through it (it would scale the withheld gradients
        the step sends too); expert-parallel experts, all-reduced beside DDP, are clipped as usual.
        """
        params = [p for p in model.parameters() if p.grad is not None]
        if not self.world.distributed:
            return torch.nn.utils.clip_grad_norm_(params, max_norm)
        if self._expert_params and not self.fsdp:
            sync_expert_grads(self._expert_params, self.world, self.comm)
        if self._sp_params:
            sync_sequence_parallel_grads(self._sp_params, self.world, self.comm)
        # under pipeline parallelism each stage holds its own parameters: the squares add up over pp
        norm = self.reduce_pp(self._grad_norm_sq(params)).sqrt()
        # one call per mesh: under FSDP2 x EP the dense and expert gradients are DTensors on different meshes
        on_ep = {id(p) for p in self._expert_params}
        dense, experts = [p for p in params if id(p) not in on_ep], [p for p in params if id(p) in on_ep]
        for group in (
            (experts,) if self.compression is not None and self.compression.clips_locally else (dense, experts)
        ):
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, norm)
        return norm

    def _grad_norm_sq(self, params: list[nn.Parameter]) -> torch.Tensor:
        """The squared global gradient norm: each part's squares summed over the groups it is split over.

        Parameters fall into four kinds: whole on every rank, split over ``ep`` (experts), over ``tp``,
        or over both; FSDP2's sharded gradients give a partial DTensor norm, summed by ``full_tensor``.
        """
        on_ep, on_tp = {id(p) for p in self._expert_params}, {id(p) for p in self._tp_params}
        kinds: dict[tuple[bool, bool], list[torch.Tensor]] = {(e, t): [] for e in (False, True) for t in (False, True)}
        for p in params:
            kinds[id(p) in on_ep, id(p) in on_tp].append(p.grad)

        def squares(grads: list[torch.Tensor]) -> torch.Tensor:
            if not grads:
                return torch.zeros((), device=self.world.device)
            norm = torch.nn.utils.get_total_norm(grads)
            return (norm.full_tensor() if hasattr(norm, "full_tensor") else norm).float().pow(2)

        whole, tp_sq, ep_sq, both_sq = (
            squares(kinds[k]) for k in ((False, False), (False, True), (True, False), (True, True))
        )
        if self.world.ep_size > 1:
            ep_sq, both_sq = self.comm.all_reduce(torch.stack([ep_sq, both_sq]), self.world.ep_group).unbind()
        if self.world.tp_size > 1:
            tp_sq, both_sq = self.comm.all_reduce(torch.stack([tp_sq, both_sq]), self.world.tp_group).unbind()
        return whole + tp_sq + ep_sq + both_sq

    def step_values(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> tuple[float, float]:
        return self.reducer.step_values(loss, grad_norm)

    def reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Per-source sums, routing counts and loads over the ranks (the accounting's ``reduce``).

        Under pipeline parallelism each figure arises on one stage (the losses on the last, a layer's
        routing where it lives), so the dp sums are summed over the pipeline too.
        """
        return self.reduce_pp(self.reducer.sum(tensor))

    def reduce_pp(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over the ranks of one pipeline: stage-local figures (router losses per layer, held-out sums) made whole."""
        if self.pipeline is None:
            return tensor
        return self.comm.all_reduce(tensor.detach().clone(), self.world.pp_group)

    def global_load(self, load_ME: torch.Tensor) -> torch.Tensor:
        """The step's expert load over every rank, for the aux-loss-free bias update (only then a collective)."""
        return self.reducer.sum(load_ME) if self._reduce_load else load_ME

    # ---- outputs ----------------------------------------------------------------------------
    def metrics_writer(self, run_dir: str | Path, config: MetricsConfig | None = None):
        return MetricsWriter(run_dir, config) if self.is_main else _NoMetrics()

    def model_state(self, model: nn.Module) -> dict:
        return ckpt.model_state(model, self.world, fsdp=self.fsdp, experts=self.experts, tp=self.tp_layouts)

    def optim_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
        return ckpt.optim_state(model, optimizer, self.world, fsdp=self.fsdp, experts=self.experts, tp=self.tp_layouts)

    def load_model_state(self, model: nn.Module, state: dict) -> None:
        ckpt.load_model_state(model, state, self.world, fsdp=self.fsdp, experts=self.experts, tp=self.tp_layouts)

    def load_optim_state(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
        ckpt.load_optim_state(
            model, optimizer, state, self.world, fsdp=self.fsdp, experts=self.experts, tp=self.tp_layouts
        )

    def save_checkpoint(
        self, manager: CheckpointManager, step: int, state: dict, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> Path:
        """``state`` (the run's other parts) and the model's and optimizer's shards, each rank writing its own."""
        shards, groups = ckpt.shard_state(model, optimizer, self.world, experts=self.experts, tp=self.tp_layouts)
        if self.compression is not None:  # each rank's withheld gradients (top-k residuals, PowerSGD's error)
            shards |= self.compression.shards(**self._coordinates())
        state = {**state, "optimizer": {"param_groups": groups}}
        return ckpt.save_sharded(manager, step, state, shards, self.world)

    def load_shards(self, model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path, param_groups: list) -> None:
        """This rank's part of a checkpoint's shards, saved on any mesh."""
        ckpt.load_shards(model, optimizer, folder, param_groups, self.world, experts=self.experts, tp=self.tp_layouts)
        if self.compression is not None:
            self.compression.load_shards(folder, **self._coordinates())

    def _coordinates(self) -> dict:
        return {"dp_rank": self.world.dp_rank, "tp_rank": self.world.tp_rank, "tp_size": self.world.tp_size}

    def comm_report(self) -> dict:
        """Communication since the last call: seconds, bytes sent, and bytes saved by compression."""
        report = self.comm.state_dict()
        report["bytes_saved"] = report["bytes_uncompressed"] - report["bytes_sent"]
        self.comm.reset()
        return report
