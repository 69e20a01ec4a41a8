"""The compiled Gopher repetition pass: the regex's tokens, and every metric equal to the reference computation."""

from __future__ import annotations

import gzip
import inspect
import io
import random
from functools import cache
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import zstandard

from tests.curate.gopher_repetition_reference import reference_metrics
from winnow.curate.dedup.text import string_buffers
from winnow.curate.stages.filters.gopher_repetition import gopher_repetition_metrics
from winnow.curate.text.codepoints import LETTER, NUMBER, SPACE, STRIP, TABLE, WORD
from winnow.curate.text.repetition import _scan, repetition_counts
from winnow.curate.text.tokens import A_NUMBER, A_SPACE, A_WORD, ASCII, token_spans
from winnow.curate.text.words import TOKEN_PATTERN

SAMPLES = Path(__file__).resolve().parents[2] / "data_samples"
# Characters that exercise every alternative and class of TOKEN_PATTERN: Unicode letters, marks and numbers,
# spaces the regex knows and ones it does not, both apostrophes, the long s and Kelvin sign (case folding),
# URL prefixes and the symbols with rules of their own.
ALPHABET = [
    *"aZs S t T r R e v l L d m M h w _ 0 9",
    "é",
    "ſ",
    "K",
    "ǅ",
    "²",
    "½",
    "Ⅻ",
    "٣",
    "中",
    "🙂",
    "\u0301",
    "\u200b",
    " ",
    "  ",
    "\n",
    "\n\n",
    "\t",
    "\r\n",
    "\u00a0",
    "\u2028",
    "\u0085",
    "\x1c",
    "\x0b",
    *".,;:!?'’\"`-=/<>()[]{}*#~+@$%^&|\\",
    "http://",
    "https://",
    "www.",
    "...",
    "--",
    "):",
    "e.g.",
    "U.S.",
]


def _fuzz(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 40))) for _ in range(n)]


@cache
def sample_texts() -> tuple[str, ...]:
    """Every document of data_samples/ (the JSONL, Parquet and text files)."""
    out: list[str] = []
    for path in sorted(SAMPLES.glob("*/*")):
        if path.suffix == ".parquet":
            out += pl.read_parquet(path, columns=["text"])["text"].to_list()
        elif path.suffix in (".jsonl", ".gz", ".zst"):
            raw = path.read_bytes()
            raw = gzip.decompress(raw) if path.suffix == ".gz" else raw
            raw = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw)).read() if path.suffix == ".zst" else raw
            frame = pl.read_ndjson(io.BytesIO(b"\n".join(line for line in raw.splitlines() if line.startswith(b"{"))),
                                   ignore_errors=True, schema={"text": pl.String})  # fmt: skip
            out += [t for t in frame["text"].to_list() if t is not None]
        elif path.parent.name == "legal":
            out.append(path.read_text("utf-8", errors="replace"))
    return tuple(out)


@cache
def long_texts() -> tuple[str, ...]:
    """Long documents: standard-library sources and their docstrings, the licence texts joined, and heavy repeats."""
    import argparse
    import email.message
    import typing

    sources = [inspect.getsource(m) for m in (argparse, typing, inspect, email.message)]
    docs = [
        "\n\n".join(inspect.getdoc(o) or "" for o in vars(m).values() if callable(o))
        for m in (argparse, inspect, email.message)
    ]
    legal = "\n\n".join(t for t in sample_texts() if "Copyright" in t[:2000])[:2_000_000]
    paragraph = "A paragraph that comes back again and again, with its own words: e.g. U.S. don't — done.\n\n"
    return (*sources, *docs, legal, paragraph * 3000, ("line one\nline one\n" * 5000) + "the end")


def _regex_tokens(texts: list[str]) -> tuple[list[int], list[str]]:
    frame = (
        pl.DataFrame({"t": texts}, schema={"t": pl.String})
        .select(pl.int_range(pl.len()).alias("row"), pl.col("t").str.extract_all(TOKEN_PATTERN).alias("tok"))
        .explode("tok")
        .drop_nulls("tok")
    )
    return frame["row"].to_list(), frame["tok"].to_list()


def _scanner_tokens(texts: list[str]) -> tuple[list[int], list[str]]:
    offsets, data = string_buffers(pl.Series(texts, dtype=pl.String))
    rows, starts, ends = token_spans(offsets, data, *TABLE.cover(offsets, data))
    return rows.tolist(), [bytes(data[a:b]).decode() for a, b in zip(starts, ends)]


@pytest.mark.parametrize("texts", [_fuzz(3000), _fuzz(300, seed=1) + ["", " ", "x"]], ids=["fuzz", "fuzz-short"])
def test_scanner_gives_the_regex_tokens_on_adversarial_text(texts):
    assert _scanner_tokens(texts) == _regex_tokens(texts)


def test_scanner_gives_the_regex_tokens_on_sample_and_long_documents():
    texts = [*sample_texts(), *long_texts()]
    assert _scanner_tokens(texts) == _regex_tokens(texts)


def test_ascii_classes_are_the_regex_engines():
    props = TABLE.props[:128]
    for bit, a_bit in ((WORD, A_WORD), (SPACE, A_SPACE), (NUMBER, A_NUMBER)):
        assert np.array_equal((props & bit) != 0, (ASCII & a_bit) != 0)


def test_code_point_classes_come_from_the_regex_engine():
    chars = ["a", "é", "ſ", "K", "²", "\u00a0", "\u0085", "\x1c", "\u200b", "\u0301", "中"]
    offsets, data = string_buffers(pl.Series(chars))
    props, fold = TABLE.cover(offsets, data)
    series = pl.Series(chars)
    for pattern, bit in ((r"^\w$", WORD), (r"^\s$", SPACE), (r"^\p{L}$", LETTER), (r"^\p{N}$", NUMBER)):
        assert [bool(props[ord(c)] & bit) for c in chars] == series.str.contains(pattern).to_list(), pattern
    assert [bool(props[ord(c)] & STRIP) for c in chars] == (series.str.strip_chars() == "").to_list()
    assert chr(fold[ord("ſ")]) == "s" and chr(fold[ord("S")]) == "s" and fold[ord("K")] == 0  # (?i) folds ſ to s


def _assert_metrics_equal(texts: list[str]) -> None:
    series = pl.Series(texts, dtype=pl.String)
    ours, ref = gopher_repetition_metrics(series), reference_metrics(series)
    assert ours.columns == ref.columns
    for name in ref.columns:
        a, b = ours[name], ref[name]
        same = (a.is_null() & b.is_null()) | (a == b).fill_null(False)
        assert same.all(), f"{name}: {(~same).sum()} documents differ, first at row {int((~same).arg_true()[0])}"


def test_every_metric_equals_the_reference_on_the_sample_data():
    _assert_metrics_equal(list(sample_texts()))


def test_every_metric_equals_the_reference_on_long_documents():
    _assert_metrics_equal([*long_texts(), *_fuzz(500, seed=2)])


def test_ngram_definitions_on_a_worked_example():
    # "a b" occurs 4 times, " ".join length 3 -> 12 characters. 2-grams scanned greedily... the kernel has no
    # n = 2 duplicate scan, so the 5-gram scan is checked on a text where it jumps: "a b c d e" twice, then "x".
    offsets, data = string_buffers(pl.Series(["a b a b c a b c d a b", "a b c d e a b c d e x", "one"]))
    segments, top, dup = repetition_counts(offsets, data, *TABLE.cover(offsets, data))
    assert top[0, 0] == 12  # top 2-gram "a b": 4 x 3 characters
    assert top[1, 0] == 2 * 5  # top 3-gram "a b c" twice (ties: the first seen), 5 characters each
    assert dup[0, 1] == 5  # the second "a b c d e" is a duplicate 5-gram of "abcde" (5 characters); the scan then jumps
    assert top[0, 2] == -1 and dup[0, 2] == 0  # one word: no 2-gram, nothing repeated
    assert segments[:, 0].tolist() == [1, 0, 0, 1, 0, 0, 21]  # one paragraph, one line, 21 characters


def test_newlines_characters_and_ascii_are_counted_at_every_alignment():
    text = "ab\né\n\n中x🙂\nplain ascii text, long enough for whole words\n\u2028y\n"
    data = np.frombuffer(text.encode() * 3, dtype=np.uint8)
    words = data[: len(data) - len(data) % 8].view(np.uint64)
    for lo in range(0, 17):
        for hi in range(lo, len(data) + 1, 5):
            piece = bytes(data[lo:hi])
            newlines, chars, high = _scan(data, words, lo, hi)
            assert newlines == piece.count(b"\n") and chars == sum((b & 0xC0) != 0x80 for b in piece)
            assert (high < 128) == piece.isascii(), (lo, hi)


def test_unknown_code_points_finds_every_non_ascii_character_wherever_it_falls():
    """The scan that skips ASCII 8 bytes a step still finds each code point at every byte offset, in sliced
    columns and at the buffer's very end."""
    from winnow.curate.text.codepoints import KNOWN, _unknown_code_points

    rng = random.Random(7)
    wide = ["é", "ſ", "中", "🙂", "\u0600", "\U0010fffd"]
    texts = []
    for _ in range(300):
        parts = [("a" * rng.randrange(0, 19)) + rng.choice(wide) for _ in range(rng.randrange(0, 4))]
        texts.append("".join(parts) + "b" * rng.randrange(0, 9))
    texts.append("x" * 31 + "🙂")  # a 4-byte character ending the buffer
    column = pl.Series(texts)
    props = np.zeros(0x110000, dtype=np.uint8)
    props[ord("ſ")] = KNOWN  # a known code point is not reported
    for start in (0, 1, 5, 13):
        offsets, data = string_buffers(column.slice(start))
        want = {ord(c) for t in texts[start:] for c in t if ord(c) >= 128} - {ord("ſ")}
        got = _unknown_code_points(offsets, data, props)
        assert sorted(got.tolist()) == sorted(want)
