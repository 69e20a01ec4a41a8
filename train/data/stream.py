"""One shard set (a job folder's split) as a resumable stream of packed sequences.

It owns the worker processes (``PieceStream``) and the token buffer (``Packer``) of one set,
turns the shard visits' messages into buffered tokens, applies the epoch-end policy, and
states its position as ``(epoch, shard, offset)``: the first token of the next sequence it
will hand out. The loader composes one stream per set (several when mixing at load time).
"""

from __future__ import annotations

import logging

import numpy as np

from winnow.train.data.config import LoaderConfig
from winnow.train.data.packing import Packer, SourceIds
from winnow.train.data.pieces import Piece, ShardDone
from winnow.train.data.shards import ShardSet
from winnow.train.data.workers import EpochEnd, PieceStream
from winnow.train.errors import ShardError
from winnow.train.tokenizer import Tokenizer

log = logging.getLogger(__name__)


class SetStream:
    """Packed sequences of one shard set, forever over epochs or (``finite``) for one pass."""

    def __init__(
        self, shards: ShardSet, *, config: LoaderConfig, tokenizer: Tokenizer, ids: SourceIds, finite: bool
    ) -> None:
        self.shards, self.config, self.tokenizer, self.ids, self.finite = shards, config, tokenizer, ids, finite
        self.position: tuple[int, int, int] = (0, 0, 0)
        self.bad_shards = 0
        # every rank reads and tokenizes every shard of the global stream (token shards avoid that)
        self.counters = {"tokens_read": 0, "bytes_read": 0, "bytes_hashed": 0, "tokens_tokenized": 0}
        self._bad_seen: set[str] = set()
        self._pieces: PieceStream | None = None
        self._packer: Packer | None = None

    def _start(self) -> None:
        epoch, shard, offset = self.position
        cfg = self.config
        self._pieces = PieceStream(
            self.shards,
            start_epoch=epoch,
            start_shard=shard,
            epochs=1 if self.finite else None,
            num_workers=cfg.num_workers,
            prefetch=cfg.prefetch,
            start_method=cfg.start_method,
            tokenizer=self.tokenizer,
            fmt=cfg.format,
            verify=cfg.verify_checksums,
            piece_rows=cfg.piece_rows,
            shuffle_window=cfg.shuffle_window,
            seed=cfg.seed,
            skip_bad=cfg.skip_bad_shards,
            interleave=self.finite,  # a held-out pass: sources in turn, so a capped evaluation reads every one
        )
        self._messages = iter(self._pieces)
        self._packer = Packer(
            eos_id=self.tokenizer.eos_id,
            pad_id=self.tokenizer.pad_id,
            dtype=self.tokenizer.dtype,
            sources=self.ids,
            skip=offset,
        )
        self._finished, self._epoch_docs = False, 0

    def _on_message(self, msg, seq_len: int) -> None:
        packer = self._packer
        if isinstance(msg, Piece):
            packer.push(msg)
            self.counters["tokens_tokenized"] += len(msg.tokens)
            self.counters["tokens_read"] += len(msg.tokens)
            self._epoch_docs += len(msg.doc_lens)
        elif isinstance(msg, ShardDone):
            packer.skip_done()  # the resume offset is within the first shard only, even if it turned bad
            if not msg.error:
                size = self.shards.shards[msg.shard].bytes or 0
                self.counters["bytes_read"] += size
                self.counters["bytes_hashed"] += size if self.config.verify_checksums else 0
                return
            self.bad_shards += 1
            if msg.error not in self._bad_seen:
                self._bad_seen.add(msg.error)
                log.warning("skipping a bad shard (skip_bad_shards is on): %s", msg.error)
        elif isinstance(msg, EpochEnd):
            if not self._epoch_docs and packer.available() == 0:
                raise ShardError(
                    f"{self.shards.root}: epoch {msg.epoch} has no documents (every shard empty or skipped)"
                )
            self._epoch_docs = 0
            if self.finite:
                packer.close_stream()
                self._finished = True
            elif self.config.epoch_end == "pad":
                packer.end_epoch(seq_len)

    def fill(self, seq_len: int, n_seqs: int) -> bool:
        """Buffer the tokens of ``n_seqs`` sequences; False when a finite pass has nothing left to predict."""
        if self._packer is None:
            self._start()
        need = n_seqs * seq_len + 1
        while self._packer.available() < need and not self._finished:
            self._on_message(next(self._messages), seq_len)
        if self._packer.available() < need:
            if not self._packer.has_target():
                return False
            self._packer.pad_to(need)
        return True

    def take(self, seq_len: int, n_seqs: int, rows: np.ndarray, *, boundary: bool) -> dict[str, np.ndarray]:
        """``rows`` of the next ``n_seqs`` sequences (after ``fill``); the stream moves past all of them."""
        arrays = self._packer.take(seq_len, n_seqs, rows, boundary=boundary)
        self.position = self._packer.position() or self.position
        return arrays

    def close(self) -> None:
        if self._pieces is not None:
            self._pieces.close()
        self._pieces = self._packer = None
