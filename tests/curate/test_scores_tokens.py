"""The score featurizer: tokens, case folding, CJK, caps, stable hashes and the spill layout."""

from __future__ import annotations

import numpy as np
import polars as pl

from winnow.curate.stages.scores.features import (
    features_column,
    features_csr,
    list_csr,
    split_spilled,
    token_buckets,
)
from winnow.curate.stages.scores.tokens import hash_strings, hash_tokens


def test_words_are_case_folded_and_split_on_punctuation():
    th = hash_tokens(pl.Series(["Hello, World! hello", "ÉTÉ été"]))
    assert th.indptr.tolist() == [0, 3, 5]
    assert th.uni[0] == th.uni[2] and th.uni[0] != th.uni[1]
    assert th.uni[3] == th.uni[4]


def test_han_characters_are_tokens_and_empty_or_null_text_has_none():
    th = hash_tokens(pl.Series(["中文abc文本", "", None, "   "]))
    assert th.n_words.tolist() == [5, 0, 0, 0]
    assert th.indptr.tolist() == [0, 5, 5, 5, 5]


def test_max_tokens_caps_kept_tokens_but_counts_all_words():
    th = hash_tokens(pl.Series(["a b c d e", "x y"]), max_tokens=2)
    assert th.indptr.tolist() == [0, 2, 4]
    assert th.n_words.tolist() == [5, 2]


def test_hashes_are_stable_values_and_seeded():
    # Saved models depend on these exact values: a change here needs a new HASH_VERSION.
    assert hash_tokens(pl.Series(["hello"])).uni.tolist() == [1656767905311477007]
    a, b = hash_strings(pl.Series(["id-1", "id-2", "id-1"]), seed=0), hash_strings(pl.Series(["id-1"]), seed=1)
    assert a[0] == a[2] and a[0] != a[1] and a[0] != b[0]


def test_bigrams_depend_on_order():
    th = hash_tokens(pl.Series(["red fox", "fox red"]))
    assert th.bi[1] != th.bi[3] and th.bi[0] == 0 and th.bi[2] == 0


def test_spilled_layout_round_trips_to_token_aligned_ids():
    th = hash_tokens(pl.Series(["one two three", "", "four"]))
    indptr, ids = features_csr(th, 1000)
    col = features_column(th, 1000)
    assert col.dtype == pl.List(pl.UInt32) and col.list.len().to_list() == [5, 0, 1]
    ptr2, vals2 = list_csr(col)
    assert np.array_equal(ptr2, indptr) and np.array_equal(vals2, ids)
    doc, uni, bi = split_spilled(ptr2, vals2)
    assert doc.tolist() == [0, 0, 0, 2]
    assert uni.tolist() == (th.uni % np.uint64(1000)).astype(np.int64).tolist()
    assert bi[0] == -1 and bi[3] == -1 and bi[1] == th.bi[1] % 1000
    for got, want in zip(token_buckets(th, 1000), (doc, uni, bi)):  # the same without the spill layout
        assert got.tolist() == want.tolist()


def test_a_large_document_without_spaces_is_one_token():
    th = hash_tokens(pl.Series(["x" * 20_000_000]))
    assert th.indptr.tolist() == [0, 1]


def test_words_past_the_cap_are_counted_as_the_capped_scan_would():
    """Past ``max_tokens`` the words are only counted: every cap gives the uncapped scan's count."""
    import random

    rng = random.Random(4)
    alphabet = [*"ab_Z9 .,-\n", "é", "É", "Ω", "中", "かな", "🙂", "\u00aa", "\u00d7", "\u0301", "\uff21"]
    texts = ["".join(rng.choices(alphabet, k=rng.randrange(0, 60))) for _ in range(500)]
    full = hash_tokens(pl.Series(texts))
    for cap in (1, 2, 5, 17):
        capped = hash_tokens(pl.Series(texts), max_tokens=cap)
        assert capped.n_words.tolist() == full.n_words.tolist()
        assert (np.diff(capped.indptr) == np.minimum(full.n_words, cap)).all()
