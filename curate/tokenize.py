"""The tokenizer the ``tokens`` output format writes with: byte-level or a Hugging Face ``tokenizer.json``.

The ids are a contract with whoever trains on the shards (winnow's loader, Megatron-LM, NeMo,
GPT-NeoX), so they are defined here without reference to ``train/``:

* ``byte``: id = the UTF-8 byte value (0-255), end-of-document 256, padding 257, vocabulary 258.
  ``train.tokenizer.ByteTokenizer`` implements the same mapping; the manifest records it.
* a ``tokenizer.json``: the ids the ``tokenizers`` library gives with ``add_special_tokens=False``
  and ``encode_special_tokens`` (a special token's text inside a document is encoded as text)
  (no BOS/EOS templates: the writer appends exactly one end-of-document token per document). The
  end-of-document token is ``eos_token`` if given, else the first of ``EOS_CANDIDATES`` in the
  vocabulary. The manifest records its id and the sha256 of the tokenizer's canonical JSON, which
  the loader compares with its own tokenizer before reading a single token.
"""

from __future__ import annotations

import hashlib
import itertools
import logging

import numpy as np
import pyarrow as pa

from winnow.curate.errors import ConfigError, require
from winnow.curate.wholefile import TOKENIZER_BYTES, read_whole

BYTE_VOCAB, BYTE_EOS, BYTE_PAD = 258, 256, 257
# End-of-document tokens of common model families, in the order they are looked up:
# GPT-2 / Qwen / winnow's own BPE, Llama-3, Llama-2 / Mistral, Gemma.
log = logging.getLogger(__name__)

EOS_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")


def token_dtype(vocab_size: int) -> np.dtype:
    """Smallest dtype Megatron's indexed dataset has codes for that holds every id (it has no uint32)."""
    if vocab_size <= 2**8:
        return np.dtype(np.uint8)
    if vocab_size <= 2**16:
        return np.dtype(np.uint16)
    return np.dtype(np.int32)


class ShardTokenizer:
    """Turns a text column into one flat id array plus per-document lengths (no separators)."""

    def __init__(
        self, spec: str = "byte", *, eos_token: str | None = None, key: str = "output.tokens.tokenizer"
    ) -> None:
        self.spec = spec
        self._tok = None
        if spec == "byte":
            if eos_token is not None:
                raise ConfigError(f"{key} = 'byte' has a fixed end-of-document id ({BYTE_EOS}); drop eos_token")
            self.kind, self.vocab_size, self.eos_id, self.sha256, self.json = "byte", BYTE_VOCAB, BYTE_EOS, None, None
            return
        tokenizers = require("tokenizers", extra="tokenizers", feature=f"{key} = <tokenizer.json>")
        data = read_whole(spec, limit=TOKENIZER_BYTES, what=f"{key}: the tokenizer file", error=ConfigError)
        try:
            tok = tokenizers.Tokenizer.from_str(data.decode("utf-8"))
        except Exception as err:  # noqa: BLE001 - the Rust side raises plain Exceptions for every failure
            raise ConfigError(
                f"{key} = {spec!r}: not a tokenizer.json the tokenizers library can load ({err}); give "
                "'byte' or the path of a Hugging Face tokenizer.json"
            ) from err
        tok.encode_special_tokens = True  # "<|endoftext|>" in a document is text: only packing places EOS
        try:  # a tokenizer that cannot encode text it has never seen fails here, before any shard is written
            tok.encode_batch_fast(["winnow's probe: Zürich 東京 😀 \x01"], add_special_tokens=False)
        except Exception as err:  # noqa: BLE001 - the Rust side raises plain Exceptions for every failure
            raise ConfigError(
                f"{key} = {spec!r} cannot encode text: {err} (a WordLevel or WordPiece model needs its unk_token "
                "in its vocabulary); fix the tokenizer.json or give another"
            ) from err
        # ids may skip numbers (a WordLevel vocabulary of {"a": 0, "</s>": 1000}): the dtype holds the largest,
        # as the training side's vocabulary does (train.tokenizer)
        self._tok, self.kind = tok, "hf"
        self.vocab_size = max(tok.get_vocab_size(), max(tok.get_vocab().values(), default=-1) + 1)
        self.json = tok.to_str()
        self.sha256 = hashlib.sha256(self.json.encode()).hexdigest()
        names = [eos_token] if eos_token is not None else list(EOS_CANDIDATES)
        found = [(n, tok.token_to_id(n)) for n in names if tok.token_to_id(n) is not None]
        if not found:
            what = (
                f"has no token {eos_token!r}"
                if eos_token
                else f"has none of the usual end-of-document tokens {list(EOS_CANDIDATES)}"
            )
            raise ConfigError(
                f"{key} = {spec!r} {what}; set output.tokens.eos_token to the tokenizer's end-of-document token"
            )
        self.eos_token, self.eos_id = found[0]
        if self.eos_id in tok.encode(self.eos_token, add_special_tokens=False).ids:
            log.warning(
                "%s = %r: its end-of-document token %r is an ordinary token (not a special one), so a document "
                "holding the text %r gets the end-of-document id inside it; mark it special in the tokenizer "
                '("added_tokens" with "special": true), or set output.tokens.eos_token to a special token',
                key, spec, self.eos_token, self.eos_token,
            )  # fmt: skip

    @property
    def dtype(self) -> np.dtype:
        return token_dtype(self.vocab_size)

    def describe(self) -> dict:
        """What the manifest records and the loader compares: kind, vocabulary, EOS id (and the JSON's sha256)."""
        out = {"kind": self.kind, "vocab_size": self.vocab_size, "eos_id": self.eos_id}
        if self.sha256:
            out["sha256"] = self.sha256
        return out

    def encode(self, texts: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
        """Ids of every document back to back (``self.dtype``) and each document's length (int64)."""
        if isinstance(texts, pa.ChunkedArray):
            texts = texts.combine_chunks()
        texts = texts.cast(pa.large_string()).fill_null("")
        if self._tok is None:
            # The ids are the bytes: read the Arrow buffers, no per-document Python.
            _, off_buf, data_buf = texts.buffers()
            offsets = np.frombuffer(off_buf, np.int64, count=len(texts) + 1, offset=texts.offset * 8)
            data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.empty(0, np.uint8)
            return data[offsets[0] : offsets[-1]].astype(self.dtype), np.diff(offsets)
        encs = self._tok.encode_batch_fast(texts.to_pylist(), add_special_tokens=False)
        lens = np.fromiter((len(e.ids) for e in encs), np.int64, count=len(encs))
        flat = np.fromiter(itertools.chain.from_iterable(e.ids for e in encs), self.dtype, count=int(lens.sum()))
        return flat, lens
