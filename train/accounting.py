"""Per-source accounting on the device: loss sums, token counts and source × expert routing.

Every micro-step adds into a few small device tensors with ``index_add_`` (no host sync);
``flush()`` reduces them once per log step (through ``reduce``, the seam for distributed
all-reduce) and turns them into the per-source figures of DESIGN.md contract 4.
Shape legend: S sources, E experts, M MoE layers, B batch, L sequence length, K top-k.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from winnow.train.errors import ShardError


def check_source_ids(source_ids_BL: torch.Tensor, sources: Sequence[str], known: Sequence[str] | None = None) -> None:
    """ShardError unless every id in a (host-side) batch names one of the run's ``sources``.

    The per-source sums are sized when the run starts; a source the manifest did not list (or
    a manifest listing none) would otherwise surface as an IndexError deep in ``index_add_``.
    """
    top = int(source_ids_BL.max()) if source_ids_BL.numel() else -1
    if top < len(sources):
        return
    unknown = list(known[len(sources) :]) if known is not None and len(known) > len(sources) else [f"id {top}"]
    listed = f"the run's sources are {list(sources)}" if sources else "the shards' manifest lists no sources"
    raise ShardError(
        f"a batch holds documents of source(s) {unknown}, but {listed}: every source must be named "
        'before training starts; list them all under "sources" in the shards\' manifest.json (winnow '
        "curate writes them) or re-curate"
    )


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


class SourceAccounting:
    """Running per-source sums between two log steps (or over one evaluation pass)."""

    def __init__(
        self,
        sources: Sequence[str],
        *,
        n_moe_layers: int,
        n_experts: int,
        device: torch.device,
        reduce: Callable[[torch.Tensor], torch.Tensor] = _identity,
    ) -> None:
        self.sources = list(sources)
        self.n_experts = n_experts
        self.reduce = reduce
        S = len(self.sources)
        # float64 sums: millions of tokens per log step must add up exactly enough to compare per document
        self.loss_sum_S = torch.zeros(S, dtype=torch.float64, device=device)
        self.tokens_S = torch.zeros(S, dtype=torch.int64, device=device)
        self.routing_MSE = torch.zeros(n_moe_layers, S, max(n_experts, 1), dtype=torch.int64, device=device)
        self.load_ME = torch.zeros(n_moe_layers, max(n_experts, 1), dtype=torch.float64, device=device)

    def add_loss(self, token_loss_BL: torch.Tensor, source_ids_BL: torch.Tensor, loss_mask_BL: torch.Tensor) -> None:
        src_T = source_ids_BL.reshape(-1).clamp(min=0)  # padding may carry -1; its mask is False anyway
        mask_T = loss_mask_BL.reshape(-1)
        loss_T = token_loss_BL.detach().reshape(-1).to(torch.float64) * mask_T
        self.loss_sum_S.index_add_(0, src_T, loss_T)
        self.tokens_S.index_add_(0, src_T, mask_T.to(torch.int64))

    def add_routing(
        self,
        experts_per_layer: Sequence[torch.Tensor],
        source_ids_BL: torch.Tensor,
        loss_mask_BL: torch.Tensor,
        *,
        first_layer: int = 0,
    ) -> None:
        """Count which experts each source's (unmasked) tokens were routed to, per MoE layer.

        ``experts_per_layer`` are MoE layers ``first_layer, first_layer + 1, ...`` (a pipeline stage's).
        """
        src_T = source_ids_BL.reshape(-1).clamp(min=0)
        mask_T = loss_mask_BL.reshape(-1).to(torch.int64)
        for layer, experts_TK in enumerate(experts_per_layer):
            cell_TK = src_T[:, None] * self.n_experts + experts_TK
            weight_TK = mask_T[:, None].expand_as(experts_TK)
            self.routing_MSE[first_layer + layer].view(-1).index_add_(0, cell_TK.reshape(-1), weight_TK.reshape(-1))

    def add_load(self, load_ME: torch.Tensor, *, first_layer: int = 0) -> None:
        self.load_ME[first_layer : first_layer + load_ME.shape[0]] += load_ME.to(torch.float64)

    def merge(self, other: SourceAccounting) -> None:
        """Add another accumulator's sums (a finished step's) into this one, on the device."""
        self.loss_sum_S += other.loss_sum_S
        self.tokens_S += other.tokens_S
        self.routing_MSE += other.routing_MSE
        self.load_ME += other.load_ME

    def flush(self) -> dict:
        """Reduce, convert to host figures and reset; one device-to-host transfer per tensor."""
        # copy=True: on a CPU run .cpu() would alias the buffers that reset() zeroes
        loss_sum, tokens, routing, load = (
            self.reduce(t).to("cpu", copy=True)
            for t in (self.loss_sum_S, self.tokens_S, self.routing_MSE, self.load_ME)
        )
        self.reset()
        total_loss, total_tokens = float(loss_sum.sum()), int(tokens.sum())
        per_source = {}
        for i, name in enumerate(self.sources):
            n = int(tokens[i])
            per_source[name] = {
                "tokens": n,
                "loss_sum": float(loss_sum[i]),
                "mean_loss": float(loss_sum[i]) / n if n else None,
                "token_share": n / total_tokens if total_tokens else 0.0,
                "loss_share": float(loss_sum[i]) / total_loss if total_loss else 0.0,
            }
        load_share = load / load.sum(-1, keepdim=True).clamp(min=1)
        return {
            "tokens": total_tokens,
            "mean_loss": total_loss / total_tokens if total_tokens else None,
            "per_source": per_source,
            "routing": {name: routing[:, i].tolist() for i, name in enumerate(self.sources)},  # [layer][expert]
            "expert_load": load_share.tolist(),  # [layer][expert], fractions of routed assignments
        }

    def reset(self) -> None:
        for t in (self.loss_sum_S, self.tokens_S, self.routing_MSE, self.load_ME):
            t.zero_()

    def state_dict(self) -> dict:
        return {
            "loss_sum_S": self.loss_sum_S.cpu(),
            "tokens_S": self.tokens_S.cpu(),
            "routing_MSE": self.routing_MSE.cpu(),
            "load_ME": self.load_ME.cpu(),
        }

    def load_state_dict(self, state: dict) -> None:
        for key in ("loss_sum_S", "tokens_S", "routing_MSE", "load_ME"):
            getattr(self, key).copy_(state[key])
