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

from winnow.curate.errors import ConfigError, StageError, require
from winnow.curate.schema import make_rejects
from winnow.curate.stages.base import Barrier, Plan, StageConfig, StageContext, StageOutput
from winnow.curate.stages.mixing.cuts import Cuts, find_cuts
from winnow.curate.stages.mixing.external import ROW, rows_within, task_offsets
from winnow.curate.stages.mixing.hashing import hash_strings, source_salts
from winnow.curate.stages.mixing.selection import SELECTIONS, preference_keys, share
from winnow.curate.stages.mixing.weights import SCHEMES, plan_targets
from winnow.curate.wholefile import TOKENIZER_BYTES, read_whole

log = logging.getLogger(__name__)

_DEFAULT_SCORE = {"top": "quality", "importance": "dsir_weight"}
_EMPTY = pl.DataFrame(schema={"id": pl.String, "_count": pl.Int32})
MIX_BYTES = 128  # per row of a key range in the plan: code, keys, position, tokens, their sorted copy


MAX_EPOCHS = 1e6  # passes over a source: a document's copies are counted in 64-bit integers


@dataclass(kw_only=True, slots=True)
class MixConfig(StageConfig):
    """Mixture scheme, token budget, epoch cap, token estimate and in-source selection."""

    SOURCE_KEYS: ClassVar[tuple[str, ...]] = ("sources", "weights")
    SCOPED: ClassVar[bool] = False

    scheme: Literal["explicit", "temperature", "unimax"] | None = None  # default: explicit if weights else temperature
    weights: dict[str, float] = field(default_factory=dict)  # explicit: source -> weight (normalized); absent = 0
    # temperature: p ∝ tokens^(1/T); 1 keeps natural proportions, inf gives every source the same share
    temperature: float = field(default=1.0, metadata={"infinite": True})
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
            raise ConfigError(
                f"sources cannot scope this stage (mix sets the shares of the whole mixture), got sources={self.sources}"
            )
        if self.scheme is None:
            self.scheme = "explicit" if self.weights else "temperature"
        if self.scheme not in SCHEMES:
            raise ConfigError(f"mix.scheme = {self.scheme!r} is invalid; allowed: one of {list(SCHEMES)}")
        if self.scheme != "explicit" and self.weights:
            raise ConfigError(
                f"mix.weights are read by scheme = 'explicit' only, and scheme = {self.scheme!r} sets the shares "
                "itself; leave weights out, or set scheme = 'explicit'"
            )
        for name, w in self.weights.items():
            if not (isinstance(w, (int, float)) and math.isfinite(w) and w >= 0):
                raise ConfigError(f"mix.weights.{name} = {w!r} is invalid; allowed: a finite number >= 0")
        if self.scheme == "explicit" and not any(w > 0 for w in self.weights.values()):
            raise ConfigError(
                f"scheme 'explicit' needs weights with at least one positive value, got weights={self.weights}"
            )
        if not self.temperature > 0:
            raise ConfigError(f"mix.temperature = {self.temperature!r} is invalid; allowed: > 0")
        if not 0 < self.max_epochs <= MAX_EPOCHS:
            raise ConfigError(f"mix.max_epochs = {self.max_epochs!r} is invalid; allowed: > 0 and <= {MAX_EPOCHS:g}")
        if self.total_tokens is not None and self.total_tokens < 1:
            raise ConfigError(f"mix.total_tokens = {self.total_tokens!r} is invalid; allowed: >= 1")
        if not 0.1 <= self.bytes_per_token <= 1000:  # real tokenizers: about 1 (bytes) to 10 bytes per token
            raise ConfigError(
                f"mix.bytes_per_token = {self.bytes_per_token!r} is invalid; allowed: from 0.1 to 1000 (text bytes per "
                "token: 1 for bytes, about 4 for a BPE on English)"
            )
        if self.tokenizer is not None and not Path(self.tokenizer).is_file():
            raise ConfigError(
                f"mix.tokenizer = {self.tokenizer!r} is invalid (no such file, or not a regular file); "
                "allowed: a tokenizers JSON file"
            )
        if self.select not in SELECTIONS:
            raise ConfigError(f"mix.select = {self.select!r} is invalid; allowed: one of {list(SELECTIONS)}")
        if self.select == "random" and self.score_column is not None:
            raise ConfigError(
                f"mix.score_column = {self.score_column!r} is read by select = 'top' or 'importance' only; "
                "set one of those, or leave score_column out (select = 'random' keeps rows by a hash of their id)"
            )
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
            self._tokenizer.encode_special_tokens = True  # counted as the tokens output writes them
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
                raise StageError(
                    f"{self.ctx.stage_id}: select={self.config.select!r} needs the column {col!r}; add a score stage before mix or set score_column"
                )
            if not train.schema[col].is_numeric():
                raise StageError(
                    f"{self.ctx.stage_id}: select={self.config.select!r} ranks rows by score_column {col!r}, which "
                    f"holds {train.schema[col]} values; name a numeric column (a score stage's, or a kept field "
                    "typed float64)"
                )
            keys = keys.with_columns(train[col].cast(pl.Float64).alias("_score"))
        return keys

    # plan ------------------------------------------------------------------------------
    def plan(self, keys: pl.LazyFrame) -> Plan:
        """Per source: whole passes from the token totals, and a partial pass's cut-off key; each task applies them."""
        if "source" not in keys.collect_schema().names():  # no rows reached the stage
            return Plan(None, {"sources": {}}, per_task=lambda task, own: _EMPTY)
        c = self.config
        totals = keys.group_by("source").agg(
            pl.len().alias("rows"), pl.col("_tokens").cast(pl.Int64).sum().alias("tokens")
        )
        totals = totals.collect(engine="streaming").sort("source")
        names = totals["source"].to_list()
        rows, available = totals["rows"].to_numpy(), totals["tokens"].to_numpy().astype(np.float64)
        present = set(names)
        without_rows = sorted(n for n, w in c.weights.items() if w > 0 and n not in present)
        if without_rows:  # its share goes to the others: say so, never rescale silently
            log.warning(
                "%s: sources %s have a weight but no rows left when the mix is planned (check the stages "
                "before it, or the source names); the other sources' shares are scaled up to fill the mixture",
                self.ctx.stage_id,
                without_rows,
            )
        targets = (
            plan_targets(
                names,
                available,
                scheme=c.scheme,
                weights=c.weights,
                temperature=c.temperature,
                max_epochs=c.max_epochs,
                total_tokens=c.total_tokens,
            )
            if names
            else None
        )
        shares = [share(available[s], int(rows[s]), targets.tokens[s], c.max_copies) for s in range(len(names))]
        offsets = task_offsets(keys)
        by = ["_code", *(e.meta.output_name() for e in preference_keys(c.select)), ROW]
        rest = np.array([np.nan if sh.rest is None else sh.rest for sh in shares], dtype=np.float64)
        what = f"{self.ctx.stage_id}'s partial passes"
        cuts = find_cuts(
            self._sort_keys(keys.with_row_index(ROW), names),
            by,
            rows,
            rest,
            lambda n: rows_within(self.ctx.memory_gb, MIX_BYTES, n, what=f"{what} over {n} rows"),
        )
        report = self._report(names, rows, available, targets, shares, cuts) if names else {"sources": {}}
        starved = [
            n
            for n, r in report["sources"].items()
            if r["weight"] > 0 and r["available_rows"] and not r["realized_tokens"]
        ]
        if starved:
            log.warning(
                "%s: sources %s have a weight but no row fits their target at a budget of %d tokens (every row is a "
                "mix:not_selected reject); raise total_tokens, or leave it unset for the largest budget the epoch cap allows",
                self.ctx.stage_id,
                starved,
                report["budget_tokens"],
            )
        report["weights_without_rows"] = without_rows
        self._warn_unscored(keys, [n for n, sh in zip(names, shares) if sh.rest is not None])
        passes = np.array([sh.passes for sh in shares], dtype=np.int32)
        sorted_names = pl.Series(names, dtype=pl.String)  # sorted: a task's sources find their codes by search

        def per_task(task: int, own: pl.LazyFrame | None) -> pl.DataFrame:
            if own is None:
                return _EMPTY
            frame = own.with_row_index(ROW, offset=offsets.get(task, 0)).with_columns(*preference_keys(c.select))
            frame = frame.select("id", "source", *by[1:]).collect()
            code = sorted_names.search_sorted(frame["source"]).to_numpy().astype(np.int64)
            count = passes[code] + cuts.taken(code, frame)
            return frame.select("id", pl.Series("_count", count, dtype=pl.Int32))

        return Plan(None, report, per_task=per_task)

    def _warn_unscored(self, keys: pl.LazyFrame, partial: list[str]) -> None:
        """Say which sources the mix selects part of without a score on any row: their rows are then kept by the
        seeded hash of their ids, as with select = 'random', whatever ``select`` says."""
        if self.config.score_column is None or not partial:
            return
        scored = (
            keys.filter(pl.col("source").is_in(partial)).group_by("source").agg(pl.col("_score").is_not_null().any())
        )
        unscored = sorted(scored.filter(~pl.col("_score")).collect()["source"].to_list())
        if unscored:
            log.warning(
                "%s: select = %r keeps part of sources %s, but none of their rows has a %r score, so their rows are "
                "kept at random (by a hash of their ids); score those sources (the score stage's sources), or name "
                "another score_column",
                self.ctx.stage_id, self.config.select, unscored, self.config.score_column,
            )  # fmt: skip

    def _sort_keys(self, keys: pl.LazyFrame, names: list[str]) -> pl.LazyFrame:
        code = pl.col("source").cast(pl.Enum(names)).to_physical().cast(pl.UInt32).alias("_code")
        return keys.with_columns(code, *preference_keys(self.config.select))

    def _report(self, names, rows, available, targets, shares, cuts: Cuts) -> dict:
        passes = np.array([sh.passes for sh in shares], dtype=np.int64)
        k = cuts.rows
        realized = available * passes + cuts.tokens
        total_target, total_realized = targets.tokens.sum(), realized.sum()
        target_share = targets.tokens / total_target if total_target else np.zeros(len(names))
        realized_share = realized / total_realized if total_realized else np.zeros(len(names))
        epochs = np.divide(realized, available, out=np.zeros(len(names)), where=available > 0)
        dropped = np.where(passes == 0, rows - k, 0)
        repeated = np.where(passes >= 2, rows, np.where(passes == 1, k, 0))
        added = np.where(passes >= 1, rows * (passes - 1) + k, 0)
        copies = passes + (k > 0)
        sources = {
            name: {
                "available_rows": int(rows[s]),
                "available_tokens": int(available[s]),
                "weight": float(targets.weights[s]),
                "target_tokens": int(round(targets.tokens[s])),
                "target_share": float(target_share[s]),
                "realized_tokens": int(realized[s]),
                "realized_share": float(realized_share[s]),
                "epochs": float(epochs[s]),
                "capped": bool(targets.capped[s]),
                "rows_dropped": int(dropped[s]),
                "rows_repeated": int(repeated[s]),
                "copies_added": int(added[s]),
                "max_copies": int(copies[s]),
            }
            for s, name in enumerate(names)
        }
        return {
            "scheme": self.config.scheme,
            "budget_tokens": int(round(targets.budget)),
            "budget_set_by": targets.set_by,
            "realized_tokens": int(total_realized),
            "sources": sources,
            "key_ranges": cuts.ranges,
        }

    # apply -----------------------------------------------------------------------------
    def apply(self, batch: pl.DataFrame, decision: pl.DataFrame | None = None) -> StageOutput:  # type: ignore[override]
        is_val = (pl.col("split") == "val").fill_null(False) if "split" in batch.columns else pl.lit(False)
        if decision is None:
            decision = pl.DataFrame(schema={"id": pl.String, "_count": pl.Int32})
        df = batch.join(decision.select("id", "_count"), on="id", how="left", maintain_order="left")
        df = df.with_columns(pl.when(is_val).then(pl.lit(1, pl.Int32)).otherwise(pl.col("_count")).alias("_count"))
        missing = df.filter(pl.col("_count").is_null())
        if missing.height:
            raise StageError(
                f"{self.ctx.stage_id}: {missing.height} training rows (e.g. id {missing['id'][0]!r}) are not in the mix plan; re-run the plan"
            )
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
