"""The process group and the one device mesh of a ``torchrun`` launch: gloo on CPU, NCCL on GPU.

``torchrun`` sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``;
without them the run is one process and no process group is created.

As in torchtitan (``ParallelDims.build_mesh``), one 1-D world mesh is unflattened into the
views each feature needs, so every group is a slice of the same ranks:

* dense ``("pp", "dp_replicate", "dp_shard", "tp")``, ``tp`` fastest: a rank is
  ``((pp·R + r)·S + s)·T + t``; ``"dp"`` flattens ``dp_replicate × dp_shard`` (data sharding,
  gradient and metric reductions), ``dp_shard`` (or ``dp_replicate × dp_shard``, HSDP) is FSDP2's
  mesh and ``tp`` the tensor-parallel one;
* sparse ``("pp", "edp", "ep", "tp")`` splits the same ``dp`` ranks into expert groups: ``ep``
  consecutive dp ranks share one copy of the experts (all-to-all), ``edp`` ranks hold the same
  experts (their gradients are averaged).
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from winnow.train.errors import ConfigError
from winnow.train.parallel.config import MeshDims, ParallelConfig

log = logging.getLogger(__name__)

DENSE_DIMS = ("pp", "dp_replicate", "dp_shard", "tp")
SPARSE_DIMS = ("pp", "edp", "ep", "tp")


@dataclass(slots=True)
class World:
    """Where this process stands: rank, size, device, the mesh's degrees, coordinates and groups (None when alone).

    Coordinates follow from ``rank`` and ``dims`` alone (the layout of ``DENSE_DIMS``), so a World
    built by hand for a test has the same ranks a launched one would.
    """

    rank: int
    size: int
    local_rank: int
    device: torch.device
    dims: MeshDims = field(default_factory=MeshDims)
    mesh: object | None = None  # torch.distributed.device_mesh.DeviceMesh over DENSE_DIMS
    sparse_mesh: object | None = None  # the same ranks over SPARSE_DIMS
    dp_mesh: object | None = None  # "dp": dp_replicate x dp_shard flattened

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ---- coordinates ----------------------------------------------------------------------
    @property
    def tp_rank(self) -> int:
        return self.rank % self.dims.tp

    @property
    def dp_rank(self) -> int:
        """This rank's index among the ranks reading different data (dp_replicate-major, then dp_shard)."""
        return (self.rank // self.dims.tp) % self.dims.dp

    @property
    def pp_rank(self) -> int:
        return self.rank // (self.dims.tp * self.dims.dp)

    @property
    def dp_shard_rank(self) -> int:
        return self.dp_rank % self.dims.dp_shard

    @property
    def ep_rank(self) -> int:
        return self.dp_rank % self.dims.ep

    @property
    def edp_rank(self) -> int:
        return self.dp_rank // self.dims.ep

    # ---- sizes ----------------------------------------------------------------------------
    @property
    def dp_size(self) -> int:
        return self.dims.dp

    @property
    def tp_size(self) -> int:
        return self.dims.tp

    @property
    def pp_size(self) -> int:
        return self.dims.pp

    @property
    def ep_size(self) -> int:
        return self.dims.ep

    @property
    def edp_size(self) -> int:
        return self.dims.edp

    # ---- groups (None in one process) ----------------------------------------------------
    def _group(self, mesh, name: str):
        return None if mesh is None else mesh[name].get_group()

    @property
    def dp_group(self):
        """Ranks reading different data: gradients, token counts, losses and per-source sums reduce over it."""
        return None if self.dp_mesh is None else self.dp_mesh.get_group()

    @property
    def tp_group(self):
        return self._group(self.mesh, "tp")

    @property
    def pp_group(self):
        return self._group(self.mesh, "pp")

    @property
    def ep_group(self):
        """Ranks sharing one copy of the experts (the all-to-all's group)."""
        return self._group(self.sparse_mesh, "ep")

    @property
    def edp_group(self):
        """Ranks holding the same experts: the expert gradients are summed over it."""
        return self._group(self.sparse_mesh, "edp")

    @property
    def fsdp_mesh(self):
        """FSDP2's mesh: ``dp_shard``, or ``(dp_replicate, dp_shard)`` (HSDP) when both are > 1."""
        if self.mesh is None:
            return None
        return self.mesh["dp_replicate", "dp_shard"] if self.dims.dp_replicate > 1 else self.mesh["dp_shard"]


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


def build_meshes(device_type: str, dims: MeshDims):
    """(dense, sparse, dp) DeviceMeshes over the current process group, all unflattened from one world mesh."""
    from torch.distributed.device_mesh import init_device_mesh

    world = init_device_mesh(device_type, (dims.world,), mesh_dim_names=("world",))
    dense = world._unflatten(0, (dims.pp, dims.dp_replicate, dims.dp_shard, dims.tp), DENSE_DIMS)
    sparse = world._unflatten(0, (dims.pp, dims.edp, dims.ep, dims.tp), SPARSE_DIMS)
    dp = dense["dp_replicate", "dp_shard"]._flatten("dp")
    return dense, sparse, dp


def init_world(cfg: ParallelConfig, *, device: str = "auto", n_experts: int = 0) -> World:
    """Join the ``torchrun`` process group (once) and build the mesh; a one-process World otherwise."""
    size = launched_world_size()
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    dev = pick_device(device, local_rank)
    dims = cfg.resolve(size, n_experts=n_experts)
    if size == 1:
        return World(rank=0, size=1, local_rank=0, device=dev, dims=dims)
    backend = cfg.backend if cfg.backend != "auto" else ("nccl" if dev.type == "cuda" else "gloo")
    if backend == "nccl" and dev.type != "cuda":
        raise ConfigError("train.parallel.backend = 'nccl' needs CUDA devices; use 'gloo' (or 'auto') on CPU")
    if not dist.is_initialized():
        dist.init_process_group(backend, device_id=dev if dev.type == "cuda" else None)
    dense, sparse, dp = build_meshes(dev.type, dims)
    log.info("rank %d/%d on %s (%s): mesh %s", rank, size, dev, backend, dims.describe())
    return World(
        rank=rank, size=size, local_rank=local_rank, device=dev, dims=dims, mesh=dense, sparse_mesh=sparse, dp_mesh=dp
    )


def shutdown(*, wait: bool | None = None) -> None:
    """Leave the process group (a no-op when there is none).

    With ``wait`` every rank first meets the others at a barrier, so none tears down its
    connections while a peer still has work queued on the group. By default it waits unless an
    exception is on its way out (a ``finally`` after a failure), since then the other ranks may
    never arrive. A process that left a group should end with ``exit_process`` (see there).
    """
    global _LEFT_GROUP
    if not dist.is_initialized():
        return
    if wait if wait is not None else sys.exc_info()[1] is None:
        dist.barrier()
    dist.destroy_process_group()
    _LEFT_GROUP = True


_LEFT_GROUP = False  # whether this process has left a process group (``exit_process`` then skips finalization)


def exit_process(code: int) -> int:
    """End a process that left a gloo process group with ``code``, without Python's finalization.

    A gloo worker thread destroys a finished collective's work object after the caller has been
    told it is done; the work holds tensors with Python objects, and if the interpreter is already
    finalizing, the thread's wait for the GIL ends it with ``pthread_exit`` inside that destructor:
    ``std::terminate``, "terminate called without an active exception", SIGABRT, and ``torchrun``
    marks a finished run as failed (3 of 19 two-rank ``winnow train`` runs on a loaded 2-core
    machine; the core dump shows ``ProcessGroupGloo::runLoop`` -> ``~AsyncBarrierWork`` ->
    ``PyEval_AcquireThread``). Skipping finalization (after flushing the streams and logging) leaves
    that thread nothing to race: 0 of 120 such runs aborted.
    Returns ``code`` (and does nothing) in a process that is not a launched rank (``WORLD_SIZE`` > 1)
    or never left a group: a test process that made a one-rank group of its own carries on.
    """
    if not (_LEFT_GROUP and launched_world_size() > 1):
        return code
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)
