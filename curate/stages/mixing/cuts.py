"""Every source's partial-pass cut-off, found for all sources at once, and applied to a task's rows.

A source asked for ``rest`` tokens beyond its whole passes takes its most preferred rows until the
running token total first passes ``rest``, then keeps the row that crosses it only if that lands
closer to the target. With rows sorted by the key ``(_code, preference..., _row)`` this is "every
row of the source before a cut-off key". Sources come from a field of the data (web domains,
repositories: 10^4-10^5 of them), so the work is columnar over all sources together:

1. one scan: tokens and rows per (key range, source), and per source the first range whose
   running total passes ``rest`` (a grouped cumulative sum, no loop over sources);
2. one scan per key range that holds a crossing (at most the number of ranges, however many
   sources): that range's rows of those sources, sorted, grouped cumulative sums again, and per
   source the crossing row, which is the cut-off key;
3. per task, its rows' source codes index the cut-off arrays (``taken``): O(task rows).

Time O(rows x ranges_read + sources), memory one key range plus arrays of the source count; the
same cut-offs as one whole sort, whatever the budget (``curate.stages.mixing.external``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from winnow.curate.stages.mixing.external import ROW, KeyRanges, key_ranges

NONE, ALL, KEY = 0, 1, 2  # a source's cut: no partial pass, every row, the rows before a key


@dataclass(frozen=True, slots=True)
class Cuts:
    """Per source code: the kind of cut, whether the key row itself is taken, rows and tokens taken, the key."""

    kind: np.ndarray  # int8: NONE, ALL or KEY
    inclusive: np.ndarray  # bool: rows equal to the key are taken too
    rows: np.ndarray  # int64: rows the partial pass takes
    tokens: np.ndarray  # float64: tokens it takes
    key: dict[str, np.ndarray]  # by column (after _code): the cut row's value
    ranges: int  # key ranges the plan read

    def taken(self, code: np.ndarray, frame: pl.DataFrame) -> np.ndarray:
        """Whether each row (source ``code``, key columns in ``frame``) is in its source's partial pass."""
        kind = self.kind[code]
        out = kind == ALL
        at = np.flatnonzero(kind == KEY)
        if not len(at):
            return out
        c = code[at]
        cols = list(self.key)
        last = frame[cols[-1]].to_numpy()[at]
        bound = self.key[cols[-1]][c]
        less = np.where(self.inclusive[c], last <= bound, last < bound)
        for col in reversed(cols[:-1]):  # lexicographic: an earlier column decides unless equal
            a, b = frame[col].to_numpy()[at], self.key[col][c]
            less = (a < b) | ((a == b) & less)
        out[at] = less
        return out


def find_cuts(frame: pl.LazyFrame, by: list[str], rows: np.ndarray, rest: np.ndarray, max_rows) -> Cuts:
    """The cuts of the sources with a partial pass (``rest`` not NaN) over ``frame`` (``_code``, ``by``, ``_tokens``).

    ``rows``: each source's row count; ``max_rows(n)``: rows a key range may hold for ``n`` rows.
    """
    n_sources = len(rows)
    cuts = Cuts(
        kind=np.zeros(n_sources, np.int8),
        inclusive=np.zeros(n_sources, bool),
        rows=np.zeros(n_sources, np.int64),
        tokens=np.zeros(n_sources, np.float64),
        key={c: np.zeros(n_sources, _dtype(c)) for c in by[1:]},
        ranges=1,
    )
    partial = np.flatnonzero(~np.isnan(rest))
    if not len(partial):
        return cuts
    frame = frame.filter(pl.col("_code").is_in(partial.tolist()))
    n = int(rows[partial].sum())
    ranges = key_ranges(frame, by, n, max_rows(n))
    sums = frame.group_by(ranges.index().alias("_range"), "_code").agg(
        pl.len().alias("n"), pl.col("_tokens").cast(pl.Int64).sum().alias("t")
    )
    sums = sums.collect(engine="streaming").sort("_code", "_range")
    code, rng = sums["_code"].to_numpy().astype(np.int64), sums["_range"].to_numpy()
    run_t, run_n = _grouped_cumsum(code, sums["t"].to_numpy()), _grouped_cumsum(code, sums["n"].to_numpy())
    past = run_t > rest[code]  # float compare, as the running totals of one sort would be
    first = _first_per_group(code, past)  # per source code: its first range past rest, else -1
    whole = partial[first[partial] < 0]  # the source's rows all fit in its partial pass
    last = _last_per_group(code)
    cuts.kind[whole], cuts.inclusive[whole], cuts.rows[whole] = ALL, True, rows[whole]
    cuts.tokens[whole] = run_t[last[whole]]
    crossing = partial[first[partial] >= 0]
    at = first[crossing]
    before_t, before_n = run_t[at] - sums["t"].to_numpy()[at], run_n[at] - sums["n"].to_numpy()[at]
    for j in np.unique(rng[at]):  # one filtered scan per key range that holds a crossing
        mine = rng[at] == j
        _cut_in_range(frame, ranges, int(j), by, crossing[mine], before_t[mine], before_n[mine], rest, cuts)
    return Cuts(cuts.kind, cuts.inclusive, cuts.rows, cuts.tokens, cuts.key, len(ranges))


def _cut_in_range(
    frame: pl.LazyFrame,
    ranges: KeyRanges,
    j: int,
    by: list[str],
    sources: np.ndarray,
    before_t: np.ndarray,
    before_n: np.ndarray,
    rest: np.ndarray,
    cuts: Cuts,
) -> None:
    """The crossing row of each of ``sources`` in key range ``j`` (their tokens and rows before it given)."""
    part = frame.filter(ranges.where(j) & pl.col("_code").is_in(sources.tolist())).select(*by, "_tokens")
    part = part.collect(engine="streaming").sort(by)
    code = part["_code"].to_numpy().astype(np.int64)
    slot = np.full(len(cuts.kind), -1, np.int64)
    slot[sources] = np.arange(len(sources))
    s = slot[code]  # each row's position in ``sources``
    running = before_t[s] + _grouped_cumsum(code, part["_tokens"].to_numpy().astype(np.int64))
    starts = np.flatnonzero(np.r_[True, code[1:] != code[:-1]])
    k = np.add.reduceat((running <= rest[code]).astype(np.int64), starts)  # rows whose running total stays <= rest
    cross = starts + k  # the row that passes rest: there is one, the range was picked for it
    src = code[starts]
    above = running[cross].astype(np.float64)
    below = np.where(k > 0, running[np.maximum(cross - 1, 0)], before_t[slot[src]]).astype(np.float64)
    inclusive = above - rest[src] < rest[src] - below  # the next document lands closer to the target
    cuts.kind[src], cuts.inclusive[src] = KEY, inclusive
    cuts.rows[src] = before_n[slot[src]] + k + inclusive
    cuts.tokens[src] = np.where(inclusive, above, below)
    for col in by[1:]:
        cuts.key[col][src] = part[col].to_numpy()[cross]


def _dtype(column: str) -> type:
    return np.int64 if column == ROW else np.float64


def _grouped_cumsum(groups: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Running sums of ``values`` restarting at every change of ``groups`` (sorted into runs)."""
    total = np.cumsum(values, dtype=np.int64)
    starts = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]])
    offset = np.repeat(total[starts] - values[starts], np.diff(np.r_[starts, len(groups)]))
    return total - offset


def _first_per_group(groups: np.ndarray, flag: np.ndarray) -> np.ndarray:
    """Per group id (an index into a dense array): the position of its first flagged row, -1 if none."""
    out = np.full(int(groups.max()) + 1 if len(groups) else 0, -1, np.int64)
    hits = np.flatnonzero(flag)
    uniq, first = np.unique(groups[hits], return_index=True)
    out[uniq] = hits[first]
    return out


def _last_per_group(groups: np.ndarray) -> np.ndarray:
    """Per group id: the position of its last row (groups sorted into runs)."""
    out = np.full(int(groups.max()) + 1 if len(groups) else 0, -1, np.int64)
    starts = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]])
    out[groups[starts]] = np.r_[starts[1:], len(groups)] - 1
    return out
