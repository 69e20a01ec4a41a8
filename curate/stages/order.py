"""``order``: the curriculum, the order in which the loader will read the training rows.

``collect`` keeps per training row its id (and ``repeat``), source, the ordering value (a
numeric column, ``length`` = UTF-8 bytes of the text, for a sequence-length warm-up, or
``random``: none, so the hash alone orders each source, a seeded shuffle with the same
source shares in every window, the control a curriculum is compared with) and a stable
hash of (id, repeat) salted by (seed, source). ``plan`` orders each source's
rows easy-to-hard (or hard-to-easy) under a pacing function (``mixing.pacing``), then
interleaves the sources so every window of ``window`` rows keeps the mixture's source
shares (``mixing.stratify``), or lays them out source by source when ``stratify = false``;
optionally shuffles inside each window, so local order is random while the curriculum
holds at the window scale. The result is an ``order`` column (Int64 rank over training
rows; null for ``val`` rows) by which the runner writes the train shards.

The plan works within ``[job] memory_gb``: it reads the keys in key ranges
(``mixing.external``), spills each row's place and then its rank to Parquet under the plan
folder, and gives each task its ranks on demand; any budget gives the same ranks and report.
A paced curriculum draws from a pool that spans a source, so one source's rows must fit.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import numpy as np
import polars as pl

from winnow.curate.errors import ConfigError, StageError
from winnow.curate.schema import empty_rejects
from winnow.curate.stages.base import Barrier, Plan, StageConfig, StageContext, StageOutput
from winnow.curate.stages.mixing.external import ROW, key_ranges, rows_within, task_offsets
from winnow.curate.stages.mixing.hashing import hash_strings, seed_key, source_salts, unit
from winnow.curate.stages.mixing.pacing import PACINGS, Paced
from winnow.curate.stages.mixing.stratify import (
    CLOSED_FORM_SOURCES,
    MAX_MERGE_ROWS,
    Curve,
    merge_key,
    positions,
    shuffle_windows,
    within_source,
)

log = logging.getLogger(__name__)

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # spreads repeat indices over the salt's bits
ORDER_BYTES = 160  # per row of a key range or a range of places: keys, hash, value, position, the sorted copy
_SPILL_GROUP = 16384  # rows per row group of the spills: a range's filtered scan prunes the rest


@dataclass(kw_only=True, slots=True)
class OrderConfig(StageConfig):
    """What to order by, how fast harder rows enter, and how sources share each window."""

    SOURCE_KEYS: ClassVar[tuple[str, ...]] = ("sources", "source_order")
    SCOPED: ClassVar[bool] = False

    by: str = "difficulty"  # any numeric column, "length" (text bytes: short documents first), or "random" (shuffled)
    # easy_to_hard: the lowest values are read first
    direction: Literal["easy_to_hard", "hard_to_easy"] = "easy_to_hard"
    # how fast harder rows are admitted: sorted (plain sort), linear, sqrt or step competence
    pacing: Literal["sorted", "linear", "sqrt", "step"] = "sorted"
    start: float = 0.1  # linear/sqrt: fraction of the easiest rows admitted from the first position
    steps: int = 4  # step: number of stages
    stratify: bool = True  # keep source shares in every window; false: source by source
    source_order: list[str] = field(default_factory=list)  # stratify = false: source sequence (default: by name)
    window: int = 1000  # rows per window, for stratification, shuffling and the report
    # shuffle the rows inside each window: random local order, the curriculum kept across windows
    shuffle_within_window: bool = False
    tolerance: float = 0.02  # windows whose shares deviate more are counted and logged
    seed: int | None = None  # default: the job seed
    report_windows: int = 3  # first and last windows listed in the report

    def __post_init__(self) -> None:
        if self.sources is not None:
            raise ConfigError(
                f"sources cannot scope this stage (order ranks every training row), got sources={self.sources}"
            )
        if not self.by:
            raise ConfigError("by must name a numeric column, 'length' or 'random', got ''")
        if self.direction not in ("easy_to_hard", "hard_to_easy"):
            raise ConfigError(
                f"order.direction = {self.direction!r} is invalid; allowed: 'easy_to_hard' or 'hard_to_easy'"
            )
        if self.pacing not in PACINGS:
            raise ConfigError(f"order.pacing = {self.pacing!r} is invalid; allowed: one of {list(PACINGS)}")
        if not 0.0 <= self.start <= 1.0:
            raise ConfigError(f"order.start = {self.start!r} is invalid; allowed: a fraction in [0, 1]")
        if self.steps < 1:
            raise ConfigError(f"order.steps = {self.steps!r} is invalid; allowed: >= 1")
        if self.window < 1:
            raise ConfigError(f"order.window = {self.window!r} is invalid; allowed: >= 1")
        if not 0.0 < self.tolerance <= 1.0:
            raise ConfigError(f"order.tolerance = {self.tolerance!r} is invalid; allowed: in (0, 1]")
        if self.report_windows < 0:
            raise ConfigError(f"order.report_windows = {self.report_windows!r} is invalid; allowed: >= 0")
        if self.source_order and self.stratify:
            raise ConfigError("source_order applies only with stratify = false")


class Order(Barrier):
    """Ranks the training rows into a curriculum; the runner writes train shards in that order."""

    kind = "order"
    orders_output = True
    Config = OrderConfig
    reasons = ()
    config: OrderConfig

    def __init__(self, config: OrderConfig, ctx: StageContext) -> None:
        super().__init__(config, ctx)
        self.seed = ctx.seed if config.seed is None else config.seed

    def collect(self, batch: pl.DataFrame) -> pl.DataFrame:
        train = batch.filter(pl.col("split").ne_missing("val")) if "split" in batch.columns else batch
        by = self.config.by
        if by == "length":
            value = train["text"].str.len_bytes().cast(pl.Float64)
        elif by == "random":  # every row the same value: the salted hash decides the order within a source
            value = pl.Series(np.zeros(train.height))
        elif by in train.columns and train.schema[by].is_numeric():
            value = train[by].cast(pl.Float64)
        else:
            found = f"has dtype {train.schema[by]}" if by in train.columns else "is missing"
            raise StageError(
                f"{self.ctx.stage_id}: by={by!r} must be a numeric column, 'length' or 'random'; the column {found}"
            )
        salts = source_salts(train["source"], "order", self.seed)
        keys = ["id", "repeat"] if "repeat" in train.columns else ["id"]
        if "repeat" in train.columns:
            salts = salts ^ (train["repeat"].cast(pl.UInt64).to_numpy() * _GOLDEN)
        return train.select(*keys, "source").with_columns(
            value.alias("_value"), pl.Series("_h", hash_strings(train["id"], salts), dtype=pl.UInt64)
        )

    def plan(self, keys: pl.LazyFrame) -> Plan:
        """Three passes, each over pieces within ``[job] memory_gb``; the result does not depend on the pieces.

        1. key ranges of (source, ordering value, hash, position): each source's curriculum, so
           every row gets its place in the whole order (``stratify.positions``; past a few sources a
           merge key and one more pass of key ranges sorting by it), spilled by place;
        2. ranges of places (whole windows): the window shuffle, the report, and each row's rank,
           spilled by position;
        3. per task (``per_task``): the ranks of that task's rows, read back by position.
        """
        c = self.config
        schema = keys.collect_schema().names()
        id_cols = ["id", "repeat"] if "repeat" in schema else ["id"]
        empty = pl.DataFrame(schema={"id": pl.String, "repeat": pl.Int32, "order": pl.Int64}).select(*id_cols, "order")
        if "source" not in schema:  # no rows reached the stage
            return Plan(None, {"rows": 0}, per_task=lambda task, own: empty)
        totals = dict(keys.group_by("source").len().collect(engine="streaming").iter_rows())
        names = sorted(totals)
        if not c.stratify and c.source_order:
            unknown = set(c.source_order) - set(names)
            names = [n for n in c.source_order if n in names] + [n for n in names if n not in c.source_order]
            if unknown:
                log.warning(
                    "%s: source_order names sources with no training rows: %s", self.ctx.stage_id, sorted(unknown)
                )
        sizes = [int(totals[n]) for n in names]
        n = sum(sizes)
        ranges_gb = (
            self.ctx.memory_gb / 2 if c.pacing != "sorted" else self.ctx.memory_gb
        )  # a paced pool takes the other half
        max_rows = rows_within(ranges_gb, ORDER_BYTES, n, what=f"{self.ctx.stage_id}'s order over {n} rows")
        if max_rows < c.window:
            least = c.window * ORDER_BYTES * 2 * (self.ctx.memory_gb / ranges_gb) / 1e9
            raise ConfigError(
                f"job.memory_gb = {self.ctx.memory_gb} is too small for one window of {self.ctx.stage_id} "
                f"({c.window} rows x {ORDER_BYTES} B); set job.memory_gb to at least {least:.3g} or lower order.window"
            )
        offsets = task_offsets(keys)
        spill = self.ctx.plan_dir / "spill"
        shutil.rmtree(spill, ignore_errors=True)
        spill.mkdir(parents=True)
        ranges = self._place(keys.with_row_index(ROW), names, sizes, max_rows, spill)
        report = self._rank(names, sizes, max_rows, spill)
        report["key_ranges"] = ranges

        def per_task(task: int, own: pl.LazyFrame | None) -> pl.DataFrame:
            if own is None:
                return empty
            ids = own.select(*id_cols).collect()
            if not ids.height:
                return empty
            lo = offsets.get(task, 0)
            ranks = pl.scan_parquet(sorted((spill / "rank").glob("*.parquet")), glob=False).filter(
                pl.col(ROW).is_between(lo, lo + ids.height, closed="left")
            )
            ranks = ranks.collect().sort(ROW)
            if ranks.height != ids.height:
                raise StageError(
                    f"{self.ctx.stage_id}: task {task} has {ids.height} rows but {ranks.height} ranks; re-run the plan"
                )
            return ids.with_columns(ranks["order"])

        return Plan(None, report, per_task=per_task, spill=spill)

    def _place(self, indexed: pl.LazyFrame, names: list[str], sizes: list[int], max_rows: int, spill) -> int:
        """Pass 1: rows in each source's curriculum, range by range; spills (row, place, source, value, hash).

        Each key range's rows get their rank in their source (vectorized over all sources), then their
        place: by the closed form for a few sources, else by a merge key and a sort pass (``_merge``).
        """
        c = self.config
        value = -pl.col("_value") if c.direction == "hard_to_easy" else pl.col("_value")
        value = pl.when(value.is_null() | value.is_nan()).then(float("inf")).otherwise(value) + 0.0  # NaN: the hardest
        code = pl.col("source").cast(pl.Enum(names)).to_physical().cast(pl.UInt32).alias("_code")
        frame = indexed.with_columns(code, value.alias("_v"), unit("_h").alias("_u"))
        by = ["_code", "_v", "_u", ROW]
        n, counts = sum(sizes), np.asarray(sizes, dtype=np.int64)
        merge = c.stratify and len(names) > CLOSED_FORM_SOURCES
        if merge and counts.max(initial=0) > MAX_MERGE_ROWS:
            raise StageError(
                f"{self.ctx.stage_id}: a source has {counts.max()} rows; stratified order merges sources "
                f"of up to {MAX_MERGE_ROWS} rows each (split the source, or set order.stratify = false)"
            )
        folder = spill / ("merge" if merge else "place")
        folder.mkdir()
        ranges = key_ranges(frame, by, n, max_rows)
        paced = Paced(c, sizes, self.ctx.memory_gb) if c.pacing != "sorted" else None
        rank = np.zeros(len(names), np.int64)  # rows of each source placed so far
        for i, part in enumerate(ranges.sorted(frame, [*by, "_value", "_h"])):
            if not part.height:
                continue
            if paced is None:
                rows, g = part, part["_code"].to_numpy().astype(np.int64)
                k = within_source(g, rank)
            else:  # a paced source is placed once all its rows are in
                rows, g, k = self._paced(part, paced, rank, counts)
                if rows is None:
                    continue
            out = rows.select(ROW, "_value", "_h").with_columns(pl.Series("_code", g, dtype=pl.UInt32))
            if merge:
                out = out.with_columns(pl.Series("_q", merge_key(k, counts[g]))).sort("_q", "_code")
            else:
                out = out.with_columns(pl.Series("_place", positions(k, g, counts, c.stratify))).sort("_place")
            out.write_parquet(folder / f"{i:05d}.parquet", row_group_size=_SPILL_GROUP)
        if merge:
            self._merge(spill, n, max_rows)
        return len(ranges)

    @staticmethod
    def _paced(part: pl.DataFrame, paced: Paced, rank: np.ndarray, counts: np.ndarray):
        """A key range's rows of the paced sources completed in it: (rows, source codes, ranks in source), or Nones."""
        done = []
        for (g,), rows in part.partition_by("_code", maintain_order=True, as_dict=True).items():
            rank[g] += rows.height
            rows = paced.add(g, rows, done=rank[g] == counts[g])
            if rows is not None:
                done.append((rows, g, paced.within(g)))
        if not done:
            return None, None, None
        return (
            pl.concat([r for r, _, _ in done]),
            np.concatenate([np.full(r.height, g, np.int64) for r, g, _ in done]),
            np.concatenate([k for _, _, k in done]),
        )

    @staticmethod
    def _merge(spill, n: int, max_rows: int) -> None:
        """Pass 1b, for many sources: sort every row by (merge key, source), range by range; its position is its place."""
        keys = pl.scan_parquet(sorted((spill / "merge").glob("*.parquet")), glob=False)
        (spill / "place").mkdir()
        ranges = key_ranges(keys, ["_q", "_code", ROW], n, max_rows)
        lo = 0
        for j, part in enumerate(ranges.sorted(keys, [ROW, "_value", "_h", "_code", "_q"])):
            part = part.select(ROW, "_value", "_h", "_code").with_columns(
                pl.Series("_place", np.arange(lo, lo + part.height, dtype=np.int64))
            )
            part.write_parquet(spill / "place" / f"{j:05d}.parquet", row_group_size=_SPILL_GROUP)
            lo += part.height
        shutil.rmtree(spill / "merge")

    def _rank(self, names: list[str], sizes: list[int], max_rows: int, spill) -> dict:
        """Pass 2: whole windows of places at a time: shuffle inside windows, rank, report; spills (row, rank) by row."""
        c = self.config
        n = sum(sizes)
        (spill / "rank").mkdir()
        span = (max_rows // c.window) * c.window  # whole windows (plan checked that one fits)
        report = Curve(names, sizes, c)
        places = pl.scan_parquet(sorted((spill / "place").glob("*.parquet")), glob=False) if n else None
        for lo in range(0, n, span):
            hi = min(lo + span, n)
            part = places.filter(pl.col("_place").is_between(lo, hi, closed="left")).collect().sort("_place")
            if part.height != hi - lo:
                raise StageError(
                    f"{self.ctx.stage_id}: places {lo}..{hi - 1} hold {part.height} rows; the plan is inconsistent"
                )
            seq = np.arange(part.height, dtype=np.int64)
            if c.shuffle_within_window:
                shuffle_windows(seq, part["_h"].to_numpy(), seed_key("order.shuffle", self.seed), c.window)
            report.add(lo, part["_code"].to_numpy()[seq], part["_value"].to_numpy()[seq])
            ranked = pl.DataFrame({ROW: part[ROW].gather(seq), "order": np.arange(lo, hi, dtype=np.int64)})
            ranked.sort(ROW).write_parquet(spill / "rank" / f"{lo // span:05d}.parquet", row_group_size=_SPILL_GROUP)
        out = report.finish()
        if out["windows_over_tolerance"] and c.stratify:
            log.warning(
                "%s: %d of %d windows deviate from the source shares by more than %s",
                self.ctx.stage_id,
                out["windows_over_tolerance"],
                n // c.window,
                c.tolerance,
            )
        return out

    def apply(self, batch: pl.DataFrame, decision: pl.DataFrame | None = None) -> StageOutput:  # type: ignore[override]
        is_val = (pl.col("split") == "val").fill_null(False) if "split" in batch.columns else pl.lit(False)
        keys = ["id", "repeat"] if "repeat" in batch.columns else ["id"]
        if decision is None:
            decision = pl.DataFrame(schema={"id": pl.String, "repeat": pl.Int32, "order": pl.Int64}).select(
                *keys, "order"
            )
        missing_keys = [k for k in keys if k not in decision.columns]
        if missing_keys:
            raise StageError(f"{self.ctx.stage_id}: the order decision lacks {missing_keys}; re-run the plan")
        base = batch.drop("order") if "order" in batch.columns else batch
        df = base.join(decision.select(*keys, "order"), on=keys, how="left", maintain_order="left")
        lost = df.filter(~is_val & pl.col("order").is_null())
        if lost.height:
            raise StageError(
                f"{self.ctx.stage_id}: {lost.height} training rows (e.g. id {lost['id'][0]!r}) are not in the order plan; re-run the plan"
            )
        df = df.with_columns(pl.when(is_val).then(None).otherwise(pl.col("order")).alias("order"))
        return StageOutput(df, empty_rejects(df))
