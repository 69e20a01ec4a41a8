"""Token shards as the loader sees them: the manifest's ``tokens`` entries, each memory-mapped on demand.

A token shard is Megatron-Core's indexed dataset (``part-X.bin`` + ``part-X.idx``) plus winnow's
``part-X.doc.npy`` (per document: source code, row in the Parquet shard); the layout is written
by ``curate.writers.tokens`` and described in docs/design.md. This module reads it from that
description alone (``train`` never imports ``curate``): the ``.idx`` header and arrays, checked
against the manifest (sha256, documents, tokens, dtype) and against the ``.bin``'s size, before a
single token is used. The ``.bin`` is memory-mapped (local files) or read by byte range (any
other fsspec file system), so a rank touches only the token ranges it asks for.
"""

from __future__ import annotations

import hashlib
import io
import logging
import mmap
import struct
from dataclasses import dataclass, field

import fsspec
import numpy as np
import orjson

from winnow.train.data.shards import (
    MANIFEST,
    cat_shard,
    check_listed,
    listed_twice,
    manifest_sources,
    open_shards,
    read_manifest_file,
    refuse_two_splits,
    remedy,
    shard_digest,
)
from winnow.train.errors import ConfigError, NoShardsError, ShardError

log = logging.getLogger(__name__)

INDEX_MAGIC = b"MMIDIDX\x00\x00"
# megatron.core.datasets.indexed_dataset.DType
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}
TOKEN_DTYPES = frozenset({1, 2, 3, 4, 5, 8})  # the codes of integer types: token ids
_HEADER = len(INDEX_MAGIC) + 8 + 1 + 8 + 8
_SCAN_BYTES = 64 << 20  # of a .bin per piece of the pass that hashes it and checks its ids


def sidecar(bin_path: str, suffix: str) -> str:
    """``part-X.bin`` -> ``part-X<suffix>`` (``.idx``, ``.doc.npy``)."""
    return bin_path[: -len(".bin")] + suffix


@dataclass(frozen=True, slots=True)
class TokenShardInfo:
    """One manifest ``tokens`` entry; ``path`` is the Parquet shard of the same rows (for tracing)."""

    bin_path: str
    path: str
    rows: int
    tokens: int
    dtype: str
    sha256: str | None
    index_sha256: str | None
    docs_sha256: str | None
    source_names: tuple[str, ...]
    max_id: int | None = None  # the largest id, as the writer recorded it

    def sidecar(self, suffix: str) -> str:
        return sidecar(self.bin_path, suffix)


@dataclass(slots=True)
class TokenShardSet:
    """The token shards of one split of a job folder, in manifest (curriculum) order."""

    root: str
    fs: fsspec.AbstractFileSystem
    shards: list[TokenShardInfo]
    tokenizer: dict
    sources: list[str] = field(default_factory=list)
    fingerprint: str = ""
    local: bool = True
    view: None = None  # token shards always come with a manifest (ShardSet.view is for folders without one)


def read_manifest(data: str, storage_options: dict | None = None) -> tuple[fsspec.AbstractFileSystem, str, dict]:
    """The job folder's manifest; ``{}`` when there is none (a folder of text shards has no token shards)."""
    fs, root = fsspec.core.url_to_fs(str(data), **(storage_options or {}))
    root = root.rstrip("/")
    try:
        manifest = read_manifest_file(fs, root, str(data))
    except FileNotFoundError:
        return fs, root, {}
    return fs, root, manifest


def outside_vocabulary(url: str, what: str, vocab_size: int) -> ShardError:
    """The error for a token shard holding an id (``what``) that the run's tokenizer does not have."""
    return ShardError(
        f"token shard {url}: {what} is outside this run's tokenizer's {vocab_size} ids; the shard "
        "was written with another tokenizer or is damaged: curate it again with the run's tokenizer "
        "([output.tokens] tokenizer), or set [train.tokenizer] to the shard's"
    )


def token_entries(manifest: dict, split: str) -> list[dict]:
    return [e for e in manifest.get("shards") or [] if e.get("format") == "tokens" and e.get("split", "train") == split]


def open_token_shards(
    data: str, *, split: str, tokenizer: dict, storage_options: dict | None = None, missing: str = "raise"
) -> TokenShardSet | None:
    """The ``split``'s token shards of job folder ``data``; None when it has none.

    ``tokenizer`` is the loader's tokenizer description (``Tokenizer.describe()``); shards written
    with another tokenizer are a ``ConfigError`` (their ids would mean other tokens).
    """
    fs, root, manifest = read_manifest(data, storage_options)
    entries = token_entries(manifest, split)
    if not entries:
        return None
    twice = listed_twice(e["path"] for e in entries)
    if twice is not None:  # read once per listing: other data than the job curated
        raise ShardError(
            f"{data}/{MANIFEST} lists the token shard {twice} twice; a job's manifest names each shard once (this "
            "one is damaged or edited by hand): curate the job again"
        )
    refuse_two_splits([e for e in manifest.get("shards") or [] if e.get("format") == "tokens"], f"{data}/{MANIFEST}")
    written = entries[0].get("tokenizer") or {}
    if {k: written.get(k) for k in tokenizer} != tokenizer:
        raise ConfigError(
            f"{data}: its token shards were written with tokenizer {written}, this run's tokenizer is "
            f"{tokenizer}; set [train.tokenizer] to the one the shards were made with "
            '(the job folder keeps it as shards/tokens/tokenizer.json), or train.data.format = "parquet"'
        )
    recorded = {".bin": "bytes", ".idx": "index_bytes", ".doc.npy": "docs_bytes"}  # the manifest's size of each
    check_listed(
        fs,
        root,
        [sidecar(e["path"], ext) for e in entries for ext in recorded],
        f"{data}/{MANIFEST}",
        missing=missing,
        sizes={sidecar(e["path"], ext): e.get(key) for e in entries for ext, key in recorded.items()},
        remedy=remedy(manifest, str(data)),
    )
    vocab = tokenizer.get("vocab_size")
    past = [e for e in entries if vocab is not None and isinstance(e.get("max_id"), int) and e["max_id"] >= vocab]
    if past:  # what the writer recorded, known before any shard is opened
        raise outside_vocabulary(
            f"{data}/{past[0]['path']}", f"token id {past[0]['max_id']} (the manifest's max_id)", vocab
        )
    listed = [e for e in manifest["shards"] if e.get("format") == "parquet" and e.get("split", "train") == split]
    parquet = {_stem(e["path"]): e["path"] for e in listed}
    shards = [
        TokenShardInfo(
            bin_path=e["path"],
            path=parquet.get(_stem(e["path"]), e["path"]),
            rows=int(e["rows"]),
            tokens=int(e["tokens"]),
            dtype=e["dtype"],
            sha256=e.get("sha256"),
            index_sha256=e.get("index_sha256"),
            docs_sha256=e.get("docs_sha256"),
            source_names=tuple(e.get("source_names") or ()),
            max_id=e.get("max_id"),
        )
        for e in entries
    ]
    if sorted(parquet) == sorted(_stem(s.bin_path) for s in shards):
        # the rows of the Parquet shards of the same names: a loader state saved reading either format resumes
        # on the other (the positions are the same; docs/design.md, token shards)
        digest = shard_digest(listed)
    else:
        digest = hashlib.sha256(orjson.dumps([[s.bin_path, s.tokens, s.sha256] for s in shards])).hexdigest()[:16]
    protocol = fs.protocol[0] if isinstance(fs.protocol, tuple) else fs.protocol
    local = protocol in ("file", "local")
    return TokenShardSet(
        root=("" if local else f"{protocol}://") + root,
        fs=fs,
        shards=shards,
        tokenizer=written,
        sources=manifest_sources(manifest),
        fingerprint=digest,
        local=local,
    )


def split_sources(data: str, *, split: str, fmt: str, storage_options: dict | None = None) -> list[str]:
    """Source names of a folder's ``split`` in the shards ``fmt`` reads (as the loader picks them); ShardError if none.
    The listed files are checked as the loader opens them (there, and of the sizes the manifest gives)."""
    if fmt in ("auto", "tokens"):
        _, _, manifest = read_manifest(data, storage_options)
        if token_entries(manifest, split):  # the tokenizer is the run's to compare: any here
            return open_token_shards(data, split=split, tokenizer={}, storage_options=storage_options).sources
        if fmt == "tokens":
            raise NoShardsError(f"{data}/{MANIFEST} lists no 'tokens' shards for split {split!r}")
        fmt = "parquet"
    return open_shards(data, split=split, fmt=fmt, storage_options=storage_options).sources


def shards_tokenizer(data: str, storage_options: dict | None = None) -> str | None:
    """The tokenizer a job folder's token shards were written with: "byte", its tokenizer.json, or None.

    None when the folder has no token shards (or is not a local job folder): the caller's default applies.
    """
    fs, root, manifest = read_manifest(data, storage_options)
    entries = token_entries(manifest, "train")
    if not entries:
        return None
    if (entries[0].get("tokenizer") or {}).get("kind") == "byte":
        return "byte"
    # shards/tokens/<split>/part-X.bin -> shards/tokens/tokenizer.json, copied there by the curation
    path = f"{root}/{entries[0]['path'].rsplit('/', 2)[0]}/tokenizer.json"
    protocol = fs.protocol[0] if isinstance(fs.protocol, tuple) else fs.protocol
    if protocol not in ("file", "local") or not fs.exists(path):
        log.warning("%s: its token shards' tokenizer.json is not a local file; set [train.tokenizer] path", data)
        return None
    return path


def _stem(path: str) -> str:
    name = path.rsplit("/", 1)[-1]
    return name.split(".", 1)[0]


def _check_sha(where: str, data: bytes, expected: str | None) -> None:
    if expected:
        digest = hashlib.sha256(data).hexdigest()
        if digest != expected:
            raise ShardError(f"{where}: checksum mismatch: sha256 is {digest}, the manifest says {expected}")


class TokenShard:
    """One opened, checked token shard: document sizes, file-order token offsets, sources, rows; ids by range."""

    def __init__(
        self, shard_set: TokenShardSet, index: int, *, vocab_size: int, verify: bool, eos_id: int | None = None
    ) -> None:
        info = self.info = shard_set.shards[index]
        self._fs, self.bytes_read, self.bytes_hashed = shard_set.fs, 0, 0
        self.url = f"{shard_set.root}/{info.bin_path}"
        idx_url, doc_url = f"{shard_set.root}/{info.sidecar('.idx')}", f"{shard_set.root}/{info.sidecar('.doc.npy')}"
        idx, docs = self._cat(idx_url), self._cat(doc_url)
        _check_sha(f"token shard {idx_url}", idx, info.index_sha256)
        _check_sha(f"token shard {doc_url}", docs, info.docs_sha256)
        self.dtype, self.sizes = self._parse_index(idx_url, idx)
        if self.dtype.name != info.dtype:
            raise ShardError(f"token shard {idx_url}: dtype {self.dtype.name}, the manifest says {info.dtype}")
        if vocab_size > np.iinfo(self.dtype).max + 1:
            raise ShardError(
                f"token shard {idx_url}: dtype {self.dtype.name} cannot hold the tokenizer's {vocab_size} ids"
            )
        n_tok = int(self.sizes.sum())
        if len(self.sizes) != info.rows or n_tok != info.tokens:
            raise ShardError(
                f"token shard {idx_url}: {len(self.sizes)} documents / {n_tok} tokens, the manifest says "
                f"{info.rows} / {info.tokens} (truncated or replaced?)"
            )
        try:
            size = self._fs.size(self.url)
        except FileNotFoundError as err:
            raise ShardError(f"token shard {self.url}: missing (listed in the manifest but not found)") from err
        if size != n_tok * self.dtype.itemsize:
            raise ShardError(
                f"token shard {self.url}: {size} bytes, its index says {n_tok} tokens of {self.dtype.name} "
                f"= {n_tok * self.dtype.itemsize} bytes (truncated or replaced?)"
            )
        try:
            table = np.load(io.BytesIO(docs), allow_pickle=False)
        except ValueError as err:
            raise ShardError(f"token shard {doc_url}: not a readable .npy file: {err}") from err
        if table.dtype.names != ("source", "row") or len(table) != len(self.sizes):
            raise ShardError(
                f"token shard {doc_url}: {len(table)} documents with fields {table.dtype.names}, "
                f"expected {len(self.sizes)} with ('source', 'row')"
            )
        self.source_codes, self.rows = table["source"].astype(np.int64), table["row"].astype(np.int64)
        if len(self.source_codes) and self.source_codes.max() >= len(info.source_names):
            raise ShardError(
                f"token shard {doc_url}: source code {self.source_codes.max()} but the manifest names "
                f"{len(info.source_names)} sources"
            )
        self.starts = np.zeros(len(self.sizes), np.int64)  # file-order token offset of each document
        np.cumsum(self.sizes[:-1], out=self.starts[1:])
        self._local = shard_set.local
        self._map = np.memmap(self.url, self.dtype, mode="r") if shard_set.local and n_tok else None
        self.eos_id = eos_id
        hash_it = bool(verify and info.sha256)
        if hash_it or shard_set.local or info.max_id is None:  # remote and unverified: the writer's max_id will do
            self._scan(vocab_size, hash_it=hash_it)
        else:
            if info.max_id >= vocab_size:
                self._bad_id(vocab_size)
            if eos_id is not None and n_tok and int(self.read(n_tok - 1, n_tok)[0]) != eos_id:  # the last document's
                self._no_eos(len(self.sizes) - 1)

    def _cat(self, url: str) -> bytes:
        data = cat_shard(self._fs, url, what="token shard")
        self.bytes_read += len(data)
        return data

    def _parse_index(self, url: str, idx: bytes) -> tuple[np.dtype, np.ndarray]:
        if len(idx) < _HEADER or idx[: len(INDEX_MAGIC)] != INDEX_MAGIC:
            raise ShardError(f"token shard {url}: not a Megatron indexed-dataset index (no MMIDIDX header)")
        version, code, n_seq, n_doc = struct.unpack_from("<QBQQ", idx, len(INDEX_MAGIC))
        if version != 1 or code not in DTYPES:
            raise ShardError(
                f"token shard {url}: index version {version}, dtype code {code}; expected version 1 and a known code"
            )
        if code not in TOKEN_DTYPES:
            raise ShardError(
                f"token shard {url}: its tokens are {np.dtype(DTYPES[code]).name} (dtype code {code}); token ids are "
                "integers: write the shard with an integer dtype (uint16 for a vocabulary up to 65,536)"
            )
        if len(idx) != _HEADER + n_seq * 12 + n_doc * 8:
            raise ShardError(
                f"token shard {url}: {len(idx)} bytes, its header promises {_HEADER + n_seq * 12 + n_doc * 8} (truncated?)"
            )
        dtype = np.dtype(DTYPES[code])
        sizes = np.frombuffer(idx, np.int32, n_seq, _HEADER).astype(np.int64)
        pointers = np.frombuffer(idx, np.int64, n_seq, _HEADER + 4 * n_seq)
        docs = np.frombuffer(idx, np.int64, n_doc, _HEADER + 12 * n_seq)
        expected = np.concatenate([[0], np.cumsum(sizes[:-1])]) * dtype.itemsize if n_seq else pointers
        if (
            not np.array_equal(pointers, expected)
            or not np.array_equal(docs, np.arange(n_seq + 1))
            or (sizes < 1).any()
        ):
            raise ShardError(
                f"token shard {url}: index pointers or document indices are not one contiguous sequence "
                "per document (not written by winnow's tokens format?)"
            )
        return dtype, sizes

    def _scan(self, vocab_size: int, *, hash_it: bool) -> None:
        """One pass over the ``.bin``: its sha256 (``hash_it``) and every id in ``[0, vocab_size)``.

        An id past the vocabulary would index past the embedding (a device-side assert on a GPU), so it is
        a ShardError naming the shard, the id and its document, here, not a crash at some later step.
        """
        digest, at, bad, open_doc = hashlib.sha256(), 0, None, None
        ends = self.starts + self.sizes - 1  # each document's last token, which is the end-of-document token
        with self._fs.open(self.url, "rb") as fh:
            while chunk := fh.read(_SCAN_BYTES):
                if hash_it:
                    digest.update(chunk)
                ids = np.frombuffer(chunk, self.dtype)
                if bad is None and len(ids) and (ids.max() >= vocab_size or (self.dtype.kind != "u" and ids.min() < 0)):
                    first = int(np.flatnonzero((ids >= vocab_size) | (ids < 0))[0])
                    bad = (at + first, int(ids[first]))
                    if not hash_it:
                        break
                if open_doc is None and self.eos_id is not None:
                    lo, hi = np.searchsorted(ends, [at, at + len(ids)])
                    wrong = np.flatnonzero(ids[ends[lo:hi] - at] != self.eos_id)
                    if len(wrong):
                        open_doc = int(lo + wrong[0])
                at += len(ids)
        if not self._local:
            self.bytes_read += at * self.dtype.itemsize
        if hash_it:
            self.bytes_hashed += at * self.dtype.itemsize
            if digest.hexdigest() != self.info.sha256:  # a damaged shard: said before the ids it damaged
                raise ShardError(
                    f"token shard {self.url}: checksum mismatch: sha256 is {digest.hexdigest()}, the manifest "
                    f"says {self.info.sha256}"
                )
        if bad is not None:
            self._bad_id(vocab_size, *bad)
        if open_doc is not None:
            self._no_eos(open_doc)

    def _no_eos(self, doc: int) -> None:
        """Raise the ShardError for document ``doc``, which does not end with the end-of-document token: the stream
        puts that token between documents in its place, so the documents would run together, each losing a token."""
        raise ShardError(
            f"token shard {self.url}: document {doc} (row {int(self.rows[doc])} of {self.info.path}) does not end "
            f"with the end-of-document token {self.eos_id}; a token shard holds each document followed by it "
            "(Megatron's tools/preprocess_data.py --append-eod): write the shards again with it, or curate the text "
            'with [output] formats = ["tokens"]'
        )

    def _bad_id(self, vocab_size: int, at: int | None = None, value: int | None = None) -> None:
        """Raise the ShardError for id ``value`` at token ``at`` (None: the manifest's ``max_id`` is past the vocabulary)."""
        if at is None:
            what = f"token id {self.info.max_id} (the manifest's max_id)"
        else:
            doc = int(np.searchsorted(self.starts, at, side="right")) - 1
            what = f"token id {value} at token {at} (document {doc}, row {int(self.rows[doc])} of {self.info.path})"
        raise outside_vocabulary(self.url, what, vocab_size)

    def read(self, lo: int, hi: int) -> np.ndarray:
        """File-order tokens ``[lo, hi)``."""
        if self._map is not None:
            return self._map[lo:hi]
        size = self.dtype.itemsize
        return np.frombuffer(self._fs.cat_file(self.url, start=lo * size, end=hi * size), self.dtype)

    def release(self) -> None:
        """Drop this process's mapped pages of the shard (the stream has moved past it); they stay in the page cache."""
        mapping = getattr(self._map, "_mmap", None)
        if mapping is not None and hasattr(mapping, "madvise"):
            mapping.madvise(mmap.MADV_DONTNEED)

    def take(self, pos_BT: np.ndarray) -> np.ndarray:
        """File-order tokens at ``pos_BT``, each row a contiguous range (one read per row off a memory map)."""
        if self._map is not None:
            return self._map[pos_BT]
        return np.stack([self.read(int(r[0]), int(r[-1]) + 1) for r in pos_BT])
