"""One set of token shards as a resumable stream that reads only this rank's sequences.

The stream is the one ``packing`` describes for text shards, ``EOS d0 EOS d1 ...`` per shard,
shards in manifest order, epochs back to back with the same ``epoch_end`` padding, masks and
(``shuffle_window``) document order, so for the same tokenizer it yields the same batches as
``SetStream``. The difference is that no token is materialized until it is asked for: the
stream from the current step's base is a list of *segments* (one shard's stream, or a block of
padding) laid out by their token counts alone, and ``take`` gathers only the positions of the
rows it is given. A Megatron ``.bin`` holds ``d0 EOS d1 EOS ...``, so a shard's stream in file
order is the file shifted right by one behind a leading EOS.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from train.data.config import LoaderConfig
from train.data.packing import SourceIds
from train.data.pieces import window_order
from train.data.tokenshards import TokenShard, TokenShardSet
from train.errors import ShardError
from train.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Segment:
    start: int  # stream position of this segment's first token (relative to the resume point)
    length: int
    doc0: int  # document number of its first document (a padding block is one document)
    shard: TokenShard | None = None  # None: padding
    epoch: int = 0
    index: int = 0
    skip: int = 0  # tokens of the shard's stream before this segment (the resume offset)
    order: np.ndarray | None = None  # stream order of the documents (None: file order)
    cum: np.ndarray | None = None  # (D+1,) stream offset of each document in stream order
    src: np.ndarray | None = None  # (D,) source id of each document in stream order
    mask_first: bool = False  # the shard stream's leading EOS is not a target (after an epoch's padding)
    closing: bool = False  # padding whose first token is the real closing EOS

    @property
    def end(self) -> int:
        return self.start + self.length


class TokenStream:
    """Packed sequences of one token-shard set: the ``SetStream`` interface (``fill``, ``take``, ``position``)."""

    def __init__(self, shards: TokenShardSet, *, config: LoaderConfig, tokenizer: Tokenizer, ids: SourceIds, finite: bool) -> None:
        self.shards, self.config, self.tokenizer, self.ids, self.finite = shards, config, tokenizer, ids, finite
        self.position: tuple[int, int, int] = (0, 0, 0)
        self.bad_shards = 0
        self.counters = {"tokens_read": 0, "bytes_read": 0, "bytes_hashed": 0, "tokens_tokenized": 0}
        self._open: dict[int, TokenShard | None] = {}
        self._segments: list[_Segment] | None = None

    # -- the stream's layout ------------------------------------------------------------
    def _shard(self, index: int) -> TokenShard | None:
        """Shard ``index`` opened and checked once per process; None when bad and skipped."""
        if index not in self._open:
            try:
                shard = TokenShard(self.shards, index, vocab_size=self.tokenizer.vocab_size, verify=self.config.verify_checksums)
                self.counters["bytes_read"] += shard.bytes_read
                self.counters["bytes_hashed"] += shard.bytes_hashed
                shard.bytes_read = 0
            except ShardError as err:
                if not self.config.skip_bad_shards:
                    raise
                log.warning("skipping a bad shard (skip_bad_shards is on): %s", err)
                shard = None
            self._open[index] = shard
        return self._open[index]

    def _start(self) -> None:
        epoch, shard, offset = self.position
        self._segments, self._base, self._next_doc = [], 0, 0
        self._visit = epoch * len(self.shards.shards) + shard
        self._skip, self._mask_next, self._finished, self._epoch_docs = offset, False, False, 0
        self._stop = (epoch + 1) * len(self.shards.shards) if self.finite else None

    def _end(self) -> int:
        return self._segments[-1].end if self._segments else self._base

    def available(self) -> int:
        return self._end() - self._base

    def _add_shard(self, epoch: int, index: int) -> None:
        skip, self._skip = self._skip, 0  # the resume offset is within the first shard only, even if it turned bad
        shard = self._shard(index)
        if shard is None:
            self.bad_shards += 1
            return
        n = len(shard.sizes)
        self._epoch_docs += n
        if shard.info.tokens - skip <= 0:
            return
        order = window_order(n, self.config.shuffle_window, self.config.seed, epoch, index)
        sizes = shard.sizes if order is None else shard.sizes[order]
        cum = np.zeros(n + 1, np.int64)
        np.cumsum(sizes, out=cum[1:])
        codes = shard.source_codes if order is None else shard.source_codes[order]
        src = self.ids.lookup(list(shard.info.source_names))[codes].astype(np.int64) if n else np.empty(0, np.int64)
        self._segments.append(_Segment(self._end(), shard.info.tokens - skip, self._next_doc, shard, epoch, index, skip,
                                       order, cum, src, mask_first=self._mask_next and skip == 0))
        self._mask_next = False
        self._next_doc += n

    def _pad(self, count: int, *, closing: bool) -> None:
        if count > 0:
            self._segments.append(_Segment(self._end(), count, self._next_doc, closing=closing))
            self._next_doc += 1

    def _epoch_end(self, epoch: int, seq_len: int) -> None:
        if not self._epoch_docs and self.available() == 0:
            raise ShardError(f"{self.shards.root}: epoch {epoch} has no documents (every shard empty or skipped)")
        self._epoch_docs = 0
        if self.finite:
            if self.available():
                self._pad(1, closing=True)
            self._finished = True
        elif self.config.epoch_end == "pad":
            filled = self.available()
            full = -(-filled // seq_len) * seq_len
            if full > filled:  # the next epoch's leading EOS would not land on a sequence boundary
                self._pad(full - filled, closing=True)
                self._mask_next = True

    def _has_target(self) -> bool:
        for seg in self._segments:
            lo = max(seg.start, self._base + 1)  # targets start one past the base
            if lo >= seg.end:
                continue
            if seg.shard is not None:
                first_masked = seg.mask_first and lo == seg.start
                if seg.end - lo > int(first_masked):
                    return True
            elif seg.closing and lo == seg.start:
                return True
        return False

    def fill(self, seq_len: int, n_seqs: int) -> bool:
        """Lay out the stream far enough for ``n_seqs`` sequences; False when a finite pass has nothing left to predict."""
        if self._segments is None:
            self._start()
        need, n = n_seqs * seq_len + 1, len(self.shards.shards)
        while self.available() < need and not self._finished:
            if self._stop is not None and self._visit >= self._stop:
                break
            epoch, index = divmod(self._visit, n)
            self._add_shard(epoch, index)
            self._visit += 1
            if index == n - 1:
                self._epoch_end(epoch, seq_len)
        if self.available() < need:
            if not self._has_target():
                return False
            self._pad(need - self.available(), closing=False)
        return True

    # -- reading ------------------------------------------------------------------------
    def _gather(self, pos: np.ndarray) -> tuple[np.ndarray, ...]:
        """Per stream position: token, document number, valid target, source id, shard, row."""
        tok = np.empty(len(pos), np.int64)
        doc, valid = np.empty(len(pos), np.int64), np.ones(len(pos), bool)
        src, shard_of, row = np.zeros(len(pos), np.int64), np.full(len(pos), -1, np.int64), np.full(len(pos), -1, np.int64)
        starts = np.array([s.start for s in self._segments], np.int64)
        which = np.searchsorted(starts, pos, side="right") - 1
        for k in np.unique(which):
            seg, at = self._segments[k], np.flatnonzero(which == k)
            q = pos[at] - seg.start
            if seg.shard is None:
                tok[at], doc[at] = self.tokenizer.pad_id, seg.doc0
                valid[at] = seg.closing & (q == 0)
                if seg.closing:
                    tok[at[q == 0]] = self.tokenizer.eos_id
                continue
            q = q + seg.skip  # position within the shard's stream
            j = np.searchsorted(seg.cum, q, side="right") - 1  # document in stream order
            within = q - seg.cum[j]
            file_doc = j if seg.order is None else seg.order[j]
            t = np.full(len(q), self.tokenizer.eos_id, np.int64)
            body = within > 0
            # stream token (doc, k>0) is file token starts[doc] + k - 1; k = 0 is the leading EOS
            t[body] = self._read(seg, seg.shard.starts[file_doc[body]] + within[body] - 1)
            tok[at], doc[at], src[at] = t, seg.doc0 + j, seg.src[j]
            shard_of[at], row[at] = seg.index, seg.shard.rows[file_doc]
            if seg.mask_first:
                valid[at[q == 0]] = False
        return tok, doc, valid, src, shard_of, row

    def _read(self, seg: _Segment, file_pos: np.ndarray) -> np.ndarray:
        """Tokens at file positions ``file_pos`` of ``seg``'s shard, reading each contiguous run once."""
        if not len(file_pos):
            return np.empty(0, np.int64)
        breaks = np.flatnonzero(np.diff(file_pos) != 1) + 1
        runs = np.split(file_pos, breaks)
        out = np.concatenate([seg.shard.read(int(r[0]), int(r[-1]) + 1) for r in runs]).astype(np.int64)
        self.counters["tokens_read"] += len(out)
        self.counters["bytes_read"] += len(out) * seg.shard.dtype.itemsize
        return out

    def take(self, seq_len: int, n_seqs: int, rows: np.ndarray, *, boundary: bool) -> dict[str, np.ndarray]:
        """This rank's ``rows`` of the step's ``n_seqs`` sequences; the stream moves past all of them."""
        assert self.available() >= n_seqs * seq_len + 1, "take() before the step was filled"
        pos_BT1 = self._base + np.asarray(rows, np.int64)[:, None] * seq_len + np.arange(seq_len + 1)
        shape = pos_BT1.shape
        tok, doc, valid, src, shard_of, row = (a.reshape(shape) for a in self._gather(pos_BT1.ravel()))
        doc_BT = doc[:, :-1]
        out = {
            "tokens": tok[:, :-1], "targets": tok[:, 1:],
            "source_ids": src[:, :-1],  # a target belongs to the document whose context predicts it
            "loss_mask": valid[:, 1:],
            "doc_ids": (doc_BT - doc_BT[:, :1]).astype(np.int32) if boundary else np.zeros(doc_BT.shape, np.int32),
            "origin_shard": shard_of[:, 0], "origin_row": row[:, 0],
        }
        self._base += n_seqs * seq_len
        self._segments = [s for s in self._segments if s.end > self._base]
        self._update_position()
        return out

    def _update_position(self) -> None:
        seg = self._segments[0]  # take() leaves at least one token past the base
        if seg.shard is not None:  # a base in padding (end of a finite pass) keeps the last position
            self.position = (seg.epoch, seg.index, seg.skip + self._base - seg.start)

    def close(self) -> None:
        """Forget the layout (``position`` stays); memory maps are kept for the next pass."""
        self._segments = None
