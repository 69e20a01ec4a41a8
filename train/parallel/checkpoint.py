"""Full (unsharded) model and optimizer state from any layout, and back, so N-rank checkpoints resume on M ranks.

Whatever the layout (one process, DDP, FSDP2, experts sharded over ``ep``), the state saved is
the one-process model's: parameter names without wrapper prefixes, full expert tensors, and
the optimizer state keyed by parameter name (``torch.distributed.checkpoint.state_dict``).
Rank 0 writes it with the run's ``CheckpointManager`` (atomic, checksummed); every rank reads
it back and keeps its own part.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)

from train.checkpoint import PREFIX, CheckpointManager
from train.parallel.expert_parallel import gather_experts, local_slice
from train.parallel.mesh import World

_FULL = StateDictOptions(full_state_dict=True)


def _is_sharded(value) -> bool:
    return isinstance(value, torch.Tensor) and value.ndim > 0


def model_state(model: nn.Module, world: World, *, fsdp: bool, experts: list[str]) -> dict:
    """The one-process model's state dict, on the CPU (complete on rank 0 at least)."""
    if fsdp:
        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    state = model.state_dict()
    for name in experts:
        state[name] = gather_experts(state[name], world)
    return {k: v.detach().cpu() for k, v in state.items()}


def optim_state(model: nn.Module, optimizer: torch.optim.Optimizer, world: World, *, fsdp: bool,
                experts: list[str]) -> dict:
    """The optimizer state keyed by parameter name, full tensors, on the CPU."""
    if fsdp:
        return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    state = get_optimizer_state_dict(model, optimizer)
    for name in experts:
        per_param = state["state"].get(name, {})
        for key, value in per_param.items():
            if _is_sharded(value):
                per_param[key] = gather_experts(value, world)
    return _to_cpu(state)


def _to_cpu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    return obj


def load_model_state(model: nn.Module, state: dict, world: World, *, fsdp: bool, experts: list[str]) -> None:
    if fsdp:
        set_model_state_dict(model, state, options=_FULL)
        return
    state = dict(state)
    for name in experts:
        state[name] = local_slice(state[name], world)
    model.load_state_dict(state)


def load_optim_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict, world: World, *, fsdp: bool,
                     experts: list[str]) -> None:
    if state.get("state") and all(isinstance(k, int) for k in state["state"]):
        optimizer.load_state_dict(state)  # saved by a one-process run before name-keyed optimizer state
        return
    if fsdp:
        set_optimizer_state_dict(model, optimizer, state, options=_FULL)
        return
    state = {"state": {k: dict(v) for k, v in state["state"].items()}, "param_groups": state["param_groups"]}
    for name in experts:
        per_param = state["state"].get(name, {})
        for key, value in per_param.items():
            if _is_sharded(value):
                per_param[key] = local_slice(value, world)
    set_optimizer_state_dict(model, optimizer, state)


def save_on_main(manager: CheckpointManager, step: int, state: dict, world: World) -> Path:
    """Rank 0 writes; the others wait for it, so a checkpoint is complete before anyone goes on."""
    path = manager.folder / f"{PREFIX}{step:08d}"
    if world.is_main:
        path = manager.save(step, state)
    if world.distributed:
        dist.barrier()
    return path
