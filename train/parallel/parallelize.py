"""``parallelize``: the one step that applies the run's parallelisms to a plain model, in torchtitan's order.

The model (``train.model``) is ordinary PyTorch with no parallel code in its layers. On each rank,
after the pipeline (``torch.distributed.pipelining``) has cut the model to this rank's stages:

1. tensor and sequence parallelism (``tensor_parallel``): split weights cut to this rank's part, the
   crossings of the ``tp`` group hooked onto the attention, feed-forward and MoE modules;
2. expert parallelism (``expert_parallel``): each MoE layer keeps this rank's experts, the all-to-all
   of the routed rows hooked onto its ``experts`` module;
3. activation checkpointing, per block (``torch.distributed._composable.checkpoint``: hooks on the
   block, so the parameter names stay the plain model's);
4. ``torch.compile``, per block (``nn.Module.compile``: in place, names unchanged; the blocks run the same
   code, so one compilation serves them all);
5. FSDP2 (``data_parallel.apply_fsdp``): every block, then the root (each pipeline stage), sharded over
   ``dp_shard`` (the experts over ``edp``).

DDP, the alternative to 5, wraps the whole model (or each stage) afterwards (``Parallel.parallelize``).
Every step works in place on the module tree, on real or meta tensors, so the weights each rank
ends up holding (and initialising, ``train.model.init``) follow from the layout alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from winnow.train.parallel.comm import CommTimer
from winnow.train.parallel.config import ParallelConfig
from winnow.train.parallel.mesh import World


@dataclass(slots=True)
class Layout:
    """What ``parallelize`` did to the model's parameters, by their (unchanged) names."""

    tp_layouts: dict[str, tuple[int, int]] = field(default_factory=dict)  # split over tp: name -> (dim, parts)
    experts: list[str] = field(default_factory=list)  # sharded over ep
    dispatches: dict = field(default_factory=dict)  # id(MoE.experts) -> its ExpertDispatch


def apply_activation_checkpointing(model: nn.Module) -> None:
    """Recompute each block's activations in the backward pass instead of keeping them."""
    from torch.distributed._composable import checkpoint

    for block in model.blocks:
        if block is not None:  # a pipeline stage holds some of the blocks
            checkpoint(block)


def apply_compile(model: nn.Module) -> None:
    """Compile each block (on a GPU: norms, SwiGLU and routing fused); the collectives tensor and expert
    parallelism hook into a block run eager between its compiled pieces (graph breaks)."""
    for block in model.blocks:
        if block is not None:
            block.compile()


def parallelize(
    model: nn.Module,
    world: World,
    cfg: ParallelConfig,
    timer: CommTimer,
    *,
    activation_checkpointing: bool = False,
    compile: bool = False,
    stages: list[nn.Module] | None = None,
) -> Layout:
    """Apply TP/SP, EP, activation checkpointing, compile and FSDP2 to ``model`` in place (see the module docstring).

    ``stages``: under pipeline parallelism this rank's stage modules (each an FSDP2 root of its own);
    ``model`` then holds their layers only.
    """
    layout = Layout()
    if world.tp_size > 1:
        from winnow.train.parallel.tensor_parallel import apply_tensor_parallel

        layout.tp_layouts = apply_tensor_parallel(model, world, timer, sequence_parallel=cfg.sequence_parallel)
    if world.ep_size > 1:
        from winnow.train.parallel.expert_parallel import (
            apply_expert_parallel,
            sharded_expert_names,
        )

        layout.dispatches = apply_expert_parallel(model, world, timer)
        layout.experts = sharded_expert_names(model)
    if activation_checkpointing:
        apply_activation_checkpointing(model)
    if compile:
        apply_compile(model)
    if world.dims.dp_shard > 1:
        from winnow.train.parallel.data_parallel import apply_fsdp

        for root in stages or [model]:
            # a pipeline keeps the stage's parameters gathered over its micro-batches (see apply_fsdp)
            apply_fsdp(root, world, cfg, timer, reshard_after_forward=stages is None)
    return layout
