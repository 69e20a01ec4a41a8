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

from winnow.train.data.config import LoaderConfig
from winnow.train.data.packing import SourceIds
from winnow.train.data.pieces import interleave_order, window_order
from winnow.train.data.tokenshards import TokenShard, TokenShardSet
from winnow.train.errors import ShardError
from winnow.train.tokenizer import Tokenizer

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


def _doc_of(cum: np.ndarray, q_BT: np.ndarray) -> np.ndarray:
    """Document of each position of rows of consecutive positions: ``searchsorted(cum, q) - 1``, in O(B*T).

    Only the rows' first and last positions are searched; the documents starting inside a row mark
    their first position, and a running count along the row numbers the rest.
    """
    j0 = np.searchsorted(cum, q_BT[:, 0], side="right") - 1
    j1 = np.searchsorted(cum, q_BT[:, -1], side="right") - 1
    n = j1 - j0  # documents starting inside each row
    row = np.repeat(np.arange(len(n)), n)
    k = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n) + np.repeat(j0 + 1, n)
    marks = np.zeros(q_BT.shape, np.int64)
    marks[row, cum[k] - q_BT[row, 0]] = 1
    return j0[:, None] + np.cumsum(marks, axis=1)


class TokenStream:
    """Packed sequences of one token-shard set: the ``SetStream`` interface (``fill``, ``take``, ``position``)."""

    def __init__(
        self, shards: TokenShardSet, *, config: LoaderConfig, tokenizer: Tokenizer, ids: SourceIds, finite: bool
    ) -> None:
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
                shard = TokenShard(
                    self.shards,
                    index,
                    vocab_size=self.tokenizer.vocab_size,
                    verify=self.config.verify_checksums,
                    eos_id=self.tokenizer.eos_id,
                )
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
        # a held-out pass reads sources in turn, so a capped evaluation reads every one
        order = (
            interleave_order(shard.source_codes)
            if self.finite
            else window_order(n, self.config.shuffle_window, self.config.seed, epoch, index)
        )
        sizes = shard.sizes if order is None else shard.sizes[order]
        cum = np.zeros(n + 1, np.int64)
        np.cumsum(sizes, out=cum[1:])
        codes = shard.source_codes if order is None else shard.source_codes[order]
        src = self.ids.lookup(list(shard.info.source_names))[codes].astype(np.int64) if n else np.empty(0, np.int64)
        self._segments.append(
            _Segment(
                self._end(),
                shard.info.tokens - skip,
                self._next_doc,
                shard,
                epoch,
                index,
                skip,
                order,
                cum,
                src,
                mask_first=self._mask_next and skip == 0,
            )
        )
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
    def _fill(self, seg: _Segment, lo: int, hi: int, out: tuple[np.ndarray, ...]) -> None:
        """Write stream positions ``[lo, hi)`` (all inside ``seg``) into the views ``out``."""
        tok, doc, valid, src, shard_of, row = out
        q0, q1 = lo - seg.start, hi - seg.start
        if seg.shard is None:
            tok[:], doc[:], valid[:], src[:], shard_of[:], row[:] = self.tokenizer.pad_id, seg.doc0, False, 0, -1, -1
            if seg.closing and q0 == 0:
                tok[0], valid[0] = self.tokenizer.eos_id, True
            return
        q = np.arange(q0 + seg.skip, q1 + seg.skip)  # positions within the shard's stream
        j = np.searchsorted(seg.cum, q, side="right") - 1  # document in stream order
        if seg.order is None:
            # the stream is the .bin shifted right by one behind a leading EOS: one contiguous read
            a = int(q[0])
            if a == 0:
                tok[0] = self.tokenizer.eos_id
            tok[int(a == 0) :] = self._read(seg, max(a - 1, 0), int(q[-1]))
            file_doc = j
        else:
            within = q - seg.cum[j]
            file_doc = seg.order[j]
            body = within > 0  # a document's first stream token is its leading EOS
            tok[~body] = self.tokenizer.eos_id
            tok[body] = self._take(seg, seg.shard.starts[file_doc[body]] + within[body] - 1)
        doc[:], src[:], shard_of[:] = seg.doc0 + j, seg.src[j], seg.index
        row[0] = seg.shard.rows[file_doc[0]]
        valid[:] = True
        if seg.mask_first and q[0] == 0:
            valid[0] = False

    def _read(self, seg: _Segment, lo: int, hi: int) -> np.ndarray:
        """File tokens ``[lo, hi)`` of ``seg``'s shard."""
        self.counters["tokens_read"] += hi - lo
        self.counters["bytes_read"] += (hi - lo) * seg.shard.dtype.itemsize
        return seg.shard.read(lo, hi)

    def _take(self, seg: _Segment, file_pos: np.ndarray) -> np.ndarray:
        """File tokens at ``file_pos`` (shuffled documents), reading each contiguous run once."""
        if not len(file_pos):
            return np.empty(0, np.int64)
        runs = np.split(file_pos, np.flatnonzero(np.diff(file_pos) != 1) + 1)
        return np.concatenate([self._read(seg, int(r[0]), int(r[-1]) + 1) for r in runs])

    def _take_within(self, seg: _Segment, rows: np.ndarray, seq_len: int, out: tuple[np.ndarray, ...]) -> None:
        """The common case, vectorized: the whole step inside one shard in file order, past its leading EOS."""
        tok, doc, valid, src, shard_of, row = out
        q = (
            (self._base - seg.start + seg.skip) + rows[:, None] * seq_len + np.arange(seq_len + 1)
        )  # shard stream positions
        tok[:] = seg.shard.take(q - 1)  # stream position q is file position q - 1
        j = _doc_of(seg.cum, q)
        doc[:], src[:], shard_of[:], valid[:] = seg.doc0 + j, seg.src[j], seg.index, True
        row[:, 0] = seg.shard.rows[j[:, 0]]
        self.counters["tokens_read"] += q.size
        self.counters["bytes_read"] += q.size * seg.shard.dtype.itemsize

    def _take_rows(self, rows: np.ndarray, seq_len: int, out: tuple[np.ndarray, ...]) -> None:
        """Row by row, each split where it crosses a segment (shard, padding or epoch) boundary."""
        width = seq_len + 1
        starts = np.array([s.start for s in self._segments], np.int64)
        for b, r in enumerate(rows):
            lo = self._base + int(r) * seq_len  # row b reads stream positions [lo, lo + T]
            k = int(np.searchsorted(starts, lo, side="right")) - 1
            at = lo
            while at < lo + width:  # usually one segment; a row can span shard or epoch boundaries
                seg = self._segments[k]
                end = min(seg.end, lo + width)
                self._fill(seg, at, end, tuple(a[b, at - lo : end - lo] for a in out))
                at, k = end, k + 1

    def take(self, seq_len: int, n_seqs: int, rows: np.ndarray, *, boundary: bool) -> dict[str, np.ndarray]:
        """This rank's ``rows`` of the step's ``n_seqs`` sequences; the stream moves past all of them."""
        assert self.available() >= n_seqs * seq_len + 1, "take() before the step was filled"
        n_rows, width = len(rows), seq_len + 1
        out = (
            np.empty((n_rows, width), np.int64),
            np.empty((n_rows, width), np.int64),
            np.empty((n_rows, width), bool),
            np.empty((n_rows, width), np.int64),
            np.empty((n_rows, width), np.int64),
            np.full((n_rows, width), -1, np.int64),
        )
        first = self._segments[0]
        if (
            first.shard is not None
            and first.order is None
            and first.end >= self._base + n_seqs * seq_len + 1
            and self._base - first.start + first.skip > 0
        ):
            self._take_within(first, np.asarray(rows, np.int64), seq_len, out)
        else:
            self._take_rows(np.asarray(rows, np.int64), seq_len, out)
        tok, doc, valid, src, shard_of, row = out
        doc_BT = doc[:, :-1]
        arrays = {
            "tokens": tok[:, :-1],
            "targets": tok[:, 1:],
            "source_ids": src[:, :-1],  # a target belongs to the document whose context predicts it
            "loss_mask": valid[:, 1:],
            "doc_ids": (doc_BT - doc_BT[:, :1]).astype(np.int32) if boundary else np.zeros(doc_BT.shape, np.int32),
            "origin_shard": shard_of[:, 0],
            "origin_row": row[:, 0],
        }
        self._base += n_seqs * seq_len
        for seg in self._segments:
            if seg.end <= self._base and seg.shard is not None:
                seg.shard.release()  # keeps resident memory flat however much data a pass reads
        self._segments = [s for s in self._segments if s.end > self._base]
        self._update_position()
        return arrays

    def _update_position(self) -> None:
        seg = self._segments[0]  # take() leaves at least one token past the base
        if seg.shard is not None:  # a base in padding (end of a finite pass) keeps the last position
            self.position = (seg.epoch, seg.index, seg.skip + self._base - seg.start)

    def close(self) -> None:
        """Forget the layout (``position`` stays); memory maps are kept for the next pass."""
        self._segments = None
