"""Duplicate clusters: exact Jaccard of candidate pairs, connected components, who is kept.

Shared by ``dedup.exact`` and ``dedup.minhash``: both end with a ``members`` frame (one row
per document in a cluster of two or more, with ``_cluster``) from which ``choose_keepers``
picks one row per cluster by the keep policy and ``cluster_report`` builds the manifest
entry. Everything is deterministic: components are labelled by their lowest document index
and ties in the keep policy fall back to the lowest ``id``.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import polars as pl

from winnow.curate.dedup.jit import njit

KeepPolicy = Literal["first", "longest", "quality"]
KEEP_POLICIES: tuple[str, ...] = ("first", "longest", "quality")


@njit(cache=True, nogil=True)
def _find(parent, x):
    root = x
    while parent[root] != root:
        root = parent[root]
    while parent[x] != root:  # path compression
        parent[x], x = root, parent[x]
    return root


@njit(cache=True, nogil=True)
def connected_components(n, a, b):
    """Component label of each of ``n`` nodes given edges ``a[i]-b[i]``: the lowest node index in it."""
    parent = np.arange(n, dtype=np.int64)
    for i in range(a.shape[0]):
        ra = _find(parent, np.int64(a[i]))
        rb = _find(parent, np.int64(b[i]))
        if ra < rb:
            parent[rb] = ra
        elif rb < ra:
            parent[ra] = rb
    for x in range(n):
        parent[x] = _find(parent, x)
    return parent


@njit(cache=True, nogil=True)
def pair_jaccard(a_pos, b_pos, offsets, values):
    """Exact Jaccard of sorted unique sets ``values[offsets[i]:offsets[i+1]]`` for each pair."""
    out = np.empty(a_pos.shape[0], dtype=np.float64)
    for t in range(a_pos.shape[0]):
        i, iend = offsets[a_pos[t]], offsets[a_pos[t] + 1]
        j, jend = offsets[b_pos[t]], offsets[b_pos[t] + 1]
        size = (iend - i) + (jend - j)
        common = 0
        while i < iend and j < jend:
            x, y = values[i], values[j]
            common += x == y
            i += x <= y
            j += y <= x
        union = size - common
        out[t] = common / union if union > 0 else 0.0
    return out


def _policy_order(policy: str, columns: list[str]) -> tuple[list[pl.Expr], list[bool]]:
    if policy == "longest":
        return [pl.col("_len"), pl.col("id")], [True, False]
    if policy == "quality" and "quality" in columns:
        return [pl.col("quality").fill_nan(None), pl.col("id")], [True, False]
    return [pl.col("id")], [False]


def choose_keepers(members: pl.DataFrame, policy: str) -> pl.DataFrame:
    """Rows to drop, with ``duplicate_of`` (the kept row's id) and ``duplicate_source``.

    ``members`` has ``_cluster``, ``id``, ``source``, ``_task`` and, for the policies that
    need them, ``_len`` / ``quality``. ``quality`` falls back to ``first`` when no row has it.
    """
    by, descending = _policy_order(policy, members.columns)
    ranked = members.sort(["_cluster", *by], descending=[False, *descending], nulls_last=True)
    keeper = pl.col("id").first().over("_cluster")
    return (
        ranked.with_columns(
            keeper.alias("duplicate_of"), pl.col("source").first().over("_cluster").alias("duplicate_source")
        )
        .filter(pl.col("id") != pl.col("duplicate_of"))
        .select("id", "_task", "source", "duplicate_of", "duplicate_source")
    )


def cluster_report(dropped: pl.DataFrame, n_clusters: int, n_docs: int) -> dict:
    """Manifest entry: clusters, rows removed per source, cross-source duplicate counts."""
    per_source = dropped.group_by("source").len().sort("source")
    cross = (
        dropped.filter(pl.col("source") != pl.col("duplicate_source"))
        .with_columns(
            pl.concat_str(
                pl.min_horizontal("source", "duplicate_source"),
                pl.max_horizontal("source", "duplicate_source"),
                separator="|",
            ).alias("pair")
        )
        .group_by("pair")
        .len()
        .sort("pair")
    )
    return {
        "documents": n_docs,
        "clusters": n_clusters,
        "removed": dropped.height,
        "removed_per_source": dict(zip(per_source["source"].to_list(), per_source["len"].to_list())),
        "cross_source_duplicates": dict(zip(cross["pair"].to_list(), cross["len"].to_list())),
    }


def decision_frame(dropped: pl.DataFrame) -> pl.DataFrame:
    """What ``apply`` needs per task: the dropped ids and whom they duplicate."""
    return dropped.select(pl.col("id"), pl.col("_task"), pl.col("duplicate_of"))
