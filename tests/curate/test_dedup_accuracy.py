"""Accuracy of MinHash dedup against exact Jaccard, and of its signatures against datasketch."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from winnow.curate.dedup import duplicate_clusters, minhash_signatures

VOCAB = [f"w{i}" for i in range(3000)]


def _edit(words, rng, share):
    out = list(words)
    for i in rng.choice(len(out), size=int(share * len(out)), replace=False):
        out[i] = VOCAB[rng.integers(len(VOCAB))]
    return out


def _insert(words, rng, share):
    at = int(rng.integers(len(words)))
    block = [VOCAB[j] for j in rng.integers(len(VOCAB), size=int(share * len(words)))]
    return words[:at] + block + words[at:]


def planted_corpus(n_bases=150, seed=0):
    """Base documents of 6 paragraphs plus near-duplicates by word edits, insertions and paragraph shuffles."""
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n_bases):
        paragraphs = [[VOCAB[j] for j in rng.integers(len(VOCAB), size=30)] for _ in range(6)]
        docs.append("\n\n".join(" ".join(p) for p in paragraphs))
        words = [w for p in paragraphs for w in p]
        # Edit and insertion amounts straddle threshold 0.8, so many pairs sit close to it.
        docs.append(" ".join(_edit(words, rng, rng.uniform(0.005, 0.06))))
        docs.append(" ".join(_insert(words, rng, rng.uniform(0.05, 0.5))))
        order = rng.permutation(6)
        docs.append("\n\n".join(" ".join(paragraphs[i]) for i in order))
    perm = rng.permutation(len(docs))
    return [docs[i] for i in perm]


def _shingles(text, n=5):
    words = text.split()
    return {tuple(words[i : i + n]) for i in range(max(len(words) - n + 1, 1))}


def exact_removed(texts, threshold):
    """Documents removed by exact Jaccard: all but the lowest position of each connected component."""
    sets = [_shingles(t) for t in texts]
    index = {}
    for i, s in enumerate(sets):
        for g in s:
            index.setdefault(g, []).append(i)
    pairs = {(a, b) for docs in index.values() for a, b in itertools.combinations(docs, 2)}
    similar = [(a, b, len(sets[a] & sets[b]) / len(sets[a] | sets[b])) for a, b in pairs]
    parent = list(range(len(texts)))

    def find(x):
        while parent[x] != x:
            x = parent[x]
        return x

    for a, b, j in similar:
        if j >= threshold:
            ra, rb = find(a), find(b)
            parent[max(ra, rb)] = min(ra, rb)
    removed = {i for i in range(len(texts)) if find(i) != i}
    return removed, [j for _, _, j in similar]


@pytest.fixture(scope="module")
def corpus():
    texts = planted_corpus()
    removed, similarities = exact_removed(texts, 0.8)
    return texts, removed, np.array(similarities)


def test_corpus_has_pairs_near_the_threshold(corpus):
    _, removed, similarities = corpus
    assert np.count_nonzero((similarities > 0.7) & (similarities < 0.8)) >= 20
    assert np.count_nonzero((similarities >= 0.8) & (similarities < 0.9)) >= 20
    assert len(removed) >= 100


@pytest.mark.parametrize("scheme", ["oph", "permutations"])
def test_precision_and_recall_against_exact_jaccard(corpus, scheme):
    texts, truth, _ = corpus
    clusters = duplicate_clusters(texts, threshold=0.8, scheme=scheme)
    removed = {i for c in clusters for i in c[1:]}
    precision = len(removed & truth) / max(len(removed), 1)
    recall = len(removed & truth) / len(truth)
    assert precision >= 0.98 and recall >= 0.98, (precision, recall)


def _token_pair(jaccard, union, rng):
    common = round(jaccard * union)
    tokens = rng.permutation(10**6)[:union]
    only = (union - common) // 2
    a = np.concatenate([tokens[:common], tokens[common : common + only]])
    b = np.concatenate([tokens[:common], tokens[common + only : common + 2 * only]])
    return a, b, common / (common + 2 * only)


@pytest.mark.parametrize("scheme", ["oph", "permutations"])
@pytest.mark.parametrize("jaccard", [0.3, 0.6, 0.85])
def test_signature_estimates_agree_with_datasketch(scheme, jaccard):
    from datasketch import MinHash

    rng = np.random.default_rng(7)
    a, b, true_j = _token_pair(jaccard, 400, rng)
    texts = [" ".join(f"t{x}" for x in a), " ".join(f"t{x}" for x in b)]
    ours, theirs = [], []
    for seed in range(20):
        sig = minhash_signatures(texts, ngram=1, num_perm=128, scheme=scheme, seed=seed)
        ours.append(np.mean(sig[0] == sig[1]))
        m1, m2 = MinHash(num_perm=128, seed=seed), MinHash(num_perm=128, seed=seed)
        m1.update_batch([f"t{x}".encode() for x in a])
        m2.update_batch([f"t{x}".encode() for x in b])
        theirs.append(m1.jaccard(m2))
    se = np.sqrt(true_j * (1 - true_j) / 128)
    assert np.all(np.abs(np.array(ours) - true_j) < 4 * se)
    assert abs(np.mean(ours) - true_j) < 3 * se / np.sqrt(20)
    assert abs(np.mean(ours) - np.mean(theirs)) < 3 * se * np.sqrt(2 / 20)
