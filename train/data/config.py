"""The loader's options: one validated dataclass, mapped from ``[train.data]``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from winnow.train.errors import checker

_check = checker("train.data")


@dataclass(kw_only=True, slots=True)
class LoaderConfig:
    """How shards become batches: sizes, workers, order, packing and bad-input policy.

    The global order of packed sequences depends only on the manifest, ``seed``,
    ``shuffle_window``, ``epoch_end``, the tokenizer and the sequence length(s); never on
    ``num_workers``, ``piece_rows`` or (outside the sequence-length warm-up) the number of ranks.
    """

    batch_size: int = 8  # sequences per batch on each rank
    seq_len: int = 256
    num_workers: int = 2  # reading + tokenizing processes; 0 runs everything inline
    prefetch: int = 4  # tokenized pieces each worker may have queued ahead of the trainer
    piece_rows: int = 512  # documents per piece a worker sends (latency vs overhead)
    start_method: Literal["fork", "spawn", "forkserver"] = "fork"
    seed: int = 0
    format: Literal["auto", "tokens", "parquet", "webdataset"] = "auto"  # auto: token shards when the job has them
    verify_checksums: bool = True
    skip_bad_shards: bool = False  # True: warn, count and go on instead of raising ShardError
    boundary_mask: bool = True  # doc_ids mark documents so attention can stay within them
    epoch_end: Literal["pad", "carry"] = "pad"  # last partial sequence: padded (loss-masked) or carried over
    shuffle_window: int = 0  # >1: documents shuffled within windows of this many rows of a shard, per epoch
    seq_len_warmup_steps: int = 0  # >0: sequence length grows linearly over these many steps
    seq_len_warmup_start: int = 64
    seq_len_warmup_multiple: int = 16  # warm-up lengths are rounded down to a multiple of this
    mix_weights: list[float] = field(default_factory=list)  # one token weight per data set; [] = equal
    pin_memory: bool | None = None  # None: pin when CUDA is available
    storage_options: dict[str, str] = field(default_factory=dict)  # passed to fsspec (e.g. endpoint_url)

    def __post_init__(self) -> None:
        for key in (
            "batch_size",
            "seq_len",
            "prefetch",
            "piece_rows",
            "seq_len_warmup_start",
            "seq_len_warmup_multiple",
        ):
            value = getattr(self, key)
            _check(isinstance(value, int) and value > 0, key, value, "a positive integer")
        for key in ("num_workers", "shuffle_window", "seq_len_warmup_steps", "seed"):  # a seed seeds numpy: >= 0
            value = getattr(self, key)
            _check(isinstance(value, int) and value >= 0, key, value, "an integer >= 0")
        _check(
            self.start_method in ("fork", "spawn", "forkserver"),
            "start_method",
            self.start_method,
            '"fork", "spawn" or "forkserver"',
        )
        _check(
            self.format in ("auto", "tokens", "parquet", "webdataset"),
            "format",
            self.format,
            '"auto", "tokens", "parquet" or "webdataset"',
        )
        _check(self.epoch_end in ("pad", "carry"), "epoch_end", self.epoch_end, '"pad" or "carry"')
        _check(
            all(isinstance(w, (int, float)) and w > 0 for w in self.mix_weights),
            "mix_weights",
            self.mix_weights,
            "positive numbers, one per data set",
        )
        if self.seq_len_warmup_steps:
            _check(
                self.seq_len_warmup_start <= self.seq_len,
                "seq_len_warmup_start",
                self.seq_len_warmup_start,
                f"at most seq_len ({self.seq_len})",
            )

    def seq_len_at(self, step: int) -> int:
        """Sequence length of global step ``step``: linear warm-up, then ``seq_len``."""
        if step >= self.seq_len_warmup_steps:
            return self.seq_len
        lo, hi, m = self.seq_len_warmup_start, self.seq_len, self.seq_len_warmup_multiple
        length = lo + (hi - lo) * step // self.seq_len_warmup_steps
        return max(lo, length // m * m)
