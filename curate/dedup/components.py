"""Connected components of a duplicate graph too large for memory: large-star / small-star over edge files.

Kiveris et al., "Connected Components in MapReduce and Beyond" (SoCC 2014):
https://dl.acm.org/doi/10.1145/2670979.2670997. Each step groups the edges by one endpoint
and rewires every group to its smallest node:

* large-star: for node ``u`` with neighbours ``N(u)`` and ``m = min(N(u) + {u})``, link every
  ``v`` in ``N(u)`` with ``v > u`` to ``m``;
* small-star: for node ``u`` with its smaller neighbours ``S(u)`` and ``m = min(S(u) + {u})``,
  link every ``v`` in ``S(u) + {u}`` other than ``m`` to ``m``.

Alternating them until the edge set stops changing leaves a star per component whose centre
is its smallest node: that is each node's label (the lowest document index in its component,
as ``curate.dedup.clusters.connected_components`` gives). The edges live in Parquet files;
a step reads one partition of edges at a time (``node % parts``), so memory holds
``edges / parts`` edges, never a structure over all documents. The result does not depend on
``parts``: each group sees the same neighbours whatever partition it falls in.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import polars as pl

log = logging.getLogger(__name__)

_MAX_ROUNDS = 200


def _fingerprint(u: np.ndarray, v: np.ndarray) -> int:
    # Order-free hash of an edge set (sum of mixed packed edges), to see when a round changed nothing.
    packed = (u.astype(np.uint64) << np.uint64(32)) | v.astype(np.uint64)
    with np.errstate(over="ignore"):
        return int(_mix(packed).sum(dtype=np.uint64))


def _mix(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(33))
        x = x * np.uint64(0xFF51AFD7ED558CCD)
        x = x ^ (x >> np.uint64(33))
        x = x * np.uint64(0xC4CEB9FE1A85EC53)
        return x ^ (x >> np.uint64(33))


def _read_part(files: list[str], part: int, parts: int) -> tuple[np.ndarray, np.ndarray]:
    """Edges ``(u, v)`` with ``u % parts == part`` from ``files``, sorted by ``(u, v)`` and unique."""
    if not files:
        return np.zeros(0, dtype=np.uint32), np.zeros(0, dtype=np.uint32)
    scan = pl.scan_parquet(files, glob=False)
    if parts > 1:
        scan = scan.filter(pl.col("u") % parts == part)
    df = scan.unique().sort("u", "v").collect()
    return df["u"].to_numpy(), df["v"].to_numpy()


def _group_min(u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per edge: the group start index of its ``u`` and ``m = min(u, min v)`` of that group (``u`` sorted)."""
    starts = np.flatnonzero(np.r_[True, u[1:] != u[:-1]])
    mins = np.minimum(np.minimum.reduceat(v, starts), u[starts])
    sizes = np.diff(np.r_[starts, len(u)])
    return starts, np.repeat(mins, sizes)


def _write(folder: Path, name: str, u: np.ndarray, v: np.ndarray) -> str | None:
    if len(u) == 0:
        return None
    path = folder / name
    pl.DataFrame({"u": u.astype(np.uint32), "v": v.astype(np.uint32)}).write_parquet(path, compression="lz4")
    return str(path)


def _large_star(files: list[str], parts: int, out: Path) -> tuple[list[str], int]:
    """Large-star over undirected edges stored both ways; writes ``(max, min)`` edges keyed by the larger end."""
    out.mkdir(parents=True)
    written, fingerprint = [], 0
    for part in range(parts):
        u, v = _read_part(files, part, parts)
        if not len(u):
            continue
        with np.errstate(over="ignore"):
            fingerprint = (fingerprint + _fingerprint(u, v)) % 2**64
        _, m = _group_min(u, v)
        keep = v > u
        a, b = v[keep], m[keep]  # link v - m (v > u >= m, so v is the larger end)
        link = a != b
        written.append(_write(out, f"part-{part:05d}.parquet", a[link], b[link]))
    return [f for f in written if f], fingerprint


def _small_star(files: list[str], parts: int, out: Path) -> list[str]:
    """Small-star over ``(larger, smaller)`` edges; writes undirected edges both ways, keyed by each end."""
    out.mkdir(parents=True)
    written = []
    for part in range(parts):
        u, v = _read_part(files, part, parts)  # v < u: each group is S(u)
        if not len(u):
            continue
        starts, m = _group_min(u, v)
        nodes = np.concatenate([v, u[starts]])
        mins = np.concatenate([m, m[starts]])
        link = nodes != mins
        a, b = nodes[link], mins[link]
        written.append(_write(out, f"part-{part:05d}.parquet", np.concatenate([a, b]), np.concatenate([b, a])))
    return [f for f in written if f]


def components(edge_files: list[str], parts: int, folder: Path) -> pl.DataFrame:
    """``node``, ``label`` (both UInt32, sorted by node) of every node on an edge of ``edge_files`` (columns ``a``, ``b``).

    ``folder`` holds the rounds' edge files (removed at the end); ``parts`` partitions bound
    each step's memory.
    """
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    start = folder / "round-000"
    start.mkdir()
    files = []
    for k, path in enumerate(edge_files):
        df = pl.read_parquet(path, columns=["a", "b"], glob=False)
        a, b = df["a"].to_numpy(), df["b"].to_numpy()
        files.append(_write(start, f"in-{k:05d}.parquet", np.concatenate([a, b]), np.concatenate([b, a])))
    files = [f for f in files if f]
    previous = None
    for rnd in range(1, _MAX_ROUNDS + 1):
        large, fingerprint = _large_star(files, parts, folder / f"round-{rnd:03d}-large")
        if fingerprint == previous:
            break
        previous = fingerprint
        files = _small_star(large, parts, folder / f"round-{rnd:03d}-small")
    else:  # pragma: no cover - the algorithm converges in O(log^2 n) rounds
        raise RuntimeError(f"connected components did not converge in {_MAX_ROUNDS} rounds")
    log.info("components: converged after %d round(s) in %d partition(s)", rnd, parts)
    # Converged: stars. Each node's label is the smallest of itself and its neighbours.
    labels = []
    for part in range(parts):
        u, v = _read_part(files, part, parts)
        if len(u):
            starts, m = _group_min(u, v)
            labels.append(
                pl.DataFrame({"node": u[starts], "label": m[starts]}, schema={"node": pl.UInt32, "label": pl.UInt32})
            )
    shutil.rmtree(folder, ignore_errors=True)
    if not labels:
        return pl.DataFrame(schema={"node": pl.UInt32, "label": pl.UInt32})
    return pl.concat(labels).sort("node")
