"""Data parallelism on PyTorch's own wrappers: DDP (optionally compressed: ``train.parallel.compression``) and FSDP2.

Both average gradients over the data-parallel ranks; the trainer scales its data loss by the
data-parallel degree and normalizes by the global token count so the average is the global-batch mean.
"""

# no `from __future__ import annotations`: DDP checks the comm hooks' annotations at runtime
import logging
import time
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from winnow.train.parallel.comm import CommTimer
from winnow.train.parallel.config import ParallelConfig
from winnow.train.parallel.mesh import World

log = logging.getLogger(__name__)


def _timed_allreduce(timer: CommTimer):
    """DDP's default hook (all-reduce then divide by the world), with its time and bytes counted."""

    def hook(group, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        world = dist.get_world_size(group)
        buffer = bucket.buffer()
        nbytes, start = buffer.numel() * buffer.element_size(), time.perf_counter()

        def done(fut):
            timer.add_interval(start, time.perf_counter(), nbytes, nbytes)
            return fut.value()[0].div_(world)

        return dist.all_reduce(buffer, group=group, async_op=True).get_future().then(done)

    return hook


def wrap_ddp(
    model: nn.Module, world: World, cfg: ParallelConfig, timer: CommTimer, *, ignore: list[str] = (), compression=None
) -> DistributedDataParallel:
    """DDP over the data-parallel ranks; ``ignore`` names parameters it must not all-reduce (expert shards).

    ``compression``: a ``TopKCompression`` (``compression = "topk"``) or ``PowerSGDCompression``
    (``powersgd_rank``) whose hook replaces the all-reduce.
    """
    if ignore:
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, list(ignore))
    device_ids = [world.device.index] if world.device.type == "cuda" else None
    # no per-forward buffer sync: the only mutable buffer (the router bias) is updated from globally reduced loads
    ddp = DistributedDataParallel(
        model,
        device_ids=device_ids,
        process_group=world.dp_group,
        bucket_cap_mb=cfg.bucket_mb,
        forward_sync_buffers=False,
    )
    if compression is not None:
        compression.register(ddp)
    else:
        ddp.register_comm_hook(world.dp_group, _timed_allreduce(timer))
    return ddp


def _timed_fsdp_comms(timer: CommTimer):
    """FSDP2's default all-gather and reduce-scatter, with their time and bytes counted.

    They subclass FSDP2's defaults so FSDP keeps treating them as the default comms. An
    asynchronous call (FSDP issues them on a side stream on GPU) is counted from launch to
    the completion of its future, as DDP's buckets are; a blocking one around the call.
    """
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

    def timed(work, start: float, nbytes: int):
        if work is None:
            timer.add_interval(start, time.perf_counter(), nbytes, nbytes)
        else:
            work.get_future().then(lambda _: timer.add_interval(start, time.perf_counter(), nbytes, nbytes))
        return work

    class TimedAllGather(DefaultAllGather):
        def __call__(self, output_tensor, input_tensor, group, async_op=False):
            start = time.perf_counter()
            work = super().__call__(output_tensor, input_tensor, group, async_op)
            return timed(work, start, input_tensor.numel() * input_tensor.element_size())

    class TimedReduceScatter(DefaultReduceScatter):
        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            start = time.perf_counter()
            work = super().__call__(output_tensor, input_tensor, group, op, async_op)
            return timed(work, start, input_tensor.numel() * input_tensor.element_size())

    return TimedAllGather(), TimedReduceScatter()


def apply_fsdp(
    model: nn.Module, world: World, cfg: ParallelConfig, timer: CommTimer, *, reshard_after_forward: bool = True
) -> nn.Module:
    """Shard every block, then the root, with FSDP2 (``fully_shard``), in place; CPU offload when asked.

    ``model`` is the whole transformer or one pipeline stage (``StageModule``, its blocks in a
    ``ModuleDict``). Under pipeline parallelism, as in torchtitan, the parameters stay gathered
    from forward to backward (``reshard_after_forward=False``): every micro-batch's backward
    would otherwise all-gather them again; the stage (``PipelineStage``) skips the reduce-scatter
    on all but the step's last backward.

    Under expert parallelism (as torchtitan's ``apply_fsdp`` for MoE) the dense parameters are
    sharded over FSDP's mesh (``dp_shard``, ep ranks included; HSDP's two dims when replicated), and each MoE layer's local experts
    over the ``edp`` ranks that hold the same experts (the sparse mesh's ``edp`` dimension), as
    an FSDP unit of their own (the block's ``experts`` module). Expert gradients arrive summed over the ep
    ranks by the all-to-all's backward; their reduce-scatter divides by the data-parallel degree,
    as the dense one does, so both are the global-batch mean.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard
    from torch.distributed.tensor import Shard

    from winnow.train.model.moe import MoE

    dense_mesh = world.fsdp_mesh
    # Pinned host memory only speeds up copies to an accelerator, and pinning needs one: without it
    # ``pin_memory`` raises, so a CPU-only (gloo) run offloads to plain memory.
    policy = CPUOffloadPolicy(pin_memory=torch.accelerator.is_available()) if cfg.cpu_offload else OffloadPolicy()
    all_gather, reduce_scatter = _timed_fsdp_comms(timer)

    def shard(module: nn.Module, mesh, **kw) -> None:
        fully_shard(module, mesh=mesh, offload_policy=policy, reshard_after_forward=reshard_after_forward, **kw)
        module.set_custom_all_gather(all_gather)
        module.set_custom_reduce_scatter(reduce_scatter)

    # The MoE block returns a view of its output; FSDP2 warns that an in-place op on it would skip its
    # pre-backward hook. ``Block`` adds it out of place, so the warning does not apply.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(FSDP\w+\) returned a view tensor")
    blocks = model.blocks.values() if isinstance(model.blocks, nn.ModuleDict) else model.blocks
    for block in blocks:
        moe = block.ffn
        if world.ep_size > 1 and isinstance(moe, MoE):
            expert_mesh = world.sparse_mesh["edp"]
            # fewer local experts than ranks to shard them over: shard the next dimension instead
            dim = 0 if moe.experts.w13_ED2F.shape[0] >= expert_mesh.size() else 1
            shard(moe.experts, expert_mesh, shard_placement_fn=lambda _p, dim=dim: Shard(dim))
            moe.experts.set_gradient_divide_factor(float(world.dp_size))
            # gloo has no PREMUL_SUM: sum, then divide. Not on one rank, where FSDP2 (torch 2.13) already
            # divides by the factor when it copies instead of reduce-scattering, and would divide twice.
            if expert_mesh.size() > 1 and dist.get_backend(expert_mesh.get_group()) != "nccl":
                moe.experts.set_force_sum_reduction_for_comms(True)
        shard(block, dense_mesh)
    shard(model, dense_mesh)
    return model
