"""The ``[train.parallel]`` table: how a run under ``torchrun`` splits its work over processes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from train.errors import ConfigError


def _check(ok: bool, key: str, value: object, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"train.parallel.{key} = {value!r} is invalid; allowed: {allowed}")


# Why tensor and pipeline parallelism are refused (see README "Distributed training"):
TENSOR_PARALLEL_REFUSAL = (
    "train.parallel.tensor_parallel = {value!r}: tensor parallelism is not offered. "
    "torch.distributed.tensor.parallel shards nn.Linear weights (Colwise/Rowwise plans); the MoE experts are "
    "grouped (E, D, F) parameters run by one grouped matmul, so a plan would only cover attention and leave the "
    "experts replicated, and DTensor's CPU/gloo path lacks the grouped-matmul and scaled-dot-product sharding "
    "rules. Shard the experts with train.parallel.expert_parallel instead (works on gloo and NCCL).")
PIPELINE_PARALLEL_REFUSAL = (
    "train.parallel.pipeline_parallel = {value!r}: pipeline parallelism is not offered. "
    "torch.distributed.pipelining passes only tensors between stages, while every MoE block returns router "
    "statistics (load, aux and z losses, chosen experts) that the trainer needs on the last stage for the "
    "router loss and per-source expert accounting. Use data, fully-sharded or expert parallelism.")


@dataclass(kw_only=True, slots=True)
class ParallelConfig:
    """Data, fully-sharded and expert parallelism of one run (``[train.parallel]``).

    The number of processes comes from ``torchrun`` (``WORLD_SIZE``), not from here:
    ``expert_parallel`` of them share one copy of the experts, and the world is a 2-D
    mesh ``(dp, ep)`` with ``dp = world / expert_parallel``.
    """

    mode: Literal["none", "ddp", "fsdp"] = "ddp"  # dense parameters: replicated (DDP) or sharded (FSDP2)
    cpu_offload: bool = False  # fsdp only: parameters, gradients and optimizer state live on the CPU
    expert_parallel: int = 1  # ranks the experts of each MoE layer are sharded over (1: every rank holds all)
    powersgd_rank: int = 0  # ddp only: >0 compresses gradients with PowerSGD at this rank
    powersgd_start_iter: int = 10  # plain all-reduce for the first steps (PowerSGD's warm start)
    bucket_mb: int = 25  # DDP bucket size
    backend: Literal["auto", "gloo", "nccl"] = "auto"  # auto: nccl on CUDA, gloo on CPU
    tensor_parallel: int = 1  # refused when > 1 (see TENSOR_PARALLEL_REFUSAL)
    pipeline_parallel: int = 1  # refused when > 1 (see PIPELINE_PARALLEL_REFUSAL)

    def __post_init__(self) -> None:
        _check(self.mode in ("none", "ddp", "fsdp"), "mode", self.mode, "'none', 'ddp' or 'fsdp'")
        _check(self.backend in ("auto", "gloo", "nccl"), "backend", self.backend, "'auto', 'gloo' or 'nccl'")
        for key in ("expert_parallel", "bucket_mb", "tensor_parallel", "pipeline_parallel"):
            value = getattr(self, key)
            _check(isinstance(value, int) and value >= 1, key, value, "an integer >= 1")
        for key in ("powersgd_rank", "powersgd_start_iter"):
            value = getattr(self, key)
            _check(isinstance(value, int) and value >= 0, key, value, "an integer >= 0")
        _check(not self.cpu_offload or self.mode == "fsdp", "cpu_offload", self.cpu_offload,
               "true only with mode = 'fsdp' (FSDP2's CPUOffloadPolicy)")
        _check(not self.powersgd_rank or self.mode == "ddp", "powersgd_rank", self.powersgd_rank,
               "0 unless mode = 'ddp' (PowerSGD is a DDP communication hook)")
        _check(self.expert_parallel == 1 or self.mode != "fsdp", "expert_parallel", self.expert_parallel,
               "1 with mode = 'fsdp' (expert parallelism composes with mode = 'ddp')")
        if self.tensor_parallel > 1:
            raise ConfigError(TENSOR_PARALLEL_REFUSAL.format(value=self.tensor_parallel))
        if self.pipeline_parallel > 1:
            raise ConfigError(PIPELINE_PARALLEL_REFUSAL.format(value=self.pipeline_parallel))

    def check_world(self, world_size: int, n_experts: int) -> None:
        """Validate against the launched world and the model (known only at start-up)."""
        ep = self.expert_parallel
        _check(world_size % ep == 0, "expert_parallel", ep, f"a divisor of the number of processes ({world_size})")
        _check(ep == 1 or (n_experts > 1 and n_experts % ep == 0), "expert_parallel", ep,
               f"a divisor of train.model.n_experts ({n_experts})")
