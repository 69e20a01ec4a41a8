"""Which piece of each parameter this rank holds, and how its attribution dot products add up over the ranks.

Every figure of an attributed stretch is a dot product ``⟨displacement, held-out gradient⟩``,
a sum over the parameters' elements, so each rank can take it over the pieces it holds (its FSDP
shards, its experts, its tensor-parallel slices, the replicated rest) and one all-reduce over
the world adds the pieces. A piece held by ``C`` ranks (its *copies*: replicas under DDP, the
tp ranks of a replicated weight, the ``dp_replicate`` ranks of an HSDP shard) is weighted 1/C,
so it counts once. Per-source displacements under plain data parallelism are partial sums of
each rank's own tokens (``D`` ranks hold the piece with different data, ``C = D·R`` with ``R``
ranks sharing the data, e.g. tp): they are weighted ``D/C = 1/R`` and their sum over the ranks is
the whole. FSDP2's shards instead get the global per-source gradient (summed over the ranks that
reduce-scatter that parameter, then cut to the shard), as FSDP2 reduces the total one.

The model's layers split gradients by the id of the tensor the forward uses (``key``): the
parameter itself, or under FSDP2 the unsharded parameter FSDP2 all-gathers into (one object,
made at the first all-gather and reused). Held-out gradients are taken with respect to those
tensors (full size) and cut to this rank's piece. Under expert parallelism every ep rank sends
the same held-out rows to each expert, so an expert's held-out gradient arrives ``ep`` times
and is divided by it. Under sequence parallelism a norm's scale sees this tp rank's part of each
sequence: its per-source parts are partial sums over the tp ranks too, its held-out gradient is
summed over them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def local(tensor: torch.Tensor) -> torch.Tensor:
    """The local tensor of a DTensor (an FSDP2 shard), the tensor itself otherwise."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


class Pieces:
    """Per optimizer parameter: its key, the group its per-source gradients are summed over, its weights."""

    def __init__(self, params: Sequence[torch.Tensor], *, model: torch.nn.Module | None = None, parallel=None) -> None:
        self.params = list(params)
        n = len(self.params)
        self.world = parallel.world if parallel is not None else None
        self.timer = parallel.comm if parallel is not None else None
        self.distributed = self.world is not None and self.world.distributed
        names = {id(p): name for name, p in model.named_parameters()} if model is not None else {}
        self.seq_part: tuple[int, int] | None = None  # sequence parallel: (tp rank, tp) of the norms' rows
        seq_partial: set[int] = set()  # the norms' scales: each tp rank sees its part of the sequence
        if parallel is not None and getattr(parallel.cfg, "sequence_parallel", False) and parallel.world.tp_size > 1:
            from winnow.train.parallel.tensor_parallel import sequence_parallel_parameters

            self.seq_part = (parallel.world.tp_rank, parallel.world.tp_size)
            seq_partial = {id(p) for p in sequence_parallel_parameters(model)}
        self.heldout_tp_sum = [id(p) in seq_partial for p in self.params]
        experts = set(parallel.experts) if parallel is not None else set()
        tp_split = set(parallel.tp_layouts) if parallel is not None else set()
        self.sharded = [hasattr(p, "device_mesh") for p in self.params]  # FSDP2 DTensor shards
        self.data_ranks = [1] * n  # D: ranks holding this piece whose per-source parts are partial sums
        self.partial_w, self.global_w = [1.0] * n, [1.0] * n
        self.heldout_scale = [1.0] * n
        self.grad_group: list = [None] * n  # FSDP2: the group the per-source gradients are summed over
        self._fsdp: dict[int, object] = {}  # index -> FSDPParam (the sharded and unsharded parameter)
        self.whole = True  # whether every rank holds every parameter whole (one process, DDP; not a pipeline stage)
        if not self.distributed:
            return
        w = self.world
        self.whole = w.pp_size == 1  # under pipeline parallelism a rank holds its stages only
        for i, p in enumerate(self.params):
            name = names.get(id(p), "")
            expert = name in experts
            self.whole = self.whole and not (expert or name in tp_split or self.sharded[i])
            # R: the tp ranks hold a replicated weight and see the same batch (a norm under sequence parallelism:
            # each its part of the sequence, so they are data ranks too)
            same_data = 1 if name in tp_split or id(p) in seq_partial else w.tp_size
            if self.sharded[i]:
                replicas = 1
                for dim, placement in enumerate(p.placements):
                    if placement.is_replicate():
                        replicas *= p.device_mesh.size(dim)
                copies, self.data_ranks[i] = replicas * same_data, 1
                self.grad_group[i] = (w.edp_group if w.edp_size > 1 else None) if expert else w.dp_group
            else:
                self.data_ranks[i] = (w.edp_size if expert else w.dp_size) * (w.tp_size if id(p) in seq_partial else 1)
                copies = self.data_ranks[i] * same_data
            self.global_w[i] = 1.0 / copies
            self.partial_w[i] = self.data_ranks[i] / copies
            if expert:
                self.heldout_scale[i] = 1.0 / w.ep_size
        if any(self.sharded):
            stages = parallel.pipeline.modules if getattr(parallel, "pipeline", None) is not None else []
            self._find_fsdp_params([model, *stages])  # a pipeline stage's own FSDP2 unit holds its embedding, head

    # ---- what the forward uses ---------------------------------------------------------------
    def _find_fsdp_params(self, roots: list[torch.nn.Module]) -> None:
        index = {id(p): i for i, p in enumerate(self.params)}
        for module in {id(m): m for root in roots for m in root.modules()}.values():
            state = module._get_fsdp_state() if hasattr(module, "_get_fsdp_state") else None
            for group in getattr(state, "_fsdp_param_groups", ()) if state is not None else ():
                for fp in group.fsdp_params:
                    if id(fp.sharded_param) in index:
                        self._fsdp[index[id(fp.sharded_param)]] = (fp, module)

    def _unsharded(self, i: int) -> torch.Tensor:
        fp, module = self._fsdp[i]
        if not hasattr(fp, "_unsharded_param"):  # made at the first all-gather: do one (a collective)
            module.unshard()
            module.reshard()
        return fp._unsharded_param

    def inputs(self) -> list[torch.Tensor]:
        """The tensors the forward computes with: the parameters, or FSDP2's unsharded ones."""
        return [self._unsharded(i) if i in self._fsdp else p for i, p in enumerate(self.params)]

    def keys(self) -> list[int]:
        """What the gradient split knows each parameter by (``hooks.py``)."""
        return [id(t) for t in self.inputs()]

    def full_shapes(self) -> list[torch.Size]:
        """Shapes of the tensors the forward uses (an FSDP2 parameter's global shape)."""
        return [p.shape for p in self.params]

    def local_shapes(self) -> list[torch.Size]:
        return [local(p).shape for p in self.params]

    # ---- cutting and summing -------------------------------------------------------------------
    def cut(self, i: int, full: torch.Tensor) -> torch.Tensor:
        """This rank's piece of a (..., *full shape) tensor of parameter ``i`` (leading dims kept)."""
        if not self.sharded[i]:
            return full
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        p = self.params[i]
        shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
        lead = full.ndim - len(shape)
        for d, (size, start) in enumerate(zip(shape, offset)):
            if size != full.shape[lead + d]:
                full = full.narrow(lead + d, start, size)
        return full

    def heldout(self, grads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Full-size held-out gradients (S, ...) to this rank's pieces, each counted once."""
        out = []
        for i, g in enumerate(grads):
            if self.heldout_tp_sum[i]:  # sequence parallel: each tp rank's part of the sequence
                g = g.clone()
                self.timer.all_reduce(g, self.world.tp_group)
            g = self.cut(i, g)
            out.append(g * self.heldout_scale[i] if self.heldout_scale[i] != 1.0 else g)
        return out

    def reduce_grads(self, i: int, grad_S: torch.Tensor) -> torch.Tensor:
        """FSDP2: the global per-source gradient of parameter ``i``'s shard from this rank's full-size part."""
        group = self.grad_group[i]
        if group is not None:
            grad_S = grad_S.clone(memory_format=torch.contiguous_format)  # parts may be a strided view: one block
            self.timer.all_reduce(grad_S, group)
        return self.cut(i, grad_S).contiguous()

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` summed over the world (each rank's weighted dots of its pieces)."""
        if not self.distributed:
            return tensor
        out = tensor.detach().clone()
        return self.timer.all_reduce(out)
