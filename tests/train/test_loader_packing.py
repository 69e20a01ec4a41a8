"""Packing: per-token source ids, no document lost or duplicated, padding, warm-up, val pass."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.train.shards_util import make_docs, write_job
from winnow.train.data import Loader, LoaderConfig

EOS = 256


def decode_docs(batches) -> tuple[list[str], list[set[int]]]:
    """Documents rebuilt from the valid targets of single-rank batches, with their tokens' source ids."""
    toks = np.concatenate([b.targets[b.loss_mask].numpy() for b in batches])
    srcs = np.concatenate([b.source_ids[b.loss_mask].numpy() for b in batches])
    ends = np.flatnonzero(toks == EOS)
    docs, doc_srcs, start = [], [], 0
    for end in ends:  # a document's tokens and its closing EOS carry its source id
        docs.append(toks[start:end].astype(np.uint8).tobytes().decode())
        doc_srcs.append(set(srcs[start : end + 1].tolist()))
        start = end + 1
    return docs, doc_srcs


def epoch_tokens(docs) -> int:
    return sum(len(d["text"].encode()) + 1 for d in docs)


@pytest.fixture
def job(tmp_path):
    docs = make_docs(60)
    return write_job(tmp_path, [docs[:25], docs[25:26], docs[26:]]), docs


def take(loader, n):
    return [next(loader) for _ in range(n)]


@pytest.mark.parametrize("epoch_end", ["pad", "carry"])
@pytest.mark.parametrize("fmt", ["parquet", "webdataset"])
def test_two_epochs_rebuild_every_document_in_order_with_its_source(job, fmt, epoch_end):
    folder, docs = job
    cfg = LoaderConfig(batch_size=3, seq_len=32, num_workers=0, format=fmt, epoch_end=epoch_end, piece_rows=7)
    loader = Loader(cfg, folder)
    n_batches = 2 * epoch_tokens(docs) // (3 * 32) + 4
    got, got_srcs = decode_docs(take(loader, n_batches))
    expected = [d["text"] for d in docs] * 2
    assert got[: len(expected)] == expected  # curriculum order kept, nothing lost or repeated
    for doc, srcs in zip(docs * 2, got_srcs):
        assert srcs == {loader.sources.index(doc["source"])}


def test_pad_mode_masks_padding_and_restarts_epoch_on_a_sequence_boundary(job):
    folder, docs = job
    loader = Loader(LoaderConfig(batch_size=1, seq_len=16, num_workers=0, epoch_end="pad"), folder)
    total = epoch_tokens(docs)  # stream of an epoch, the leading EOS included
    n_seqs = -(-total // 16)
    batches = take(loader, n_seqs + 1)
    last = batches[n_seqs - 1]
    filled = total - (n_seqs - 1) * 16  # real inputs in the epoch's last sequence
    assert 0 < filled < 16, "test data must end an epoch mid-sequence"
    assert last.loss_mask[0, :filled].all() and not last.loss_mask[0, filled:].any()
    assert last.targets[0, filled - 1] == EOS  # the last document's end is still a target
    first_of_next = batches[n_seqs]
    assert first_of_next.tokens[0, 0] == EOS and first_of_next.tokens[0, 1:4].tolist() == list(b"<we")


def test_doc_ids_number_documents_within_each_sequence(job):
    folder, _ = job
    for boundary in (True, False):
        batch = next(Loader(LoaderConfig(batch_size=4, seq_len=64, num_workers=0, boundary_mask=boundary), folder))
        tokens, doc_ids = batch.tokens.numpy(), batch.doc_ids.numpy()
        if not boundary:
            assert not doc_ids.any()
            continue
        expected = np.cumsum(tokens == EOS, axis=1)
        expected -= expected[:, :1]  # a sequence starting with a separator starts document 0
        assert (doc_ids == expected).all() and doc_ids.dtype == np.int32


def test_seq_len_warmup_grows_lengths_then_keeps_seq_len(job):
    folder, _ = job
    cfg = LoaderConfig(
        batch_size=2,
        seq_len=64,
        num_workers=0,
        seq_len_warmup_steps=4,
        seq_len_warmup_start=16,
        seq_len_warmup_multiple=8,
    )
    lengths = [b.tokens.shape[1] for b in take(Loader(cfg, folder), 6)]
    assert lengths == [16, 24, 40, 52 // 8 * 8, 64, 64]


def test_val_is_one_finite_pass_padded_to_whole_batches(tmp_path):
    docs = make_docs(20)
    folder = write_job(tmp_path, [docs[:10]], val=[docs[10:15], docs[15:]])
    loader = Loader(LoaderConfig(batch_size=4, seq_len=32, num_workers=0), folder, split="val")
    batches = list(loader)
    assert all(b.tokens.shape == (4, 32) for b in batches)
    got, _ = decode_docs(batches)
    assert got == [d["text"] for d in docs[10:]]
    assert not batches[-1].loss_mask[-1].any() or batches[-1].loss_mask.sum() < 4 * 32
    assert [b.num_tokens for b in list(loader)] == [b.num_tokens for b in batches]  # iterating again: a fresh pass


def test_unknown_source_in_data_gets_a_new_id(tmp_path):
    docs = make_docs(6, sources=("web", "newcomer"))
    folder = write_job(tmp_path, [docs], sources=["web"])
    loader = Loader(LoaderConfig(batch_size=2, seq_len=32, num_workers=0), folder, sources=["books"])
    batch = next(loader)
    assert loader.sources == ["books", "web", "newcomer"]
    assert set(batch.source_ids[batch.loss_mask].tolist()) <= {1, 2}


def test_origins_name_shard_and_row_of_first_document(job):
    folder, _ = job
    loader = Loader(LoaderConfig(batch_size=2, seq_len=4, num_workers=0), folder)
    first, second = next(loader), next(loader)
    # document 0 ("<web:0>") is EOS + 7 bytes: both sequences of step 0 start inside it
    assert first.origins == [("shards/train/part-00000-00000.parquet", 0)] * 2
    assert second.origins == [("shards/train/part-00000-00000.parquet", 1)] * 2


@pytest.mark.slow
def test_worker_path_does_not_import_pandas(tmp_path):
    """pyarrow's pa.array/pa.table/fill_null import pandas lazily: ~1 s added to each worker's first batch."""
    import subprocess
    import sys

    docs = make_docs(10)
    docs[3]["source"] = None
    folder = write_job(tmp_path, [docs], sources=["web"])
    code = (
        "import sys\nfrom winnow.train.data.shards import open_shards\nfrom winnow.train.data.pieces import shard_pieces\n"
        "from winnow.train.tokenizer import ByteTokenizer\n"
        "for fmt in ('parquet', 'webdataset'):\n"
        f"    s = open_shards({str(folder)!r}, split='train', fmt=fmt)\n"
        "    list(shard_pieces(s, 0, 0, tokenizer=ByteTokenizer(), fmt=fmt, verify=True, piece_rows=4, "
        "shuffle_window=3, seed=0, skip_bad=False))\n"
        "    print(fmt, 'pandas' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path(__file__).parents[2]
    )
    assert out.stdout.split() == ["parquet", "False", "webdataset", "False"]
