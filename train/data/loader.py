"""The prefetching loader: shards of a job folder to packed ``Batch``es, resumable and elastic.

The *global order* is the documents of the manifest's shards in manifest (curriculum) order,
tokenized into one stream and cut into sequences step by step (see ``packing``). Global
sequence ``i`` of a step goes to rank ``i % world_size``; every rank reads the whole stream,
so the order depends only on the data, the seed and the sequence lengths, never on the number
of ranks or workers. The state is the position of the next step's first token,
``(epoch, shard, offset)``, plus the step count: the same on every rank, so a run resumed
with any number of ranks or workers continues the same global order.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch

from train.data.batch import Batch
from train.data.config import LoaderConfig
from train.data.packing import Packer, SourceIds
from train.data.pieces import Piece, ShardDone
from train.data.shards import open_shards
from train.data.workers import EpochEnd, PieceStream
from train.errors import CheckpointError, ConfigError, ShardError
from train.tokenizer import ByteTokenizer, Tokenizer

log = logging.getLogger(__name__)

STATE_VERSION = 1


class Loader:
    """Iterate to get this rank's ``Batch``es: forever over epochs for ``train``, one pass for ``val``."""

    def __init__(self, config: LoaderConfig, data: str | Path, *, split: str = "train", tokenizer: Tokenizer | None = None,
                 rank: int = 0, world_size: int = 1, sources: list[str] | None = None) -> None:
        if not (isinstance(world_size, int) and world_size >= 1 and 0 <= rank < world_size):
            raise ConfigError(f"rank={rank!r}, world_size={world_size!r} is invalid; need world_size >= 1 and 0 <= rank < world_size")
        self.config, self.split, self.rank, self.world_size = config, split, rank, world_size
        self.tokenizer = tokenizer or ByteTokenizer()
        self.shards = open_shards(str(data), split=split, fmt=config.format, storage_options=config.storage_options)
        self._ids = SourceIds(sources)
        self._ids.extend(self.shards.sources)
        self._pin = torch.cuda.is_available() if config.pin_memory is None else config.pin_memory
        self._position, self._step = (0, 0, 0), 0
        self._stream: PieceStream | None = None
        self._packer: Packer | None = None
        self.wait_seconds = 0.0
        self._counters = {"batches": 0, "tokens": 0, "bad_shards": 0, "wait_seconds": 0.0}
        self._bad_seen: set[str] = set()

    @property
    def sources(self) -> list[str]:
        """Source id -> name; names first seen in the data are appended, so ids never change."""
        return list(self._ids.names)

    @property
    def epoch(self) -> int:
        return self._position[0]

    def __iter__(self) -> Loader:
        return self

    def _start(self) -> None:
        epoch, shard, offset = self._position
        cfg = self.config
        self._stream = PieceStream(
            self.shards, start_epoch=epoch, start_shard=shard, epochs=1 if self.split != "train" else None,
            num_workers=cfg.num_workers, prefetch=cfg.prefetch, start_method=cfg.start_method,
            tokenizer=self.tokenizer, fmt=cfg.format, verify=cfg.verify_checksums, piece_rows=cfg.piece_rows,
            shuffle_window=cfg.shuffle_window, seed=cfg.seed, skip_bad=cfg.skip_bad_shards,
        )
        self._messages = iter(self._stream)
        self._packer = Packer(eos_id=self.tokenizer.eos_id, pad_id=self.tokenizer.pad_id, dtype=self.tokenizer.dtype,
                              sources=self._ids, skip=offset)
        self._finished, self._epoch_docs = False, 0

    def _fill(self, seq_len: int, need: int) -> None:
        """Pull pieces until the step's ``need`` tokens are buffered or the pass is over."""
        packer = self._packer
        while packer.available() < need and not self._finished:
            msg = next(self._messages)
            if isinstance(msg, Piece):
                packer.push(msg)
                self._epoch_docs += len(msg.doc_lens)
            elif isinstance(msg, ShardDone) and msg.error:
                self._counters["bad_shards"] += 1
                if msg.error not in self._bad_seen:
                    self._bad_seen.add(msg.error)
                    log.warning("skipping a bad shard (skip_bad_shards is on): %s", msg.error)
            elif isinstance(msg, EpochEnd):
                if not self._epoch_docs and packer.available() == 0:
                    raise ShardError(f"{self.shards.root}: epoch {msg.epoch} of split {self.split!r} has no documents "
                                     "(every shard empty or skipped)")
                self._epoch_docs = 0
                if self.split != "train":
                    packer.close_stream()
                    self._finished = True
                elif self.config.epoch_end == "pad":
                    packer.end_epoch(seq_len)

    def __next__(self) -> Batch:
        t0 = time.perf_counter()
        if self._packer is None:
            self._start()
        cfg = self.config
        seq_len, n_seqs = cfg.seq_len_at(self._step), cfg.batch_size * self.world_size
        need = n_seqs * seq_len + 1
        self._fill(seq_len, need)
        if self._finished and self._packer.available() < need:
            if not self._packer.has_target():
                self.close()
                self._position, self._step = (0, 0, 0), 0  # the next iteration is a fresh pass
                raise StopIteration
            self._packer.pad_to(need)
        rows = self.rank + self.world_size * np.arange(cfg.batch_size)
        arrays = self._packer.take(seq_len, n_seqs, rows, boundary=cfg.boundary_mask)
        self._position = self._packer.position() or self._position
        self._step += 1
        origins = [(self.shards.shards[s].path if s >= 0 else "", int(r)) for s, r in zip(arrays["origin_shard"], arrays["origin_row"])]
        batch = Batch.from_numpy(arrays, origins, pin=self._pin)
        self.wait_seconds = time.perf_counter() - t0
        self._counters["batches"] += 1
        self._counters["tokens"] += int(arrays["loss_mask"].sum())
        self._counters["wait_seconds"] += self.wait_seconds
        return batch

    def state_dict(self) -> dict:
        """Position of the next global step (identical on every rank; save it from any one)."""
        epoch, shard, offset = self._position
        return {"version": STATE_VERSION, "epoch": epoch, "shard": shard, "offset": offset, "step": self._step,
                "sources": self.sources, "data": self.shards.fingerprint, "tokenizer": self.tokenizer.name,
                "split": self.split, "stats": dict(self._counters)}

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``'s position; the next batch is the one the saved run would have yielded."""
        if state.get("version") != STATE_VERSION:
            raise CheckpointError(f"loader state version {state.get('version')!r} is not {STATE_VERSION}")
        for key, mine in (("data", self.shards.fingerprint), ("tokenizer", self.tokenizer.name)):
            if state.get(key) != mine:
                raise CheckpointError(f"loader state was saved with {key} {state.get(key)!r}, this run has {mine!r}; "
                                      "resume needs the same shards and tokenizer")
        self.close()
        self._position = (int(state["epoch"]), int(state["shard"]), int(state["offset"]))
        self._step = int(state["step"])
        ids = SourceIds(state["sources"])
        ids.extend(self._ids.names)
        self._ids = ids
        self._counters.update(state.get("stats", {}))

    def stats(self) -> dict:
        """Counters for the metrics: batches, loss tokens, bad shards skipped, total wait seconds, epoch."""
        return {**self._counters, "epoch": self.epoch, "step": self._step}

    def close(self) -> None:
        """Stop the worker processes (iteration restarts them from the current position)."""
        if self._stream is not None:
            self._stream.close()
        self._stream = self._packer = None

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown; nothing left to report to
            pass
