"""Exact, elastic resume and determinism: the state is a position in the global order."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest

from tests.train.shards_util import make_docs, write_job
from winnow.train.data import Loader, LoaderConfig
from winnow.train.errors import CheckpointError


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    docs = make_docs(50)
    return write_job(tmp_path_factory.mktemp("job"), [docs[:20], docs[20:35], docs[35:]])


def cfg(**kw) -> LoaderConfig:
    base = {"batch_size": 2, "seq_len": 16, "num_workers": 0, "piece_rows": 6}
    return LoaderConfig(**{**base, **kw})


def rows_of(batch) -> list[tuple]:
    """Each sequence as a hashable tuple of everything the trainer sees."""
    arrays = [batch.tokens, batch.targets, batch.source_ids, batch.loss_mask, batch.doc_ids]
    return [
        tuple(np.concatenate([a[b].numpy().astype(np.int64) for a in arrays])) for b in range(batch.tokens.shape[0])
    ]


def global_rows(loaders, steps) -> list[tuple]:
    """The global sequence order rebuilt from all ranks: global sequence i is on rank i % world_size."""
    out = []
    for _ in range(steps):
        per_rank = [rows_of(next(ld)) for ld in loaders]
        for b in range(len(per_rank[0])):
            out.extend(r[b] for r in per_rank)
    return out


def ranks(config, folder, world, state=None):
    loaders = [Loader(config, folder, rank=r, world_size=world) for r in range(world)]
    for ld in loaders:
        if state is not None:
            ld.load_state_dict(state)
    return loaders


# an epoch here is 2802 tokens, ~88 steps of 2x16: 120 steps cross the epoch boundary
@pytest.mark.parametrize("stop", [3, 37, 87, 88, 89, 100])
@pytest.mark.parametrize("epoch_end", ["pad", "carry"])
def test_resume_yields_exactly_the_batches_the_uninterrupted_run_would_have(folder, stop, epoch_end):
    reference = global_rows(ranks(cfg(epoch_end=epoch_end), folder, 1), 120)
    first = ranks(cfg(epoch_end=epoch_end), folder, 1)
    global_rows(first, stop)
    resumed = ranks(cfg(epoch_end=epoch_end), folder, 1, first[0].state_dict())
    assert global_rows(resumed, 120 - stop) == reference[2 * stop :]


def test_state_crosses_the_epoch_boundary(folder):
    loader = Loader(cfg(), folder)
    for _ in range(100):
        next(loader)
    assert loader.state_dict()["epoch"] == 1


@pytest.mark.parametrize(("world_before", "world_after"), [(2, 1), (1, 2)])
def test_elastic_resume_keeps_the_global_order(folder, world_before, world_after):
    # an epoch is ~175 sequences of 16: the resumed part crosses the epoch boundary
    reference = global_rows(ranks(cfg(batch_size=1), folder, 1), 300)
    assert global_rows(ranks(cfg(batch_size=2), folder, 2), 30) == reference[:120]  # 2 ranks, same order
    before = ranks(cfg(batch_size=2), folder, world_before)
    done = global_rows(before, 45)
    after = ranks(cfg(batch_size=2), folder, world_after, before[0].state_dict())
    assert done + global_rows(after, 30) == reference[: len(done) + 60 * world_after]


def test_resume_with_other_worker_count_and_piece_size(folder):
    reference = global_rows(ranks(cfg(), folder, 1), 40)
    first = ranks(cfg(), folder, 1)
    global_rows(first, 23)
    resumed = ranks(cfg(piece_rows=4), folder, 1, first[0].state_dict())
    assert global_rows(resumed, 17) == reference[46:]


@pytest.mark.slow
def test_worker_processes_give_the_inline_order_and_resume_exactly(folder):
    reference = global_rows(ranks(cfg(), folder, 1), 120)
    with Loader(cfg(num_workers=2, prefetch=2), folder) as loader:
        assert global_rows([loader], 45) == reference[:90]
        state = loader.state_dict()
    with Loader(cfg(num_workers=3), folder) as loader:
        loader.load_state_dict(state)
        assert global_rows([loader], 75) == reference[90:]
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("winnow-loader")]


def test_same_seed_same_order_other_seed_other_order_with_window_shuffle(folder):
    def run(seed):
        return global_rows(ranks(cfg(shuffle_window=8, seed=seed), folder, 1), 30)

    plain = global_rows(ranks(cfg(), folder, 1), 30)
    assert run(1) == run(1)
    assert run(1) != run(2) and run(1) != plain


def test_window_shuffle_stays_within_windows(folder):
    loader = Loader(cfg(shuffle_window=5, batch_size=4), folder)
    batches = [next(loader) for _ in range(30)]
    text = b"".join(b.targets[b.loss_mask].numpy().astype(np.uint8).tobytes() for b in batches)  # EOS 256 -> 0
    ids = [int(doc.split(b">")[0].split(b":")[1]) for doc in text.split(b"\0")[:20]]  # shard 0: rows 0-19
    assert [sorted(ids[w : w + 5]) for w in range(0, 20, 5)] == [list(range(w, w + 5)) for w in range(0, 20, 5)]
    assert ids != list(range(20))


def test_state_from_other_data_is_refused(folder, tmp_path):
    other = write_job(tmp_path, [make_docs(5)])
    with pytest.raises(CheckpointError, match="data"):
        Loader(cfg(), other).load_state_dict(Loader(cfg(), folder).state_dict())
