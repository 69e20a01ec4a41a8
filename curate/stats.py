"""Per-stage counters that merge exactly across batches, tasks and workers.

Stats are keyed by a stable stage id (``"02.filter.length"``), never by position, and
merge by addition; a task writes its stats to its own folder and the runner adds them up.
Keys are data, never display strings: rejects per source are keyed ``(source, reason)``, and
a stage's counters by a name or a tuple (``("lines_removed", source)``); JSON holds them nested
(``{"lines_removed": {"docs": 4}}``), so no name is ever split back apart.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import polars as pl

from winnow.curate.errors import StageError

#: A counter's key: a name, or a name and its qualifiers (``("copies_added", source)``).
CounterKey: TypeAlias = str | tuple[str, ...]


@dataclass(slots=True)
class StageStats:
    """Counts for one stage: rows in/out, repeats, rejects by reason, per source, and seconds."""

    rows_in: int = 0
    rows_out: int = 0
    repeats: int = 0
    seconds: float = 0.0
    rejected: Counter = field(default_factory=Counter)  # reason -> rows
    source_in: Counter = field(default_factory=Counter)
    source_out: Counter = field(default_factory=Counter)
    source_rejected: Counter = field(default_factory=Counter)  # (source, reason) -> rows
    counters: Counter = field(default_factory=Counter)  # CounterKey -> value, summed

    def add_batch(self, rows_in: pl.DataFrame, kept: pl.DataFrame, rejected: pl.DataFrame, repeats: int) -> None:
        self.rows_in += rows_in.height
        self.rows_out += kept.height
        self.repeats += repeats
        self.source_in.update(_counts(rows_in, "source"))
        self.source_out.update(_counts(kept, "source"))
        if rejected.height:
            pairs = rejected.group_by("source", "reason").len()
            for source, reason, n in pairs.iter_rows():
                self.rejected[reason] += n
                self.source_rejected[(source, reason)] += n

    @property
    def rows_rejected(self) -> int:
        return sum(self.rejected.values())

    def __iadd__(self, other: StageStats) -> StageStats:
        self.rows_in += other.rows_in
        self.rows_out += other.rows_out
        self.repeats += other.repeats
        self.seconds += other.seconds
        for name in ("rejected", "source_in", "source_out", "source_rejected", "counters"):
            getattr(self, name).update(getattr(other, name))
        return self

    def to_json(self) -> dict[str, Any]:
        return {
            "rows_in": self.rows_in,
            "rows_out": self.rows_out,
            "repeats": self.repeats,
            "seconds": self.seconds,
            "rejected": dict(self.rejected),
            "source_in": dict(self.source_in),
            "source_out": dict(self.source_out),
            "source_rejected": nest(self.source_rejected),
            "counters": nest(self.counters),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StageStats:
        s = cls(rows_in=data["rows_in"], rows_out=data["rows_out"], repeats=data["repeats"], seconds=data["seconds"])
        for name in ("rejected", "source_in", "source_out"):
            getattr(s, name).update(data[name])
        s.source_rejected.update(dict(flatten(data["source_rejected"])))
        s.counters.update({k[0] if len(k) == 1 else k: v for k, v in flatten(data["counters"])})
        return s

    def summary(self) -> dict[str, Any]:
        """The manifest's view: totals, rejects by reason, and the same per source."""
        by_source: dict[str, Any] = {}
        for src in sorted(set(self.source_in) | set(self.source_out)):
            by_source[src] = {"in": self.source_in[src], "out": self.source_out[src], "rejected": {}}
        for (src, reason), n in sorted(self.source_rejected.items()):
            by_source.setdefault(src, {"in": 0, "out": 0, "rejected": {}})["rejected"][reason] = n
        return {
            "rows_in": self.rows_in,
            "rows_out": self.rows_out,
            "rows_rejected": self.rows_rejected,
            "repeats": self.repeats,
            "seconds": round(self.seconds, 4),
            "rejected": dict(sorted(self.rejected.items())),
            "by_source": by_source,
            "counters": nest(self.counters),
        }


def nest(flat: Mapping[CounterKey, float]) -> dict[str, Any]:
    """``{("a", "x"): 1, "b": 2}`` as ``{"a": {"x": 1}, "b": 2}``, keys sorted at every level."""
    out: dict[str, Any] = {}
    for key in sorted(flat, key=lambda k: (k,) if isinstance(k, str) else k):
        path = (key,) if isinstance(key, str) else key
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise StageError(f"counter {'/'.join(path)!r}: {part!r} is both a counter and a group of counters")
        if isinstance(node.get(path[-1]), dict):
            raise StageError(f"counter {'/'.join(path)!r} is both a counter and a group of counters")
        node[path[-1]] = flat[key]
    return out


def flatten(nested: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """The inverse of ``nest``: ``(key tuple, value)`` for every leaf."""
    for name, value in nested.items():
        if isinstance(value, Mapping):
            yield from flatten(value, (*prefix, name))
        else:
            yield (*prefix, name), value


def _counts(df: pl.DataFrame, col: str) -> dict[str, int]:
    if not df.height:
        return {}
    return dict(df[col].value_counts().iter_rows())


def merge_stats(parts: list[dict[str, dict[str, Any]]]) -> dict[str, StageStats]:
    """Add up per-task ``{stage_id: stats json}`` maps."""
    total: dict[str, StageStats] = {}
    for part in parts:
        for stage_id, data in part.items():
            total.setdefault(stage_id, StageStats()).__iadd__(StageStats.from_json(data))
    return total
