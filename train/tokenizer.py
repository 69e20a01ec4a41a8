"""Tokenizers for the loader: a zero-setup byte-level default and a BPE trained on the shards.

Both turn a column of texts into one flat array of token ids plus per-document lengths
(``encode_column``), which is what the loader packs; ``encode_batch`` gives the per-document
arrays of the agreed interface. Neither appends the end-of-document token: packing does.
A tokenizer saves itself into a run folder (``tokenizer.json`` for BPE plus ``tokenizer_meta.json``)
and ``load_tokenizer`` reloads it from there; nothing is ever downloaded.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from winnow.train.errors import ConfigError
from winnow.train.paths import JSON_BYTES, read_capped, replace_file

log = logging.getLogger(__name__)

META_FILE = "tokenizer_meta.json"
BPE_FILE = "tokenizer.json"
EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
# End-of-document tokens of common model families, looked up in this order (the same list as
# curate.tokenize.EOS_CANDIDATES: both sides must pick the same id for the same tokenizer.json).
EOS_CANDIDATES = (EOS_TOKEN, "<|end_of_text|>", "</s>", "<eos>")


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

    def describe(self) -> dict:
        """What the manifest of token shards records about the tokenizer they were written with."""
        return {"kind": self.kind, "vocab_size": self.vocab_size, "eos_id": self.eos_id}

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

    @abstractmethod
    def hf_tokenizer(self):
        """A ``tokenizers.Tokenizer`` that encodes and decodes as this one does, for a Hugging Face ``tokenizer.json``.

        It adds no special tokens when encoding (no template: packing puts the end-of-document
        token between documents), so ``AutoTokenizer`` gives the ids the model was trained on.
        """

    @property
    def special_tokens(self) -> dict[str, str]:
        """The end-of-document and padding tokens as strings (``{"eos_token": ..., "pad_token": ...}``)."""
        tok = self.hf_tokenizer()
        return {"eos_token": tok.id_to_token(self.eos_id), "pad_token": tok.id_to_token(self.pad_id)}

    def save(self, folder: str | Path) -> Path:
        """Write the tokenizer into ``folder`` so ``load_tokenizer(folder)`` gives it back.

        Each file is written whole under a temporary name and renamed over the old one, ``tokenizer_meta.json``
        last: a save that is killed or runs out of disk leaves the earlier tokenizer, or a new ``tokenizer.json``
        beside the earlier meta, whose digest of it (``tokenizer_sha256``) ``load_tokenizer`` then finds wrong.
        """
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in self._files().items():
            replace_file(folder / name, data)
        return folder

    def _files(self) -> dict[str, bytes]:
        """The files ``save`` writes, in the order it renames them into place."""
        return {META_FILE: _json_bytes(self.saved_meta())}

    def saved_meta(self) -> dict:
        """What ``tokenizer_meta.json`` records of this tokenizer."""
        return {"kind": self.kind, "vocab_size": self.vocab_size, "eos_id": self.eos_id, "pad_id": self.pad_id}


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

    def hf_tokenizer(self):
        """Byte-level BPE without merges: each UTF-8 byte is one token whose id is the byte (as GPT-2 writes
        bytes: ``ByteLevel`` maps them to printable characters), then ``<|endoftext|>`` (256) and ``<|pad|>`` (257).

        One difference remains outside winnow: ``tokenizer.json`` does not save the library's
        ``encode_special_tokens`` setting, so a user of the file reads a text holding the literal string
        ``<|endoftext|>`` as that token unless they set it, where winnow encodes its bytes.
        """
        from tokenizers import AddedToken, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as RustTokenizer

        chars = _gpt2_byte_chars()
        tok = RustTokenizer(models.BPE(vocab={chars[b]: b for b in range(256)}, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)  # the text is one piece
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([AddedToken(EOS_TOKEN, special=True), AddedToken(PAD_TOKEN, special=True)])
        return tok


def _gpt2_byte_chars() -> list[str]:
    """The printable character GPT-2's byte-level BPE (and ``tokenizers``' ``ByteLevel``) writes for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    chars = {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(others)}
    return [chars[b] for b in range(256)]


#: Text of many kinds, to check that a tokenizer gives back what it encodes (``HFTokenizer.lost_characters``).
PROBE = (
    "The Quick Brown Fox, 1234567890! café naïve Ünïcödé — «quoted» “text” 漢字 かな 한국어 Ελληνικά кириллица 😀 ✓ ∑"
)


class HFTokenizer(Tokenizer):
    """Any Hugging Face ``tokenizer.json`` (GPT-2, Llama-3, Mistral, ...), through the ``tokenizers`` library.

    Documents are encoded with ``add_special_tokens=False`` (no BOS/EOS templates: packing puts one
    end-of-document token between documents) and with the library's ``encode_special_tokens``, so a
    special token's text inside a document (``<|endoftext|>`` in a README) is encoded as text. ``eos_token`` defaults to the first of
    ``EOS_CANDIDATES`` the vocabulary has; the padding id is ``pad_token``'s, or ``pad_id``, or
    winnow's ``<|pad|>`` when present, else the EOS id: padding is never a target (its loss is
    masked), so any id does as filler.
    """

    kind = "hf"

    def __init__(
        self,
        tok,
        *,
        eos_token: str | None = None,
        pad_token: str | None = None,
        pad_id: int | None = None,
        where: str = "train.tokenizer",
    ) -> None:
        # A document's text "<|endoftext|>" is text: its pieces, never the end-of-document id, which packing
        # alone places between documents (the library matches special tokens inside the text by default).
        tok.encode_special_tokens = True
        self._tok, self._spec = tok, {"eos_token": eos_token, "pad_token": pad_token, "pad_id": pad_id}
        # ids may skip numbers (a WordLevel vocabulary of {"a": 0, "</s>": 1000}): the embedding covers the largest
        self.vocab_size = max(tok.get_vocab_size(), max(tok.get_vocab().values(), default=-1) + 1)
        names = [eos_token] if eos_token is not None else list(EOS_CANDIDATES)
        found = [tok.token_to_id(n) for n in names if tok.token_to_id(n) is not None]
        if not found:
            what = (
                f"has no token {eos_token!r}"
                if eos_token
                else f"has none of the usual end-of-document tokens {list(EOS_CANDIDATES)}"
            )
            raise ConfigError(f"{where}: the tokenizer {what}; set {where}.eos_token to its end-of-document token")
        self.eos_id = found[0]
        if pad_token is not None:
            if tok.token_to_id(pad_token) is None:
                raise ConfigError(
                    f"{where}.pad_token = {pad_token!r}: no such token; give another, pad_id, or neither (pads with EOS)"
                )
            self.pad_id = tok.token_to_id(pad_token)
        elif pad_id is not None:
            if not 0 <= pad_id < self.vocab_size:
                raise ConfigError(f"{where}.pad_id = {pad_id!r} is invalid; allowed: 0..{self.vocab_size - 1}")
            self.pad_id = pad_id
        else:
            own = tok.token_to_id(PAD_TOKEN)
            self.pad_id = self.eos_id if own is None else own
        self.sha256 = hashlib.sha256(tok.to_str().encode()).hexdigest()

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.vocab_size}-{self.sha256[:12]}"

    def describe(self) -> dict:
        return {"kind": "hf", "vocab_size": self.vocab_size, "eos_id": self.eos_id, "sha256": self.sha256}

    def __getstate__(self):
        return {"json": self._tok.to_str(), "spec": self._spec}

    def __setstate__(self, state):
        from tokenizers import Tokenizer as RustTokenizer

        self.__init__(RustTokenizer.from_str(state["json"]), **state["spec"])

    def encode_column(self, texts):
        arr = _as_large_strings(texts).fill_null("")
        encs = self._tok.encode_batch_fast(arr.to_pylist(), add_special_tokens=False)
        lens = np.fromiter((len(e.ids) for e in encs), np.int64, count=len(encs))
        flat = np.fromiter(itertools.chain.from_iterable(e.ids for e in encs), self.dtype, count=int(lens.sum()))
        return flat, lens

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def lost_characters(self) -> list[str]:
        """The characters of ``PROBE`` (cases, accents, scripts, symbols, an emoji) that do not come back from
        ``decode(encode(...))``: a tokenizer without byte fallback or an unknown token drops them, one that lowercases
        or normalizes changes them, and a run trains on text without them. Whitespace is left out of the comparison
        (decoders differ in it harmlessly)."""
        try:
            ids, _ = self.encode_column([PROBE])
        except Exception:  # noqa: BLE001 - the Rust side's own refusal of some text: training meets it and says it
            return []
        missing = Counter(c for c in PROBE if not c.isspace()) - Counter(self.decode(ids))
        return [c for c in dict.fromkeys(PROBE) if c in missing]  # in the probe's order

    def hf_tokenizer(self):
        from tokenizers import Tokenizer as RustTokenizer

        tok = RustTokenizer.from_str(self._tok.to_str())
        tok.post_processor = None  # documents are encoded without a template's BOS/EOS (encode_column)
        return tok

    def saved_meta(self) -> dict:
        return {**super().saved_meta(), **{k: v for k, v in self._spec.items() if v is not None}}

    def _files(self) -> dict[str, bytes]:
        body = self._tok.to_str(pretty=True).encode()
        return {BPE_FILE: body, META_FILE: _json_bytes({**self.saved_meta(), "tokenizer_sha256": _sha256(body)})}


class BPETokenizer(HFTokenizer):
    """A byte-level BPE trained on the shards by ``train_bpe`` (``<|endoftext|>`` and ``<|pad|>`` built in)."""

    kind = "bpe"
    asked_vocab_size: int | None = None  # train_bpe's vocab_size, where the texts gave fewer tokens (vocab_size)

    def __init__(self, tok, **spec) -> None:
        if tok.token_to_id(EOS_TOKEN) is None or tok.token_to_id(PAD_TOKEN) is None:
            raise ConfigError(
                f"BPE tokenizer lacks the special tokens {EOS_TOKEN!r} / {PAD_TOKEN!r}; train it with `winnow tokenizer train`"
            )
        super().__init__(tok, **{"eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN, **spec})

    def saved_meta(self) -> dict:
        asked = {} if self.asked_vocab_size is None else {"asked_vocab_size": self.asked_vocab_size}
        return {**super().saved_meta(), **asked}

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.vocab_size}"


#: The largest vocabulary ``train_bpe`` trains (64x the largest in common use).
MAX_BPE_VOCAB = 1 << 24


def train_bpe(texts: Iterable[list[str]], *, vocab_size: int, min_frequency: int = 2) -> BPETokenizer:
    """Train a byte-level BPE on batches of texts; the 256 byte symbols are always in the vocabulary."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + 2:
        raise ConfigError(
            f"vocab_size must be at least {len(alphabet) + 2} (256 byte symbols + eos + pad), got {vocab_size}"
        )
    if vocab_size > MAX_BPE_VOCAB:  # the trainer reserves tens of bytes per asked token up front: 2**29 is ~35 GB
        raise ConfigError(
            f"vocab_size must be at most {MAX_BPE_VOCAB:,} (the BPE trainer reserves memory for every token asked; "
            f"vocabularies in use stay under a million), got {vocab_size:,}"
        )
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
    reached = tok.get_vocab_size()
    log.info("trained a BPE tokenizer with %d tokens", reached)
    bpe = BPETokenizer(tok)
    if reached < vocab_size:  # BPE stops when no pair of tokens is seen min_frequency times any more
        log.warning(
            "the BPE tokenizer has %d tokens, not the %d asked (vocab_size): its texts hold no more pairs of tokens "
            "seen at least %d times (min_frequency) to merge. Train on more text for a larger vocabulary; "
            "tokenizer_meta.json records both sizes (vocab_size, asked_vocab_size)",
            reached,
            vocab_size,
            min_frequency,
        )
        bpe.asked_vocab_size = vocab_size
    return bpe


@dataclass(kw_only=True, slots=True)
class TokenizerConfig:
    """``[train.tokenizer]``: which tokenizer, and its end-of-document and padding tokens."""

    path: str = "byte"  # "byte", a Hugging Face tokenizer.json, or a folder holding one (a run folder, `winnow tokenizer train`)
    eos_token: str | None = None  # None: the first of <|endoftext|>, <|end_of_text|>, </s>, <eos> in the vocabulary
    # None: pad_id, else winnow's <|pad|> if present, else the EOS id (padding is loss-masked)
    pad_token: str | None = None
    pad_id: int | None = None  # the padding token by id, instead of pad_token

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path.strip():
            raise ConfigError(
                f"train.tokenizer.path = {self.path!r} is invalid; allowed: 'byte', a Hugging Face tokenizer.json, or "
                "a folder holding one"
            )
        if self.pad_token is not None and self.pad_id is not None:
            raise ConfigError("train.tokenizer: give pad_token or pad_id, not both")
        if self.path == "byte" and (self.eos_token, self.pad_token, self.pad_id) != (None, None, None):
            raise ConfigError(
                "train.tokenizer.path = 'byte' has fixed ids (EOS 256, pad 257); drop eos_token/pad_token/pad_id"
            )


def load_tokenizer(spec: str | Path | TokenizerConfig | None, *, where: str = "train.tokenizer") -> Tokenizer:
    """The tokenizer ``spec`` names: a ``TokenizerConfig``, a path (tokenizer.json or a folder from ``save``), or byte-level."""
    cfg = spec if isinstance(spec, TokenizerConfig) else TokenizerConfig(path="byte" if spec is None else str(spec))
    if cfg.path == "byte":
        return ByteTokenizer()
    path = Path(cfg.path)
    file = path if path.is_file() else path / BPE_FILE
    meta_file = file.parent / META_FILE
    meta = _meta(meta_file, where) if meta_file.exists() else {}
    if meta.get("kind") == "byte":
        return ByteTokenizer()
    if not file.is_file():
        raise ConfigError(
            f"{where}.path = {cfg.path!r}: no {BPE_FILE} there (nor {META_FILE}); give a Hugging Face "
            "tokenizer.json, a folder holding one (e.g. from `winnow tokenizer train`), or 'byte'"
        )
    from tokenizers import Tokenizer as RustTokenizer

    body = _read(file, where)
    if meta.get("tokenizer_sha256") not in (None, _sha256(body)):
        raise ConfigError(
            f"{where}.path: {file} is not the tokenizer {meta_file.name} beside it describes (a save into the folder "
            "was interrupted); write the tokenizer again (`winnow tokenizer train --output` the same folder)"
        )
    try:
        tok = RustTokenizer.from_str(body.decode("utf-8", errors="replace"))
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - the Rust side raises plain Exceptions for every failure
        raise ConfigError(
            f"{where}.path = {cfg.path!r}: {file} is not a tokenizer.json the tokenizers library can load: {err}"
        ) from err
    given = {k: getattr(cfg, k) for k in ("eos_token", "pad_token", "pad_id") if getattr(cfg, k) is not None}
    if not given and (
        meta.get("kind") == "bpe" or (not meta and None not in (tok.token_to_id(EOS_TOKEN), tok.token_to_id(PAD_TOKEN)))
    ):
        return BPETokenizer(tok)
    saved = {k: meta[k] for k in ("eos_token", "pad_token", "pad_id") if k in meta}
    return HFTokenizer(tok, **(given or saved), where=where)


def _json_bytes(meta: dict) -> bytes:
    return (json.dumps(meta, indent=2) + "\n").encode()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _meta(path: Path, where: str) -> dict:
    """A tokenizer folder's ``tokenizer_meta.json``, or a ConfigError naming it and ``where``."""
    fix = "write the tokenizer again (`winnow tokenizer train`), or give its tokenizer.json alone"
    try:
        meta = json.loads(_read(path, where))
    except ValueError as err:
        raise ConfigError(f"{where}.path: {path} is damaged (not JSON: {err}); {fix}") from err
    if not isinstance(meta, dict) or not all(
        isinstance(meta.get(k, ""), str) for k in ("kind", "eos_token", "pad_token")
    ):
        raise ConfigError(f"{where}.path: {path} is damaged (not an object of a tokenizer's names); {fix}")
    return meta


def _read(path: Path, where: str) -> bytes:
    """A tokenizer file, whole, under a cap (a link to /dev/zero is an error, not an endless read)."""
    import fsspec

    return read_capped(
        fsspec.filesystem("file"), str(path), limit=JSON_BYTES, what=f"{where}.path: the file", error=ConfigError
    )
