"""The process group and device mesh of a ``torchrun`` launch: gloo on CPU, NCCL on GPU, a 2-D ``(dp, ep)`` mesh.

``torchrun`` sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``;
without them the run is one process and no process group is created. Expert parallelism
borrows from data parallelism (as in torchtitan): every rank reads its own part of the data,
the ``ep`` dimension holds the ranks that share one copy of the experts and the ``dp``
dimension the ranks that hold the same experts (whose expert gradients are averaged).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from train.errors import ConfigError
from train.parallel.config import ParallelConfig

log = logging.getLogger(__name__)


@dataclass(slots=True)
class World:
    """Where this process stands: rank, size, device and the mesh's process groups (None when alone)."""

    rank: int
    size: int
    local_rank: int
    device: torch.device
    mesh: object | None = None  # torch.distributed.device_mesh.DeviceMesh, dims ("dp", "ep")
    dp_group: object | None = None
    ep_group: object | None = None
    ep_size: int = 1

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def ep_rank(self) -> int:
        return self.rank % self.ep_size


def launched_world_size() -> int:
    """Processes ``torchrun`` launched (1 when not under ``torchrun``)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def pick_device(requested: str, local_rank: int) -> torch.device:
    """``requested`` is ``"auto"``, ``"cpu"`` or ``"cuda"``; each local rank gets its own GPU."""
    use_cuda = requested == "cuda" or (requested == "auto" and torch.cuda.is_available())
    if not use_cuda:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("train.device = 'cuda' but this torch build sees no CUDA device")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def init_world(cfg: ParallelConfig, *, device: str = "auto", n_experts: int = 0) -> World:
    """Join the ``torchrun`` process group (once) and build the ``(dp, ep)`` mesh; a one-process World otherwise."""
    size = launched_world_size()
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    dev = pick_device(device, local_rank)
    if size == 1:
        if cfg.expert_parallel > 1:
            raise ConfigError(f"train.parallel.expert_parallel = {cfg.expert_parallel} needs as many processes; "
                              "launch with torchrun --nproc_per_node N")
        return World(rank=0, size=1, local_rank=0, device=dev)
    cfg.check_world(size, n_experts)
    backend = cfg.backend if cfg.backend != "auto" else ("nccl" if dev.type == "cuda" else "gloo")
    if backend == "nccl" and dev.type != "cuda":
        raise ConfigError("train.parallel.backend = 'nccl' needs CUDA devices; use 'gloo' (or 'auto') on CPU")
    if not dist.is_initialized():
        dist.init_process_group(backend, device_id=dev if dev.type == "cuda" else None)
    from torch.distributed.device_mesh import init_device_mesh

    ep = cfg.expert_parallel
    mesh = init_device_mesh(dev.type, (size // ep, ep), mesh_dim_names=("dp", "ep"))
    log.info("rank %d/%d on %s (%s): mesh dp=%d x ep=%d", rank, size, dev, backend, size // ep, ep)
    return World(rank=rank, size=size, local_rank=local_rank, device=dev, mesh=mesh,
                 dp_group=mesh["dp"].get_group(), ep_group=mesh["ep"].get_group(), ep_size=ep)


def shutdown() -> None:
    """Leave the process group (a no-op when there is none)."""
    if dist.is_initialized():
        dist.destroy_process_group()
