"""Hashing, normalization, shingling, LSH grouping and clustering kernels of curate.dedup."""

from __future__ import annotations

import types

import numpy as np
import polars as pl
import pytest

from winnow.curate.dedup.clusters import connected_components, pair_jaccard
from winnow.curate.dedup.exact import text_hashes
from winnow.curate.dedup.kernels import PLAIN_SEP, count_shingles, murmur3_128
from winnow.curate.dedup.lsh import band_pairs, choose_bands, unpack_pairs
from winnow.curate.dedup.text import normalize_expr, normalized_buffers


@pytest.mark.parametrize(
    ("data", "seed", "h1", "h2"),
    [  # reference values from the mmh3 package (hash128, unsigned: h1 low, h2 high)
        (b"", 0, 0x0, 0x0),
        (b"hello", 0, 0xCBD8A7B341BD9B02, 0x5B1E906A48AE1D19),
        (b"The quick brown fox jumps over the lazy dog", 0, 0xE34BBC7BBC071B6C, 0x7A433CA9C49A9347),
        (b"0123456789abcdef0123", 42, 0x081E6D1FD710E499, 0xB7F785C1DFD99B8D),
    ],
)
def test_murmur3_matches_reference(data, seed, h1, h2):
    buf = np.frombuffer(data, dtype=np.uint8) if data else np.zeros(0, dtype=np.uint8)
    assert murmur3_128(buf, 0, len(data), seed) == (h1, h2)


def test_text_hashes_slice_rows_out_of_one_buffer():
    hashes = text_hashes(pl.Series(["hello", "", "hello", "Hello"]), normalize="none")
    rows = hashes.rows()
    assert rows[0] == rows[2] and rows[0] != rows[3] and rows[1] == (0, 0)
    assert rows[0] == (0xCBD8A7B341BD9B02, 0x5B1E906A48AE1D19)


@pytest.mark.parametrize("mode", ["whitespace", "lower", "words"])
def test_fast_normalization_equals_the_expressions(mode):
    texts = pl.Series(
        [
            "  Hello,   World!\tfoo_bar ",
            "ÀBC déf, GHI!",
            "",
            None,
            "a\u00a0b  c",
            "x--y...z",
            "MiXeD\n\ncase",
            "ß Straße «q»",
        ]
    )
    rng = np.random.default_rng(1)  # runs of separators, punctuation and letters, with and without non-ASCII
    alphabet = list("aZ9_ \t\n.,;!?-'\x01\x7f") + ["é", "Σ", "😀", "\u00a0"]
    texts.extend(pl.Series(["".join(rng.choice(alphabet, size=n)) for n in rng.integers(0, 80, size=40)]))
    offsets, data = normalized_buffers(texts, mode)
    got = [bytes(data[offsets[i] : offsets[i + 1]]).decode() for i in range(len(texts))]
    assert got == pl.select(normalize_expr(pl.lit(texts), mode)).to_series().to_list()


def _buffers(texts):
    return normalized_buffers(pl.Series(texts), "none")


def test_short_documents_get_one_shingle_and_empty_ones_none():
    offsets, data = _buffers(["a b c d e f g", "a b", "", "   ", "a b c d e"])
    assert count_shingles(offsets, data, 5, False, PLAIN_SEP).tolist() == [3, 1, 0, 0, 1]


def test_char_shingles_count_code_points():
    offsets, data = _buffers(["abcdé", "日本語", "ab"])
    assert count_shingles(offsets, data, 3, True, PLAIN_SEP).tolist() == [3, 1, 1]


def test_choose_bands_matches_datasketch_search():
    from datasketch.lsh import _optimal_param

    for num_perm in (32, 128):
        for threshold in (0.05, 0.3, 0.5, 0.62, 0.8, 0.95):
            for fp in (0.5, 0.3):
                got = choose_bands(threshold, num_perm, fp_weight=fp, fn_weight=1 - fp)
                assert got == tuple(_optimal_param(threshold, num_perm, fp, 1 - fp)), (threshold, num_perm, fp)


def test_band_pairs_star_and_chain_per_run():
    keys = np.array([7, 3, 7, 7, 3, 9], dtype=np.uint64)
    docs = np.arange(6, dtype=np.uint32)
    a, b = unpack_pairs(band_pairs(keys, docs))
    # run of key 3: {1, 4}; run of key 7: {0, 2, 3} -> star from 0 plus chain 2-3
    assert sorted(zip(a.tolist(), b.tolist())) == [(0, 2), (0, 3), (1, 4), (2, 3)]


def test_merge_unique_is_the_sorted_union():
    from winnow.curate.dedup.lsh import merge_unique

    rng = np.random.default_rng(0)
    for trial in range(200):
        high = 50 if trial % 2 else 2**64 - 1  # many shared values, or almost none
        a, b = (np.unique(rng.integers(0, high, rng.integers(0, 40), dtype=np.uint64)) for _ in range(2))
        assert np.array_equal(merge_unique(a, b), np.union1d(a, b))


def test_components_are_labelled_by_their_lowest_member():
    labels = connected_components(6, np.array([5, 1], dtype=np.uint32), np.array([4, 2], dtype=np.uint32))
    assert labels.tolist() == [0, 1, 1, 3, 4, 4]
    labels = connected_components(6, np.array([5, 4, 1], dtype=np.uint32), np.array([1, 2, 2], dtype=np.uint32))
    assert labels.tolist() == [0, 1, 1, 3, 1, 1]


def test_pair_jaccard_of_sorted_sets():
    values = np.array([1, 2, 3, 4, 2, 3, 4, 5, 9], dtype=np.uint32)
    offsets = np.array([0, 4, 8, 9, 9], dtype=np.int64)
    got = pair_jaccard(np.array([0, 0, 2, 3]), np.array([1, 2, 3, 3]), offsets, values)
    assert got.tolist() == [3 / 5, 0.0, 0.0, 0.0]


def test_word_buffers_give_the_normalized_words():
    """Raw ASCII rows read through the tables, non-ASCII rows normalized by the compiled pass: the same shingles."""
    from winnow.curate.dedup.signatures import sketch_buffers
    from winnow.curate.dedup.text import string_buffers, word_buffers

    rng = np.random.default_rng(0)
    texts = [
        "Hello,\x01World! ÉTÉ été",
        "a\tb\x0bc\x1fd  ,;  ",
        "",
        None,
        "ΣΑΣ σας. İi ǅ ﬁ",
        "ẞtraße Ⱥ K 😀x𐐀",
        "\u00a0a\u2003b\u3000c",
    ]
    texts += [
        "".join(chr(c) for c in rng.integers(32, 0x2FFFF, size=60) if not 0xD800 <= c < 0xE000) for _ in range(50)
    ]
    series = pl.Series(texts, dtype=pl.String)
    kw = dict(
        ngram=3, chars=False, num_perm=32, scheme="oph", seed=1, bands=8, rows=4, want_signatures=True, want_sets=True
    )
    for mode in ("none", "whitespace", "lower", "words"):
        reference = pl.select(normalize_expr(pl.lit(series), mode)).to_series()
        assert normalized_buffers(series, mode)[1].tobytes() == string_buffers(reference)[1].tobytes(), mode
        want = sketch_buffers(*string_buffers(reference), **kw)
        offsets, data, tables, alt = word_buffers(series, mode)
        got = sketch_buffers(offsets, data, tables=tables, alt=alt, **kw)
        assert np.array_equal(want.signatures, got.signatures) and np.array_equal(want.set_values, got.set_values), mode


def test_code_point_tables_agree_with_the_expression():
    """The compiled normalization's per-code-point tables (from unicodedata) never disagree with polars' own."""
    from winnow.curate.dedup.text import _code_point_tables, _expression_tables

    for mode in ("lower", "words"):
        cls, lowered = _code_point_tables(mode)
        want_cls, want_lowered = _expression_tables(mode)
        handled = cls != 2
        assert handled.sum() > 80_000  # every assigned code point of planes 0-1 but a few
        assert np.array_equal(cls[handled], want_cls[handled]), mode
        kept = cls == 0
        assert np.array_equal(lowered[kept], want_lowered[kept]), mode


_M64 = (1 << 64) - 1


def _fmix64(k: int) -> int:
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & _M64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & _M64
    return k ^ (k >> 33)


def _reference_word_shingles(text: bytes, ngram: int, sep: np.ndarray, low: np.ndarray) -> list[int]:
    """Word shingle hashes by their definition: FNV-1a of each word's mapped bytes, fmix64, then the n-gram mix."""
    words, word = [], None
    for byte in text + b" ":
        if sep[byte]:
            if word is not None:
                words.append(_fmix64(word))
            word = None
            continue
        word = ((0xCBF29CE484222325 if word is None else word) ^ int(low[byte])) * 0x100000001B3 & _M64
    out = []
    for i in range(max(len(words) - ngram + 1, 1) if words else 0):
        h = ngram
        for w in words[i : i + ngram]:
            h = ((((h << 23) | (h >> 41)) & _M64) ^ w) * 0x9E3779B97F4A7C15 & _M64
        out.append(_fmix64(h))
    return out


def test_word_shingles_match_their_definition_on_short_and_long_documents():
    """The one-pass, two-chain word scanner gives each document's shingles as defined, wherever its halves are cut,
    and a batch sketched in blocks gives what it gives in one."""
    from winnow.curate.dedup.kernels import doc_shingles
    from winnow.curate.dedup.signatures import sketch_buffers
    from winnow.curate.dedup.text import _WORD_TABLES

    rng = np.random.default_rng(3)
    alphabet = np.frombuffer(b"abcXYZ09_-.,;:!? \t\n\r\x00\x7f\x80\xc3\xa9", dtype=np.uint8)
    docs = [b"", b" ", b"  ,, ", b"a", b"ab", b"a b", b" a", b"a ", b"x" * 5001, b"x" * 3000 + b" y", b"w " * 2000]
    docs += [bytes(rng.choice(alphabet, size=n)) for n in rng.integers(0, 4000, size=60)]
    docs += [b" ".join(b"w%d" % rng.integers(0, 50) for _ in range(n)) for n in (1, 4, 5, 6, 999)]
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
    data = np.frombuffer(b"".join(docs), dtype=np.uint8)
    for mode in ("none", "words"):
        sep, low = _WORD_TABLES[mode]
        for ngram in (1, 3, 5):
            buf = np.empty(max(len(d) for d in docs) // 2 + 3, dtype=np.uint64)
            got = []
            for i, doc in enumerate(docs):
                count = doc_shingles(
                    data, offsets[i], offsets[i + 1], ngram, False, sep, low, buf, buf[:0].view(np.int64)
                )
                want = _reference_word_shingles(doc, ngram, sep, low)
                assert buf[:count].tolist() == want, (mode, ngram, i)
                got.append(want)
            sketch = sketch_buffers(
                offsets, data, ngram=ngram, chars=False, num_perm=16, scheme="oph", seed=1, bands=4, rows=4,
                want_signatures=False, want_sets=True, tables=(sep, low),
            )  # fmt: skip
            assert sketch.n_shingles.tolist() == [len(w) for w in got]
            assert sketch.n_shingles.tolist() == count_shingles(offsets, data, ngram, False, sep).tolist()
            tops = [[v >> 32 for j, v in enumerate(w) if j == 0 or v >> 32 != w[j - 1] >> 32] for w in got]
            assert sketch.set_values.tolist() == [t for w in tops for t in w]
            assert np.diff(sketch.set_offsets).tolist() == [len(w) for w in tops]
            blocks = sketch_buffers(
                offsets, data, ngram=ngram, chars=False, num_perm=16, scheme="oph", seed=1, bands=4, rows=4,
                want_signatures=False, want_sets=True, tables=(sep, low), block_bytes=5000,
            )  # fmt: skip
            for name in ("band_keys", "n_shingles", "set_offsets", "set_values", "sig8"):
                assert np.array_equal(getattr(blocks, name), getattr(sketch, name)), name


def test_kernels_load_without_the_libraries_numba_would_import_for_nothing():
    """numba's first dispatch would import cffi + pycparser (its cffi typing) and scipy.linalg (BLAS for
    np.correlate): winnow's kernels use neither, so ``curate.dedup.jit`` hides them from those two imports only."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np\n"
        "from winnow.curate.dedup.kernels import PLAIN_SEP, count_shingles\n"
        "data = np.frombuffer(b'a b c d e f', dtype=np.uint8)\n"
        "assert count_shingles(np.array([0, 11]), data, 5, False, PLAIN_SEP).tolist() == [2]\n"
        "loaded = sorted(m for m in ('cffi', 'pycparser', 'scipy.linalg') if m in sys.modules)\n"
        "import importlib.util\n"
        "if importlib.util.find_spec('cffi'):\n"
        "    import cffi\n"  # still importable by anyone who wants it, where it is installed
        "    assert cffi.FFI\n"
        "print(loaded)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["[]"]


@pytest.mark.parametrize(("runs", "threads"), [(1, 1), (2, 2), (3, 3), (7, 7), (7, 0)])
def test_sets_sorted_in_runs_at_once_equal_one_run(runs, threads):
    """``read_sets``' runs write where their raw values start and are moved together: the same sets and offsets,
    whichever runs start before the earlier ones are moved (threads 0: each run starts only after the ones
    before it were moved, as with a pool of fewer threads than runs at its slowest)."""
    from concurrent.futures import ThreadPoolExecutor

    from winnow.curate.dedup.verify import _sort_unique_runs, sort_unique_into

    rng = np.random.default_rng(runs)
    sizes = rng.choice([0, 1, 5, 63, 64, 300, 2000], size=41)  # empty sets, tiny ones, both sides of the radix cut
    offsets = np.concatenate([[7], 7 + np.cumsum(sizes)]).astype(np.int64)  # not starting at 0, as a window's
    values = rng.integers(0, 50, size=int(offsets[-1]) + 3, dtype=np.uint32)  # many repeats within a set
    want_out, want_offsets = np.zeros(len(values) + 10, dtype=np.uint32), np.full(len(sizes) + 1, 5, dtype=np.int64)
    want = sort_unique_into(offsets, values, want_out, want_offsets, 5)
    got_out, got_offsets = np.zeros(len(values) + 10, dtype=np.uint32), np.full(len(sizes) + 1, 5, dtype=np.int64)
    with ThreadPoolExecutor(max(1, threads)) as pool:
        lazy = types.SimpleNamespace(map=map)  # the builtin map: run k is called when result k is wanted
        got = _sort_unique_runs(offsets, values, got_out, got_offsets, 5, pool if threads else lazy, runs)
    assert got == want
    assert got_offsets.tolist() == want_offsets.tolist()
    assert got_out[:got].tolist() == want_out[:want].tolist()


def test_lsh_pairs_are_the_same_on_any_number_of_threads():
    from winnow.curate.dedup.lsh import lsh_pairs

    rng = np.random.default_rng(0)
    n, bands = 500, 9
    keys = pl.DataFrame({f"_band_{j}": rng.integers(0, 40, size=n, dtype=np.uint64) for j in range(bands)})
    usable = rng.random(n) > 0.1
    docs = np.arange(n, dtype=np.uint32)
    one = lsh_pairs(keys.lazy(), keys.columns, docs, usable)
    assert len(one) > 1000 and (np.diff(one) > 0).all()
    for threads in (2, 4, 16):
        assert np.array_equal(lsh_pairs(keys.lazy(), keys.columns, docs, usable, threads=threads), one)
