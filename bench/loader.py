"""Benchmark: winnow's loaders (token shards, text shards) vs litdata, MosaicML streaming, webdataset, torch.

Text contenders read the same shards (written with curate's shard writer) with the same byte-level
tokenizer: winnow's text loader, ``webdataset.WebLoader`` and a map-style ``torch.utils.data.DataLoader``
(the two peers share one tokenize-and-pack function, ``tokenize_and_pack``). Pre-tokenized contenders
read the same token ids: winnow's token shards (Megatron ``.bin``/``.idx`` from curate's ``tokens``
format), litdata (``litdata.optimize`` of those documents into token chunks, then ``StreamingDataset``
with ``TokensLoader`` + ``StreamingDataLoader``) and MosaicML streaming (the stream packed into
``seq_len + 1`` windows in MDS shards, as llm-foundry's concat-tokens recipe writes them, then
``StreamingDataset`` + ``DataLoader``). All yield ``(B, T)`` int64 batches with the same batch size,
sequence length and worker count; winnow's also carry per-token source ids, loss and document
masks. The peers' preprocessing runs once, before timing. Printed per contender: tokens/s (after
the first batch), time to first batch (construction included), peak RSS of the process tree, and
ratios. Rounds alternate A B C ... A B C ... because the machine may be shared.

    python bench/loader.py --docs 4000 --rounds 2          # small: a few minutes
    python bench/loader.py --docs 40000 --batches 400      # larger (RSS should not grow with it)
    python bench/loader.py --only tokens,litdata,mds       # just the pre-tokenized contenders
    python bench/loader.py --bpe-vocab 8192                # a trained byte-level BPE instead of byte ids
    python bench/loader.py --sample out/demo               # also time the first batch on the demo shards

Peers: ``pip install litdata mosaicml-streaming`` (a contender whose package is missing is skipped
with a note). MosaicML streaming pins numpy < 2.2 and imports transformers and torchvision at
import time for its text/vision datasets; the bench stubs those two packages when they are not
importable, since the MDS reader it times uses neither.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from functools import partial
from pathlib import Path

import numpy as np
import orjson
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import loader_peers  # noqa: E402  (bench/ is on sys.path when this file runs)

from winnow.train.data import Loader, LoaderConfig  # noqa: E402
from winnow.train.data.pieces import with_separators  # noqa: E402
from winnow.train.tokenizer import ByteTokenizer, load_tokenizer  # noqa: E402

SOURCES = ["web", "code", "books", "forum"]
WORDS = np.array(
    "the of and to in is was for that with as on by at from this be are or an it which not".split()
    + [f"w{i}" for i in range(2000)]
)


# -- data ---------------------------------------------------------------------------------------
def make_job(folder: Path, docs: int, shard_rows: int, seed: int = 0, bpe_vocab: int = 0) -> Path:
    """A job folder of synthetic multi-source documents in every shard format, written by curate.

    ``bpe_vocab``: token shards (and ``folder/tokenizer/``) from a byte-level BPE trained on the
    documents, instead of byte ids.
    """
    import polars as pl

    from winnow.curate.config import OutputConfig, TokensConfig
    from winnow.curate.writers.shards import ShardWriter

    if (folder / "manifest.json").exists():
        return folder
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(5.5, 1.0, docs).astype(int), 5, 20000)  # words per document
    words = WORDS[rng.integers(0, len(WORDS), int(lengths.sum()))]
    cuts = np.cumsum(lengths)[:-1]
    texts = [" ".join(chunk) for chunk in np.split(words, cuts)]
    df = pl.DataFrame(
        {
            "id": [f"doc/{i}" for i in range(docs)],
            "source": [SOURCES[i % 4] for i in rng.integers(0, 4, docs)],
            "text": texts,
            "meta": [None] * docs,
        },
        schema={"id": pl.String, "source": pl.String, "text": pl.String, "meta": pl.String},
    )
    tokens = TokensConfig()
    if bpe_vocab:
        from winnow.train.tokenizer import train_bpe

        tok_dir = train_bpe(
            [texts[i : i + 500] for i in range(0, min(len(texts), 4000), 500)], vocab_size=bpe_vocab
        ).save(folder / "tokenizer")
        tokens = TokensConfig(tokenizer=str(tok_dir / "tokenizer.json"))
    output = OutputConfig(formats=["parquet", "webdataset", "tokens"], shard_rows=shard_rows, tokens=tokens)
    writer = ShardWriter(folder, "part-00000", output, split="train")
    writer.write(df)
    entries = writer.close()
    for e in entries:
        e["path"] = str(Path(e["path"]).relative_to(folder))
    manifest = {"format_version": 1, "job": folder.name, "sources": SOURCES, "shards": entries, "stages": []}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def shard_files(folder: Path, fmt: str) -> list[str]:
    manifest = json.loads((folder / "manifest.json").read_text())
    return [str(folder / s["path"]) for s in manifest["shards"] if s["format"] == fmt and s["split"] == "train"]


# -- the peers' shared tokenize-and-pack function ------------------------------------------------
def tokenize_and_pack(texts, src_ids, carry, seq_len, tok):
    """Tokenize documents, append them to ``carry`` and cut off every full ``seq_len + 1`` window."""
    flat, lens = tok.encode_column(texts)
    ids, doc_lens = with_separators(flat, lens, tok.eos_id)
    srcs = np.repeat(np.asarray(src_ids, np.int64), doc_lens)
    ids = np.concatenate([carry[0], ids.astype(np.int64)])
    srcs = np.concatenate([carry[1], srcs])
    n = max((len(ids) - 1) // seq_len, 0)
    pos = np.arange(n)[:, None] * seq_len + np.arange(seq_len + 1)
    return ids[pos], srcs[pos], (ids[n * seq_len :], srcs[n * seq_len :])


def empty_carry():
    return np.empty(0, np.int64), np.empty(0, np.int64)


def collate(seqs):
    tok = torch.from_numpy(np.stack([s[0] for s in seqs]))
    src = torch.from_numpy(np.stack([s[1] for s in seqs]))
    return tok[:, :-1], tok[:, 1:], src[:, 1:]


def wds_pack(samples, seq_len, tok, ids, group=256):
    """webdataset pipeline stage: samples (txt + json bytes) -> packed sequences."""
    texts, srcs, carry = [], [], empty_carry()
    for sample in samples:
        texts.append(sample["txt"].decode())
        srcs.append(ids[orjson.loads(sample["json"])["source"]])
        if len(texts) == group:
            seq_tok, seq_src, carry = tokenize_and_pack(texts, srcs, carry, seq_len, tok)
            texts, srcs = [], []
            yield from zip(seq_tok, seq_src)


def make_webdataset(folder, args):
    import webdataset as wds

    tok, ids = ByteTokenizer(), {s: i for i, s in enumerate(SOURCES)}
    ds = (
        wds.WebDataset(shard_files(folder, "webdataset"), shardshuffle=False, empty_check=False)
        .compose(partial(wds_pack, seq_len=args.seq_len, tok=tok, ids=ids))
        .batched(args.batch_size, collation_fn=collate, partial=False)
    )
    return iter(wds.WebLoader(ds, batch_size=None, num_workers=args.workers))


class PackedMapDataset(torch.utils.data.Dataset):
    """Map-style: item i is packed sequence i, found through an index of document token offsets."""

    def __init__(self, folder, seq_len):
        self.files, self.seq_len, self.tok = shard_files(folder, "parquet"), seq_len, ByteTokenizer()
        lens = [pc.binary_length(pq.read_table(f, columns=["text"])["text"]).to_numpy() + 1 for f in self.files]
        self.doc_shard = np.concatenate([np.full(len(x), i) for i, x in enumerate(lens)])
        self.doc_row = np.concatenate([np.arange(len(x)) for x in lens])
        self.doc_start = np.concatenate([[0], np.cumsum(np.concatenate(lens))])
        self.ids, self.tables = {s: i for i, s in enumerate(SOURCES)}, {}

    def __len__(self):
        return int((self.doc_start[-1] - 1) // self.seq_len)

    def _docs(self, shard, rows):
        if shard not in self.tables:  # each worker caches the shards it touched
            self.tables[shard] = pq.read_table(self.files[shard], columns=["text", "source"])
        t = self.tables[shard].take(rows)
        return t["text"], [self.ids[s] for s in t["source"].to_pylist()]

    def __getitem__(self, i):
        lo = i * self.seq_len
        first, last = np.searchsorted(self.doc_start, [lo, lo + self.seq_len + 1], side="right") - 1
        docs = np.arange(first, min(last + 1, len(self.doc_row)))
        texts, srcs = [], []
        for shard in np.unique(self.doc_shard[docs]):
            sel = docs[self.doc_shard[docs] == shard]
            t, s = self._docs(int(shard), self.doc_row[sel])
            texts.extend(t.to_pylist())
            srcs.extend(s)
        flat, lens = self.tok.encode_column(texts)
        ids, doc_lens = with_separators(flat, lens, self.tok.eos_id)
        at = lo - self.doc_start[first]
        return ids[at : at + self.seq_len + 1].astype(np.int64), np.repeat(np.asarray(srcs), doc_lens)[
            at : at + self.seq_len + 1
        ]


def make_torch(folder, args):
    ds = PackedMapDataset(folder, args.seq_len)
    return iter(
        torch.utils.data.DataLoader(
            ds,
            batch_size=args.batch_size,
            num_workers=args.workers,
            collate_fn=collate,
            persistent_workers=False,
            prefetch_factor=4 if args.workers else None,
        )
    )


def job_tokenizer(folder):
    return load_tokenizer(folder / "tokenizer" if (folder / "tokenizer").is_dir() else None)


def make_winnow_tokens(folder, args):
    """The token-shard loader reads by offset in this process: no tokenizing, so no worker processes to feed."""
    cfg = LoaderConfig(
        batch_size=args.batch_size, seq_len=args.seq_len, num_workers=0, format="tokens", verify_checksums=True
    )
    return Loader(cfg, folder, tokenizer=job_tokenizer(folder))


def make_winnow(folder, args, fmt="parquet"):
    cfg = LoaderConfig(
        batch_size=args.batch_size, seq_len=args.seq_len, num_workers=args.workers, format=fmt, verify_checksums=True
    )
    return Loader(cfg, folder, tokenizer=job_tokenizer(folder))


# -- measuring ----------------------------------------------------------------------------------
def tree_rss() -> int:
    """Resident bytes of this process and all its descendants (from /proc)."""
    total, todo = 0, [os.getpid()]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/statm") as fh:
                total += int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as fh:
                    todo.extend(int(c) for c in fh.read().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def measure(make, folder, args) -> dict:
    peak, done = [tree_rss()], threading.Event()

    def sample():
        while not done.wait(0.05):
            peak.append(tree_rss())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    it = make(folder, args)
    next(it)
    first = time.perf_counter() - t0
    t1 = time.perf_counter()
    for _ in range(args.batches):
        next(it)
    elapsed = time.perf_counter() - t1
    done.set()
    sampler.join()
    if hasattr(it, "close"):
        it.close()
    del it
    return {"tokens_s": args.batches * args.batch_size * args.seq_len / elapsed, "first_s": first, "rss": max(peak)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=4000, help="synthetic documents to generate (size flag)")
    p.add_argument("--shard-rows", type=int, default=500)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--batches", type=int, default=600, help="batches timed after the first")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument(
        "--sample", type=Path, default=None, help="a job folder (e.g. out/demo) to time winnow's first batch on"
    )
    p.add_argument(
        "--bpe-vocab",
        type=int,
        default=0,
        help="tokenize with a byte-level BPE of this many ids (trained on the data) instead of bytes",
    )
    p.add_argument(
        "--only", default="", help="comma-separated contenders: tokens,parquet,tar,webdataset,torch,litdata,mds"
    )
    args = p.parse_args()
    suffix = f"-bpe{args.bpe_vocab}" if args.bpe_vocab else ""
    folder = make_job(
        Path(__file__).parent / "_data" / f"loader-{args.docs}-tokens{suffix}",
        args.docs,
        args.shard_rows,
        bpe_vocab=args.bpe_vocab,
    )
    if args.bpe_vocab and not args.only:
        args.only = "tokens,parquet,tar,litdata,mds"  # webdataset and torch contenders tokenize bytes only
    contenders = {
        "tokens": ("winnow (token shards)", make_winnow_tokens, folder),
        "parquet": ("winnow (parquet)", make_winnow, folder),
        "tar": ("winnow (tar)", partial(make_winnow, fmt="webdataset"), folder),
        "webdataset": ("webdataset.WebLoader", make_webdataset, folder),
        "torch": ("torch DataLoader (map-style)", make_torch, folder),
        "litdata": ("litdata StreamingDataLoader", loader_peers.make_litdata, None),
        "mds": ("MosaicML streaming (MDS)", loader_peers.make_mds, None),
    }
    chosen = [k.strip() for k in args.only.split(",")] if args.only else list(contenders)
    unknown = [k for k in chosen if k not in contenders]
    if unknown:
        p.error(f"--only: unknown contender(s) {unknown}; choose from {list(contenders)}")
    prepare = {"litdata": loader_peers.prepare_litdata, "mds": loader_peers.prepare_mds}
    for key in [k for k in chosen if k in prepare]:
        t0 = time.perf_counter()
        data = prepare[key](folder, args.seq_len)
        if data is None:
            print(
                f"{contenders[key][0]}: not installed, skipped (pip install {'litdata' if key == 'litdata' else 'mosaicml-streaming'})"
            )
            chosen.remove(key)
            continue
        name, make, _ = contenders[key]
        contenders[key] = (name, make, data)
        print(f"{name}: data prepared in {time.perf_counter() - t0:.1f} s (once; reused by later runs)")
    print(
        f"{args.docs} docs in {len(shard_files(folder, 'parquet'))} shards, {args.workers} workers, "
        f"batch {args.batch_size} x {args.seq_len}, {args.batches} timed batches, {args.rounds} rounds, alternating"
    )
    results: dict[str, list[dict]] = {k: [] for k in chosen}
    for _ in range(args.rounds):
        for key in chosen:
            _, make, data = contenders[key]
            results[key].append(measure(make, data, args))
    ref = "tokens" if "tokens" in results else chosen[0]
    base = statistics.median(r["tokens_s"] for r in results[ref])
    print(
        f"{'contender':<32}{'tokens/s':>14}{'first batch s':>15}{'peak RSS MiB':>14}{contenders[ref][0].split(' (')[0] + ' ' + ref + '/peer':>22}"
    )
    for key, rs in results.items():
        tps = statistics.median(r["tokens_s"] for r in rs)
        first = statistics.median(r["first_s"] for r in rs)
        rss = max(r["rss"] for r in rs) / 2**20
        print(f"{contenders[key][0]:<32}{tps:>14,.0f}{first:>15.3f}{rss:>14.0f}{base / tps:>21.2f}x")
    if "tar" in results and "webdataset" in results:
        same_input = statistics.median(r["tokens_s"] for r in results["tar"]) / statistics.median(
            r["tokens_s"] for r in results["webdataset"]
        )
        print(f"same tar shards: winnow (tar) / webdataset.WebLoader = {same_input:.2f}x tokens/s")
    if args.sample is not None:
        firsts = []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            with Loader(LoaderConfig(num_workers=args.workers), args.sample) as loader:
                next(loader)
                firsts.append(time.perf_counter() - t0)
        print(f"winnow first batch on {args.sample}: {statistics.median(firsts):.3f} s (median of {len(firsts)})")
    print("(shared machine: ratios are paired per round; absolute figures vary with load)")


if __name__ == "__main__":
    main()
