"""How the dedup plans split their work to stay within ``[job] memory_gb``.

Every global step works on one partition at a time and keeps nothing else; the number of
partitions is the data a step holds, from the model below, over the budget (rounded up).
Partitioning never changes a result: band runs are split by key (equal keys stay together),
pairs and edges by node, exact groups by hash, and each partition's output is a pure
function of its rows.

Bytes held per item (measured peaks of the numpy/polars working sets, with sort scratch):

=============================  ==========  ==================================================
step                           bytes        item
=============================  ==========  ==================================================
band grouping (one band)       48           usable document (u64 key + u32 row, sorted copy,
                                            the run's pairs)
pair verification              40 + sets    candidate pair (packed u64, unique/screen copies)
                                            plus the shingle sets of its documents
routing to the buckets         32           (document, bucket) need: the spill is read once
                                            per this many needs over the budget (rounds)
components (one star step)     64           directed edge (two u32 + sort keys + output)
exact grouping                 96           document (two u64 hashes + the policy columns)
=============================  ==========  ==================================================

A step whose smallest unit does not fit (more than ``MAX_PARTITIONS`` partitions, or one
document's shingle set over the budget) is a ``ConfigError`` naming ``job.memory_gb``.
"""

from __future__ import annotations

import math

from winnow.curate.errors import ConfigError

BAND_BYTES = 48
PAIR_BYTES = 40
NEED_BYTES = 32  # packed u64 key + sort copy, then the document (i64) and bucket (u32) columns
EDGE_BYTES = 64
EXACT_BYTES = 96
MAX_PARTITIONS = 4096  # each band partition is a scan of the band column: beyond this the budget is unreasonable
GB = 1e9


def partitions(items: int, bytes_per_item: float, memory_gb: float, *, what: str) -> int:
    """How many partitions keep ``items x bytes_per_item`` within ``memory_gb``; raises if more than ``MAX_PARTITIONS``."""
    need = items * bytes_per_item
    parts = max(1, math.ceil(need / (memory_gb * GB)))
    if parts > MAX_PARTITIONS:
        least = need / MAX_PARTITIONS / GB
        raise ConfigError(
            f"job.memory_gb = {memory_gb} is too small for {what}: {items} items x {bytes_per_item:.0f} B would need "
            f"{parts} partitions (at most {MAX_PARTITIONS}); set job.memory_gb to at least {least:.3g}"
        )
    return parts


def check_fits(item_bytes: int, memory_gb: float, *, what: str) -> None:
    """Raise when one indivisible item (e.g. a document's shingle set) is larger than the budget."""
    if item_bytes > memory_gb * GB:
        raise ConfigError(
            f"job.memory_gb = {memory_gb} is too small for {what} ({item_bytes / GB:.3g} GB); "
            f"set job.memory_gb to at least {item_bytes / GB * 1.5:.3g}"
        )
