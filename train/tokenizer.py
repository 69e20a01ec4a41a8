"""Tokenizers for the loader: a zero-setup byte-level default and a BPE trained on the shards.

Both turn a column of texts into one flat array of token ids plus per-document lengths
(``encode_column``), which is what the loader packs; ``encode_batch`` gives the per-document
arrays of the agreed interface. Neither appends the end-of-document token: packing does.
A tokenizer saves itself into a run folder (``tokenizer.json`` for BPE plus ``tokenizer_meta.json``)
and ``load_tokenizer`` reloads it from there; nothing is ever downloaded.
"""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa

from train.errors import ConfigError

log = logging.getLogger(__name__)

META_FILE = "tokenizer_meta.json"
BPE_FILE = "tokenizer.json"
EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"


def _as_large_strings(texts: pa.Array | pa.ChunkedArray | list[str]) -> pa.LargeStringArray:
    """One contiguous large_string array (offsets int64) whatever the input was."""
    if isinstance(texts, list):
        return pa.array(texts, type=pa.large_string())
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks() if texts.num_chunks != 1 else texts.chunk(0)
    if not pa.types.is_large_string(texts.type):
        texts = texts.cast(pa.large_string())
    return texts


def null_mask(arr: pa.Array) -> np.ndarray:
    """True where ``arr`` is null, from its validity bitmap (``is_null().to_numpy()`` imports pandas)."""
    if not arr.null_count:
        return np.zeros(len(arr), bool)
    bits = np.unpackbits(np.frombuffer(arr.buffers()[0], np.uint8), bitorder="little")
    return bits[arr.offset : arr.offset + len(arr)] == 0


class Tokenizer(ABC):
    """Common interface: ``vocab_size``, ``eos_id``, ``pad_id``, encode, decode, save."""

    kind: str = ""
    vocab_size: int
    eos_id: int
    pad_id: int

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.vocab_size}"

    @property
    def dtype(self) -> np.dtype:
        """Smallest unsigned dtype holding every id: halves what workers send for byte/BPE vocabularies."""
        return np.dtype(np.uint16) if self.vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.int32)

    @abstractmethod
    def encode_column(self, texts: pa.Array | pa.ChunkedArray | list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Token ids of all documents concatenated (``self.dtype``) and each document's length (int64)."""

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """Per-document int32 id arrays (the interface the trainer and tests use)."""
        flat, lens = self.encode_column(texts)
        return np.split(flat.astype(np.int32), np.cumsum(lens)[:-1]) if len(texts) else []

    @abstractmethod
    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        """The text of ``ids``; special tokens are left out."""

    def save(self, folder: str | Path) -> Path:
        """Write the tokenizer into ``folder`` so ``load_tokenizer(folder)`` gives it back."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        meta = {"kind": self.kind, "vocab_size": self.vocab_size, "eos_id": self.eos_id, "pad_id": self.pad_id}
        (folder / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        return folder


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids 0-255, then end-of-document (256) and padding (257)."""

    kind = "byte"

    def __init__(self) -> None:
        self.vocab_size, self.eos_id, self.pad_id = 258, 256, 257

    def encode_column(self, texts):
        arr = _as_large_strings(texts)
        n = len(arr)
        if n == 0:
            return np.empty(0, self.dtype), np.empty(0, np.int64)
        # Read the Arrow buffers directly: the ids are the bytes, no per-document Python.
        _, off_buf, data_buf = arr.buffers()
        offsets = np.frombuffer(off_buf, np.int64, count=n + 1, offset=arr.offset * 8)
        data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.empty(0, np.uint8)
        lens = np.diff(offsets)
        if arr.null_count:
            lens = np.where(null_mask(arr), 0, lens)
            keep = np.repeat(lens > 0, np.diff(offsets))
            flat = data[offsets[0] : offsets[-1]][keep]
        else:
            flat = data[offsets[0] : offsets[-1]]
        return flat.astype(self.dtype), lens.astype(np.int64)

    def decode(self, ids) -> str:
        ids = np.asarray(ids)
        return ids[ids < 256].astype(np.uint8).tobytes().decode("utf-8", errors="replace")


class BPETokenizer(Tokenizer):
    """A byte-level BPE from the ``tokenizers`` library, trained on the shards by ``train_bpe``."""

    kind = "bpe"

    def __init__(self, tok) -> None:
        self._tok = tok
        self.vocab_size = tok.get_vocab_size()
        eos, pad = tok.token_to_id(EOS_TOKEN), tok.token_to_id(PAD_TOKEN)
        if eos is None or pad is None:
            raise ConfigError(f"BPE tokenizer lacks the special tokens {EOS_TOKEN!r} / {PAD_TOKEN!r}; train it with `winnow tokenizer train`")
        self.eos_id, self.pad_id = eos, pad

    def __getstate__(self):
        return {"json": self._tok.to_str()}

    def __setstate__(self, state):
        from tokenizers import Tokenizer as HFTokenizer

        self.__init__(HFTokenizer.from_str(state["json"]))

    def encode_column(self, texts):
        arr = _as_large_strings(texts).fill_null("")
        encs = self._tok.encode_batch_fast(arr.to_pylist(), add_special_tokens=False)
        lens = np.fromiter((len(e.ids) for e in encs), np.int64, count=len(encs))
        flat = np.fromiter((i for e in encs for i in e.ids), self.dtype, count=int(lens.sum()))
        return flat, lens

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def save(self, folder):
        folder = super().save(folder)
        self._tok.save(str(Path(folder) / BPE_FILE))
        return folder


def train_bpe(texts: Iterable[list[str]], *, vocab_size: int, min_frequency: int = 2) -> BPETokenizer:
    """Train a byte-level BPE on batches of texts; the 256 byte symbols are always in the vocabulary."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + 2:
        raise ConfigError(f"vocab_size must be at least {len(alphabet) + 2} (256 byte symbols + eos + pad), got {vocab_size}")
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    log.info("trained a BPE tokenizer with %d tokens", tok.get_vocab_size())
    return BPETokenizer(tok)


def load_tokenizer(path: str | Path | None) -> Tokenizer:
    """The tokenizer saved in ``path`` (a folder from ``save`` or a ``tokenizer.json``); ``None`` is byte-level."""
    if path is None or str(path) == "byte":
        return ByteTokenizer()
    path = Path(path)
    if path.is_file():
        folder, bpe_file = path.parent, path
    else:
        folder, bpe_file = path, path / BPE_FILE
    meta_file = folder / META_FILE
    kind = json.loads(meta_file.read_text())["kind"] if meta_file.exists() else ("bpe" if bpe_file.exists() else None)
    if kind == "byte":
        return ByteTokenizer()
    if kind == "bpe" and bpe_file.exists():
        from tokenizers import Tokenizer as HFTokenizer

        return BPETokenizer(HFTokenizer.from_file(str(bpe_file)))
    raise ConfigError(f"tokenizer path {str(path)!r} holds no {META_FILE} or {BPE_FILE}; give a folder written by `winnow tokenizer train` or omit it for byte-level")
