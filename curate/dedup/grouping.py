"""``dedup.minhash``'s global phase in bounded memory: band runs -> candidate pairs -> verified edges -> components.

Layout under the stage's plan folder (``ctx.plan_dir / "minhash"``), every step reading the
previous step's files one partition at a time:

1. ``candidates/band-BBB-part-PPPPP.parquet`` (``pair`` u64 = ``a << 32 | b``): band ``B``'s
   documents whose key falls in partition ``P`` (``key % parts``) are sorted by key and each
   run of equal keys is linked as a star plus a chain (``curate.dedup.lsh``). Bands are
   independent and equal keys share a partition, so the pairs do not depend on ``parts``.
2. ``edges/bucket-QQQQQ.parquet`` (``a``, ``b`` u32): the candidates with ``a % buckets == Q``,
   made unique, screened by their 8-bit signature estimate and checked by exact Jaccard on
   the spilled shingle sets (``curate.dedup.verify``), reading only the sets they need.
3. ``curate.dedup.components``: large-star / small-star over those edges, in partitions by node.

How many partitions each step takes comes from ``[job] memory_gb`` and the data (``curate.dedup.budget``).
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from curate.dedup.budget import BAND_BYTES, EDGE_BYTES, GB, PAIR_BYTES, check_fits, partitions
from curate.dedup.components import _mix, components
from curate.dedup.lsh import _run_pairs, unpack_pairs
from curate.dedup.verify import SETS_COLUMN, pair_similarities, screen_pairs

log = logging.getLogger(__name__)

WINDOW_BYTES = 8 << 20


@dataclass(slots=True)
class Grouped:
    """What the grouping found: each clustered row's component label, and the counts for the report."""

    labels: pl.DataFrame  # _row (UInt32), _cluster (UInt32): the rows in a cluster of two or more
    stats: dict


def candidate_files(keys: pl.LazyFrame, columns: list[str], parts: int, folder: Path) -> tuple[list[str], int]:
    """Step 1: each band's candidate pairs, ``parts`` key partitions at a time; returns the files and their pair count."""
    folder.mkdir(parents=True)
    files, total = [], 0
    for j, column in enumerate(columns):
        scan = keys.select("_nsh", column).with_row_index("_row").filter(pl.col("_nsh") > 0)
        for part in range(parts):
            chunk = scan.filter(pl.col(column) % parts == part) if parts > 1 else scan
            band = chunk.select(column, "_row").sort(column, "_row").collect()
            pairs = np.unique(_run_pairs(band[column].to_numpy(), band["_row"].to_numpy()))
            if len(pairs):
                path = folder / f"band-{j:03d}-part-{part:05d}.parquet"
                pl.DataFrame({"pair": pairs}).write_parquet(path, compression="lz4")
                files.append(str(path))
                total += len(pairs)
    return files, total


def _bucket(files: list[str], bucket: int, buckets: int) -> np.ndarray:
    scan = pl.scan_parquet(files)
    if buckets > 1:
        scan = scan.filter((pl.col("pair") // 2**32) % buckets == bucket)
    return np.unique(scan.collect()["pair"].to_numpy())


def edge_files(keys: pl.LazyFrame, candidates: list[str], n_candidates: int, *, verify: str, threshold: float, chunk_pairs: int,
               sample: int, seed: int, memory_gb: float, folder: Path) -> tuple[list[str], dict]:
    """Step 2: unique candidates per bucket, verified as configured, written as edges; returns the files and counts."""
    folder.mkdir(parents=True)
    set_bytes = 0.0
    if verify != "none":
        shingles = keys.select(pl.col("_nsh").mean().alias("mean"), pl.col("_nsh").max().alias("max")).collect()
        set_bytes = 4.0 * float(shingles["mean"][0] or 0)
        check_fits(8 * int(shingles["max"][0] or 0), memory_gb, what="the shingle set of the longest document (dedup.minhash verification)")
    buckets = partitions(n_candidates, PAIR_BYTES + 2 * set_bytes, memory_gb, what="the candidate pairs of dedup.minhash")
    # Sets are read in windows of about WINDOW_BYTES (less on a small budget): larger windows save
    # little time and the plan's peak grows with them.
    window_rows = int(min(1 << 16, max(1 << 8, min(WINDOW_BYTES, memory_gb * GB / 16) / max(set_bytes, 64.0))))
    stats = {"candidate_pairs": 0, "partitions": {"verify": buckets}}
    sampled, wrong = 0, 0
    files = []
    for bucket in range(buckets):
        pairs = _bucket(candidates, bucket, buckets) if candidates else np.zeros(0, dtype=np.uint64)
        stats["candidate_pairs"] += len(pairs)
        if verify == "all" and len(pairs):
            screened = screen_pairs(keys, pairs, threshold=threshold, window_rows=window_rows)
            stats["screened_pairs"] = stats.get("screened_pairs", 0) + len(screened)
            similarity = pair_similarities(keys, screened, chunk_pairs=chunk_pairs, window_rows=window_rows)
            pairs = screened[similarity >= threshold]
        elif verify == "sample" and len(pairs) and n_candidates:
            # A hash-chosen sample (the same pairs whatever the bucketing), about `sample` of all candidates.
            share = min(1.0, sample / n_candidates)
            cut = np.uint64(min(int(share * 2**64), 2**64 - 1))
            chosen = pairs[_mix(pairs ^ np.uint64(seed % 2**64)) <= cut]
            if len(chosen):
                sampled += len(chosen)
                wrong += int(np.count_nonzero(pair_similarities(keys, chosen, chunk_pairs=chunk_pairs, window_rows=window_rows) < threshold))
        if len(pairs):
            a, b = unpack_pairs(pairs)
            path = folder / f"bucket-{bucket:05d}.parquet"
            pl.DataFrame({"a": a, "b": b}).write_parquet(path, compression="lz4")
            files.append(str(path))
            stats["edges"] = stats.get("edges", 0) + len(pairs)
    if verify == "all":
        stats["verified_pairs"] = stats.pop("edges", 0)
    else:
        stats.pop("edges", None)
    if verify == "sample":
        stats.update(sampled_pairs=sampled, estimated_false_positive_rate=wrong / sampled if sampled else None)
    return files, stats


def group(keys: pl.LazyFrame, columns: list[str], *, verify: str, threshold: float, chunk_pairs: int, sample: int, seed: int,
          memory_gb: float, folder: Path, stage: str) -> Grouped:
    """Steps 1-3 over the spilled ``keys``; ``folder`` is scratch (removed at the end)."""
    shutil.rmtree(folder, ignore_errors=True)
    n_usable = keys.filter(pl.col("_nsh") > 0).select(pl.len()).collect().item()
    band_parts = partitions(n_usable, BAND_BYTES, memory_gb, what=f"one band of {stage} over {n_usable} documents")
    candidates, n_candidates = candidate_files(keys, columns, band_parts, folder / "candidates")
    edges, stats = edge_files(keys, candidates, n_candidates, verify=verify, threshold=threshold, chunk_pairs=chunk_pairs,
                              sample=sample, seed=seed, memory_gb=memory_gb, folder=folder / "edges")
    n_edges = sum(pl.scan_parquet(f).select(pl.len()).collect().item() for f in edges)
    edge_parts = partitions(2 * n_edges, EDGE_BYTES, memory_gb, what=f"the duplicate graph of {stage}")
    labels = components(edges, edge_parts, folder / "components")
    stats["partitions"] = {"bands": band_parts, **stats["partitions"], "components": edge_parts}
    shutil.rmtree(folder, ignore_errors=True)
    log.info("%s: %d candidate pairs, %d edges, partitions %s", stage, stats["candidate_pairs"], n_edges, stats["partitions"])
    return Grouped(labels.rename({"node": "_row", "label": "_cluster"}), stats)
