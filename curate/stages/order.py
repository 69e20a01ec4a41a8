"""``order``: the curriculum, the order in which the loader will read the training rows.

``collect`` keeps per training row its id (and ``repeat``), source, the ordering value (a
numeric column, or ``length`` = UTF-8 bytes of the text, for a sequence-length warm-up)
and a stable hash of (id, repeat) salted by (seed, source). ``plan`` orders each source's
rows easy-to-hard (or hard-to-easy) under a pacing function (``mixing.pacing``), then
interleaves the sources so every window of ``window`` rows keeps the mixture's source
shares (``mixing.stratify``), or lays them out source by source when ``stratify = false``;
optionally shuffles inside each window, so local order is random while the curriculum
holds at the window scale. The result is an ``order`` column (Int64 rank over training
rows; null for ``val`` rows) by which the runner writes the train shards.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import polars as pl

from curate.errors import ConfigError, StageError
from curate.schema import empty_rejects
from curate.stages.base import Barrier, Plan, StageConfig, StageContext, StageOutput
from curate.stages.mixing.hashing import hash_strings, seed_key, source_salts, to_unit
from curate.stages.mixing.pacing import PACINGS, paced_order
from curate.stages.mixing.stratify import interleave, shuffle_windows, window_counts

log = logging.getLogger(__name__)

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # spreads repeat indices over the salt's bits


@dataclass(kw_only=True, slots=True)
class OrderConfig(StageConfig):
    """What to order by, how fast harder rows enter, and how sources share each window."""

    by: str = "difficulty"  # any numeric column, or "length" (text bytes: short documents first)
    direction: Literal["easy_to_hard", "hard_to_easy"] = "easy_to_hard"
    pacing: Literal["sorted", "linear", "sqrt", "step"] = "sorted"
    start: float = 0.1  # linear/sqrt: fraction of the easiest rows admitted from the first position
    steps: int = 4  # step: number of stages
    stratify: bool = True  # keep source shares in every window; false: source by source
    source_order: list[str] = field(default_factory=list)  # stratify = false: source sequence (default: by name)
    window: int = 1000  # rows per window, for stratification, shuffling and the report
    shuffle_within_window: bool = False
    tolerance: float = 0.02  # windows whose shares deviate more are counted and logged
    seed: int | None = None  # default: the job seed
    report_windows: int = 3  # first and last windows listed in the report

    def __post_init__(self) -> None:
        if self.sources is not None:
            raise ConfigError(f"sources cannot scope this stage (order ranks every training row), got sources={self.sources}")
        if not self.by:
            raise ConfigError("by must name a numeric column or 'length', got ''")
        if self.direction not in ("easy_to_hard", "hard_to_easy"):
            raise ConfigError(f"order.direction = {self.direction!r} is invalid; allowed: 'easy_to_hard' or 'hard_to_easy'")
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
        elif by in train.columns and train.schema[by].is_numeric():
            value = train[by].cast(pl.Float64)
        else:
            found = f"has dtype {train.schema[by]}" if by in train.columns else "is missing"
            raise StageError(f"{self.ctx.stage_id}: by={by!r} must be a numeric column or 'length'; the column {found}")
        salts = source_salts(train["source"], "order", self.seed)
        keys = ["id", "repeat"] if "repeat" in train.columns else ["id"]
        if "repeat" in train.columns:
            salts = salts ^ (train["repeat"].cast(pl.UInt64).to_numpy() * _GOLDEN)
        return train.select(*keys, "source").with_columns(value.alias("_value"), pl.Series("_h", hash_strings(train["id"], salts), dtype=pl.UInt64))

    def plan(self, keys: pl.LazyFrame) -> Plan:
        c = self.config
        schema = keys.collect_schema().names()
        id_cols = ["id", "repeat"] if "repeat" in schema else ["id"]
        if "source" not in schema:  # no rows reached the stage
            return Plan(pl.DataFrame(schema={"id": pl.String, "_task": pl.Int32, "order": pl.Int64}), {"rows": 0})
        names = sorted(keys.select(pl.col("source").unique()).collect().to_series().to_list())
        if not c.stratify and c.source_order:
            unknown = set(c.source_order) - set(names)
            names = [n for n in c.source_order if n in names] + [n for n in names if n not in c.source_order]
            if unknown:
                log.warning("%s: source_order names sources with no training rows: %s", self.ctx.stage_id, sorted(unknown))
        # Pass 1 reads the numbers only; the ids are read once the ranks exist (pass 2).
        code_expr = pl.col("source").cast(pl.Enum(names)).to_physical().alias("_code")
        df = keys.select(code_expr, "_value", "_h").collect()
        codes, value, h = df["_code"].to_numpy(), df["_value"].to_numpy(), df["_h"].to_numpy()
        del df
        seq = self._sequence(codes, value, h, len(names))
        rank = np.empty(len(seq), dtype=np.int64)
        rank[seq] = np.arange(len(seq), dtype=np.int64)
        report = self._report(names, codes[seq], value[seq])
        del seq, codes, value, h
        decision = keys.select(*id_cols, "_task").collect()
        if decision.height != len(rank):
            raise StageError(f"{self.ctx.stage_id}: the keys changed between two reads ({len(rank)} then {decision.height} rows)")
        return Plan(decision.with_columns(pl.Series("order", rank, dtype=pl.Int64)), report)

    def _sequence(self, codes: np.ndarray, value: np.ndarray, h: np.ndarray, n_groups: int) -> np.ndarray:
        """Row indices in reading order (one int64 array, reordered in place group by group)."""
        c = self.config
        seq = np.argsort(codes, kind="stable")
        sizes = np.bincount(codes, minlength=n_groups).tolist()
        start = 0
        for n in sizes:
            rows = seq[start : start + n]
            key = -value[rows] if c.direction == "hard_to_easy" else value[rows]
            rows[:] = rows[paced_order(key, to_unit(h[rows]), pacing=c.pacing, start=c.start, steps=c.steps)]
            start += n
        if c.stratify:
            seq = interleave(seq, sizes)
        if c.shuffle_within_window:
            shuffle_windows(seq, h, seed_key("order.shuffle", self.seed), c.window)
        return seq

    def _report(self, names: list[str], codes_in_order: np.ndarray, value_in_order: np.ndarray) -> dict:
        c = self.config
        n = len(codes_in_order)
        counts = window_counts(codes_in_order, len(names), c.window)
        overall = counts.sum(axis=0) / max(n, 1)
        full = counts[: n // c.window] / c.window  # the last, partial window is not held to the shares
        deviation = np.abs(full - overall) if len(full) else np.zeros((0, len(names)))
        over = int((deviation.max(axis=1) > c.tolerance).sum()) if len(full) else 0
        if over and c.stratify:
            log.warning("%s: %d of %d windows deviate from the source shares by more than %s", self.ctx.stage_id, over, len(full), c.tolerance)
        picks = sorted(set(range(min(c.report_windows, len(counts)))) | set(range(max(len(counts) - c.report_windows, 0), len(counts))))
        table = [{"window": w, **{s: int(counts[w, i]) for i, s in enumerate(names)}} for w in picks]
        value_mean = np.where(np.isfinite(value_in_order), value_in_order, np.nan)
        points = np.array_split(value_mean, min(20, n)) if n else []
        return {
            "by": c.by,
            "direction": c.direction,
            "pacing": c.pacing,
            "stratify": c.stratify,
            "rows": n,
            "window": c.window,
            "windows": len(counts),
            "source_shares": {s: float(overall[i]) for i, s in enumerate(names)},
            "max_share_deviation": float(deviation.max()) if deviation.size else 0.0,
            "windows_over_tolerance": over,
            "window_rows": table,
            # Mean of the ordering column over 20 equal slices of the order: the curriculum's curve.
            "curve": [float(np.nanmean(p)) if np.isfinite(p).any() else None for p in points],
            "null_values": int(np.isnan(value_in_order).sum()),
        }

    def apply(self, batch: pl.DataFrame, decision: pl.DataFrame | None = None) -> StageOutput:  # type: ignore[override]
        is_val = (pl.col("split") == "val").fill_null(False) if "split" in batch.columns else pl.lit(False)
        keys = ["id", "repeat"] if "repeat" in batch.columns else ["id"]
        if decision is None:
            decision = pl.DataFrame(schema={"id": pl.String, "repeat": pl.Int32, "order": pl.Int64}).select(*keys, "order")
        missing_keys = [k for k in keys if k not in decision.columns]
        if missing_keys:
            raise StageError(f"{self.ctx.stage_id}: the order decision lacks {missing_keys}; re-run the plan")
        base = batch.drop("order") if "order" in batch.columns else batch
        df = base.join(decision.select(*keys, "order"), on=keys, how="left", maintain_order="left")
        lost = df.filter(~is_val & pl.col("order").is_null())
        if lost.height:
            raise StageError(f"{self.ctx.stage_id}: {lost.height} training rows (e.g. id {lost['id'][0]!r}) are not in the order plan; re-run the plan")
        df = df.with_columns(pl.when(is_val).then(None).otherwise(pl.col("order")).alias("order"))
        return StageOutput(df, empty_rejects(df))
