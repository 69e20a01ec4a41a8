"""MinHash near-duplicate removal, end to end: winnow vs datasketch vs datatrove on the same corpus.

Each system reads the same JSONL files, removes near-duplicates (word 5-grams, 128
permutations, threshold 0.8) and writes the kept documents; each run is a fresh subprocess
(so its peak RSS is its own) reporting wall time, peak RSS and the removed ids. winnow runs
as a job (``run_job``: JSONL reader, ``dedup.minhash`` stage, Parquet shards and rejects
written); datatrove as its four-step pipeline (signatures -> buckets -> clusters -> filter,
writing kept and removed JSONL); datasketch as ``MinHash`` + ``MinHashLSH`` in one process.
Precision and recall are measured against exact Jaccard of the normalized word 5-grams,
per duplicate cluster (a cluster of k documents should lose k - 1 of them, whichever).

The peers are 10-1000x slower, so by default they run on the first ``--peer-docs`` documents
(winnow too, for a like-for-like ratio) while winnow also runs on the whole ``--docs``
corpus; the second ratio assumes the peers' docs/s stays what it was on the subsample,
and says so. Rounds interleave the systems (A B C A B C) because the machine is shared.

    python bench/dedup.py --docs 200000 --peer-docs 20000 --reps 2
    python bench/dedup.py --docs 1000000 --systems winnow,datasketch --reps 1
    python bench/dedup.py --samples                      # data_samples/ (5.6k real documents)
    python bench/dedup.py --long --reps 2                # ~17k long real documents of this machine, every system on all
    python bench/dedup.py --docs 20000 --peer-docs 20000 # small and quick: every system on the same 20k

Peers are benchmark-only: ``pip install datatrove[processing] spacy`` (datasketch is a winnow dependency).
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import orjson
import xxhash

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "bench" / "_data" / "dedup"
THRESHOLD, NGRAM, NUM_PERM = 0.8, 5, 128
WORKERS = 2


# -- corpora --------------------------------------------------------------------------------
def generate(n_docs: int, folder: Path, *, seed: int = 0, per_file: int = 50_000) -> dict[str, list[str]]:
    """Random-word documents; 10% are edited or extended copies of earlier ones. Returns planted groups."""
    rng = np.random.default_rng(seed)
    vocab = np.array([f"w{i}" for i in range(50_000)])
    lengths = rng.integers(80, 300, size=n_docs)
    groups: dict[str, list[str]] = {}
    root_of: dict[int, int] = {}  # planted copy -> the original its group started from
    folder.mkdir(parents=True)
    texts: list[str] = []
    for i in range(n_docs):
        if i > 10 and rng.random() < 0.1:
            src = int(rng.integers(0, i))
            words = texts[src].split()
            if rng.random() < 0.5:
                for j in rng.choice(len(words), size=max(1, int(len(words) * rng.uniform(0.002, 0.05))), replace=False):
                    words[j] = vocab[rng.integers(len(vocab))]
            else:
                at = int(rng.integers(len(words)))
                words[at:at] = vocab[rng.integers(len(vocab), size=int(len(words) * rng.uniform(0.02, 0.3)))].tolist()
            root = root_of.setdefault(i, root_of.get(src, src))
            groups.setdefault(f"g{root:08d}", [f"g{root:08d}"]).append(f"g{i:08d}")
            texts.append(" ".join(words))
        else:
            texts.append(" ".join(vocab[rng.integers(len(vocab), size=lengths[i])]))
    _write_jsonl(folder, [f"g{i:08d}" for i in range(n_docs)], texts, per_file)
    return groups


def prepare_samples(folder: Path) -> None:
    """data_samples/ as plain JSONL (one format for every system)."""
    import polars as pl
    import zstandard

    ids, texts = [], []
    for path in sorted((ROOT / "data_samples").glob("*/*")):
        if path.suffix == ".parquet":
            df = pl.read_parquet(path, columns=["id", "text"])
            ids += df["id"].to_list()
            texts += df["text"].to_list()
        elif path.suffix in (".gz", ".zst", ".jsonl"):
            raw = path.read_bytes()
            raw = (
                gzip.decompress(raw)
                if path.suffix == ".gz"
                else zstandard.ZstdDecompressor().decompressobj().decompress(raw)
                if path.suffix == ".zst"
                else raw
            )
            for line in raw.splitlines():
                row = orjson.loads(line)
                ids.append(row["id"])
                texts.append(row["text"])
        elif path.parent.name == "legal":
            ids.append(f"legal/{path.name}")
            texts.append(path.read_text())
    folder.mkdir(parents=True)
    _write_jsonl(folder, ids, texts, 2000)


# Real long text on this machine: Python sources, package docs and licences, man pages.
_LONG_ROOTS = (
    "stdlib",
    "purelib",
    "/usr/lib/python3",
    "/usr/share/doc",
    "/usr/share/man",
    "/usr/share/common-licenses",
)
_TEXT_SUFFIXES = {".py", ".pyi", ".rst", ".md", ".txt", ".html", ".c", ".h", ".pl", ".cfg", ".toml"}
_TEXT_NAMES = {"copyright", "METADATA", "LICENSE", "README", "NEWS", "changelog", "changelog.Debian", "AUTHORS"}


def _long_candidates():
    """Text files under ``_LONG_ROOTS`` (hard links and symlinks once), in a fixed order."""
    import os
    import sysconfig

    paths = sysconfig.get_paths()
    seen = set()
    for root in (Path(paths.get(r, r)) for r in _LONG_ROOTS):
        if not root.is_dir():
            continue
        for dirpath, dirs, files in os.walk(root):
            dirs.sort()
            for name in sorted(files):
                path = Path(dirpath) / name
                base = name[:-3] if name.endswith(".gz") else name
                if not (
                    Path(base).suffix in _TEXT_SUFFIXES
                    or base in _TEXT_NAMES
                    or root.name in ("man", "common-licenses")
                ):
                    continue
                try:
                    st = path.stat()
                except OSError:
                    continue
                if path.is_symlink() or st.st_size < 200 or (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
                yield path


def _read_text_file(path: Path) -> str | None:
    try:
        raw = path.read_bytes()
        raw = gzip.decompress(raw) if path.suffix == ".gz" else raw
        return None if b"\0" in raw[:4096] else raw.decode("utf-8")
    except (OSError, EOFError, gzip.BadGzipFile, UnicodeDecodeError):
        return None


def _mutate(text: str, other: str, rng: np.random.Generator) -> str:
    """A realistic near-copy of ``text``: word edits, a block inserted from ``other``, a block deleted, a version bump."""
    import re

    kind = rng.choice(["edit", "insert", "delete", "version", "mixed"])
    if kind in ("version", "mixed"):

        def bump(m: re.Match) -> str:
            return f"{m.group(1)}.{int(m.group(2)) + 1}"

        text = re.sub(r"\b(\d+)\.(\d+)\b", bump, text, count=int(rng.integers(1, 20)))
        text = text.replace("Copyright", f"Copyright {2000 + int(rng.integers(0, 26))}", 1)
    if kind in ("edit", "mixed"):
        parts = re.split(r"(\s+)", text)
        words = [i for i in range(0, len(parts), 2) if parts[i]]
        for i in (
            rng.choice(words, size=max(1, int(len(words) * rng.uniform(0.001, 0.06))), replace=True) if words else []
        ):
            parts[i] = parts[words[int(rng.integers(len(words)))]]
        text = "".join(parts)
    if kind in ("insert", "delete", "mixed"):
        lines = text.splitlines(keepends=True)
        size = max(1, int(len(lines) * rng.uniform(0.01, 0.25)))
        at = int(rng.integers(0, len(lines) + 1))
        if kind == "delete" and len(lines) > 1:
            del lines[at : at + size]
        else:
            donor = other.splitlines(keepends=True)
            start = int(rng.integers(0, max(len(donor) - size, 0) + 1))
            lines[at:at] = donor[start : start + size]
        text = "".join(lines)
    return text


def prepare_long(folder: Path, *, target_bytes: int = 73_000_000, copies: float = 0.16, seed: int = 0) -> None:
    """Real long documents from this machine, plus near-copies made by mutating some of them.

    Files are taken in an order fixed by a hash of their path until ``target_bytes``; files over
    16 KB are kept with probability 0.2 (and none over 600 KB), which gives a heavy tail like a
    technical web corpus (mean ~5 KB, a few hundred over 50 KB). ``copies`` of the documents get
    a mutated copy (edits, insertions from another document, deletions, version bumps; some
    copies of copies), appended in a shuffled order, so some end up above and some below the
    threshold. The corpus also holds the machine's natural near-duplicates (vendored sources,
    shared licence texts, man pages in several packages).
    """
    paths = sorted(_long_candidates(), key=lambda p: xxhash.xxh64_intdigest(str(p).encode()))
    ids, texts, total = [], [], 0
    for path in paths:
        text = _read_text_file(path)
        size = len(text.encode()) if text else 0
        if (
            not text
            or size > 600_000
            or (size > 16_000 and xxhash.xxh64_intdigest(str(path).encode(), seed=1) % 100 >= 20)
        ):
            continue
        ids.append(f"file:{path}")
        texts.append(text)
        total += size
        if total >= target_bytes:
            break
    rng = np.random.default_rng(seed)
    n_orig = len(texts)
    for k in range(int(n_orig * copies)):
        src = int(rng.integers(0, len(texts)))
        texts.append(_mutate(texts[src], texts[int(rng.integers(0, n_orig))], rng))
        ids.append(f"copy:{k:05d}")
    order = rng.permutation(len(texts))
    folder.mkdir(parents=True)
    _write_jsonl(folder, [ids[i] for i in order], [texts[i] for i in order], -(-len(texts) // 8))


# Line breaks to Python's str.splitlines (which datatrove's reader uses) that JSON leaves unescaped.
_LINE_BREAKS = ((b"\xc2\x85", b"\\u0085"), (b"\xe2\x80\xa8", b"\\u2028"), (b"\xe2\x80\xa9", b"\\u2029"))


def _jsonl_line(row: dict) -> bytes:
    line = orjson.dumps(row)
    for raw, escaped in _LINE_BREAKS:
        line = line.replace(raw, escaped)
    return line


def _write_jsonl(folder: Path, ids: list[str], texts: list[str], per_file: int) -> None:
    for k in range(0, len(ids), per_file):
        lines = (_jsonl_line({"id": i, "text": t}) for i, t in zip(ids[k : k + per_file], texts[k : k + per_file]))
        (folder / f"part-{k // per_file:05d}.jsonl").write_bytes(b"\n".join(lines) + b"\n")


def _read_jsonl(folder: Path):
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_bytes().splitlines():
            yield orjson.loads(line)


# -- ground truth: exact Jaccard ------------------------------------------------------------
def _shingle_sets(texts: list[str]) -> list[set]:
    import polars as pl

    from winnow.curate.dedup.text import normalize_expr

    norm = pl.select(normalize_expr(pl.lit(pl.Series(texts, dtype=pl.String)), "words")).to_series().to_list()
    out = []
    for t in norm:
        w = t.split()
        out.append({tuple(w[i : i + NGRAM]) for i in range(max(len(w) - NGRAM + 1, 1))} if w else set())
    return out


def _shingle_hashes(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Each document's sorted unique word-5-gram hashes: ``(offsets int64[n+1], values uint64)``.

    Independent of winnow's kernels: words come from polars' split of the normalized text, word
    hashes from polars' ``hash``, 5-grams from a numpy polynomial over them (64-bit: collisions
    are ~1e-10 likely over the whole corpus). A document of fewer than 5 words is one shingle.
    """
    import polars as pl

    from winnow.curate.dedup.text import normalize_expr

    words = pl.select(normalize_expr(pl.lit(pl.Series(texts, dtype=pl.String)), "words").str.split(" ").alias("w"))
    words = words.with_columns(pl.col("w").list.eval(pl.element().filter(pl.element() != "")))
    n_words = words["w"].list.len().to_numpy().astype(np.int64)
    wh = words["w"].explode().drop_nulls().hash(seed=7).to_numpy()
    doc = np.repeat(np.arange(len(texts)), n_words)
    starts = np.concatenate([[0], np.cumsum(n_words)])
    pos = np.arange(len(wh)) - starts[doc]
    valid = pos <= np.maximum(n_words[doc] - NGRAM, 0)  # shingle starts
    h = np.full(len(wh), np.uint64(NGRAM))
    with np.errstate(over="ignore"):
        for k in range(NGRAM):
            nxt = np.zeros(len(wh), dtype=np.uint64)
            inside = pos + k < n_words[doc]
            idx = np.flatnonzero(inside)
            nxt[idx] = wh[idx + k]
            h = (h ^ nxt) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(k + 1)
            h ^= h >> np.uint64(29)
    h, doc = h[valid], doc[valid]
    order = np.lexsort((h, doc))
    h, doc = h[order], doc[order]
    keep = np.ones(len(h), dtype=bool)
    keep[1:] = (h[1:] != h[:-1]) | (doc[1:] != doc[:-1])
    h, doc = h[keep], doc[keep]
    offsets = np.concatenate([[0], np.cumsum(np.bincount(doc, minlength=len(texts)))]).astype(np.int64)
    return offsets, h


def exact_components(ids: list[str], texts: list[str]) -> list[set[str]]:
    """Connected components (size >= 2) of every pair with exact Jaccard >= THRESHOLD, found without LSH.

    All-pairs prefix filtering (Bayardo et al., WWW 2007): with tokens ordered rarest first, two
    sets with Jaccard >= t share a token among the first ``n - ceil(t n) + 1`` of each, so the
    pairs sharing such a prefix token are a superset of the true pairs; each is then checked
    exactly (intersection of the sorted hash sets) with the size filter ``|B| >= t |A|``.
    """
    offsets, values = _shingle_hashes(texts)
    sizes = np.diff(offsets)
    uniq, inverse, freq = np.unique(values, return_inverse=True, return_counts=True)
    rank = np.empty(len(uniq), dtype=np.int64)
    rank[np.lexsort((uniq, freq))] = np.arange(len(uniq))
    token_rank = rank[inverse]
    doc = np.repeat(np.arange(len(texts)), sizes)
    by_rank = np.lexsort((token_rank, doc))  # each document's tokens, rarest first
    pos = np.arange(len(values)) - offsets[doc]
    prefix = sizes - np.ceil(THRESHOLD * sizes - 1e-9).astype(np.int64) + 1
    in_prefix = by_rank[pos < prefix[doc]]
    tok, who = token_rank[in_prefix], doc[in_prefix]
    order = np.lexsort((who, tok))
    tok, who = tok[order], who[order]
    shared = np.zeros(len(tok), dtype=bool)  # tokens in two or more prefixes
    shared[1:] |= tok[1:] == tok[:-1]
    shared[:-1] |= tok[:-1] == tok[1:]
    tok, who = tok[shared], who[shared]
    candidates = set()
    for group in np.split(who, np.flatnonzero(np.diff(tok)) + 1) if len(tok) else []:
        g = group.tolist()
        candidates.update((a, b) for k, a in enumerate(g) for b in g[k + 1 :])
    parent = list(range(len(texts)))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in candidates:
        sa, sb = int(sizes[a]), int(sizes[b])
        if min(sa, sb) < THRESHOLD * max(sa, sb) or sa == 0:
            continue
        common = len(
            np.intersect1d(values[offsets[a] : offsets[a + 1]], values[offsets[b] : offsets[b + 1]], assume_unique=True)
        )
        if common >= THRESHOLD * (sa + sb - common):
            ra, rb = find(a), find(b)
            parent[max(ra, rb)] = min(ra, rb)
    comps: dict[int, set[str]] = {}
    for x in range(len(texts)):
        comps.setdefault(find(x), set()).add(ids[x])
    return [c for c in comps.values() if len(c) > 1]


def truth_components(folder: Path, groups: dict[str, list[str]] | None) -> list[set[str]]:
    """Connected components (size >= 2) of the pairs with exact Jaccard >= THRESHOLD."""
    rows = {r["id"]: r["text"] for r in _read_jsonl(folder)}
    if groups is None:  # all pairs sharing a shingle (small corpora)
        candidates = [list(rows)]
    else:  # generated corpus: random 5-grams over 50k words never collide across groups
        candidates = list(groups.values())
    parent: dict[str, str] = {}

    def find(x):
        while parent.get(x, x) != x:
            x = parent[x]
        return x

    for ids in candidates:
        sets = dict(zip(ids, _shingle_sets([rows[i] for i in ids])))
        index: dict[tuple, list[str]] = {}
        for i, s in sets.items():
            for g in s:
                index.setdefault(g, []).append(i)
        pairs = {(a, b) for docs in index.values() for k, a in enumerate(docs) for b in docs[k + 1 :]}
        for a, b in pairs:
            sa, sb = sets[a], sets[b]
            if len(sa & sb) >= THRESHOLD * len(sa | sb):
                ra, rb = find(a), find(b)
                if ra != rb:
                    parent[max(ra, rb)] = min(ra, rb)
    comps: dict[str, set[str]] = {}
    for x in list(parent):
        comps.setdefault(find(x), set()).add(x)
    for root, members in comps.items():
        members.add(root)
    return [c for c in comps.values() if len(c) > 1]


def score(removed: set[str], comps: list[set[str]]) -> tuple[float, float]:
    """Cluster-wise precision and recall: a cluster of k documents should lose exactly k - 1."""
    tp = sum(min(len(removed & c), len(c) - 1) for c in comps)
    should = sum(len(c) - 1 for c in comps)
    return tp / max(len(removed), 1), tp / max(should, 1)


# -- the systems (each runs in its own subprocess) --------------------------------------------
def run_winnow(data: Path, work: Path) -> set[str]:
    # curate before polars, as the winnow command imports them: curate sets polars' allocator options (curate/__init__.py)
    import polars as pl

    from winnow.curate.pipeline import run_job
    from winnow.pipelines.jobfile import load_job

    job_file = work / "job.toml"
    job_file.write_text(
        f'[job]\nname = "bench"\noutput = "{work / "out"}"\nworkers = {WORKERS}\n\n[[inputs]]\nsource = "bench"\npath = "{data}/*.jsonl"\n\n'
        f'[[stages]]\nkind = "dedup.minhash"\nthreshold = {THRESHOLD}\nngram = {NGRAM}\nnum_perm = {NUM_PERM}\n\n[output]\nformats = ["parquet"]\n'
    )
    run_job(load_job(job_file), progress=False)
    rejects = sorted((work / "out" / "rejects").glob("*.parquet"))
    return set(pl.read_parquet(rejects)["id"].to_list()) if rejects else set()


def run_datasketch(data: Path, work: Path) -> set[str]:
    import re

    import polars as pl
    from datasketch import MinHash, MinHashLSH

    lsh = MinHashLSH(threshold=THRESHOLD, num_perm=NUM_PERM)
    splitter = re.compile(r"[\W_]+")
    removed, kept = set(), []
    for row in _read_jsonl(data):
        words = splitter.split(row["text"].lower())
        words = [w for w in words if w]
        if not words:
            kept.append(row)
            continue
        m = MinHash(num_perm=NUM_PERM)
        m.update_batch([" ".join(words[i : i + NGRAM]).encode() for i in range(max(len(words) - NGRAM + 1, 1))])
        if lsh.query(m):  # a near-duplicate of a document already kept
            removed.add(row["id"])
        else:
            lsh.insert(row["id"], m)
            kept.append(row)
    pl.DataFrame(kept).write_parquet(work / "kept.parquet")
    return removed


def _xxhash64_text(text: str | bytes) -> int:
    return xxhash.xxh64_intdigest(text.encode() if isinstance(text, str) else text)


def _xxhash32_text(text: str | bytes) -> int:
    return xxhash.xxh32_intdigest(text.encode() if isinstance(text, str) else text)


def _patch_datatrove_xxhash() -> None:
    """datatrove 0.10.1 hands ``str`` to xxhash, which (xxhash >= 3.5) only takes bytes: encode first, as xxhash < 3.5 did itself.

    The workers are forked (``start_method="fork"``) so they inherit this patch; under datatrove's
    default forkserver they would re-import the unpatched module.
    """
    from datatrove.utils.hashes import xxhash as dt_xxhash

    dt_xxhash.xxhash64 = _xxhash64_text
    dt_xxhash.xxhash32 = _xxhash32_text


def run_datatrove(data: Path, work: Path) -> set[str]:
    from datasketch.lsh import _optimal_param
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )  # fmt: skip
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter
    from datatrove.utils.text import TextNormConfig

    _patch_datatrove_xxhash()
    bands, rows = _optimal_param(THRESHOLD, NUM_PERM, 0.5, 0.5)
    # norm_numbers off: the generated vocabulary is w0..w49999, which datatrove's default number
    # normalization maps to five words (every document then looks like every other); winnow's
    # "words" normalization and the exact-Jaccard truth keep digits too.
    norm = TextNormConfig(norm_numbers=False)
    config = MinhashConfig(n_grams=NGRAM, num_buckets=bands, hashes_per_bucket=rows, norm_config=norm)
    tasks = len(list(data.glob("*.jsonl")))
    logs = str(work / "logs")

    def run(steps: list, n_tasks: int, stage: int) -> None:
        LocalPipelineExecutor(
            steps, tasks=n_tasks, workers=WORKERS, logging_dir=f"{logs}/{stage}", start_method="fork"
        ).run()

    # The four steps of datatrove's MinHash dedup, each a full executor run as its docs show.
    run(
        [JsonlReader(str(data), glob_pattern="*.jsonl"), MinhashDedupSignature(str(work / "sigs"), config=config)],
        tasks,
        1,
    )
    run([MinhashDedupBuckets(str(work / "sigs"), str(work / "buckets"), config=config)], bands, 2)
    run([MinhashDedupCluster(str(work / "buckets"), str(work / "remove"), config=config)], 1, 3)
    removed_writer = JsonlWriter(str(work / "removed"))
    run(
        [
            JsonlReader(str(data), glob_pattern="*.jsonl"),
            MinhashDedupFilter(str(work / "remove"), exclusion_writer=removed_writer),
            JsonlWriter(str(work / "kept")),
        ],
        tasks,
        4,
    )
    removed = set()
    for path in (work / "removed").glob("*.jsonl.gz"):
        removed |= {orjson.loads(line)["id"] for line in gzip.decompress(path.read_bytes()).splitlines()}
    return removed


SYSTEMS = {"winnow": run_winnow, "datasketch": run_datasketch, "datatrove": run_datatrove}


def child(system: str, data: Path, work: Path) -> None:
    """Run one system and print its measurements as JSON (the last line of stdout)."""
    t0 = time.perf_counter()
    removed = SYSTEMS[system](data, work)
    seconds = time.perf_counter() - t0
    # VmHWM, not ru_maxrss: the latter survives exec and would report the parent bench's own peak.
    hwm = next(
        int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM")
    )
    worker = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    (work / "removed.json").write_text(json.dumps(sorted(removed)))
    # Worker pools: the parent plus every worker at the largest worker's peak (an upper bound of the sum).
    print(
        json.dumps(
            {
                "seconds": seconds,
                "peak_rss": (hwm + WORKERS * worker) * 1024,
                "main_rss": hwm * 1024,
                "worker_rss": worker * 1024,
            }
        )
    )


class _TreeRss(threading.Thread):
    """Samples the summed RSS of a process and all its descendants every 20 ms; ``peak`` is the largest sum seen.

    ``peak_anon`` is the largest sum of their private (anonymous) pages: RSS also counts the
    shared libraries' pages each process has mapped, and how many of those are mapped depends on
    the page cache, not on the run (Linux 6.18 maps a library's cached large folios whole; the
    long bench's winnow run measured 335-363 MB or 390-404 MB with the same code and 172-178 MB
    of private memory, depending on how the libraries had been read into the cache).
    """

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.peak_anon, self.stop = pid, 0, 0, threading.Event()
        self.children = Path(f"/proc/{pid}/task/{pid}/children").exists()  # the kernel lists each thread's children

    def _tree_rss(self) -> tuple[int, int]:
        """The tree's summed RSS and private RSS. Where the kernel lists children, only the tree's own ``/proc``
        entries are read (a fraction of a millisecond a sample); else every process's (several milliseconds of
        CPU a sample: on 2 cores, CPU a multi-worker run under test would otherwise have)."""
        if not self.children:
            return self._tree_rss_scan()
        total = anon = 0
        frontier = [self.pid]
        while frontier:
            pid = frontier.pop()
            try:
                resident, shared = (int(x) for x in Path(f"/proc/{pid}/statm").read_text().split()[1:3])
                for task in os.listdir(f"/proc/{pid}/task"):
                    frontier += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
            except (OSError, ValueError):
                continue
            total, anon = total + resident * 4096, anon + (resident - shared) * 4096
        return total, anon

    def _tree_rss_scan(self) -> tuple[int, int]:
        parents: dict[int, int] = {}
        rss: dict[int, tuple[int, int]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                fields = stat[stat.rindex(")") + 2 :].split()
                resident, shared = (int(x) for x in (entry / "statm").read_text().split()[1:3])
                parents[int(entry.name)], rss[int(entry.name)] = (
                    int(fields[1]),
                    (resident * 4096, (resident - shared) * 4096),
                )
            except (OSError, ValueError, IndexError):
                continue
        tree, frontier = {self.pid}, [self.pid]
        while frontier:
            frontier = [p for p, parent in parents.items() if parent in frontier and p not in tree]
            tree.update(frontier)
        found = [rss[p] for p in tree if p in rss]
        return sum(r for r, _ in found), sum(a for _, a in found)

    def run(self) -> None:
        while not self.stop.wait(0.02):
            total, anon = self._tree_rss()
            self.peak, self.peak_anon = max(self.peak, total), max(self.peak_anon, anon)


@functools.cache
def installed_bytecode() -> None:
    """Write winnow's bytecode (``__pycache__/*.pyc``) before a timed run, as an installed winnow has it.

    ``pip install`` writes it; an editable install writes it on the first import, but not where
    ``PYTHONDONTWRITEBYTECODE`` is set, and there every run would compile winnow's modules from
    source (~0.1 s per process, which no user's second run pays). ``compileall`` writes it either way.
    """
    import compileall

    for package in ("curate", "pipelines", "train"):
        compileall.compile_dir(ROOT / package, quiet=1)


def run_sampled(cmd: list[str], label: str, **popen) -> tuple[float, _TreeRss, str]:
    """Run ``cmd`` while sampling its process tree's RSS: ``(wall seconds, the sampler, stdout)``; exits with its stderr on failure."""
    installed_bytecode()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, **popen)
    sampler = _TreeRss(proc.pid)
    sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    sampler.stop.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"{label} failed:\n{err[-3000:]}")
    return wall, sampler, out


def measure(system: str, data: Path, comps: list[set[str]]) -> dict:
    """Run ``system`` on ``data`` in a fresh subprocess: docs/s over its wall time, peak RSS, precision, recall."""
    n_docs = sum(1 for _ in _read_jsonl(data))
    work = DATA / "work" / system
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    wall, sampler, out = run_sampled(
        [sys.executable, __file__, "--child", system, "--data", str(data), "--work", str(work)], system
    )
    stats = json.loads(out.strip().splitlines()[-1])
    precision, recall = score(set(json.loads((work / "removed.json").read_text())), comps)
    return {"system": system, "docs": n_docs, "docs_per_s": n_docs / wall, "wall_s": wall, "peak_rss_mb": stats["peak_rss"] / 2**20,
            "tree_mb": sampler.peak / 2**20, "anon_mb": sampler.peak_anon / 2**20, "main_mb": stats["main_rss"] / 2**20, "worker_mb": stats["worker_rss"] / 2**20,
            "rss_kb_per_doc": stats["peak_rss"] / 1024 / n_docs, "precision": precision, "recall": recall}  # fmt: skip


def subsample(data: Path, groups: dict[str, list[str]] | None, n_docs: int, files: int = 4) -> tuple[Path, dict | None]:
    """The first ``n_docs`` documents of ``data`` in ``files`` files (so every system gets that many tasks)."""
    folder = data / f"first-{n_docs}"
    rows = []
    for row in _read_jsonl(data):
        if len(rows) == n_docs:
            break
        rows.append(row)
    if not folder.exists():
        tmp = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        _write_jsonl(tmp, [r["id"] for r in rows], [r["text"] for r in rows], -(-len(rows) // files))
        tmp.rename(folder)
    if groups is None:
        return folder, None
    kept = {r["id"] for r in rows}
    return folder, {g: [i for i in ids if i in kept] for g, ids in groups.items()}


def _load(args) -> tuple[Path, dict | None]:
    data = DATA / ("samples" if args.samples else "long" if args.long else f"gen-{args.docs}")
    if not data.exists():
        print(f"writing corpus to {data} ...", flush=True)
        if args.samples:
            prepare_samples(data)
        elif args.long:
            prepare_long(data)
        else:
            groups = generate(args.docs, data)
            (data / "groups.json").write_text(json.dumps(groups))
            return data, groups
    return data, None if args.samples or args.long else json.loads((data / "groups.json").read_text())


def _truth(data: Path, groups: dict | None, exact: bool) -> list[set[str]]:
    """Ground-truth clusters, cached beside the corpus (the all-pairs check takes ~40 s on the long corpus)."""
    cache = data / "truth.json"
    if cache.exists():
        return [set(c) for c in json.loads(cache.read_text())]
    if exact:
        rows = list(_read_jsonl(data))
        comps = exact_components([r["id"] for r in rows], [r["text"] for r in rows])
    else:
        comps = truth_components(data, groups)
    cache.write_text(json.dumps([sorted(c) for c in comps]))
    return comps


def _row(r: dict) -> str:
    return (f"{r['system']:<11} {r['docs']:>9} {r['docs_per_s']:>10.0f} {r['wall_s']:>8.1f} {r['tree_mb']:>8.0f} {r['anon_mb']:>8.0f} {r['peak_rss_mb']:>9.0f} "
            f"{r['main_mb']:>8.0f} {r['worker_mb']:>8.0f} {r['rss_kb_per_doc']:>8.2f} {r['precision']:>9.4f} {r['recall']:>7.4f}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--docs", type=int, default=200_000, help="generated corpus size winnow runs on (1000000 for a 1M-document run)"
    )
    ap.add_argument(
        "--peer-docs",
        type=int,
        default=20_000,
        help="peers (and winnow, for a like-for-like ratio) also run on the first this many docs",
    )
    ap.add_argument("--samples", action="store_true", help="use data_samples/ (every system on all of it)")
    ap.add_argument(
        "--long",
        action="store_true",
        help="long real documents from this machine (prepare_long; every system on all of it)",
    )
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--systems", default="winnow,datasketch,datatrove")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.child:
        return child(args.child, args.data, args.work)

    data, groups = _load(args)
    full = (data, _truth(data, groups, exact=args.samples or args.long))
    small = full
    if not args.samples and not args.long and args.peer_docs < args.docs:
        sub, sub_groups = subsample(data, groups, args.peer_docs)
        small = (sub, truth_components(sub, sub_groups))
    systems = args.systems.split(",")
    peers = [s for s in systems if s != "winnow"]
    for name, (folder, comps) in {"full": full, "subsample": small}.items():
        n = sum(1 for _ in _read_jsonl(folder))
        print(
            f"{name}: {n} documents in {folder.relative_to(ROOT)}, {sum(len(c) - 1 for c in comps)} to remove by exact Jaccard >= {THRESHOLD}"
        )
    if "winnow" in systems:
        # numba compiles winnow's kernels once per machine (cached under __pycache__): a first run after
        # an install or an edit pays ~10-60 s for it. The timed runs are the ones after that.
        tiny, _ = subsample(full[0], None, 200, files=2)
        warm = measure("winnow", tiny, [])
        print(
            f"winnow warm-up on 200 documents (compiles the kernels if the numba cache is cold): {warm['wall_s']:.1f} s"
        )
    print("machine shared with other work: rows interleave the systems A B C A B C; compare ratios within a round\n")
    print(
        "tree MB = the largest sum of RSS over the process tree (sampled every 20 ms); anon MB = the same for private pages only "
        "(RSS less the shared libraries' mapped pages, which vary with the page cache); bound MB = main + workers x largest worker"
    )
    print(
        f"{'system':<11} {'docs':>9} {'docs/s':>10} {'wall s':>8} {'tree MB':>8} {'anon MB':>8} {'bound MB':>9} {'main MB':>8} {'wrk MB':>8} {'KB/doc':>8} {'precision':>9} {'recall':>7}"
    )
    rounds = []
    for _ in range(args.reps):
        rnd = {}
        if "winnow" in systems and small is not full:
            rnd["winnow@full"] = measure("winnow", *full)
            print(_row(rnd["winnow@full"]), flush=True)
        for system in systems:
            rnd[system] = measure(system, *small)
            print(_row(rnd[system]), flush=True)
        rounds.append(rnd)
    if "winnow" not in systems:
        return
    print()
    for peer in peers:
        same = [r["winnow"]["docs_per_s"] / r[peer]["docs_per_s"] for r in rounds]
        print(
            f"winnow / {peer} docs/s, same {rounds[0][peer]['docs']} docs: "
            + ", ".join(f"{x:.1f}x" for x in same)
            + f" (median {np.median(same):.1f}x)"
        )
        if small is not full:
            big = [r["winnow@full"]["docs_per_s"] / r[peer]["docs_per_s"] for r in rounds]
            print(f"winnow at {rounds[0]['winnow@full']['docs']} docs / {peer} at {rounds[0][peer]['docs']} docs (peer's docs/s extrapolated as constant): "
                  + ", ".join(f"{x:.1f}x" for x in big) + f" (median {np.median(big):.1f}x)")  # fmt: skip
    if small is not full:
        # The main process's growth is what grows with the corpus; a worker's peak follows the
        # size of one task (one input file), which the subsample's smaller files also shrink.
        for key, what in (("main_mb", "main process"), ("peak_rss_mb", "main + workers")):
            grow = [
                (r["winnow@full"][key] - r["winnow"][key]) * 1024 / (r["winnow@full"]["docs"] - r["winnow"]["docs"])
                for r in rounds
            ]
            print(
                f"winnow peak memory growth per extra document, {what} (KB/doc, full vs subsample): "
                + ", ".join(f"{x:.3f}" for x in grow)
            )


if __name__ == "__main__":
    main()
