"""Token shards: the Megatron-Core indexed dataset (``.bin`` + ``.idx``) plus winnow's per-document array.

One token shard is written beside each Parquet shard, from the same rows in the same order, so
document ``j`` of ``part-X.bin`` is row ``j`` of ``part-X.parquet`` (the curriculum order).

* ``part-X.bin``: every document's ids followed by one end-of-document id (Megatron's
  ``--append-eod``), in the smallest dtype Megatron has a code for (``curate.tokenize.token_dtype``).
* ``part-X.idx``: Megatron-Core's ``MMIDIDX`` index exactly as ``megatron.core.datasets.
  indexed_dataset._IndexWriter`` writes it: the 9-byte magic, version ``<Q`` 1, dtype code ``<B``,
  sequence count ``<Q``, document count ``<Q``, then sizes (int32, tokens per document with its
  EOS), pointers (int64 byte offsets into ``.bin``) and document indices (int64, ``0..n``: one
  sequence per document). Megatron-LM, NeMo and GPT-NeoX read the pair through the prefix ``part-X``.
* ``part-X.doc.npy``: per document ``source`` (uint32 index into the manifest entry's
  ``source_names``) and ``row`` (uint32, the row in the Parquet shard).

Files are written under temporary names and renamed when complete, like every other shard.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import struct
import time
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from winnow.curate.atomic import rename_into_place, write_bytes_atomic, write_text_atomic
from winnow.curate.errors import OutputError
from winnow.curate.tokenize import ShardTokenizer

INDEX_MAGIC = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
_INDEX_HEADER = "<QBQQ"  # after the magic: version, dtype code, sequences, documents + 1
# megatron.core.datasets.indexed_dataset.DType
DTYPE_CODES = {
    np.dtype(np.uint8): 1,
    np.dtype(np.int8): 2,
    np.dtype(np.int16): 3,
    np.dtype(np.int32): 4,
    np.dtype(np.int64): 5,
    np.dtype(np.float64): 6,
    np.dtype(np.float32): 7,
    np.dtype(np.uint16): 8,
}
DOC_DTYPE = np.dtype([("source", "<u4"), ("row", "<u4")])
SUFFIXES = (".bin", ".idx", ".doc.npy")
TOKENIZER_FILE = "tokenizer.json"  # shards/tokens/tokenizer.json, beside the split folders


@functools.lru_cache(maxsize=4)
def shard_tokenizer(spec: str, eos_token: str | None) -> ShardTokenizer:
    """One loaded tokenizer per worker process (a large tokenizer.json takes a while to parse)."""
    return ShardTokenizer(spec, eos_token=eos_token)


def index_bytes(sizes: np.ndarray, dtype: np.dtype) -> bytes:
    """The ``.idx`` file of documents with ``sizes`` tokens each (one sequence per document)."""
    sizes = np.asarray(sizes, np.int32)
    pointers = np.zeros(len(sizes), np.int64)
    np.cumsum(sizes[:-1].astype(np.int64) * dtype.itemsize, out=pointers[1:])
    header = INDEX_MAGIC + struct.pack(_INDEX_HEADER, INDEX_VERSION, DTYPE_CODES[dtype], len(sizes), len(sizes) + 1)
    return header + sizes.tobytes() + pointers.tobytes() + np.arange(len(sizes) + 1, dtype=np.int64).tobytes()


def index_sizes(idx: bytes) -> np.ndarray:
    """The per-document token counts of an ``.idx`` file ``index_bytes`` wrote (its inverse, for the sizes)."""
    _, _, n_seq, _ = struct.unpack_from(_INDEX_HEADER, idx, len(INDEX_MAGIC))
    return np.frombuffer(idx, np.int32, n_seq, len(INDEX_MAGIC) + struct.calcsize(_INDEX_HEADER))


def _digest(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


class TokenShardWriter:
    """Tokenizes and appends the rows of one shard; ``close`` writes the index and returns the manifest entry."""

    def __init__(self, folder: Path, name: str, tokenizer: ShardTokenizer, *, split: str) -> None:
        self.folder, self.name, self.tok, self.split = Path(folder), name, tokenizer, split
        self.folder.mkdir(parents=True, exist_ok=True)
        self._bin = self._tmp(".bin").open("wb")
        self._sizes: list[np.ndarray] = []
        self._codes: list[np.ndarray] = []
        self._names: dict[str, int] = {}
        self.rows = 0
        self.seconds = 0.0
        self.max_id = -1  # recorded in the manifest: a loader reading the shard remotely checks ids against it
        copy = self.folder.parent / TOKENIZER_FILE
        if tokenizer.json is not None and not copy.exists():
            write_text_atomic(copy, tokenizer.json)  # the job folder carries the tokenizer its shards were written with

    def _tmp(self, suffix: str) -> Path:
        return self.folder / f".{self.name}{suffix}.tmp"

    def add(self, df: pl.DataFrame) -> None:
        """Append the documents of ``df`` (columns ``text`` and ``source``), one EOS after each."""
        t0 = time.perf_counter()
        flat, lens = self.tok.encode(df["text"].to_arrow())
        sizes = lens + 1
        out = np.empty(int(sizes.sum()), self.tok.dtype)
        is_eos = np.zeros(len(out), bool)
        is_eos[np.cumsum(sizes) - 1] = True
        out[is_eos] = self.tok.eos_id
        out[~is_eos] = flat
        self.seconds += time.perf_counter() - t0
        self.max_id = max(self.max_id, int(out.max())) if len(out) else self.max_id
        self._bin.write(out.tobytes())
        sources = df["source"].fill_null("<null>")
        for s in sources.unique(maintain_order=True).to_list():
            self._names.setdefault(s, len(self._names))
        self._codes.append(sources.replace_strict(self._names, return_dtype=pl.UInt32).to_numpy())
        self._sizes.append(sizes)
        self.rows += df.height

    def abandon(self) -> None:
        """Close and remove the shard's temporary files (a failed task: its outputs are written again on resume)."""
        with contextlib.suppress(OSError):
            self._bin.close()  # a full disk fails the flush again: the file goes anyway
        for suffix in SUFFIXES:
            self._tmp(suffix).unlink(missing_ok=True)

    def close(self) -> dict[str, Any]:
        """Rename the three files into place; the manifest entry of the ``.bin`` (sidecars share its prefix)."""
        self._bin.close()
        sizes = np.concatenate(self._sizes) if self._sizes else np.empty(0, np.int64)
        if len(sizes) and sizes.max() > np.iinfo(np.int32).max:
            raise ValueError(f"{self.name}: a document of {sizes.max()} tokens does not fit the index's int32 sizes")
        self._tmp(".idx").write_bytes(index_bytes(sizes, self.tok.dtype))
        codes = np.concatenate(self._codes) if self._codes else np.empty(0, np.uint32)
        docs = np.empty(len(sizes), DOC_DTYPE)
        docs["source"], docs["row"] = codes, np.arange(len(sizes), dtype=np.uint32)
        with self._tmp(".doc.npy").open("wb") as fh:
            np.save(fh, docs, allow_pickle=False)
        finals = {}
        for suffix in SUFFIXES:
            final = self.folder / f"{self.name}{suffix}"
            rename_into_place(self._tmp(suffix), final)
            finals[suffix] = final
        names = list(self._names)
        by_source = (
            np.bincount(codes, weights=sizes, minlength=len(names)).astype(np.int64)
            if len(sizes)
            else np.zeros(len(names), np.int64)
        )
        rows_by_source = np.bincount(codes, minlength=len(names)) if len(sizes) else np.zeros(len(names), np.int64)
        binf, idx, doc = finals[".bin"], finals[".idx"], finals[".doc.npy"]
        return {
            "split": self.split,
            "format": "tokens",
            "path": binf,
            "rows": self.rows,
            "bytes": binf.stat().st_size,
            "sha256": _digest(binf),
            "sources": {n: int(rows_by_source[i]) for i, n in sorted(enumerate(names), key=lambda x: x[1])},
            "means": {},
            "tokens": int(sizes.sum()),
            "dtype": self.tok.dtype.name,
            "source_names": names,
            "max_id": self.max_id,
            "tokens_by_source": {n: int(by_source[i]) for i, n in sorted(enumerate(names), key=lambda x: x[1])},
            "index_sha256": _digest(idx),
            "index_bytes": idx.stat().st_size,
            "docs_sha256": _digest(doc),
            "docs_bytes": doc.stat().st_size,
            "tokenizer": self.tok.describe(),
            "tokenize_seconds": round(self.seconds, 6),
        }


def _checked(path: Path, expected: str | None, what: str) -> bytes:
    data = path.read_bytes()
    if expected and hashlib.sha256(data).hexdigest() != expected:
        raise OutputError(
            f"token shard {path}: {what} sha256 differs from the manifest's {expected}; the job folder "
            "was changed after curation: curate the job again"
        )
    return data


def subset_token_shard(job_dir: Path, entry: dict, source: str, root: Path, path: str) -> dict | None:
    """The documents of ``source`` in the token shard of manifest ``entry`` as a token shard of their own.

    Written as ``root/path`` (a ``.bin`` path relative to ``root``) and its sidecars, in the same order (the curriculum), so document ``j``
    is row ``j`` of the same source's rows of the Parquet shard; the three files are checked against
    the entry's sha256 first. Returns the new manifest entry, or None when the shard holds none of
    ``source``'s documents.
    """
    prefix = Path(job_dir) / entry["path"][: -len(".bin")]
    names = list(entry.get("source_names") or [])
    if source not in names:
        return None
    idx = _checked(prefix.with_name(prefix.name + ".idx"), entry.get("index_sha256"), "index")
    docs = np.load(
        io.BytesIO(_checked(prefix.with_name(prefix.name + ".doc.npy"), entry.get("docs_sha256"), "document array")),
        allow_pickle=False,
    )
    sizes = index_sizes(idx)
    keep = docs["source"] == names.index(source)
    if not keep.any():
        return None
    dtype = np.dtype(entry["dtype"])
    tokens = np.frombuffer(_checked(prefix.with_name(prefix.name + ".bin"), entry.get("sha256"), "token"), dtype)
    if len(docs) != len(sizes) or int(sizes.sum(dtype=np.int64)) != len(tokens):
        raise OutputError(
            f"token shard {prefix}.bin: {len(tokens)} tokens and {len(docs)} documents do not match its "
            f"index ({len(sizes)} documents); curate the job again"
        )
    out = Path(root) / path[: -len(".bin")]
    out.parent.mkdir(parents=True, exist_ok=True)
    kept_sizes = sizes[keep]
    files = {".bin": tokens[np.repeat(keep, sizes)].tobytes(), ".idx": index_bytes(kept_sizes, dtype)}
    out_docs = np.empty(len(kept_sizes), DOC_DTYPE)
    out_docs["source"], out_docs["row"] = 0, np.arange(len(kept_sizes), dtype=np.uint32)
    buf = io.BytesIO()
    np.save(buf, out_docs, allow_pickle=False)
    files[".doc.npy"] = buf.getvalue()
    for suffix, data in files.items():
        write_bytes_atomic(out.with_name(out.name + suffix), data)
    n_tokens = int(kept_sizes.sum(dtype=np.int64))
    sha = {suffix: hashlib.sha256(data).hexdigest() for suffix, data in files.items()}
    return {
        "split": entry.get("split", "train"),
        "format": "tokens",
        "path": path,
        "rows": len(kept_sizes),
        "bytes": len(files[".bin"]),
        "sha256": sha[".bin"],
        "sources": {source: len(kept_sizes)},
        "means": {},
        "tokens": n_tokens,
        "dtype": dtype.name,
        "source_names": [source],
        "tokens_by_source": {source: n_tokens},
        "max_id": int(tokens[np.repeat(keep, sizes)].max()) if n_tokens else -1,
        "index_sha256": sha[".idx"],
        "index_bytes": len(files[".idx"]),
        "docs_sha256": sha[".doc.npy"],
        "docs_bytes": len(files[".doc.npy"]),
        "tokenizer": entry.get("tokenizer"),
    }
