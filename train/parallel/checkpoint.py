"""Model and optimizer state in any layout, saved so that N-rank checkpoints resume on M ranks.

Checkpoints (``save_sharded``/``load_shards``): every rank writes the shards it holds into the
checkpoint's DCP folder (``train.dcp``) under the one-process model's names — FSDP2's DTensors
as they are, tensor parallelism's split weights joined into whole tensors, the experts an expert-parallel rank holds as a
DTensor sharded along the expert dimension over ``ep`` (replicated over the ranks holding the
same experts), replicated tensors once. Loading builds the same state dict for the new layout and
lets DCP read each rank's part of every global tensor, so a run saved on one mesh resumes on
another. Rank 0 writes the rest (``state.pt``) and commits the folder (atomic, checksummed).

The full (one-process) state (``model_state``/``optim_state``, and back) stays for
``Trainer.state_dict`` and ``init_from``: parameter names without wrapper prefixes, full expert
tensors, the optimizer state keyed by parameter name.
Under pipeline parallelism each rank holds some layers (under the one-process names): the DCP
folder gets every stage's tensors from the rank holding them, and the one-process state gathers
them over the ``pp`` group; each rank loads its layers'.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from winnow.train import dcp
from winnow.train.checkpoint import PREFIX, SHARDS_DIR, CheckpointManager
from winnow.train.errors import CheckpointError
from winnow.train.parallel import tensor_parallel
from winnow.train.parallel.expert_parallel import gather_experts, local_slice
from winnow.train.parallel.mesh import World

_FULL = StateDictOptions(full_state_dict=True)


def _is_sharded(value) -> bool:
    return isinstance(value, torch.Tensor) and value.ndim > 0


def _full(name: str, tensor: torch.Tensor, world: World, experts: list[str], tp: dict) -> torch.Tensor:
    """The one-process tensor from this rank's part: joined over ``tp`` (its layout), then over ``ep`` (rows)."""
    if name in tp:
        tensor = tensor_parallel.gather(tensor, tp[name], world)
    return gather_experts(tensor, world) if name in experts else tensor


def part(name: str, tensor: torch.Tensor, world: World, experts: list[str], tp: dict) -> torch.Tensor:
    """This rank's part of a one-process tensor (the inverse of ``_full``)."""
    if name in experts:
        tensor = local_slice(tensor, world)
    return tensor_parallel.local(tensor, tp[name], world) if name in tp else tensor


def shard_of(param: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """The piece of ``full`` (a tensor of ``param``'s global shape) that ``param`` holds: an FSDP2 DTensor's
    local shard, or all of it."""
    if not hasattr(param, "device_mesh"):
        return full
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    for dim, (size, start) in enumerate(zip(shape, offset)):
        full = full.narrow(dim, start, size)
    return full


def _map_optim(state: dict, names, fn) -> None:
    """Apply ``fn(name, tensor)`` to every non-scalar optimizer entry of the parameters ``names``, in place."""
    for name in dict.fromkeys(names):
        per_param = state["state"].get(name, {})
        for key, value in per_param.items():
            if _is_sharded(value):
                per_param[key] = fn(name, value)


def model_state(model: nn.Module, world: World, *, fsdp: bool, experts: list[str], tp: dict | None = None) -> dict:
    """The one-process model's state dict, on the CPU (complete on rank 0 at least)."""
    if fsdp and not experts and not tp and world.pp_size == 1:
        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    tp = tp or {}
    # FSDP2 x EP (or x PP): full over each mesh's FSDP shards on every rank, then the experts gathered over ep
    # and the stages over pp
    state = get_model_state_dict(model, options=_FULL) if fsdp else model.state_dict()
    for name in dict.fromkeys([*experts, *tp]):
        state[name] = _full(name, state[name], world, experts, tp)
    return _gather_stages({k: v.detach().cpu() for k, v in state.items()}, world)


def optim_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    world: World,
    *,
    fsdp: bool,
    experts: list[str],
    tp: dict | None = None,
) -> dict:
    """The optimizer state keyed by parameter name, full tensors, on the CPU."""
    if fsdp and not experts and not tp and world.pp_size == 1:
        return get_optimizer_state_dict(
            model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
    tp = tp or {}
    state = get_optimizer_state_dict(model, optimizer, options=_FULL if fsdp else None)
    _map_optim(state, [*experts, *tp], lambda name, value: _full(name, value, world, experts, tp))
    state = _to_cpu(state)
    if world.pp_size > 1:
        parts = _gather_objects(state, world)
        state = {
            "state": {k: v for part in parts for k, v in part["state"].items()},
            "param_groups": [
                {**group, "params": [n for part in parts for n in part["param_groups"][i]["params"]]}
                for i, group in enumerate(parts[0]["param_groups"])
            ],
        }
    return state


def _gather_objects(obj, world: World) -> list:
    parts = [None] * world.pp_size
    dist.all_gather_object(parts, obj, group=world.pp_group)
    return parts


def _gather_stages(state: dict, world: World) -> dict:
    """The union of the pipeline stages' state dicts (their names are the one-process model's)."""
    if world.pp_size == 1:
        return state
    return {k: v for part in _gather_objects(state, world) for k, v in part.items()}


def _own(state: dict, names) -> dict:
    return {k: v for k, v in state.items() if k in names}


def _to_cpu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    return obj


def load_model_state(
    model: nn.Module, state: dict, world: World, *, fsdp: bool, experts: list[str], tp: dict | None = None
) -> None:
    tp = tp or {}
    state = _own(state, model.state_dict()) if world.pp_size > 1 else dict(state)  # this stage's layers
    for name in dict.fromkeys([*experts, *tp]):
        state[name] = part(name, state[name], world, experts, tp)
    if fsdp:  # each rank passes the full tensors (its experts' rows); FSDP2 keeps its shard
        set_model_state_dict(model, state, options=_FULL)
    else:
        model.load_state_dict(state)


def load_optim_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict,
    world: World,
    *,
    fsdp: bool,
    experts: list[str],
    tp: dict | None = None,
) -> None:
    if state.get("state") and all(isinstance(k, int) for k in state["state"]):
        optimizer.load_state_dict(state)  # saved by a one-process run before name-keyed optimizer state
        return
    tp = tp or {}
    state = {"state": {k: dict(v) for k, v in state["state"].items()}, "param_groups": state["param_groups"]}
    if world.pp_size > 1:  # this stage's parameters
        names = {name for name, _ in model.named_parameters()}
        state = {
            "state": _own(state["state"], names),
            "param_groups": [{**g, "params": [n for n in g["params"] if n in names]} for g in state["param_groups"]],
        }
    _map_optim(state, [*experts, *tp], lambda name, value: part(name, value, world, experts, tp))
    set_optimizer_state_dict(model, optimizer, state, options=_FULL if fsdp else None)


# ---- sharded checkpoints (DCP) -------------------------------------------------------------
def _expert_dtensor(local: torch.Tensor, world: World):
    """This rank's experts as the global (E, ...) tensor's Shard(0) over ep, replicated over dp (shares storage)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    return DTensor.from_local(local, world.sparse_mesh["edp", "ep"], [Replicate(), Shard(0)], run_check=False)


def _rank_experts(value: torch.Tensor) -> torch.Tensor:
    """All of this rank's experts (or tp part): under FSDP2 a DTensor sharded over ``edp`` or ``dp_shard`` (gathered here, a copy)."""
    return value.full_tensor() if hasattr(value, "full_tensor") else value


def _as_param(local: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """This rank's experts (or tp part) laid out as ``like`` (FSDP2's DTensor over its mesh, or a plain tensor)."""
    if not hasattr(like, "device_mesh"):
        return local
    from torch.distributed.tensor import distribute_tensor

    # every edp rank holds the same experts after the load, so each keeps its own chunk
    return distribute_tensor(local, like.device_mesh, like.placements)


def shard_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, world: World, *, experts: list[str], tp: dict | None = None
) -> tuple[dict, list]:
    """(this rank's tensors for the DCP folder: ``model`` and ``optimizer.state``; the optimizer's param groups).

    The tensors share storage with the model and optimizer, so ``dcp.load`` into them loads in place;
    except the tensor-parallel ones, joined over ``tp`` into whole (new) tensors (``load_shards``
    keeps this rank's part): the fused projections' parts are no single block of the whole tensor,
    which a DCP chunk must be, and whole tensors resume on any tp degree.
    """
    tp = tp or {}
    model_sd = get_model_state_dict(model)
    optim_sd = get_optimizer_state_dict(
        model, optimizer
    )  # creates the moments of a fresh optimizer (DCP needs targets)
    for name in tp:  # under FSDP2 this tp rank's part is first gathered over dp_shard
        model_sd[name] = tensor_parallel.gather(_rank_experts(model_sd[name]), tp[name], world)
    _map_optim(optim_sd, tp, lambda name, value: tensor_parallel.gather(_rank_experts(value), tp[name], world))
    for name in experts:
        model_sd[name] = _expert_dtensor(_rank_experts(model_sd[name]), world)
        per_param = optim_sd["state"].get(name, {})
        for key, value in per_param.items():
            if _is_sharded(value):
                per_param[key] = _expert_dtensor(_rank_experts(value), world)
    return {"model": model_sd, "optimizer": {"state": optim_sd["state"]}}, optim_sd["param_groups"]


def load_shards(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    folder: Path,
    param_groups: list,
    world: World,
    *,
    experts: list[str],
    tp: dict | None = None,
) -> None:
    """Read this rank's part of a checkpoint's shards (saved on any mesh) into the model and optimizer."""
    tp = tp or {}
    shards, _ = shard_state(model, optimizer, world, experts=experts, tp=tp)
    dcp.load(shards, folder)
    params = dict(model.named_parameters())

    def as_mine(name: str, value: torch.Tensor) -> torch.Tensor:
        """The loaded tensor as this rank's parameter: its experts (the DTensor's local rows), its tp part of
        a whole tensor, then laid out as the parameter (re-sharded over FSDP2's mesh)."""
        if name in experts:
            value = value.to_local()
        if name in tp:
            value = tensor_parallel.local(value, tp[name], world)
        return _as_param(value, params[name])

    for name in dict.fromkeys([*experts, *tp]):
        shards["model"][name] = as_mine(name, shards["model"][name])
    _map_optim(shards["optimizer"], [*experts, *tp], as_mine)
    set_model_state_dict(model, shards["model"])
    # the saved groups' settings over this rank's own parameters: a pipeline stage holds only some of them
    own = get_optimizer_state_dict(model, optimizer)["param_groups"]
    groups = [{**saved, "params": mine["params"]} for saved, mine in zip(param_groups, own, strict=True)]
    set_optimizer_state_dict(model, optimizer, {"state": shards["optimizer"]["state"], "param_groups": groups})


def _agree(world: World, error: str | None) -> None:
    """Rank 0's outcome to every rank, so none waits forever in a collective after rank 0 failed."""
    if world.distributed:
        box = [error]
        dist.broadcast_object_list(box, src=0)
        error = box[0]
    if error is not None:
        raise CheckpointError(error)


def save_sharded(manager: CheckpointManager, step: int, state: dict, shards: dict, world: World) -> Path:
    """Every rank writes its shards into the step's temporary folder, then rank 0 writes ``state`` and commits it."""
    tmp = manager.tmp_path(step)
    error = None
    if world.is_main:
        try:
            manager.begin(step)
        except CheckpointError as err:
            error = str(err)
    _agree(world, error)
    try:  # a collective: returns (or raises, on every rank) once every rank's files and the metadata are written
        dcp.save(shards, tmp / SHARDS_DIR)
    except (OSError, RuntimeError) as err:
        failed = manager.failed(step, err) if world.is_main else CheckpointError(f"checkpoint {step}: {err}")
        raise failed from err
    path, error = manager.folder / f"{PREFIX}{step:08d}", None
    if world.is_main:
        try:
            path = manager.commit(step, state)
        except CheckpointError as err:
            error = str(err)
    _agree(world, error)
    return path
