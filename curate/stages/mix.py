"""``mix``: the training mixture, as target token shares per source.

``collect`` keeps per training row its id, source, a token estimate (UTF-8 bytes /
``bytes_per_token``, or a count with a ``tokenizers`` JSON file), a stable hash of the id
salted by (seed, source), and the score when selection is quality-aware. ``plan`` turns the
scheme (explicit weights, temperature, UniMax) and the token budget into target tokens per
source and then into a copy count per row (``mixing.selection``): down-sampling drops rows
without replacement (``mix:not_selected``), up-sampling repeats whole passes plus one
partial pass, never more than ``ceil(max_epochs)`` copies of a document. Each source's
random stream depends only on its own rows, the seed and its name, so adding a source does
not reshuffle the others. ``apply`` emits the copies with a ``repeat`` column (0 for the
first copy). ``val`` rows pass through untouched.

The plan holds no per-row state: totals per source give the whole passes, and a partial
pass is "every row before a cut-off in preference order", found in one key range
(``mixing.external``, sized by ``[job] memory_gb``); each task then compares its own rows
with the cut-offs. Any budget gives the same copies and report.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
import polars as pl

from curate.errors import ConfigError, StageError, require
from curate.schema import make_rejects
from curate.stages.base import Barrier, Plan, StageConfig, StageContext, StageOutput
from curate.stages.mixing.external import ROW, before, key_ranges, rows_within, task_offsets
from curate.stages.mixing.hashing import hash_strings, source_salts
from curate.stages.mixing.selection import SELECTIONS, Cut, Share, cut, preference_keys, share
from curate.stages.mixing.weights import SCHEMES, plan_targets
from curate.wholefile import TOKENIZER_BYTES, read_whole

log = logging.getLogger(__name__)

_DEFAULT_SCORE = {"top": "quality", "importance": "dsir_weight"}
_EMPTY = pl.DataFrame(schema={"id": pl.String, "_count": pl.Int32})
MIX_BYTES = 128  # per row of a key range in the plan: code, keys, position, tokens, their sorted copy


@dataclass(kw_only=True, slots=True)
class MixConfig(StageConfig):
    """Mixture scheme, token budget, epoch cap, token estimate and in-source selection."""

    SOURCE_KEYS: ClassVar[tuple[str, ...]] = ("sources", "weights")

    scheme: Literal["explicit", "temperature", "unimax"] | None = None  # default: explicit if weights else temperature
    weights: dict[str, float] = field(default_factory=dict)  # explicit: source -> weight (normalized); absent = 0
    temperature: float = 1.0  # temperature: p ∝ tokens^(1/T); 1 keeps natural proportions
    max_epochs: float = 1.0  # passes over a source at most; a document gets at most ceil(max_epochs) copies
    total_tokens: int | None = None  # default: the largest budget no source's cap forbids (unimax: all tokens)
    bytes_per_token: float = 4.0  # text bytes per token, to estimate token counts without a tokenizer
    tokenizer: str | None = None  # a tokenizers JSON file: count tokens instead of estimating from bytes
    # which rows a down-sampled source keeps: random, the top by score_column, or by importance weight
    select: Literal["random", "top", "importance"] = "random"
    score_column: str | None = None  # default: quality (top), dsir_weight (importance: weights exp(score))
    seed: int | None = None  # default: the job seed

    def __post_init__(self) -> None:
        if self.sources is not None:
            raise ConfigError(f"sources cannot scope this stage (mix sets the shares of the whole mixture), got sources={self.sources}")
        if self.scheme is None:
            self.scheme = "explicit" if self.weights else "temperature"
        if self.scheme not in SCHEMES:
            raise ConfigError(f"mix.scheme = {self.scheme!r} is invalid; allowed: one of {list(SCHEMES)}")
        for name, w in self.weights.items():
            if not (isinstance(w, (int, float)) and math.isfinite(w) and w >= 0):
                raise ConfigError(f"mix.weights.{name} = {w!r} is invalid; allowed: a finite number >= 0")
        if self.scheme == "explicit" and not any(w > 0 for w in self.weights.values()):
            raise ConfigError(f"scheme 'explicit' needs weights with at least one positive value, got weights={self.weights}")
        if not self.temperature > 0:
            raise ConfigError(f"mix.temperature = {self.temperature!r} is invalid; allowed: > 0")
        if not self.max_epochs > 0:
            raise ConfigError(f"mix.max_epochs = {self.max_epochs!r} is invalid; allowed: > 0")
        if self.total_tokens is not None and self.total_tokens < 1:
            raise ConfigError(f"mix.total_tokens = {self.total_tokens!r} is invalid; allowed: >= 1")
        if not self.bytes_per_token > 0:
            raise ConfigError(f"mix.bytes_per_token = {self.bytes_per_token!r} is invalid; allowed: > 0")
        if self.tokenizer is not None and not Path(self.tokenizer).is_file():
            raise ConfigError(f"mix.tokenizer = {self.tokenizer!r} is invalid (no such file, or not a regular file); "
                              "allowed: a tokenizers JSON file")
        if self.select not in SELECTIONS:
            raise ConfigError(f"mix.select = {self.select!r} is invalid; allowed: one of {list(SELECTIONS)}")
        if self.select != "random" and self.score_column is None:
            self.score_column = _DEFAULT_SCORE[self.select]

    @property
    def max_copies(self) -> int:
        return math.ceil(self.max_epochs - 1e-9)


class Mix(Barrier):
    """Samples each source to its target token share of the training mixture."""

    kind = "mix"
    Config = MixConfig
    reasons = ("mix:not_selected",)
    config: MixConfig

    def __init__(self, config: MixConfig, ctx: StageContext) -> None:
        super().__init__(config, ctx)
        self.seed = ctx.seed if config.seed is None else config.seed
        self._tokenizer = None

    # collect ---------------------------------------------------------------------------
    def _tokens(self, text: pl.Series) -> pl.Series:
        if self.config.tokenizer is None:
            return (text.str.len_bytes() / self.config.bytes_per_token).ceil().cast(pl.Int32)
        if self._tokenizer is None:
            tokenizers = require("tokenizers", extra="tokenizers", feature="mix with tokenizer=...")
            data = read_whole(self.config.tokenizer, limit=TOKENIZER_BYTES, what="mix.tokenizer", error=ConfigError)
            self._tokenizer = tokenizers.Tokenizer.from_str(data.decode("utf-8", errors="replace"))
        encoded = self._tokenizer.encode_batch_fast(text.to_list(), add_special_tokens=False)
        return pl.Series([len(e) for e in encoded], dtype=pl.Int32)

    def collect(self, batch: pl.DataFrame) -> pl.DataFrame:
        if "repeat" in batch.columns:
            raise StageError(f"{self.ctx.stage_id}: rows already carry a repeat column; a job may mix only once")
        train = batch.filter(pl.col("split").ne_missing("val")) if "split" in batch.columns else batch
        salts = source_salts(train["source"], "mix", self.seed)
        keys = train.select("id", "source").with_columns(
            self._tokens(train["text"]).alias("_tokens"),
            pl.Series("_h", hash_strings(train["id"], salts), dtype=pl.UInt64),
        )
        if self.config.score_column is not None:
            col = self.config.score_column
            if col not in train.columns:
                raise StageError(f"{self.ctx.stage_id}: select={self.config.select!r} needs the column {col!r}; add a score stage before mix or set score_column")
            keys = keys.with_columns(train[col].cast(pl.Float64).alias("_score"))
        return keys

    # plan ------------------------------------------------------------------------------
    def plan(self, keys: pl.LazyFrame) -> Plan:
        """Per source: whole passes from the token totals, and a partial pass's cut-off key; each task applies them."""
        if "source" not in keys.collect_schema().names():  # no rows reached the stage
            return Plan(None, {"sources": {}}, per_task=lambda task, own: _EMPTY)
        c = self.config
        totals = keys.group_by("source").agg(pl.len().alias("rows"), pl.col("_tokens").cast(pl.Int64).sum().alias("tokens"))
        totals = totals.collect(engine="streaming").sort("source")
        names = totals["source"].to_list()
        rows, available = totals["rows"].to_numpy(), totals["tokens"].to_numpy().astype(np.float64)
        targets = plan_targets(
            names, available, scheme=c.scheme, weights=c.weights, temperature=c.temperature, max_epochs=c.max_epochs, total_tokens=c.total_tokens
        ) if names else None
        shares = [share(available[s], int(rows[s]), targets.tokens[s], c.max_copies) for s in range(len(names))]
        offsets = task_offsets(keys)
        by = ["_code", *(e.meta.output_name() for e in preference_keys(c.select)), ROW]
        indexed = self._sort_keys(keys.with_row_index(ROW), names)
        cuts, ranges = self._cuts(indexed, by, names, rows, shares)
        report = self._report(names, rows, available, targets, shares, cuts, ranges) if names else {"sources": {}}

        def per_task(task: int, own: pl.LazyFrame | None) -> pl.DataFrame:
            if own is None:
                return _EMPTY
            frame = self._sort_keys(own.with_row_index(ROW, offset=offsets.get(task, 0)), names)
            count = pl.col("_code").replace_strict(list(range(len(names))), [sh.passes for sh in shares], return_dtype=pl.Int32)
            for s, c in cuts.items():
                taken = pl.lit(True) if c.key is None else before(by, c.key, inclusive=c.inclusive)
                count = count + ((pl.col("_code") == s) & taken).cast(pl.Int32)
            return frame.select("id", count.alias("_count")).collect()

        return Plan(None, report, per_task=per_task)

    def _sort_keys(self, keys: pl.LazyFrame, names: list[str]) -> pl.LazyFrame:
        code = pl.col("source").cast(pl.Enum(names)).to_physical().cast(pl.UInt32).alias("_code")
        return keys.with_columns(code, *preference_keys(self.config.select))

    def _cuts(self, indexed: pl.LazyFrame, by: list[str], names: list[str], rows: np.ndarray, shares: list[Share]):
        """Each partial pass's ``Cut``, by source code; and how many key ranges were read."""
        partial = [s for s, sh in enumerate(shares) if sh.rest is not None]
        if not partial:
            return {}, 1
        frame = indexed.filter(pl.col("_code").is_in(partial))
        n = int(rows[partial].sum())
        ranges = key_ranges(frame, by, n, rows_within(self.ctx.memory_gb, MIX_BYTES, n, what=f"{self.ctx.stage_id}'s partial passes over {n} rows"))
        sums = frame.group_by(ranges.index().alias("_range"), "_code").agg(pl.len().alias("n"), pl.col("_tokens").cast(pl.Int64).sum().alias("t"))
        sums = sums.collect(engine="streaming").sort("_code", "_range")
        cuts = {}
        for s in partial:
            rest = shares[s].rest
            mine = sums.filter(pl.col("_code") == s)
            total = np.cumsum(mine["t"].to_numpy())
            past = np.flatnonzero(total > rest)  # float compare, as the running totals of one sort would be
            if not len(past):
                cuts[s] = Cut(None, True, int(rows[s]), float(total[-1]))
                continue
            j = int(past[0])
            tokens_before = int(total[j - 1]) if j else 0
            rows_before = int(mine["n"][:j].sum())
            part = frame.filter(ranges.where(int(mine["_range"][j])) & (pl.col("_code") == s)).select(*by, "_tokens")
            part = part.collect(engine="streaming").sort(by)
            running = tokens_before + np.cumsum(part["_tokens"].to_numpy(), dtype=np.int64)
            k, inclusive, taken = cut(running, float(tokens_before), rest)
            cuts[s] = Cut(part.select(by).row(k - 1 if inclusive else k), inclusive, rows_before + k, taken)
        return cuts, len(ranges)

    def _report(self, names, rows, available, targets, shares, cuts, ranges) -> dict:
        realized = np.array([available[s] * sh.passes + (cuts[s].tokens if s in cuts else 0.0) for s, sh in enumerate(shares)])
        total_target, total_realized = targets.tokens.sum(), realized.sum()
        sources = {}
        for s, (name, sh) in enumerate(zip(names, shares)):
            n, k = int(rows[s]), (cuts[s].rows if s in cuts else 0)
            sources[name] = {
                "available_rows": n,
                "available_tokens": int(available[s]),
                "weight": float(targets.weights[s]),
                "target_tokens": int(round(targets.tokens[s])),
                "target_share": float(targets.tokens[s] / total_target) if total_target else 0.0,
                "realized_tokens": int(realized[s]),
                "realized_share": float(realized[s] / total_realized) if total_realized else 0.0,
                "epochs": float(realized[s] / available[s]) if available[s] else 0.0,
                "capped": bool(targets.capped[s]),
                "rows_dropped": n - k if sh.passes == 0 else 0,
                "rows_repeated": n if sh.passes >= 2 else (k if sh.passes == 1 else 0),
                "copies_added": n * (sh.passes - 1) + k if sh.passes >= 1 else 0,
                "max_copies": sh.passes + (1 if k else 0),
            }
        return {"scheme": self.config.scheme, "budget_tokens": int(round(targets.budget)), "realized_tokens": int(total_realized),
                "sources": sources, "key_ranges": ranges}

    # apply -----------------------------------------------------------------------------
    def apply(self, batch: pl.DataFrame, decision: pl.DataFrame | None = None) -> StageOutput:  # type: ignore[override]
        is_val = (pl.col("split") == "val").fill_null(False) if "split" in batch.columns else pl.lit(False)
        if decision is None:
            decision = pl.DataFrame(schema={"id": pl.String, "_count": pl.Int32})
        df = batch.join(decision.select("id", "_count"), on="id", how="left", maintain_order="left")
        df = df.with_columns(pl.when(is_val).then(pl.lit(1, pl.Int32)).otherwise(pl.col("_count")).alias("_count"))
        missing = df.filter(pl.col("_count").is_null())
        if missing.height:
            raise StageError(f"{self.ctx.stage_id}: {missing.height} training rows (e.g. id {missing['id'][0]!r}) are not in the mix plan; re-run the plan")
        counts = df["_count"].to_numpy()
        rejected = make_rejects(df.filter(pl.col("_count") == 0).drop("_count"), "mix:not_selected")
        take = np.repeat(np.arange(df.height), counts)
        first = np.repeat(np.cumsum(counts) - counts, counts)
        kept = df.drop("_count")[take].with_columns(pl.Series("repeat", np.arange(len(take)) - first, dtype=pl.Int32))
        dropped = df.filter(pl.col("_count") == 0).group_by("source").len()
        extra = df.filter(pl.col("_count") > 1).group_by("source").agg((pl.col("_count") - 1).sum())
        counters = {("rows_dropped", s): float(n) for s, n in dropped.iter_rows()}
        counters |= {("copies_added", s): float(n) for s, n in extra.iter_rows()}
        return StageOutput(kept, rejected, repeats=int(np.maximum(counts - 1, 0).sum()), counters=counters)
