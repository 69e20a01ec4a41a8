"""Packing: the ordered token stream cut into fixed-length sequences, a global step at a time.

The stream is every piece's tokens back to back (``EOS d0 EOS d1 ...``). A global step of
``n`` sequences of length ``T`` reads positions ``[base, base + n*T]``: sequence ``j`` has
inputs ``[base + j*T, base + (j+1)*T)`` and targets shifted by one, so consecutive sequences
share one boundary token and no target is skipped. ``base`` advances by ``n*T`` per step and
is always a sequence boundary; that makes the cut independent of ``n`` (the number of ranks)
whenever ``T`` is fixed.

Epoch end (``epoch_end = "pad"``): the last partial sequence is completed with the closing
EOS (a real target: the end of the last document) and padding whose targets are masked; the
next epoch starts on a sequence boundary with its first separator masked as a target. With
``"carry"`` the next epoch simply continues the stream. Nothing is ever dropped.

Per token the buffer keeps the token, its document number and whether it is a valid target;
per document its source id, shard, row and start offset within its shard, so that the
position at ``base`` can be stated as ``(epoch, shard, offset)`` for exact resume.
"""

from __future__ import annotations

import numpy as np

from winnow.train.data.pieces import Piece


class SourceIds:
    """Source name -> id, in order of first appearance; unknown names get the next id."""

    def __init__(self, names: list[str] | None = None) -> None:
        self.names: list[str] = []
        self._ids: dict[str, int] = {}
        self.extend(names or [])

    def extend(self, names: list[str]) -> None:
        for name in names:
            if name not in self._ids:
                self._ids[name] = len(self.names)
                self.names.append(name)

    def restore(self, saved: list[str]) -> None:
        """Ids as saved with a run, then names known here but not there (in place: streams share this object)."""
        names = list(saved) + [n for n in self.names if n not in saved]
        self.names, self._ids = [], {}
        self.extend(names)

    def lookup(self, names: list[str]) -> np.ndarray:
        self.extend(names)
        return np.array([self._ids[n] for n in names], np.int32)


class Packer:
    """A token buffer that hands out the sequences of one global step at a time."""

    _DOC_FIELDS = ("src", "epoch", "shard", "row", "shard_start", "abs_start")

    def __init__(self, *, eos_id: int, pad_id: int, dtype: np.dtype, sources: SourceIds, skip: int = 0) -> None:
        self.eos_id, self.pad_id, self.sources = eos_id, pad_id, sources
        self.tok = np.empty(0, dtype)
        self.doc = np.empty(0, np.int64)  # document number of each token (pads form their own)
        self.valid = np.empty(0, bool)  # may the token be predicted (False: padding, masked separators)
        self.docs = {f: np.empty(0, np.int64) for f in self._DOC_FIELDS}
        self.doc_base = 0  # document number of self.docs[...][0]
        self.next_doc = 0
        self.abs_base = 0  # stream position of tok[0]
        self.cursor = 0  # index of the current step's base in tok
        self._skip = skip  # tokens still to drop on resume (the part of the shard already trained on)
        self._mask_next = False

    def available(self) -> int:
        return len(self.tok) - self.cursor

    def has_target(self) -> bool:
        return bool(self.valid[self.cursor + 1 :].any())

    def _append(
        self, tok: np.ndarray, doc: np.ndarray, valid: np.ndarray, docs: dict[str, np.ndarray], first_new: int
    ) -> None:
        # Compact on append only: the buffer is rebuilt once per piece, not once per step.
        first_doc = int(self.doc[self.cursor]) if self.available() else first_new
        drop = first_doc - self.doc_base
        self.tok = np.concatenate([self.tok[self.cursor :], tok])
        self.doc = np.concatenate([self.doc[self.cursor :], doc])
        self.valid = np.concatenate([self.valid[self.cursor :], valid])
        self.docs = {f: np.concatenate([self.docs[f][drop:], docs[f]]) for f in self._DOC_FIELDS}
        self.abs_base += self.cursor
        self.doc_base, self.cursor = first_doc, 0

    def push(self, piece: Piece) -> None:
        """Append a piece's documents (dropping the first ``skip`` tokens when resuming)."""
        n_docs, n_tok = len(piece.doc_lens), len(piece.tokens)
        drop = min(self._skip, n_tok)
        self._skip -= drop
        if n_docs == 0 or drop == n_tok:
            return
        numbers = self.next_doc + np.arange(n_docs, dtype=np.int64)
        self.next_doc += n_docs
        starts = np.cumsum(piece.doc_lens) - piece.doc_lens
        valid = np.ones(n_tok - drop, bool)
        if self._mask_next:
            valid[0], self._mask_next = False, False
        abs_end = self.abs_base + len(self.tok)
        docs = {
            "src": self.sources.lookup(piece.source_names)[piece.source_codes].astype(np.int64),
            "epoch": np.full(n_docs, piece.epoch, np.int64),
            "shard": np.full(n_docs, piece.shard, np.int64),
            "row": piece.rows,
            "shard_start": piece.offset + starts,
            "abs_start": abs_end - drop + starts,
        }
        self._append(piece.tokens[drop:], np.repeat(numbers, piece.doc_lens)[drop:], valid, docs, int(numbers[0]))

    def skip_done(self) -> None:
        """The shard the resume offset points into is over: skip nothing further."""
        self._skip = 0

    def _pad(self, count: int, *, closing: bool) -> None:
        """Append ``count`` tokens of padding, the first an EOS that is a real target when ``closing``."""
        if count <= 0:
            return
        tok = np.full(count, self.pad_id, self.tok.dtype)
        valid = np.zeros(count, bool)
        if closing:
            tok[0], valid[0] = self.eos_id, True
        number = self.next_doc
        self.next_doc += 1
        docs = {f: np.array([-1], np.int64) for f in self._DOC_FIELDS}
        docs["src"][:] = 0
        self._append(tok, np.full(count, number, np.int64), valid, docs, number)

    def end_epoch(self, seq_len: int) -> None:
        """Complete the last partial sequence of an epoch with padding (``epoch_end = "pad"``)."""
        filled = self.available()
        full = -(-filled // seq_len) * seq_len
        if full > filled:
            # the next epoch's leading EOS would not land on a sequence boundary: close and pad
            self._pad(full - filled, closing=True)
            self._mask_next = True

    def close_stream(self) -> None:
        """End of a finite pass: the closing EOS of the last document is still a target."""
        if self.available():
            self._pad(1, closing=True)

    def pad_to(self, need: int) -> None:
        """Fill the last step of a finite pass with masked padding."""
        self._pad(need - self.available(), closing=False)

    def position(self) -> tuple[int, int, int] | None:
        """``(epoch, shard, token offset in that shard's stream)`` of the current step's base.

        None only after the end of a finite pass (the base is padding).
        """
        d = int(self.doc[self.cursor]) - self.doc_base
        if self.docs["shard"][d] < 0:
            return None
        offset = int(self.docs["shard_start"][d] + self.abs_base + self.cursor - self.docs["abs_start"][d])
        return int(self.docs["epoch"][d]), int(self.docs["shard"][d]), offset

    def take(self, seq_len: int, n_seqs: int, rows: np.ndarray, *, boundary: bool) -> dict[str, np.ndarray]:
        """This rank's ``rows`` of the step's ``n_seqs`` sequences; advances to the next step."""
        assert self.available() >= n_seqs * seq_len + 1, "take() before the step was filled"
        pos_BT1 = self.cursor + rows[:, None] * seq_len + np.arange(seq_len + 1)  # B rows, T+1 positions
        tok = self.tok[pos_BT1].astype(np.int64)
        doc_BT = self.doc[pos_BT1[:, :-1]]
        local_BT = doc_BT - self.doc_base
        first = local_BT[:, 0]
        out = {
            "tokens": tok[:, :-1],
            "targets": tok[:, 1:],
            # a target belongs to the document whose context predicts it (its closing EOS included)
            "source_ids": self.docs["src"][local_BT],
            "loss_mask": self.valid[pos_BT1[:, 1:]],
            "doc_ids": (doc_BT - doc_BT[:, :1]).astype(np.int32) if boundary else np.zeros(doc_BT.shape, np.int32),
            "origin_shard": self.docs["shard"][first],
            "origin_row": self.docs["row"][first],
        }
        self.cursor += n_seqs * seq_len
        return out
