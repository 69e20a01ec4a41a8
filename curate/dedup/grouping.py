"""``dedup.minhash``'s global phase in bounded memory: band runs -> candidate pairs -> verified edges -> components.

Layout under the stage's plan folder (``ctx.plan_dir / "minhash"``), every step reading the
previous step's files one partition at a time:

1. ``candidates/band-BBB-part-PPPPP.parquet`` (``pair`` u64 = ``a << 32 | b``): band ``B``'s
   documents whose key falls in partition ``P`` (``key % parts``) are sorted by key and each
   run of equal keys is linked as a star plus a chain (``curate.dedup.lsh``). Bands are
   independent and equal keys share a partition, so the pairs do not depend on ``parts``.
2. ``edges/bucket-QQQQQ.parquet`` (``a``, ``b`` u32): the candidates with ``a % buckets == Q``
   (split into one file per bucket in one pass over step 1's files), made unique, screened by
   their 8-bit signature estimate and checked by exact Jaccard on the spilled shingle sets
   (``curate.dedup.verify``). Each bucket gets the values of its documents from
   ``curate.dedup.routing``, which reads each spilled column once for all the buckets, so the
   step's reading does not grow with the number of buckets.
3. ``curate.dedup.components``: large-star / small-star over those edges, in partitions by node.

How many partitions each step takes comes from ``[job] memory_gb`` and the data (``curate.dedup.budget``).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from winnow.curate.dedup.budget import BAND_BYTES, EDGE_BYTES, GB, PAIR_BYTES, check_fits, partitions
from winnow.curate.dedup.clusters import connected_components, pair_jaccard
from winnow.curate.dedup.components import _mix, components
from winnow.curate.dedup.lsh import _run_pairs, lsh_pairs, unpack_pairs
from winnow.curate.dedup.routing import Router
from winnow.curate.dedup.verify import (
    SETS_COLUMN,
    SIG8_COLUMN,
    pair_similarities,
    read_sets,
    screen_margin,
    screen_pairs,
    sig8_similarity,
    sort_unique_into,
)

log = logging.getLogger(__name__)

WINDOW_BYTES = 8 << 20


@dataclass(frozen=True, slots=True)
class GroupOptions:
    """What ``group`` takes of its stage and the job."""

    verify: str  # "all", "sample" or "none": which candidate pairs get the exact check
    threshold: float
    chunk_pairs: int  # pairs checked at a time
    sample: int  # verify = "sample": pairs checked
    seed: int
    memory_gb: float  # [job] memory_gb
    stage: str  # the stage's id, for messages
    workers: int = 1  # [job] workers: threads the plan may use in memory


@dataclass(slots=True)
class Grouped:
    """What the grouping found: each clustered row's component label, and the counts for the report."""

    labels: pl.DataFrame  # _row (UInt32), _cluster (UInt32): the rows in a cluster of two or more
    stats: dict


def candidate_files(
    keys: pl.LazyFrame, columns: list[str], parts: int, folder: Path, *, bands_per_pass: int = 1
) -> tuple[list[str], int]:
    """Step 1: each band's candidate pairs, ``parts`` key partitions at a time; returns the files and their pair count.

    With one partition, ``bands_per_pass`` bands are read in one scan of the keys (as many as the
    budget holds: a small job reads its 25 band columns once instead of 25 times); the pairs of
    each band are the same either way.
    """
    folder.mkdir(parents=True)
    files, total = [], 0

    def emit(j: int, part: int, band: pl.DataFrame, column: str) -> None:
        nonlocal total
        pairs = np.unique(_run_pairs(band[column].to_numpy(), band["_row"].to_numpy()))
        if len(pairs):
            path = folder / f"band-{j:03d}-part-{part:05d}.parquet"
            pl.DataFrame({"pair": pairs}).write_parquet(path, compression="lz4")
            files.append(str(path))
            total += len(pairs)

    if parts == 1:
        per = max(1, bands_per_pass)
        for lo in range(0, len(columns), per):
            chosen = columns[lo : lo + per]
            frame = keys.select("_nsh", *chosen).with_row_index("_row").filter(pl.col("_nsh") > 0).collect()
            for j, column in enumerate(chosen, start=lo):
                emit(j, 0, frame.select(column, "_row").sort(column, "_row"), column)
            del frame
        return files, total
    for j, column in enumerate(columns):
        scan = keys.select("_nsh", column).with_row_index("_row").filter(pl.col("_nsh") > 0)
        for part in range(parts):
            chunk = scan.filter(pl.col(column) % parts == part)
            emit(j, part, chunk.select(column, "_row").sort(column, "_row").collect(), column)
    return files, total


def split_pairs(candidates: list[str], buckets: int, folder: Path) -> list[Path]:
    """Step 2a: every candidate file's pairs appended to the file of their bucket (``a % buckets``), in one pass."""
    folder.mkdir(parents=True)
    paths = [folder / f"bucket-{q:05d}.u64" for q in range(buckets)]
    for file in candidates:
        pairs = pl.read_parquet(file, glob=False)["pair"].to_numpy()
        owner = (pairs >> np.uint64(32)) % np.uint64(buckets)
        order = np.argsort(owner, kind="stable")
        pairs, owner = pairs[order], owner[order]
        cuts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1], True])
        for s, e in zip(cuts[:-1], cuts[1:]):
            with open(paths[int(owner[s])], "ab") as fh:
                pairs[s:e].tofile(fh)
    return paths


def _read_pairs(path: Path) -> np.ndarray:
    return np.fromfile(path, dtype=np.uint64) if path.exists() else np.zeros(0, dtype=np.uint64)


def _write_pairs(path: Path, pairs: np.ndarray) -> None:
    path.unlink(missing_ok=True)
    if len(pairs):
        pairs.tofile(path)


def _docs(pairs: np.ndarray) -> np.ndarray:
    return np.unique(np.concatenate(unpack_pairs(pairs)))


def screen_buckets(
    keys: pl.LazyFrame, paths: list[Path], *, threshold: float, window_rows: int, memory_gb: float, folder: Path
) -> tuple[int, int]:
    """Step 2b: each bucket's pairs whose 8-bit signature estimate is within ``screen_margin``; returns (kept, passes over the spill)."""
    if SIG8_COLUMN not in keys.collect_schema().names():  # a spill without signature bytes: every pair goes on
        return sum(len(_read_pairs(p)) for p in paths), 0
    router = Router(folder, len(paths))
    for q, path in enumerate(paths):
        router.need(q, _docs(_read_pairs(path)))
    passes = router.route(keys, SIG8_COLUMN, window_rows=window_rows, memory_gb=memory_gb)
    kept = 0
    for q, path in enumerate(paths):
        pairs, routed = _read_pairs(path), router.read(q)
        if len(pairs):
            k = int(routed.offsets[1] - routed.offsets[0])
            a, b = unpack_pairs(pairs)
            estimate = sig8_similarity(
                routed.positions(a), routed.positions(b), routed.data.reshape(len(routed.docs), k)
            )
            pairs = pairs[estimate >= threshold - screen_margin(threshold, k)]
            _write_pairs(path, pairs)
        kept += len(pairs)
    return kept, passes


def _sorted_sets(offsets: np.ndarray, data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Raw ``_shingles`` values -> sorted unique sets (as ``pair_jaccard`` reads them), as bytes: done once per document."""
    values = data.view("<u4") if len(data) else np.zeros(0, dtype=np.uint32)
    out, out_offsets = np.empty(len(values), dtype=np.uint32), np.zeros(len(offsets), dtype=np.int64)
    cursor = sort_unique_into(offsets // 4, values, out, out_offsets, 0)
    return out_offsets * 4, out[:cursor].view(np.uint8)


def verify_buckets(
    keys: pl.LazyFrame,
    paths: list[Path],
    *,
    threshold: float,
    chunk_pairs: int,
    window_rows: int,
    memory_gb: float,
    folder: Path,
) -> tuple[int, int]:
    """Step 2c: each bucket's pairs whose exact Jaccard reaches ``threshold``; returns (kept, passes over the spill)."""
    router = Router(folder, len(paths))
    for q, path in enumerate(paths):
        router.need(q, _docs(_read_pairs(path)))
    passes = router.route(keys, SETS_COLUMN, window_rows=window_rows, memory_gb=memory_gb, transform=_sorted_sets)
    kept = 0
    for q, path in enumerate(paths):
        pairs, routed = _read_pairs(path), router.read(q)
        if len(pairs):
            a, b = unpack_pairs(pairs)
            offsets, values = routed.offsets // 4, routed.data.view("<u4")
            similarity = np.concatenate([
                pair_jaccard(routed.positions(a[lo : lo + chunk_pairs]), routed.positions(b[lo : lo + chunk_pairs]), offsets, values)
                for lo in range(0, len(pairs), chunk_pairs)
            ])  # fmt: skip
            pairs = pairs[similarity >= threshold]
            _write_pairs(path, pairs)
        kept += len(pairs)
    return kept, passes


def _sample_wrong(
    keys: pl.LazyFrame,
    parts: Iterable[np.ndarray],
    *,
    n_candidates: int,
    threshold: float,
    sample: int,
    seed: int,
    chunk_pairs: int,
    window_rows: int,
) -> tuple[int, int]:
    """(pairs sampled, how many are below ``threshold``) of the candidate pairs in ``parts`` (arrays): a hash-chosen
    sample, the same pairs whatever the bucketing."""
    share = min(1.0, sample / max(n_candidates, 1))
    cut = np.uint64(min(int(share * 2**64), 2**64 - 1))
    chosen = [pairs[_mix(pairs ^ np.uint64(seed % 2**64)) <= cut] for pairs in parts]
    chosen = np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, dtype=np.uint64)
    if not len(chosen):
        return 0, 0
    similarity = pair_similarities(keys, chosen, chunk_pairs=chunk_pairs, window_rows=window_rows)
    return len(chosen), int(np.count_nonzero(similarity < threshold))


def _window_rows(set_bytes: float, memory_gb: float) -> int:
    """Rows per read of the spill: sets are read in windows of about ``WINDOW_BYTES`` (less on a small budget);
    larger windows save little time and the plan's peak grows with them."""
    return int(min(1 << 16, max(1 << 8, min(WINDOW_BYTES, memory_gb * GB / 16) / max(set_bytes, 64.0))))


def _set_bytes(keys: pl.LazyFrame, verify: str, memory_gb: float) -> float:
    """Mean bytes of a document's spilled shingle set (0 when nothing is verified); raises when the longest does not fit."""
    if verify == "none":
        return 0.0
    shingles = keys.select(pl.col("_nsh").mean().alias("mean"), pl.col("_nsh").max().alias("max")).collect()
    check_fits(
        8 * int(shingles["max"][0] or 0),
        memory_gb,
        what="the shingle set of the longest document (dedup.minhash verification)",
    )
    return 4.0 * float(shingles["mean"][0] or 0)


def edge_files(
    keys: pl.LazyFrame,
    candidates: list[str],
    n_candidates: int,
    *,
    verify: str,
    threshold: float,
    chunk_pairs: int,
    sample: int,
    seed: int,
    memory_gb: float,
    folder: Path,
) -> tuple[list[str], dict]:
    """Step 2: unique candidates per bucket, verified as configured, written as edges; returns the files and counts."""
    folder.mkdir(parents=True)
    set_bytes = _set_bytes(keys, verify, memory_gb)
    buckets = partitions(
        n_candidates, PAIR_BYTES + 2 * set_bytes, memory_gb, what="the candidate pairs of dedup.minhash"
    )
    window_rows = _window_rows(set_bytes, memory_gb)
    paths = split_pairs(candidates, buckets, folder / "pairs")
    stats: dict = {"candidate_pairs": 0, "partitions": {"verify": buckets}}
    for path in paths:
        pairs = np.unique(_read_pairs(path))
        _write_pairs(path, pairs)
        stats["candidate_pairs"] += len(pairs)
    if verify == "all":
        route = {"window_rows": window_rows, "memory_gb": memory_gb}
        stats["screened_pairs"], sig_passes = screen_buckets(
            keys, paths, threshold=threshold, folder=folder / "sig8", **route
        )
        stats["verified_pairs"], set_passes = verify_buckets(
            keys, paths, threshold=threshold, chunk_pairs=chunk_pairs, folder=folder / "sets", **route
        )
        stats["spill_passes"] = {"signatures": sig_passes, "sets": set_passes}
    elif verify == "sample":
        sampled, wrong = _sample_wrong(
            keys,
            map(_read_pairs, paths),
            n_candidates=stats["candidate_pairs"],
            threshold=threshold,
            sample=sample,
            seed=seed,
            chunk_pairs=chunk_pairs,
            window_rows=window_rows,
        )
        stats.update(sampled_pairs=sampled, estimated_false_positive_rate=wrong / sampled if sampled else None)
    files = []
    for q, path in enumerate(paths):
        a, b = unpack_pairs(_read_pairs(path))
        if len(a):
            files.append(str(folder / f"bucket-{q:05d}.parquet"))
            pl.DataFrame({"a": a, "b": b}).write_parquet(files[-1], compression="lz4")
    return files, stats


def group(keys: pl.LazyFrame, columns: list[str], options: GroupOptions, *, folder: Path) -> Grouped:
    """Steps 1-3 over the spilled ``keys``; ``folder`` is scratch (removed at the end)."""
    shutil.rmtree(folder, ignore_errors=True)
    counts = keys.select((pl.col("_nsh") > 0).sum().alias("usable"), pl.col("_nsh").sum().alias("shingles")).collect()
    n_usable, shingles = int(counts["usable"][0] or 0), int(counts["shingles"][0] or 0)
    o, sig_bytes = options, 0
    if o.verify == "all" and SIG8_COLUMN in keys.collect_schema().names():
        sig_bytes = keys.select(pl.col(SIG8_COLUMN).bin.size().max()).collect().item() or 0
    if in_memory_bytes(n_usable, len(columns), shingles if o.verify != "none" else 0, sig_bytes) <= o.memory_gb * GB:
        return _group_in_memory(keys, columns, o)
    band_parts = partitions(n_usable, BAND_BYTES, o.memory_gb, what=f"one band of {o.stage} over {n_usable} documents")
    per_pass = max(1, int(o.memory_gb * GB // max(n_usable * BAND_BYTES, 1)))  # bands one scan can hold (one partition)
    candidates, n_candidates = candidate_files(
        keys, columns, band_parts, folder / "candidates", bands_per_pass=per_pass
    )
    edges, stats = edge_files(
        keys,
        candidates,
        n_candidates,
        verify=o.verify,
        threshold=o.threshold,
        chunk_pairs=o.chunk_pairs,
        sample=o.sample,
        seed=o.seed,
        memory_gb=o.memory_gb,
        folder=folder / "edges",
    )
    n_edges = sum(pl.scan_parquet(f, glob=False).select(pl.len()).collect().item() for f in edges)
    edge_parts = partitions(2 * n_edges, EDGE_BYTES, o.memory_gb, what=f"the duplicate graph of {o.stage}")
    labels = components(edges, edge_parts, folder / "components")
    stats["partitions"] = {"bands": band_parts, **stats["partitions"], "components": edge_parts}
    shutil.rmtree(folder, ignore_errors=True)
    return _grouped(labels.rename({"node": "_row", "label": "_cluster"}), stats, n_edges, o.stage)


def _grouped(labels: pl.DataFrame, stats: dict, n_edges: int, stage: str) -> Grouped:
    log.info(
        "%s: %d candidate pairs, %d edges, partitions %s", stage, stats["candidate_pairs"], n_edges, stats["partitions"]
    )
    return Grouped(labels, stats)


def _cpus() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def in_memory_bytes(n_usable: int, bands: int, shingles: int, signature_bytes: int) -> int:
    """What ``_group_in_memory`` holds at most: every band key, the candidate pairs of every band (at most two per
    document and band, with ``PAIR_BYTES`` each for their copies) and twice the shingle sets of all documents (the
    sorted sets it checks pairs on are at most those; the rest is one window of the raw ones, ``_window_rows``), and
    twice the 8-bit signatures (``signature_bytes`` per document: read in windows, then joined)."""
    return n_usable * (bands * (8 + 2 * PAIR_BYTES) + 2 * signature_bytes) + 8 * shingles


def _group_in_memory(keys: pl.LazyFrame, columns: list[str], o: GroupOptions) -> Grouped:
    """Steps 1-3 as arrays, for spilled keys that fit in ``o.memory_gb`` (``in_memory_bytes``): the same candidate
    pairs, checks, edges, clusters and counts as the partitioned steps with one partition each, without the files
    between them. Each spilled column is read once (the sets of the documents on screened pairs only); LSH, the
    sorting of sets and the exact check run on up to ``o.workers`` threads."""
    n = keys.select(pl.len()).collect().item()
    usable = keys.select("_nsh").collect()["_nsh"].to_numpy() > 0
    threads = max(1, min(o.workers, _cpus()))  # the plan runs between phases, alone: its kernels release the GIL
    pairs = lsh_pairs(keys, columns, np.arange(n, dtype=np.uint32), usable, threads=threads)
    stats: dict = {"candidate_pairs": len(pairs), "partitions": {"verify": 1}}
    window_rows = _window_rows(_set_bytes(keys, o.verify, o.memory_gb), o.memory_gb)
    if o.verify == "all":
        has_sig8 = SIG8_COLUMN in keys.collect_schema().names()
        screened = screen_pairs(keys, pairs, threshold=o.threshold, window_rows=window_rows)
        a, b = unpack_pairs(screened)
        need = np.unique(np.concatenate([a, b]))
        offsets, values = read_sets(keys, need, window_rows, threads=threads)
        a, b = np.searchsorted(need, a), np.searchsorted(need, b)
        step = max(1, min(o.chunk_pairs, -(-len(screened) // threads)))
        with ThreadPoolExecutor(threads) as pool:
            chunks = pool.map(
                lambda lo: pair_jaccard(a[lo : lo + step], b[lo : lo + step], offsets, values),
                range(0, len(screened), step),
            )
            similarity = np.concatenate([*chunks, np.zeros(0)])
        pairs = screened[similarity >= o.threshold]
        stats.update(screened_pairs=len(screened), verified_pairs=len(pairs))
        stats["spill_passes"] = {
            "signatures": int(has_sig8 and stats["candidate_pairs"] > 0),
            "sets": int(len(screened) > 0),
        }
    elif o.verify == "sample":
        sampled, wrong = _sample_wrong(
            keys, [pairs], n_candidates=len(pairs), threshold=o.threshold, sample=o.sample, seed=o.seed,
            chunk_pairs=o.chunk_pairs, window_rows=window_rows,
        )  # fmt: skip
        stats.update(sampled_pairs=sampled, estimated_false_positive_rate=wrong / sampled if sampled else None)
    a, b = unpack_pairs(pairs)
    labels = connected_components(n, a, b)
    nodes = np.unique(np.concatenate([a, b]))
    frame = pl.DataFrame({"_row": nodes, "_cluster": labels[nodes].astype(np.uint32)})
    stats["partitions"] = {"bands": 1, **stats["partitions"], "components": 1}
    return _grouped(frame, stats, len(pairs), o.stage)
