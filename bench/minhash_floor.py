"""MinHash against the kernel floor: winnow's signature + LSH against rensa's and datasketch's on the same shingles,
and the dedup job end to end against a rensa pipeline (precision and recall against exact Jaccard, peak memory).

    pip install rensa                     # the peer, for this benchmark only
    python bench/minhash_floor.py         # the corpus of bench/floor.py, 1 and 2 workers, 2 rounds
    python bench/minhash_floor.py --workers 2 --rounds 3 --datasketch-docs 500

Kernel (one thread each, one process, A B A B): winnow's ``dedup.minhash`` collect step
(text -> word 5-gram shingles -> 128-slot signature -> LSH band keys, plus the shingle sets and
signature bytes it spills for the exact check) and its LSH candidate pairs, against rensa's
``RMinHash.digest_matrix_from_flat_token_hashes`` + ``RMinHashLSH.insert_matrix_and_query_duplicate_flags``
on winnow's own 64-bit shingle hashes (so rensa does no shingling: winnow's time includes it), and
datasketch's ``MinHash.bulk`` + ``MinHashLSH`` on the same hashes (a subsample: it is ~100x slower). winnow's
phase is timed twice: from text (its shingling included, as the stage runs it) and from the same ready
hashes rensa gets (its signature, band keys, spilled sets and LSH pairs, with the stage's own kernels).

End to end (each run a fresh process, peak RSS of its process tree sampled every 20 ms; winnow's bytecode is
written first, as an installed winnow has it): winnow's
job as a user runs it (``winnow curate job.toml``: JSONL in; ``dedup.minhash`` with its defaults at
threshold 0.8; Parquet + WebDataset out) with 1 and 2 workers, against the pipeline a rensa user
writes (JSON load, Python word 5-gram shingles of the normalized words, ``RMinHash.from_token_sets``,
``RMinHashLSH`` keep-first with a check of the estimated Jaccard similarity, Parquet out) in one process. Precision and recall:
removed documents against the clusters of exact Jaccard >= 0.8 (``bench/dedup.py``'s all-pairs
ground truth, cached beside the corpus). The job's floor: the same job without its stage (reading
the JSONL, writing the shards and the manifest), the time no dedup stage in that job can go below; the
rensa pipeline's time over it is the most any such job can reach against the pipeline.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import floor_corpus  # noqa: E402

DATA = ROOT / "bench" / "_data" / "floor"
THRESHOLD, NGRAM, NUM_PERM, RENSA_BANDS = 0.8, 5, 128, 32


@functools.cache
def _flat_shingles():
    """The compiled loop of ``shingle_hashes``, built once per process."""
    from winnow.curate.dedup.jit import njit
    from winnow.curate.dedup.kernels import doc_shingles

    @njit(nogil=True)
    def flat(offsets, data, alt_rows, alt_offsets, alt_data, sep, low):
        n = len(offsets) - 1
        longest = 0
        for i in range(n):
            longest = max(longest, offsets[i + 1] - offsets[i], alt_offsets[i + 1] - alt_offsets[i])
        buf = np.empty(longest // 2 + 3, dtype=np.uint64)
        starts = np.empty(0, dtype=np.int64)
        out = np.empty(len(data) // 2 + len(alt_data) // 2 + n, dtype=np.uint64)  # at most a word per two bytes
        rows = np.zeros(n + 1, dtype=np.int64)
        for i in range(n):
            if alt_rows[i]:
                k = doc_shingles(alt_data, alt_offsets[i], alt_offsets[i + 1], NGRAM, False, sep, low, buf, starts)
            else:
                k = doc_shingles(data, offsets[i], offsets[i + 1], NGRAM, False, sep, low, buf, starts)
            out[rows[i] : rows[i] + k] = buf[:k]
            rows[i + 1] = rows[i] + k
        return rows, out[: rows[n]]

    return flat


@functools.cache
def _sketch_from_hashes():
    """``dedup.minhash``'s per-document work after shingling, on ready shingle hashes: the signature, its low
    bytes, the band keys and the spilled set, with winnow's own kernels (``sketch_block`` without its shingling)."""
    from winnow.curate.dedup.jit import njit
    from winnow.curate.dedup.signatures import _band_keys, _grown, _signature, _spill

    @njit(nogil=True)
    def sketch(offsets, hashes, a, b, rows, bands):
        n, k = len(offsets) - 1, a.shape[0]
        sig, filled = np.empty(k, dtype=np.uint64), np.empty(k, dtype=np.bool_)
        sig8 = np.empty((n, k), dtype=np.uint8)
        keys = np.empty((n, bands), dtype=np.uint64)
        set_values = np.empty(len(hashes) // 2 + 1, dtype=np.uint32)
        cursor = 0
        for i in range(n):
            count = offsets[i + 1] - offsets[i]
            buf = hashes[offsets[i] : offsets[i + 1]]
            _signature(buf, count, a, b, True, sig, filled)
            for p in range(k):
                sig8[i, p] = np.uint8(sig[p] & np.uint64(0xFF))
            _band_keys(sig, rows, bands, b[0], keys[i])
            if count > 0:
                if cursor + count > set_values.shape[0]:
                    set_values = _grown(set_values, cursor + count)
                cursor = _spill(buf, count, set_values, cursor)
        return keys, sig8, set_values[:cursor]

    return sketch


def winnow_from_hashes(offsets: np.ndarray, hashes: np.ndarray) -> tuple[float, int]:
    """Seconds of ``dedup.minhash``'s signature (its default one-permutation scheme), band keys, spilled sets and
    LSH candidate pairs from ready shingle hashes, as rensa gets them; the candidate count."""
    import polars as pl

    from winnow.curate.dedup.lsh import lsh_pairs
    from winnow.curate.dedup.minhash import MinHashConfig, band_columns
    from winnow.curate.dedup.signatures import slot_params

    config = MinHashConfig(threshold=THRESHOLD)
    bands, rows = config.lsh_shape()
    a, b = slot_params(config.num_perm, config.seed)
    t0 = time.perf_counter()
    keys, _, _ = _sketch_from_hashes()(offsets, hashes, a, b, rows, bands)
    frame = pl.DataFrame({c: keys[:, i] for i, c in enumerate(band_columns(bands))})
    usable = np.diff(offsets) > 0
    pairs = lsh_pairs(frame.lazy(), band_columns(bands), np.arange(len(offsets) - 1, dtype=np.uint32), usable)
    return time.perf_counter() - t0, len(pairs)


def shingle_hashes(texts) -> tuple[np.ndarray, np.ndarray]:
    """winnow's 64-bit word 5-gram shingle hashes of ``texts``: ``(offsets int64[n+1], hashes uint64)``."""
    from winnow.curate.dedup.text import word_buffers

    offsets, data, (sep, low), alt = word_buffers(texts, "words")
    return _flat_shingles()(offsets, data, *alt, sep, low)


def winnow_phase(texts) -> tuple[float, int]:
    """Seconds of ``dedup.minhash``'s collect kernel and LSH candidate pairs over ``texts``; the candidate count."""
    from winnow.curate.dedup.lsh import lsh_pairs
    from winnow.curate.dedup.minhash import MinHashConfig, band_columns, minhash_keys

    config = MinHashConfig(threshold=THRESHOLD)
    t0 = time.perf_counter()
    keys = minhash_keys(texts, config, with_sets=True)
    usable = keys["_nsh"].to_numpy() > 0
    pairs = lsh_pairs(keys.lazy(), band_columns(config.lsh_shape()[0]), np.arange(len(texts), dtype=np.uint32), usable)
    return time.perf_counter() - t0, len(pairs)


def rensa_phase(offsets: np.ndarray, hashes: np.ndarray) -> tuple[float, int]:
    from rensa import RMinHash, RMinHashLSH

    t0 = time.perf_counter()
    matrix = RMinHash.digest_matrix_from_flat_token_hashes(hashes, offsets, NUM_PERM, 42)
    flags = RMinHashLSH(
        threshold=THRESHOLD, num_perm=NUM_PERM, num_bands=RENSA_BANDS
    ).insert_matrix_and_query_duplicate_flags(matrix)
    return time.perf_counter() - t0, int(sum(flags))


def datasketch_phase(offsets: np.ndarray, hashes: np.ndarray, n_docs: int) -> float:
    from datasketch import MinHash, MinHashLSH
    from datasketch.lsh import _optimal_param

    sets = [hashes[offsets[i] : offsets[i + 1]].tobytes() for i in range(n_docs)]
    sets = [[s[j : j + 8] for j in range(0, len(s), 8)] for s in sets]
    t0 = time.perf_counter()
    sketches = MinHash.bulk(sets, num_perm=NUM_PERM)
    lsh = MinHashLSH(threshold=THRESHOLD, num_perm=NUM_PERM, params=_optimal_param(THRESHOLD, NUM_PERM, 0.5, 0.5))
    for i, m in enumerate(sketches):
        lsh.query(m)
        lsh.insert(i, m)
    return time.perf_counter() - t0


def kernel_section(corpus: Path, rounds: int, datasketch_docs: int) -> None:
    os.environ.setdefault("RAYON_NUM_THREADS", "1")  # rensa: one core, as winnow's kernel here
    frame = floor_corpus.texts(corpus)
    texts = frame["text"]
    mb = texts.str.len_bytes().sum() / 1e6
    winnow_phase(texts.head(50))  # compiled kernels loaded
    offsets, hashes = shingle_hashes(texts)
    t0 = time.perf_counter()
    shingle_hashes(texts)
    t_shingles = time.perf_counter() - t0
    rensa_phase(offsets[:51], hashes[: offsets[50]])  # loaded and warm
    print(
        f"\n== minhash kernel: {len(texts)} documents, {mb:.1f} MB, {len(hashes)} shingles; one thread each, A B A B =="
    )
    print(
        f"  (winnow's word 5-gram shingling alone, text -> 64-bit hashes: {t_shingles:.2f} s; rensa gets those hashes)"
    )
    winnow_from_hashes(offsets[:51], hashes[: offsets[50]])  # compiled
    pairs, same = [], []
    for r in range(rounds):
        order = ("winnow", "hashes", "rensa") if r % 2 == 0 else ("rensa", "hashes", "winnow")
        phases = {"winnow": lambda: winnow_phase(texts), "hashes": lambda: winnow_from_hashes(offsets, hashes),
                  "rensa": lambda: rensa_phase(offsets, hashes)}  # fmt: skip
        res = {name: phases[name]() for name in order}
        pairs.append((res["winnow"][0], res["rensa"][0]))
        same.append((res["hashes"][0], res["rensa"][0]))
        print(f"  round {r + 1}: winnow signature + LSH from text {res['winnow'][0]:.2f} s ({res['winnow'][1]} candidate pairs), "
              f"from the same hashes as rensa {res['hashes'][0]:.2f} s ({res['hashes'][1]} pairs); "
              f"rensa sketch + LSH from hashes {res['rensa'][0]:.2f} s ({res['rensa'][1]} flagged)", flush=True)  # fmt: skip
    print(
        f"  winnow's signature + LSH from the same shingle hashes: {statistics.median(w / r for w, r in same):.2f}x "
        f"rensa's sketch + LSH; from text, its shingling included: {statistics.median(w / r for w, r in pairs):.2f}x "
        "(medians)"
    )
    if datasketch_docs:
        n = min(datasketch_docs, len(texts))
        sub_mb = texts.head(n).str.len_bytes().sum() / 1e6
        seconds = datasketch_phase(offsets, hashes, n)
        w = winnow_phase(texts.head(n))[0]
        print(
            f"  datasketch MinHash.bulk + MinHashLSH on the first {n} documents ({sub_mb:.1f} MB): {seconds:.2f} s, "
            f"winnow {w:.2f} s on the same: winnow {seconds / w:.0f}x faster"
        )


# -- end to end -----------------------------------------------------------------------------
def job_file(corpus: Path, work: Path, workers: int, *, stages: bool = True) -> Path:
    """The dedup job (or the same job without its stage) as the TOML file a user writes."""
    inputs = "".join(f'[[inputs]]\nsource = "{s}"\npath = "{corpus / s}/*.jsonl"\n\n' for s in floor_corpus.SHARES)
    stage = f'[[stages]]\nkind = "dedup.minhash"\nthreshold = {THRESHOLD}\n\n' if stages else ""
    path = work / "job.toml"
    path.write_text(f'[job]\nname = "dedup"\noutput = "{work / "out"}"\nworkers = {workers}\n\n{inputs}{stage}'
                    '[output]\nformats = ["parquet", "webdataset"]\n')  # fmt: skip
    return path


def winnow_removed(work: Path) -> set[str]:
    """The ids a job in ``work`` removed (its rejects)."""
    import polars as pl

    rejects = sorted((work / "out" / "rejects").glob("*.parquet"))
    return set(pl.read_parquet(rejects)["id"].to_list()) if rejects else set()


def run_rensa(corpus: Path, work: Path, workers: int) -> set[str]:
    import re

    import orjson
    import pyarrow as pa
    import pyarrow.parquet as pq
    from rensa import RMinHash, RMinHashLSH

    rows = [orjson.loads(line) for path in sorted(corpus.glob("*/*.jsonl")) for line in path.read_bytes().splitlines()]
    word = re.compile(r"[^\W_]+|_+")  # letters and digits; what winnow's "words" normalization keeps apart
    sets = []
    for row in rows:
        words = word.findall(row["text"].lower())
        sets.append([" ".join(words[i : i + NGRAM]) for i in range(max(len(words) - NGRAM + 1, 1))] if words else [])
    sketches = RMinHash.from_token_sets(sets, NUM_PERM, 42)
    lsh = RMinHashLSH(threshold=THRESHOLD, num_perm=NUM_PERM, num_bands=RENSA_BANDS // 2)
    removed, kept = set(), []
    for i, (row, m) in enumerate(zip(rows, sketches)):
        if sets[i] and any(sketches[j].jaccard(m) >= THRESHOLD for j in lsh.query(m)):
            removed.add(row["id"])
            continue
        if sets[i]:
            lsh.insert(i, m)
        kept.append(row)
    pq.write_table(pa.table({"id": [r["id"] for r in kept], "text": [r["text"] for r in kept]}), work / "kept.parquet")
    return removed


SYSTEMS = {"rensa": run_rensa}


def child(system: str, corpus: Path, work: Path, workers: int) -> None:
    t0 = time.perf_counter()
    removed = SYSTEMS[system](corpus, work, workers)
    (work / "removed.json").write_text(json.dumps(sorted(removed)))
    print(json.dumps({"seconds": time.perf_counter() - t0}))


def measure(system: str, corpus: Path, workers: int, comps: list[set[str]]) -> dict:
    """One fresh process of ``system`` (the winnow command, its floor, or the rensa pipeline of ``SYSTEMS``): wall
    seconds, peak memory, and precision/recall of what it removed."""
    from dedup import run_sampled, score

    work = DATA / "out" / f"dedup-{system}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    if system == "rensa":
        cmd = [sys.executable, __file__, "--child", system, "--corpus", str(corpus), "--work", str(work),
               "--workers", str(workers)]  # fmt: skip
    else:  # the command a user runs: winnow curate job.toml
        job = job_file(corpus, work, workers, stages=system == "winnow")
        cmd = [sys.executable, "-m", "winnow.pipelines.cli", "-q", "curate", str(job)]
    wall, sampler, _ = run_sampled(cmd, system, env={**os.environ, "PYTHONPATH": str(ROOT)})
    removed = json.loads((work / "removed.json").read_text()) if system == "rensa" else winnow_removed(work)
    precision, recall = score(set(removed), comps)
    shutil.rmtree(work, ignore_errors=True)
    return {
        "wall": wall,
        "tree_mb": sampler.peak / 2**20,
        "anon_mb": sampler.peak_anon / 2**20,
        "precision": precision,
        "recall": recall,
    }


def truth(corpus: Path) -> list[set[str]]:
    """Clusters of exact Jaccard >= THRESHOLD (cached beside the corpus)."""
    from dedup import exact_components

    cache = corpus / "truth.json"
    if not cache.exists():
        frame = floor_corpus.texts(corpus)
        comps = exact_components(frame["id"].to_list(), frame["text"].to_list())
        cache.write_text(json.dumps([sorted(c) for c in comps]))
    return [set(c) for c in json.loads(cache.read_text())]


def end_to_end_section(corpus: Path, workers: list[int], rounds: int) -> None:
    comps = truth(corpus)
    print(
        f"\n== dedup end to end: {sum(len(c) - 1 for c in comps)} documents to remove by exact Jaccard >= {THRESHOLD} =="
    )
    print("  tree MB: peak RSS of the process tree; anon MB: its private pages only (RSS less mapped shared libraries)")
    measure("winnow", corpus, max(workers), comps)  # warm-up: the page cache and numba's cache
    for w in workers:
        pairs, floors = [], []
        for r in range(rounds):
            order = ("winnow", "rensa", "floor") if r % 2 == 0 else ("floor", "rensa", "winnow")
            res = {name: measure(name, corpus, w, comps) for name in order}
            pairs.append((res["winnow"]["wall"], res["rensa"]["wall"]))
            floors.append(res["floor"]["wall"])
            for name in order:
                x = res[name]
                labels = {"winnow": f"winnow, {w} worker(s)", "rensa": "rensa pipeline", "floor": "floor (no stage)"}
                label = labels[name]
                quality = "" if name == "floor" else f"  precision {x['precision']:.4f}  recall {x['recall']:.4f}"
                print(f"  {label:<22} {x['wall']:6.1f} s  tree {x['tree_mb']:6.0f} MB  anon {x['anon_mb']:6.0f} MB"
                      f"{quality}", flush=True)  # fmt: skip
        print(
            f"  winnow with {w} worker(s): {statistics.median(r / w_ for w_, r in pairs):.2f}x the rensa pipeline's speed (median)"
        )
        rensa, floor = statistics.median(r for _, r in pairs), statistics.median(floors)
        print(
            f"  the job's floor (the same job without its stage: read JSONL, write Parquet + WebDataset) {floor:.2f} s: "
            f"{rensa / floor:.2f}x the rensa pipeline's speed is the most any dedup stage in this job can reach"
        )


def section(corpus: Path, workers: list[int], rounds: int, datasketch_docs: int = 1000) -> None:
    kernel_section(corpus, rounds, datasketch_docs)
    end_to_end_section(corpus, workers, rounds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--mb", type=float, default=85.0)
    ap.add_argument(
        "--datasketch-docs",
        type=int,
        default=1000,
        help="datasketch runs on the first this many documents (0: not at all)",
    )
    ap.add_argument("--sections", default="kernel,end-to-end")
    ap.add_argument("--child")
    ap.add_argument("--corpus", type=Path)
    ap.add_argument("--work", type=Path)
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.corpus, args.work, int(args.workers))
    from floor import machine

    print(machine())
    corpus = floor_corpus.ensure(DATA, args.mb)
    if "kernel" in args.sections:
        kernel_section(corpus, args.rounds, args.datasketch_docs)
    if "end-to-end" in args.sections:
        end_to_end_section(corpus, [int(w) for w in args.workers.split(",")], args.rounds)


if __name__ == "__main__":
    main()
