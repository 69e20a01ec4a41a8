"""``clean``: Unicode and whitespace normalization, optional mojibake repair, and removal of
boilerplate lines (lines that repeat across many documents of one source).

With boilerplate removal on (``boilerplate_min_docs``) it is a barrier, because boilerplate is
a property of a source, not of a document; without it, a row-local stage:

1. ``collect`` normalizes each document and emits one 64-bit hash per distinct non-blank
   line (plus one row per document, ``h`` null, so the plan can count documents), each with its
   document's key ``d`` (a hash of its lines in order: equal for copies of one document);
2. ``plan`` counts, per source, in how many distinct documents each line hash occurs (copies of
   a document count once: a text repeated in many files is dedup's to keep once, not boilerplate to
   remove from every copy) and writes the hashes at or above both thresholds to
   ``<plan_dir>/boilerplate.parquet``;
3. ``apply`` normalizes again and drops those lines, reporting the counters
   ``("chars_removed", source)`` and ``("lines_removed", source)``.

Everything runs over whole columns. NFC/NFKC (``str.normalize``) runs only on the rows holding
a character the form may change (most real text has none), and there only on the pieces around
non-ASCII characters (``curate.text.forms``); control characters and whitespace go in one
compiled pass (``curate.text.layout``) equal to the expressions of ``normalize_text``. Lines are
split, stripped and hashed in one compiled pass over the column's bytes (``_lines``), and
``apply`` rebuilds every document without its boilerplate lines in another (``_without_lines``,
equal to joining the kept lines, collapsing runs of newlines and stripping the ends). Only
``fix_mojibake`` runs ftfy per row, since ftfy is Python — once per row, in ``apply``: lines are
hashed before the repair (in ``collect`` and ``apply`` alike), and the kept lines are repaired and
normalized after the boilerplate is gone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import numpy as np
import polars as pl

from winnow.curate.dedup.jit import njit
from winnow.curate.dedup.kernels import fmix64
from winnow.curate.dedup.text import string_array, string_buffers
from winnow.curate.errors import ConfigError, StageError, require
from winnow.curate.schema import empty_rejects, make_rejects
from winnow.curate.stages.base import Barrier, Plan, StageConfig, StageContext, StageOutput
from winnow.curate.stats import CounterKey
from winnow.curate.text.codepoints import TABLE, rows_with_byte_at_least
from winnow.curate.text.forms import normalized_rows
from winnow.curate.text.layout import clean_layout
from winnow.curate.text.tokens import hash_bytes, stripped
from winnow.curate.text.words import unify_line_breaks

log = logging.getLogger(__name__)

_HASH_SEED = 0xC1EA
_U64 = np.uint64
_BOILERPLATE_FILE = "boilerplate.parquet"
# Zero-width space, word joiner, byte-order mark, soft hyphen: invisible and never needed.
# ZWJ/ZWNJ (U+200C/U+200D) stay: emoji sequences and Persian or Indic spelling need them.
_INVISIBLE = r"[\x{200b}\x{2060}\x{feff}\x{ad}]"
# Text whose characters all lie below a form's first changed code point is already in that form
# (ICU's "minNoCompCP": U+0300 for NFC, U+00A0 for NFKC). As the UTF-8 lead byte of that
# character: a row holding no byte at or above it is left as it is (0xC2 also admits U+0080-U+009F).
_FIRST_CHANGED_LEAD = {"NFC": 0xCC, "NFKC": 0xC2}


def _visible(text: pl.Expr) -> pl.Expr:
    """Whether a text holds a character other than whitespace and format characters (Unicode Cf: bidi marks and
    isolates, zero-width characters), i.e. anything a reader would see."""
    return text.str.contains(r"[^\s\p{Cf}]")


@dataclass(kw_only=True, slots=True)
class CleanConfig(StageConfig):
    """What ``clean`` normalizes and which lines count as boilerplate."""

    # Unicode normalization form of the text; none: leave it as read
    unicode_form: Literal["NFC", "NFKC", "none"] = "NFC"
    remove_control: bool = True  # control characters other than newline and tab, and zero-width characters
    normalize_whitespace: bool = True  # unify line breaks, collapse spaces, drop trailing spaces, keep paragraph breaks
    fix_mojibake: bool = False  # repair mis-decoded text with ftfy (optional dependency)
    # a line is boilerplate in >= this many distinct documents of its source (copies count once); false: off
    boilerplate_min_docs: int | None = 10
    boilerplate_min_fraction: float = 0.01  # ... and in >= this fraction of the source's documents
    drop_empty: bool = True  # reject documents left empty by cleaning, as ``clean:empty``

    def __post_init__(self) -> None:
        if self.unicode_form not in ("NFC", "NFKC", "none"):
            raise ConfigError(
                f"clean.unicode_form = {self.unicode_form!r} is invalid; allowed: one of 'NFC', 'NFKC', 'none'"
            )
        if self.boilerplate_min_docs is not None and self.boilerplate_min_docs < 2:
            raise ConfigError(
                f"clean.boilerplate_min_docs = {self.boilerplate_min_docs!r} is invalid; allowed: an integer >= 2 "
                f"(a line in one document is not boilerplate) or unset"
            )
        if not 0.0 <= self.boilerplate_min_fraction <= 1.0:
            raise ConfigError(
                f"clean.boilerplate_min_fraction = {self.boilerplate_min_fraction!r} is invalid; allowed: in [0, 1]"
            )


def normalize_text(
    text: pl.Expr,
    *,
    unicode_form: str = "NFC",
    remove_control: bool = True,
    normalize_whitespace: bool = True,
    compiled: bool = True,
) -> pl.Expr:
    """``text`` normalized as ``clean`` does it, as one expression.

    With both ``remove_control`` and ``normalize_whitespace`` (the default), those steps run as one
    compiled pass (``curate.text.layout``) with the result of the expressions below; ``compiled=False``
    runs the expressions themselves.
    """
    if normalize_whitespace:
        text = unify_line_breaks(text)
    if unicode_form != "none":
        text = text.map_batches(lambda s: _unicode_normalized(s, unicode_form), return_dtype=pl.String)
    if compiled and remove_control and normalize_whitespace:
        return text.map_batches(_layout, return_dtype=pl.String)
    if remove_control:
        text = text.str.replace_all(rf"[\p{{Cc}}&&[^\n\t]]|{_INVISIBLE}", "")
    if normalize_whitespace:
        text = (
            text.str.replace_all(r"[^\S\n]+\n", "\n")  # trailing spaces; whitespace-only lines become blank
            .str.replace_all(r"(\S)(?:[^\S\n]{2,}|[^\S \n])", "${1} ")  # inner runs to one space; indentation stays
            .str.replace_all(r"\n{3,}", "\n\n")  # at most one blank line: paragraph breaks survive
            .str.strip_chars()
        )
    return text


def _layout(text: pl.Series) -> pl.Series:
    """Control characters removed and whitespace normalized, compiled (``curate.text.layout``); nulls stay."""
    offsets, data = string_buffers(text.fill_null(""))
    out = pl.Series(text.name, string_array(*clean_layout(offsets, data, TABLE.cover(offsets, data)[0])))
    if text.null_count():
        out = pl.select(pl.when(text.is_null()).then(None).otherwise(out)).to_series().alias(text.name)
    return out


def _unicode_normalized(text: pl.Series, form: str) -> pl.Series:
    """``text.str.normalize(form)``, run only on the rows it may change (most real text is ASCII or Latin), and
    there only on the pieces around non-ASCII characters (``curate.text.forms``)."""
    offsets, data = string_buffers(text)
    rows = np.flatnonzero(rows_with_byte_at_least(offsets, data, _FIRST_CHANGED_LEAD[form]))
    if not len(rows):
        return text
    return text.scatter(rows, normalized_rows(text, offsets, data, rows, form))


@njit(cache=True, nogil=True)
def _lines(offsets, data, props):
    """Every line of every string, split at ``"\\n"`` as ``str.split("\\n")`` splits: ``(row, start, end, h, keyed)``.

    ``[start, end)`` are the line's bytes in ``data``; ``h`` is a 64-bit hash of the line without the
    characters ``str.strip_chars()`` removes at either end, and ``keyed`` is False (``h`` 0) where
    nothing is left, i.e. for a blank line.
    """
    n = offsets.shape[0] - 1
    total = n
    for p in range(offsets[0], offsets[n]):
        total += data[p] == 10
    row = np.empty(total, dtype=np.uint32)
    start = np.empty(total, dtype=np.int64)
    end = np.empty(total, dtype=np.int64)
    h = np.zeros(total, dtype=np.uint64)
    keyed = np.zeros(total, dtype=np.bool_)
    k = 0
    for i in range(n):
        lo, stop = offsets[i], offsets[i + 1]
        while True:
            hi = lo
            while hi < stop and data[hi] != 10:
                hi += 1
            row[k], start[k], end[k] = i, lo, hi
            s, e = stripped(data, lo, hi, props)
            if e > s:
                h[k], keyed[k] = fmix64(hash_bytes(data, s, e) ^ _U64(_HASH_SEED)), True
            k += 1
            if hi == stop:
                break
            lo = hi + 1
    return row, start, end, h, keyed


@njit(cache=True, nogil=True)
def _without_lines(offsets, data, line_row, line_start, line_end, drop, props):
    """Every string of ``offsets``/``data`` rebuilt without its lines where ``drop`` (lines as ``_lines`` gives
    them): the kept lines joined by ``"\\n"``, runs of three or more newlines made two, and the ends stripped
    as ``str.strip_chars()`` does (a no-op on text ``clean`` normalized). ``(offsets, data, removed)``, with
    ``removed`` the lines dropped per string."""
    n = offsets.shape[0] - 1
    out = np.empty(offsets[n] - offsets[0], dtype=np.uint8)
    out_offsets = np.zeros(n + 1, dtype=np.int64)
    removed = np.zeros(n, dtype=np.int64)
    o, k, lines = 0, 0, line_row.shape[0]
    for i in range(n):
        first = k
        while k < lines and line_row[k] == i:
            removed[i] += drop[k]
            k += 1
        begin = o
        newlines = 0  # newlines of the run being written: the third and later of a run are left out
        joined = False
        for j in range(first, k):
            if drop[j]:
                continue
            if joined:
                if newlines < 2:
                    out[o] = 10
                    o += 1
                newlines += 1
            joined = True
            for p in range(line_start[j], line_end[j]):
                out[o] = data[p]
                o += 1
            if line_end[j] > line_start[j]:
                newlines = 0
        s, e = stripped(out, begin, o, props)
        for p in range(s, e):
            out[begin + p - s] = out[p]
        o = begin + e - s
        out_offsets[i + 1] = o
    return out_offsets, out[:o], removed


@njit(cache=True, nogil=True)
def _document_keys(n, row, h):
    """A 64-bit key per string from its lines' hashes in order (``_lines``; blank lines left out): equal for
    strings of the same lines, so copies of one document count once."""
    keys = np.full(n, _U64(_HASH_SEED), dtype=np.uint64)
    for k in range(row.shape[0]):
        if h[k]:
            i = row[k]
            keys[i] = fmix64(keys[i] ^ h[k])  # in order: each line mixed into what its predecessors made
    return keys


@njit(cache=True, nogil=True)
def _first_in_row(row, h):
    """bool per line: is it the first line of its document with its hash (``row`` non-decreasing)?"""
    n = row.shape[0]
    out = np.zeros(n, dtype=np.bool_)
    size = 16
    keys = np.zeros(size, dtype=np.uint64)
    used = np.zeros(size, dtype=np.int64)  # the document a slot was filled for, plus one (0: never)
    start = 0
    while start < n:
        end = start
        while end < n and row[end] == row[start]:
            end += 1
        while size < 2 * (end - start):
            size *= 2
            keys = np.zeros(size, dtype=np.uint64)
            used = np.zeros(size, dtype=np.int64)
        tag = start + 1  # unique per document: a slot of an earlier one reads as empty
        for i in range(start, end):
            k = h[i]
            j = np.int64(k & np.uint64(size - 1))  # polars' hashes: every bit already mixed
            while used[j] == tag and keys[j] != k:
                j = (j + 1) & (size - 1)
            if used[j] != tag:
                used[j], keys[j] = tag, k
                out[i] = True
        start = end
    return out


class Clean(Barrier):
    """Normalizes text and removes lines repeated across many documents of the same source."""

    kind = "clean"
    Config = CleanConfig
    reasons = ("clean:empty", "clean:boilerplate")
    artifacts = 3  # its keys carry each document's key ``d`` (2: without; 1: polars' line hashes)
    config: CleanConfig

    def __init__(self, config: CleanConfig, ctx: StageContext) -> None:
        super().__init__(config, ctx)
        self._ftfy = (
            require("ftfy", package="ftfy", extra="mojibake", feature="clean's fix_mojibake")
            if config.fix_mojibake
            else None
        )
        self._boilerplate: pl.DataFrame | None = None

    @classmethod
    def is_barrier(cls, config: CleanConfig) -> bool:  # type: ignore[override]
        return config.boilerplate_min_docs is not None

    def _repaired(self, batch: pl.DataFrame) -> pl.DataFrame:
        """ftfy's mojibake repair: pure Python, the one per-row step, taken only when asked for."""
        if self._ftfy is None:
            return batch
        return batch.with_columns(pl.col("text").map_elements(self._ftfy.fix_text, return_dtype=pl.String))

    def _normalized(self, batch: pl.DataFrame) -> pl.DataFrame:
        c = self.config
        return batch.with_columns(
            normalize_text(
                pl.col("text"),
                unicode_form=c.unicode_form,
                remove_control=c.remove_control,
                normalize_whitespace=c.normalize_whitespace,
            )
        )

    def collect(self, batch: pl.DataFrame) -> pl.DataFrame:
        docs = batch.select(
            "id", "source", pl.lit(None, dtype=pl.UInt64).alias("h"), pl.lit(None, dtype=pl.UInt64).alias("d")
        )
        if self.config.boilerplate_min_docs is None:
            return docs
        offsets, data = string_buffers(self._normalized(batch.select("text"))["text"])
        row, _, _, h, keyed = _lines(offsets, data, TABLE.cover(offsets, data)[0])
        row, h = row[keyed], h[keyed]
        d = _document_keys(batch.height, row, h)
        first = _first_in_row(row, h)
        # The plan counts documents per source from the rows without a hash (``d``: which of them are copies of
        # one document); a line's row needs no id, only its document's key: a line in n copies counts once.
        lines = pl.DataFrame({"source": batch["source"].gather(row[first]), "h": h[first], "d": d[row[first]]})
        docs = docs.with_columns(d=pl.Series(d))
        return pl.concat([docs, lines.select(pl.lit(None, dtype=pl.String).alias("id"), "source", "h", "d")])

    def plan(self, keys: pl.LazyFrame) -> Plan:
        c = self.config
        rows = keys.filter(pl.col("h").is_null())
        if c.boilerplate_min_docs is None:
            docs = rows.group_by("source").agg(pl.len().alias("docs"))
            return Plan(None, {"docs": dict(docs.collect().sort("source").iter_rows())})
        docs = rows.group_by("source").agg(pl.len().alias("all"), pl.col("d").n_unique().alias("docs"))
        # a line counts once per distinct document: only the lines of documents with copies (usually few) need
        # the (line, document) pairs made unique; the rest are counted as they come
        copies = rows.group_by("source", "d").agg(pl.len().alias("n")).filter(pl.col("n") > 1).select("source", "d")
        lines = keys.filter(pl.col("h").is_not_null()).select("source", "h", "d")
        once = lines.join(copies, on=["source", "d"], how="anti")
        copied = lines.join(copies, on=["source", "d"], how="semi").unique(["source", "h", "d"])
        freq = pl.concat([once, copied]).group_by("source", "h").agg(pl.len().alias("df"))
        found = (
            freq.join(docs, on="source")
            .filter(
                (pl.col("df") >= c.boilerplate_min_docs) & (pl.col("df") >= c.boilerplate_min_fraction * pl.col("docs"))
            )
            .select("source", "h")
            .sort("source", "h")
            .collect()
        )
        self.ctx.plan_dir.mkdir(parents=True, exist_ok=True)
        found.write_parquet(self.ctx.plan_dir / _BOILERPLATE_FILE)
        per_source = dict(found.group_by("source").len().iter_rows())
        counts = docs.collect().sort("source")
        doc_counts = dict(zip(counts["source"], counts["all"]))
        log.info("clean: %d boilerplate lines across %d sources", found.height, len(per_source))
        return Plan(
            None,
            {
                "docs": doc_counts,
                "distinct_docs": dict(zip(counts["source"], counts["docs"])),
                "boilerplate_lines": {s: per_source.get(s, 0) for s in doc_counts},
            },
        )

    def _boilerplate_lines(self) -> pl.DataFrame:
        if self._boilerplate is None:
            path = self.ctx.plan_dir / _BOILERPLATE_FILE
            if not path.exists():
                raise StageError(f"clean ({self.ctx.stage_id}): {path} is missing; plan() must run before apply()")
            self._boilerplate = pl.read_parquet(path, glob=False)
        return self._boilerplate

    def _dropped(self, source: pl.Series, row: np.ndarray, h: np.ndarray, keyed: np.ndarray) -> np.ndarray:
        """bool per line (``_lines``): is it a boilerplate line of its document's source?"""
        boilerplate = self._boilerplate_lines()
        found = np.flatnonzero(keyed & pl.Series(h).is_in(boilerplate["h"].implode()).to_numpy())
        lines = pl.DataFrame({"line": found, "source": source.gather(row[found]), "h": h[found]})
        drop = np.zeros(len(h), dtype=np.bool_)
        drop[lines.join(boilerplate, on=["source", "h"], how="semi")["line"].to_numpy()] = True
        return drop

    def apply(self, batch: pl.DataFrame, decision: pl.DataFrame | None = None) -> StageOutput:
        counters: dict[CounterKey, float] = {}
        boilerplate_only = None  # per row: every visible line it had was boilerplate
        if self.config.boilerplate_min_docs is None:
            cleaned = self._normalized(self._repaired(batch))
        else:
            cleaned = self._normalized(batch)  # the text collect hashed lines of
            offsets, data = string_buffers(cleaned["text"])
            props = TABLE.cover(offsets, data)[0]
            row, start, end, h, keyed = _lines(offsets, data, props)
            drop = self._dropped(batch["source"], row, h, keyed)
            offsets, data, lines_removed = _without_lines(offsets, data, row, start, end, drop, props)
            cleaned = cleaned.with_columns(pl.Series("text", string_array(offsets, data)))
            # Read on the rows left empty alone, whose rebuilt text shows nothing, unless ftfy's repair changes it.
            removed = pl.Series(lines_removed) > 0
            boilerplate_only = (
                removed if self._ftfy is None else cleaned.select(removed & ~_visible(pl.col("text"))).to_series()
            )
            per_source = batch.select("source", pl.Series("n", lines_removed)).group_by("source").sum()
            for source, n in per_source.iter_rows():
                counters[("lines_removed", source)] = float(n)
            if self._ftfy is not None:
                cleaned = self._normalized(self._repaired(cleaned))
        removed = batch.select("source", (pl.col("text").str.len_chars() - cleaned["text"].str.len_chars()).alias("n"))
        for source, n in removed.group_by("source").sum().iter_rows():
            counters[("chars_removed", source)] = float(n)
        if not self.config.drop_empty:
            return StageOutput(cleaned, empty_rejects(batch), counters=counters)
        # empty: nothing visible is left (format characters such as bidi marks alone are no text)
        empty = ~cleaned.select(_visible(pl.col("text")))["text"]
        # Rejects keep the original text, so a user sees what was there; a document whose lines were all
        # boilerplate is told apart from one that was empty (or invisible) to begin with.
        if boilerplate_only is None:
            rejected = make_rejects(batch.filter(empty), "clean:empty")
        else:
            reason = (
                pl.when(pl.col("_boilerplate_only")).then(pl.lit("clean:boilerplate")).otherwise(pl.lit("clean:empty"))
            )
            rejected = make_rejects(
                batch.with_columns(boilerplate_only.alias("_boilerplate_only")).filter(empty), reason
            )
            rejected = rejected.drop("_boilerplate_only")
        return StageOutput(cleaned.filter(~empty), rejected, counters=counters)
