"""The unit of work a loader worker produces: one shard's documents, tokenized, in pieces.

A shard's *token stream* is its documents in file order (or shuffled within small windows,
reseeded per epoch), each preceded by the end-of-document token, so the stream of a whole
epoch reads ``EOS d0 EOS d1 ...``: the separator both ends the previous document and starts
the next one. Pieces cut that stream at document boundaries every ``piece_rows`` documents;
how it is cut never changes the stream, so neither the piece size nor the number of workers
can change what the trainer sees.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from winnow.train.data.shards import ShardSet, read_shard
from winnow.train.errors import ShardError
from winnow.train.tokenizer import null_mask

NULL_SOURCE = "<null>"


@dataclass(slots=True)
class Piece:
    """Consecutive documents of one shard, tokenized with their separators."""

    epoch: int
    shard: int
    offset: int  # token offset of this piece within the shard's token stream
    tokens: np.ndarray  # (N,) ids, EOS before each document
    doc_lens: np.ndarray  # (D,) int64 tokens per document, its leading EOS included
    rows: np.ndarray  # (D,) int64 row of each document in the shard file
    source_codes: np.ndarray  # (D,) int32 index into source_names
    source_names: list[str]


@dataclass(slots=True)
class ShardDone:
    """End of a shard's pieces; ``error`` is set when the shard was bad and skipped."""

    epoch: int
    shard: int
    error: str | None = None


def window_order(n: int, window: int, seed: int, epoch: int, shard: int) -> np.ndarray | None:
    """Row order with rows shuffled inside consecutive windows of ``window`` rows; None keeps file order."""
    if window <= 1 or n <= 1:
        return None
    rng = np.random.default_rng([seed, epoch, shard])
    # sorting by (window index, random key) permutes within windows only
    return np.lexsort((rng.random(n), np.arange(n) // window))


def interleave_order(codes: np.ndarray) -> np.ndarray | None:
    """Row order taking one row of each source in turn (a source's rows keep their order); None when one source.

    A held-out pass reads its shards in this order, so the first batches of a capped evaluation
    (``[train] eval_batches``) hold every source of a shard, not the first source's rows alone."""
    if len(codes) <= 1:
        return None
    by_source = np.argsort(codes, kind="stable")
    sorted_codes = codes[by_source]
    starts = np.flatnonzero(np.r_[True, sorted_codes[1:] != sorted_codes[:-1]])
    if len(starts) <= 1:
        return None
    rank = np.empty(len(codes), np.int64)  # a row's position among its source's rows
    rank[by_source] = np.arange(len(codes)) - np.repeat(starts, np.diff(np.r_[starts, len(codes)]))
    return np.lexsort((codes, rank))


def with_separators(flat: np.ndarray, lens: np.ndarray, eos: int) -> tuple[np.ndarray, np.ndarray]:
    """``flat`` with ``eos`` inserted before each document, and the new lengths."""
    out_lens = lens + 1
    out = np.empty(len(flat) + len(lens), flat.dtype)
    is_eos = np.zeros(len(out), bool)
    is_eos[np.cumsum(out_lens) - out_lens] = True
    out[is_eos] = eos
    out[~is_eos] = flat
    return out, out_lens


def shard_pieces(
    shards: ShardSet,
    index: int,
    epoch: int,
    *,
    tokenizer,
    fmt: str,
    verify: bool,
    piece_rows: int,
    shuffle_window: int,
    seed: int,
    skip_bad: bool,
    interleave: bool = False,
) -> Iterator[Piece | ShardDone]:
    """Read, check and tokenize shard ``index`` for ``epoch``; ends with one ``ShardDone``.

    ``interleave`` (held-out passes) reads the shard's rows one source at a time in turn (``interleave_order``)."""
    try:
        table = read_shard(shards, index, fmt=fmt, verify=verify)
    except ShardError as err:
        if not skip_bad:
            raise
        yield ShardDone(epoch, index, str(err))
        return
    rows = np.arange(table.num_rows, dtype=np.int64)
    encoded = table.column("source").combine_chunks().dictionary_encode()
    names = [NULL_SOURCE if s is None else s for s in encoded.dictionary.to_pylist()]
    indices = encoded.indices  # int32; read from its buffer: fill_null would import pandas in a fresh worker
    codes = np.frombuffer(indices.buffers()[1], np.int32, count=len(indices), offset=indices.offset * 4).copy()
    if indices.null_count:
        codes[null_mask(indices)] = len(names)
        names.append(NULL_SOURCE)
    order = interleave_order(codes) if interleave else window_order(table.num_rows, shuffle_window, seed, epoch, index)
    if order is not None:
        # from_buffers, not pa.array: that imports pandas (~1 s in each fresh worker)
        indices = pa.Array.from_buffers(pa.int64(), len(order), [None, pa.py_buffer(order.astype(np.int64))])
        table, rows, codes = table.take(indices), rows[order], codes[order]
    text, offset = table.column("text"), 0
    for lo in range(0, table.num_rows, piece_rows):
        hi = min(lo + piece_rows, table.num_rows)
        flat, lens = tokenizer.encode_column(text.slice(lo, hi - lo))
        tokens, doc_lens = with_separators(flat, lens, tokenizer.eos_id)
        yield Piece(epoch, index, offset, tokens, doc_lens, rows[lo:hi], codes[lo:hi], names)
        offset += len(tokens)
    yield ShardDone(epoch, index)
