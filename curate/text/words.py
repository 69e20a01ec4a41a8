"""Word tokens and lines as whole columns, for metrics that filters and scores share.

The tokenizer is one Rust regex run by polars over the whole column. It approximates
the spaCy English tokenizer that datatrove uses for its Gopher and FineWeb filters
(``datatrove.utils.text.split_into_words``): text is split on whitespace, punctuation
becomes tokens of its own, ``'s``/``n't``-style contractions split off, while URLs,
acronyms (``e.g.``, ``U.S.``) and numbers with separators (``3.5``, ``1,000``) stay
whole. Where it differs (spaCy's hand-written exceptions such as ``Mr.``, or ``C(x``
kept as one token because ``(`` is no infix for spaCy), counts move by a token or two
per document, which changes a decision only for documents sitting on a threshold;
``bench/filters.py`` measures how often.
"""

from __future__ import annotations

import polars as pl

#: One token per match; alternatives are tried left to right at each position.
TOKEN_PATTERN = (
    r"(?:https?://|www\.)[^\s<>\"'`]*[^\s<>\"'`.,;:!?)\]}]"  # URL; trailing punctuation splits off
    r"|(?:\p{L}\.){2,}"  # acronyms: e.g. / U.S.
    r"|(?i:['’](?:s|re|ve|ll|d|m|t))\b"  # contraction suffixes: 's 're 've 'll 'd 'm 't
    # A word keeps inner punctuation (self.rawdata, 1,000, 2**32, 1.5.2b2) except spaCy's infixes
    # (- ' = / : < >), which split it only when a letter follows (e-mail, a=b; not utf-8, 12:30, n=1).
    r"|\w+(?:[^\s\w'’\-=/:<>]+\w+|[\-=/:<>]\p{N}\w*)*"
    r"|[+.]\w+"  # a leading plus or dot stays on its word: +0200, .py
    r"|\.{2,}|-{2,}|={2,}|'{2,}|\*{2,}|#{2,}|~{2,}|\+{2,}|\):"  # runs spaCy keeps whole: ... -- == '' ):
    r"|[^\w\s]"  # any other symbol is a token of its own
)
#: A token with none of these is a "symbol word" (Gopher's non-symbol words have at least one).
WORD_CHAR = r"[\p{L}\p{N}\p{M}]"
#: Line breaks ``str.splitlines`` knows, unified to ``\n`` before line metrics.
LINE_BREAKS = r"\r\n|[\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]"


def unify_line_breaks(text: pl.Expr) -> pl.Expr:
    """``text`` with every line break ``str.splitlines`` recognises replaced by ``\\n``."""
    return text.str.replace_all(LINE_BREAKS, "\n")


def token_table(text: pl.Series, *, hash_seed: int | None = None) -> pl.DataFrame:
    """One row per token: ``row`` (index into ``text``), ``tok`` and ``chars``; ``h`` when ``hash_seed`` is set.

    Documents without tokens contribute no row; use ``np.bincount(row, minlength=len(text))``
    or a join on ``row`` to get per-document values back.
    """
    frame = pl.DataFrame({"text": text}).select(
        pl.int_range(pl.len(), dtype=pl.UInt32).alias("row"), pl.col("text").str.extract_all(TOKEN_PATTERN).alias("tok")
    )
    tokens = frame.explode("tok").drop_nulls("tok")
    cols = [pl.col("tok").str.len_chars().cast(pl.Int64).alias("chars")]
    if hash_seed is not None:
        cols.append(pl.col("tok").hash(seed=hash_seed).alias("h"))
    return tokens.with_columns(cols)


def per_row(values: pl.DataFrame, n_docs: int, fill: dict[str, object]) -> pl.DataFrame:
    """Spread ``values`` (keyed by ``row``) back to one row per document, filling documents it lacks."""
    rows = pl.DataFrame({"row": pl.arange(0, n_docs, dtype=pl.UInt32, eager=True)})
    out = rows.join(values, on="row", how="left", maintain_order="left")
    return out.with_columns([pl.col(c).fill_null(v) for c, v in fill.items()]).drop("row")


def count_lines(text: pl.Expr) -> pl.Expr:
    """Number of lines as ``str.splitlines`` counts them (no trailing empty line; 0 for empty text)."""
    text = unify_line_breaks(text)
    n = text.str.count_matches("\n") + 1 - text.str.ends_with("\n").cast(pl.UInt32)
    return pl.when(text.str.len_bytes() == 0).then(0).otherwise(n).cast(pl.Int64)
