"""What the loader hands the trainer: one rank's packed sequences of a step, as tensors."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np
import torch

_TENSORS = ("tokens", "targets", "source_ids", "loss_mask", "doc_ids")


@dataclass(slots=True)
class Batch:
    """Packed sequences with per-token source ids and document numbers (B sequences, T tokens).

    ``source_ids[b, t]`` is the source of the document that ``targets[b, t]`` belongs to;
    ``doc_ids[b, t]`` numbers the documents within sequence ``b`` from 0, for document-boundary
    attention masks; ``loss_mask`` is False on padding. ``origins[b]`` is the shard and row of
    the first document of sequence ``b`` (for attributing loss spikes to data).
    """

    tokens: torch.Tensor  # (B, T) int64
    targets: torch.Tensor  # (B, T) int64
    source_ids: torch.Tensor  # (B, T) int64
    loss_mask: torch.Tensor  # (B, T) bool
    doc_ids: torch.Tensor  # (B, T) int32
    origins: list[tuple[str, int]] = field(default_factory=list)

    @classmethod
    def from_numpy(cls, arrays: dict[str, np.ndarray], origins: list[tuple[str, int]], *, pin: bool = False) -> Batch:
        tensors = {k: torch.from_numpy(np.ascontiguousarray(arrays[k])) for k in _TENSORS}
        if pin:
            tensors = {k: t.pin_memory() for k, t in tensors.items()}
        return cls(**tensors, origins=origins)

    def to(self, device: torch.device | str, *, non_blocking: bool = True) -> Batch:
        """The same batch on ``device`` (asynchronous from pinned memory)."""
        moved = {k: getattr(self, k).to(device, non_blocking=non_blocking) for k in _TENSORS}
        return Batch(**moved, origins=self.origins)

    @property
    def num_tokens(self) -> int:
        """Tokens that count toward the loss."""
        return int(self.loss_mask.sum())

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.tokens.shape)

    def __repr__(self) -> str:
        kinds = ", ".join(f.name for f in fields(self))
        return f"Batch(shape={self.shape}, num_tokens={self.num_tokens}; {kinds})"


class RepeatBatch:
    """An endless, resumable stand-in for the ``Loader`` that yields one batch every step.

    For overfitting a single batch while debugging, for benchmarks that time the trainer without
    the data path, and for tests; ``position`` counts the batches handed out.
    """

    def __init__(self, batch: Batch) -> None:
        self.batch, self.position = batch, 0

    def __iter__(self) -> RepeatBatch:
        return self

    def __next__(self) -> Batch:
        self.position += 1
        return self.batch

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]
