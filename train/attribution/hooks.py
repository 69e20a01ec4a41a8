"""Weight gradients split by the source of each token position, inside the one backward pass.

A weight's gradient is a sum over the rows (token positions) it was applied to: ``δᵀx`` for a
matmul, ``Σ_rows δ·n`` for a norm's scale, a scatter of rows for an embedding. While a
``GradSplit`` is active, the model's weight-applying ops run as their per-source versions here (the
same matmuls on the rows grouped by source, so the FLOPs are unchanged): each adds every source's
part to the split's buffers and hands autograd the total. So one forward and one backward give every
source's gradient; with attention kept inside documents (``doc_mask``) that is exactly the gradient of
each source's share of the loss, router losses included at the tokens they are computed on. Rows
whose source is out of range (padding) are grouped separately and left in the total only.

The model knows nothing of this: ``Splitter`` attaches from outside. While a split is active it
enters a torch function mode (``SplitMode``) that runs ``F.linear``, ``F.embedding``, the model's
``rms_norm`` and ``expert_ffn`` (both overridable torch functions) on a tracked weight as their split
versions, and its forward hooks on each MoE block tell the experts which source each of their rows
is (the router's choices, the block's own ``assign``, and under expert parallelism the rows'
all-to-all, ``train.parallel.expert_parallel``).
Shape legend: T rows (tokens), A expert-sorted assignments, E experts, S sources, I/O in/out width.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from winnow.train.model.layers import rms_norm, rms_norm_forward, rms_norm_input_grad, swiglu
from winnow.train.model.moe import MoE, expert_ffn
from winnow.train.model.moe import expert_mm as _expert_mm


class GradSplit:
    """Per-source gradient buffers (``id(param)`` -> (S, *param.shape)) and each row's source."""

    def __init__(
        self,
        source_T: torch.Tensor,
        n_sources: int,
        buffers: dict[int, torch.Tensor],
        *,
        scale: float = 1.0,
        written: set[int] | None = None,
        sums: dict[int, torch.Tensor] | None = None,
        partial: set[int] | None = None,
        seq_part: tuple[int, int] | None = None,
    ) -> None:
        src = source_T.reshape(-1).long()
        # sequence parallel: (rank, size) of this rank's part of every (B, L) row, where the norms run
        self._seq_part, self._width = seq_part, source_T.shape[-1]
        self._part_T: torch.Tensor | None = None
        self.S, self.buffers, self.scale = n_sources, buffers, scale
        # the keys whose buffer already holds a part this step: the others are overwritten, not added to,
        # so the owner never zeroes its buffers (the caller clears the set between steps)
        self.written = set() if written is None else written
        self.sums = sums  # by key, Σ_s of the step's parts (None: not kept)
        # the keys whose gradient this step had rows of no source: their total holds more than the sources' sum
        self.partial = set() if partial is None else partial
        self.src_T = torch.where((src >= 0) & (src < n_sources), src, n_sources)  # S: no source
        self.unsourced = bool((self.src_T == n_sources).any())  # whether any row has no source (padding)
        self._groups: dict[int, tuple[torch.Tensor, list[int]]] = {}
        self._one_hot: dict[tuple[int, torch.dtype], torch.Tensor] = {}
        self.rows_A: torch.Tensor | None = None  # the source of each row the next experts call runs on

    def sources(self, n_rows: int) -> torch.Tensor:
        """Each row's source for a layer on ``n_rows`` rows: every token, or under sequence parallelism this
        rank's part of each sequence (``train.parallel.tensor_parallel``'s cut along L)."""
        if n_rows == self.src_T.shape[0] or self._seq_part is None:
            return self.src_T
        if self._part_T is None:
            rank, size = self._seq_part
            part = self._width // size
            self._part_T = self.src_T.view(-1, self._width)[:, rank * part : (rank + 1) * part].reshape(-1)
        return self._part_T

    def tracks(self, param: torch.Tensor) -> bool:
        return id(param) in self.buffers

    def groups(self, src: torch.Tensor) -> tuple[torch.Tensor | None, list[int]]:
        """(rows sorted by source, or None when they already are, group bounds: S + 2 of them when some rows
        have no source, else S + 1); cached for the token rows every layer shares (the probe's rows come
        grouped by source: no gather)."""
        key = id(src)
        if key not in self._groups:
            order = None if _sorted(src) else src.argsort(stable=True)
            bounds = [0, *torch.bincount(src, minlength=self.S + 1).cumsum(0).tolist()]
            self._groups[key] = (order, bounds if bounds[-1] > bounds[-2] else bounds[:-1])
        return self._groups[key]

    def one_hot(self, src: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """(groups, rows) 0/1 matrix of each row's group (the groups of ``groups``): a matmul by it sums each
        group's rows (no gather); cached as ``groups``."""
        key = (id(src), dtype)
        if key not in self._one_hot:
            n_groups = len(self.groups(src)[1]) - 1
            self._one_hot[key] = (src == torch.arange(n_groups, device=src.device)[:, None]).to(dtype)
        return self._one_hot[key]

    def add(self, param: torch.Tensor | int, parts: torch.Tensor) -> torch.Tensor:
        """Add (S or S + 1, *shape) parts (an S + 1st: rows of no source, left out) to ``param``'s buffer (or
        ``id(param)``'s) and their sum over the sources to ``sums``; returns the gradient of all rows, the
        total autograd gets. The first part of a step overwrites the buffer (``written``)."""
        key = param if isinstance(param, int) else id(param)
        if parts.shape[0] > self.S:
            self.partial.add(key)
        src = parts[: self.S]
        sum_src = src.sum(0)  # while the parts are in cache: the moment split needs it for the router part
        total = sum_src + parts[self.S] if parts.shape[0] > self.S else sum_src
        if total is sum_src and self.sums is not None:  # autograd's gradient is clipped in place later
            total = sum_src.clone()
        if src.dtype != torch.float32 or self.scale != 1.0:
            src, sum_src = (torch.mul(x.to(torch.float32), self.scale) for x in (src, sum_src))
        if key in self.written:
            self.buffers[key].add_(src)
            if self.sums is not None and key in self.sums:
                self.sums[key].add_(sum_src)
            return total
        # the step's first part becomes the buffer itself (no copy): the caller only reads ``parts`` after
        self.buffers[key] = src
        if self.sums is not None:
            self.sums[key] = sum_src
        self.written.add(key)
        return total


def _sorted(ids: torch.Tensor) -> bool:
    return ids.numel() < 2 or bool((ids[1:] >= ids[:-1]).all())


def _row_parts(split: GradSplit, x_TI: torch.Tensor, g_TO: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """(S or S + 1, O, I): ``g_sᵀ x_s`` over the rows of each source s (and of the rows of no source, if any)."""
    order, bounds = split.groups(src)
    xs, gs = (x_TI, g_TO) if order is None else (x_TI.index_select(0, order), g_TO.index_select(0, order))
    if _grouped_ok(gs, xs):  # every source's slice in one call
        return torch._grouped_mm(gs.t(), xs, offs=torch.tensor(bounds[1:], dtype=torch.int32, device=xs.device))
    parts = x_TI.new_empty(len(bounds) - 1, g_TO.shape[1], x_TI.shape[1])
    for s in range(len(bounds) - 1):
        lo, hi = bounds[s], bounds[s + 1]
        if hi > lo:
            torch.mm(gs[lo:hi].t(), xs[lo:hi], out=parts[s])
        else:
            parts[s].zero_()
    return parts


def _grouped_ok(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``torch._grouped_mm`` takes the row-grouped (offsets along the rows) product ``aᵀ b`` here: on
    CPU, with 16-byte aligned rows (CUDA's kernel wants bf16 on Hopper: elsewhere one matmul per group)."""
    return (
        hasattr(torch, "_grouped_mm")
        and a.device.type == "cpu"
        and (a.shape[1] * a.element_size()) % 16 == 0
        and (b.shape[1] * b.element_size()) % 16 == 0
    )


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype


class _SplitLinear(torch.autograd.Function):
    """``F.linear`` whose weight gradient is computed per source of each row."""

    @staticmethod
    def forward(ctx, x, weight, split):
        dtype = _compute_dtype(x)
        xc, wc = x.to(dtype), weight.to(dtype)
        ctx.save_for_backward(xc, wc)
        ctx.split, ctx.key, ctx.src, ctx.x_dtype, ctx.w_dtype = split, id(weight), split.src_T, x.dtype, weight.dtype
        with torch.autocast(x.device.type, enabled=False):
            return F.linear(xc, wc)

    @staticmethod
    def backward(ctx, grad):
        xc, wc = ctx.saved_tensors
        g_TO = grad.reshape(-1, grad.shape[-1]).to(wc.dtype)
        grad_x = (g_TO @ wc).view(xc.shape).to(ctx.x_dtype) if ctx.needs_input_grad[0] else None
        parts = _row_parts(ctx.split, xc.reshape(-1, xc.shape[-1]), g_TO, ctx.src)
        return grad_x, ctx.split.add(ctx.key, parts).to(ctx.w_dtype), None


def norm_weight_parts(split: GradSplit, key: int, rows_TD: torch.Tensor) -> torch.Tensor:
    """A norm's scale gradient ``Σ_rows δ·n`` per source; adds the parts and returns the total (D,)."""
    # one (groups, T) x (T, D) matmul: a third of the time of gathering the rows by source and summing slices
    # (index_add_ is serial here)
    return split.add(key, split.one_hot(split.sources(rows_TD.shape[0]), rows_TD.dtype) @ rows_TD)


class _SplitRMSNorm(torch.autograd.Function):
    """The model's RMSNorm (``train.model.layers``) with its scale's gradient ``Σ_rows g·n`` per source."""

    @staticmethod
    def forward(ctx, x, weight, eps, split, key):
        normed, rstd = rms_norm_forward(x, eps)
        ctx.save_for_backward(normed, rstd, weight)
        ctx.split, ctx.key = split, key
        return normed * weight

    @staticmethod
    def backward(ctx, grad):
        normed, rstd, weight = ctx.saved_tensors
        grad_w = norm_weight_parts(ctx.split, ctx.key, (grad * normed).reshape(-1, normed.shape[-1]))
        return rms_norm_input_grad(grad, normed, rstd, weight), grad_w, None, None, None


def _hook_embedding(split: GradSplit, weight: torch.Tensor, tokens_BL: torch.Tensor, x_BLD: torch.Tensor) -> None:
    """Add each source's part of an embedding table's gradient (rows scattered by token) when ``x_BLD``'s
    gradient arrives; autograd still accumulates the whole table's gradient itself."""
    if not x_BLD.requires_grad:
        return
    key, src, tokens = id(weight), split.src_T, tokens_BL.reshape(-1)
    flat = src * weight.shape[0] + tokens  # the row of (source, token) in the (S, vocab) buffer
    keep = (src < split.S) if split.unsourced else None  # rows of no source stay in autograd's total only
    if keep is not None:
        flat, tokens = flat[keep], tokens[keep]

    def hook(grad_BLD: torch.Tensor) -> None:
        rows = grad_BLD.reshape(-1, grad_BLD.shape[-1])
        if keep is not None:
            split.partial.add(key)
            rows = rows[keep]
        rows = rows.float()
        buf = split.buffers[key]
        if key not in split.written:
            buf.zero_()
            split.written.add(key)
        buf.view(-1, rows.shape[1]).index_add_(0, flat, rows, alpha=split.scale)
        if split.sums is not None and key in split.sums:  # a tied head's parts came first: their sum gets these too
            split.sums[key].index_add_(0, tokens, rows, alpha=split.scale)

    x_BLD.register_hook(hook)


def _group_parts(x_AI: torch.Tensor, g_AO: torch.Tensor, group_A: torch.Tensor, n_groups: int) -> torch.Tensor:
    """(n_groups, I, O): ``x_gᵀ g_g`` over the rows of each group (one grouped matmul where the kernel allows)."""
    counts = torch.bincount(group_A, minlength=n_groups)
    if _sorted(group_A):  # rows already grouped (``_split_experts`` sorts each expert's rows by source)
        xs, gs = x_AI, g_AO
    else:
        order = group_A.argsort(stable=True)
        xs, gs = x_AI.index_select(0, order), g_AO.index_select(0, order)
    if _grouped_ok(xs, gs):
        return torch._grouped_mm(xs.t(), gs, offs=counts.cumsum(0).to(torch.int32))
    parts = xs.new_zeros(n_groups, xs.shape[1], gs.shape[1])
    bounds = [0, *counts.cumsum(0).tolist()]
    for k in range(n_groups):
        if bounds[k + 1] > bounds[k]:
            torch.mm(xs[bounds[k] : bounds[k + 1]].t(), gs[bounds[k] : bounds[k + 1]], out=parts[k])
    return parts


class _SplitExpertMM(torch.autograd.Function):
    """Each expert's matmul on its slice of the expert-sorted rows (``mm``), weight gradient per (expert, source)."""

    @staticmethod
    def forward(ctx, x_AI, w_EIO, counts_E, src_A, split, mm):
        ctx.save_for_backward(x_AI, w_EIO, counts_E, src_A)
        ctx.split, ctx.key, ctx.mm = split, id(w_EIO), mm
        return mm(x_AI, w_EIO, counts_E)

    @staticmethod
    def backward(ctx, grad_AO):
        x_AI, w_EIO, counts_E, src_A = ctx.saved_tensors
        split, (E, I, O) = ctx.split, w_EIO.shape
        # the transposed view, not a copy: both kernels take its strides (a copy cost ~0.7 ms per call here)
        grad_x = ctx.mm(grad_AO, w_EIO.transpose(1, 2), counts_E) if ctx.needs_input_grad[0] else None
        expert_A = torch.repeat_interleave(torch.arange(E, device=counts_E.device), counts_E, output_size=x_AI.shape[0])
        # no empty no-source groups: they cost a zero fill each (rows from other ep ranks may have no source)
        G = split.S + 1 if split.unsourced or bool((src_A >= split.S).any()) else split.S
        # groups expert-major: ``_split_experts`` sorted each expert's rows by source, so they are slices of the
        # rows; the buffer is the (S, E, I, O) view of the (E, S, I, O) parts
        parts_EGIO = _group_parts(x_AI, grad_AO.to(x_AI.dtype), expert_A * G + src_A, E * G).view(E, G, I, O)
        return grad_x, split.add(ctx.key, parts_EGIO.transpose(0, 1)).to(w_EIO.dtype), None, None, None, None


class _Permute(torch.autograd.Function):
    """``x[order]`` for a permutation ``order`` of the rows, its backward the gather by the inverse permutation.

    autograd's backward of ``index_select`` is a zero fill and a serial ``index_add_`` on CPU, and an
    ``index_copy`` the other way costs more still: forward and backward on the demo's expert rows (16,384 x
    128, one thread) 4.9 ms as ``index_select`` and 8.5 ms as ``index_copy``, against 3.3 ms as two gathers."""

    @staticmethod
    def forward(ctx, x, order, inverse):
        ctx.inverse = inverse
        return x.index_select(0, order)

    @staticmethod
    def backward(ctx, grad):
        return grad.index_select(0, ctx.inverse), None, None


def _split_experts(
    split: GradSplit, x_AD: torch.Tensor, w13_ED2F: torch.Tensor, w2_EFD: torch.Tensor, counts_E: torch.Tensor
) -> torch.Tensor:
    """``expert_ffn`` with each matmul's weight gradient split by (expert, source).

    Each expert's rows are put in source order first (and the outputs back after), so in the backward
    every (source, expert) part is a slice of the rows the experts already hold.
    """
    src_A = split.rows_A
    E, A = counts_E.shape[0], x_AD.shape[0]
    expert_A = torch.repeat_interleave(torch.arange(E, device=counts_E.device), counts_E, output_size=A)
    order_A = (expert_A * (split.S + 1) + src_A).argsort(stable=True)
    inverse_A = torch.empty_like(order_A).index_copy_(0, order_A, torch.arange(A, device=order_A.device))
    x_AD, src_A = _Permute.apply(x_AD, order_A, inverse_A), src_A.index_select(0, order_A)
    h_A2F = _SplitExpertMM.apply(x_AD, w13_ED2F, counts_E, src_A, split, _expert_mm)
    y_AD = _SplitExpertMM.apply(swiglu(h_A2F), w2_EFD, counts_E, src_A, split, _expert_mm)
    return _Permute.apply(y_AD, inverse_A, order_A)


class SplitMode(TorchFunctionMode):
    """Runs the weight-applying ops on the weights ``split`` tracks as their per-source versions."""

    def __init__(self, split: GradSplit) -> None:
        super().__init__()
        self.split = split

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        split = self.split
        if not torch.is_grad_enabled():
            return func(*args, **kwargs)
        if func is F.linear and split.tracks(args[1]) and (args[2:] + (kwargs.get("bias"),))[0] is None:
            return _SplitLinear.apply(args[0], args[1], split)
        if func is rms_norm and split.tracks(args[1]):
            x, weight, eps = args
            return _SplitRMSNorm.apply(x.float(), weight.float(), eps, split, id(weight)).to(x.dtype)
        if func is expert_ffn and split.tracks(args[1]) and split.rows_A is not None:
            return _split_experts(split, *args)
        out = func(*args, **kwargs)
        if func is F.embedding and split.tracks(args[1]):
            _hook_embedding(split, args[1], args[0], out)
        return out


class Splitter:
    """Attaches the per-source split to a model: forward hooks on its MoE blocks, and ``active(split)``.

    ``dispatches``: under expert parallelism each MoE block's row exchange by ``id`` of its experts
    module (``Parallel.dispatches``): the rows' sources travel with the rows.
    """

    def __init__(self, model: torch.nn.Module, dispatches: dict | None = None) -> None:
        self.split: GradSplit | None = None
        self._dispatches = dispatches or {}
        for module in model.modules():
            if isinstance(module, MoE):
                module.router.register_forward_hook(self._routed(module))
                module.experts.register_forward_pre_hook(self._arriving)

    def _routed(self, moe: MoE):
        def hook(_router, _args, out) -> None:
            if self.split is not None:  # the source of each expert-sorted row, as the block will sort them
                self.split.rows_A = self.split.src_T.index_select(0, moe.assign(out[1]).token_A)

        return hook

    def _arriving(self, experts, _args) -> None:
        split = self.split
        if split is not None and split.rows_A is not None and id(experts) in self._dispatches:
            split.rows_A = self._dispatches[id(experts)].route(split.rows_A)

    @contextlib.contextmanager
    def active(self, split: GradSplit):
        """Keep ``split`` active over a micro-batch's forward and backward (activation recomputation included)."""
        before, self.split = self.split, split
        try:
            with SplitMode(split):
                yield split
        finally:
            self.split = before
