"""The Gopher repetition metrics as winnow computed them with polars regexes and one kernel pass per n-gram size.

A frozen reference for ``test_repetition_kernel.py``: the compiled single pass
(``curate.text.repetition``) must give every metric equal to these, document by document.
The token pattern is the one of ``curate.text.words`` when this reference was taken. The
kernels are not cached on disk: numba's cache finds a function's module by name, and test
runs import this file under more than one.
"""

from __future__ import annotations

import numba as nb
import numpy as np
import polars as pl

from winnow.curate.stages.filters.gopher_repetition import repetition_fractions

TOKEN_PATTERN = (
    r"(?:https?://|www\.)[^\s<>\"'`]*[^\s<>\"'`.,;:!?)\]}]"
    r"|(?:\p{L}\.){2,}"
    r"|(?i:['’](?:s|re|ve|ll|d|m|t))\b"
    r"|\w+(?:[^\s\w'’\-=/:<>]+\w+|[\-=/:<>]\p{N}\w*)*"
    r"|[+.]\w+"
    r"|\.{2,}|-{2,}|={2,}|'{2,}|\*{2,}|#{2,}|~{2,}|\+{2,}|\):"
    r"|[^\w\s]"
)
_HASH_SEED = 0x5EED
_MIX = np.uint64(0x9E3779B97F4A7C15)


@nb.njit(inline="always")
def _ngram_key(h, start, n):
    key = np.uint64(0xCBF29CE484222325)
    for j in range(start, start + n):
        key = (key ^ h[j]) * np.uint64(0x100000001B3)
        key ^= key >> np.uint64(29)
    return key


@nb.njit(inline="always")
def _slot(keys, stamps, gen, key, mask):
    i = np.int64((key * _MIX) >> np.uint64(40)) & mask
    while stamps[i] == gen and keys[i] != key:
        i = (i + 1) & mask
    return i


@nb.njit
def _table_size(offsets):
    longest = 0
    for d in range(len(offsets) - 1):
        longest = max(longest, offsets[d + 1] - offsets[d])
    size = 16
    while size < 2 * longest + 2:
        size *= 2
    return size


@nb.njit
def top_ngram_chars(h, chars, offsets, n):
    n_docs = len(offsets) - 1
    out = np.full(n_docs, -1, dtype=np.int64)
    size = _table_size(offsets)
    keys = np.zeros(size, dtype=np.uint64)
    stamps = np.zeros(size, dtype=np.int64)
    counts = np.zeros(size, dtype=np.int64)
    first = np.zeros(size, dtype=np.int64)
    for d in range(n_docs):
        lo, hi = offsets[d], offsets[d + 1]
        m = hi - lo - n + 1
        if m <= 0:
            continue
        gen = d + 1
        cap = 16
        while cap < 2 * m + 2:
            cap *= 2
        mask = cap - 1
        best_count, best_first = 0, 0
        for i in range(lo, lo + m):
            key = _ngram_key(h, i, n)
            s = _slot(keys, stamps, gen, key, mask)
            if stamps[s] != gen:
                stamps[s], keys[s], counts[s], first[s] = gen, key, 0, i
            counts[s] += 1
            c = counts[s]
            if c > best_count or (c == best_count and first[s] < best_first):
                best_count, best_first = c, first[s]
        length = n - 1
        for j in range(best_first, best_first + n):
            length += chars[j]
        out[d] = length * best_count
    return out


@nb.njit
def duplicate_ngram_chars(h, chars, offsets, n):
    n_docs = len(offsets) - 1
    out = np.zeros(n_docs, dtype=np.int64)
    size = _table_size(offsets)
    keys = np.zeros(size, dtype=np.uint64)
    stamps = np.zeros(size, dtype=np.int64)
    for d in range(n_docs):
        lo, hi = offsets[d], offsets[d + 1]
        gen = d + 1
        cap = 16
        while cap < 2 * (hi - lo) + 2:
            cap *= 2
        mask = cap - 1
        repeated = 0
        i = lo
        while i < hi - n + 1:
            key = _ngram_key(h, i, n)
            s = _slot(keys, stamps, gen, key, mask)
            if stamps[s] == gen:
                for j in range(i, i + n):
                    repeated += chars[j]
                i += n
            else:
                stamps[s], keys[s] = gen, key
                i += 1
        out[d] = repeated
    return out


def token_table(text: pl.Series) -> pl.DataFrame:
    frame = pl.DataFrame({"text": text}).select(
        pl.int_range(pl.len(), dtype=pl.UInt32).alias("row"), pl.col("text").str.extract_all(TOKEN_PATTERN).alias("tok")
    )
    tokens = frame.explode("tok").drop_nulls("tok")
    return tokens.with_columns(
        pl.col("tok").str.len_chars().cast(pl.Int64).alias("chars"), pl.col("tok").hash(seed=_HASH_SEED).alias("h")
    )


def _per_row(values: pl.DataFrame, n_docs: int, fill: dict[str, object]) -> pl.DataFrame:
    rows = pl.DataFrame({"row": pl.arange(0, n_docs, dtype=pl.UInt32, eager=True)})
    out = rows.join(values, on="row", how="left", maintain_order="left")
    return out.with_columns([pl.col(c).fill_null(v) for c, v in fill.items()]).drop("row")


def _segment_duplicates(text: pl.Series, segments: pl.Expr, prefix: str) -> pl.DataFrame:
    parts = (
        pl.DataFrame({"text": text})
        .select(pl.int_range(pl.len(), dtype=pl.UInt32).alias("row"), segments.alias("seg"))
        .explode("seg")
        .with_columns(pl.col("seg").hash(seed=_HASH_SEED).alias("h"), pl.col("seg").str.len_chars().alias("chars"))
    )
    groups = parts.group_by("row", "h").agg(pl.len().alias("n"), pl.col("chars").first())
    dup = groups.group_by("row").agg(
        pl.col("n").sum().alias(f"{prefix}s"),
        (pl.col("n") - 1).sum().alias(f"{prefix}_dups"),
        ((pl.col("n") - 1) * pl.col("chars")).sum().alias(f"{prefix}_dup_chars"),
    )
    return _per_row(dup, len(text), {f"{prefix}s": 0, f"{prefix}_dups": 0, f"{prefix}_dup_chars": 0})


def reference_metrics(text: pl.Series, top_ns=(2, 3, 4), dup_ns=(5, 6, 7, 8, 9, 10)) -> pl.DataFrame:
    """The metric columns of ``filter.gopher_repetition`` for ``text``, computed the reference way."""
    t = pl.col("text")
    paras = _segment_duplicates(text, t.str.strip_chars().str.split(r"\n{2,}", literal=False), "para")
    lines = _segment_duplicates(text, t.str.split(r"\n+", literal=False), "line")
    tokens = token_table(text)
    h, chars = tokens["h"].to_numpy(), tokens["chars"].to_numpy()
    counts = (
        np.bincount(tokens["row"].to_numpy(), minlength=len(text))
        if tokens.height
        else np.zeros(len(text), dtype=np.int64)
    )
    offsets = np.zeros(len(text) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    ngrams = {f"gopher_top_{n}gram_frac": top_ngram_chars(h, chars, offsets, n) for n in top_ns}
    ngrams |= {f"gopher_dup_{n}gram_frac": duplicate_ngram_chars(h, chars, offsets, n) for n in dup_ns}
    chars = pl.DataFrame({"chars": text.str.len_chars()})
    frame = pl.concat([chars, paras, lines, pl.DataFrame(ngrams)], how="horizontal")
    return repetition_fractions(
        frame, list(ngrams)
    )  # the division of counts is shared; the counts are what is compared
