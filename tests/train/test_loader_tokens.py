"""The token-shard loader yields exactly the text loader's batches, reading only this rank's share."""

from __future__ import annotations

import numpy as np
import pytest

from tests.train.shards_util import make_docs, write_token_job
from tests.train.test_loader_resume import global_rows, ranks, rows_of
from winnow.train.data import Loader, LoaderConfig

KEYS = ("tokens", "targets", "source_ids", "loss_mask", "doc_ids")


def batches(cfg: LoaderConfig, data, n: int, **kw) -> list:
    with Loader(cfg, data, **kw) as loader:
        out = []
        for _ in range(n):
            try:
                out.append(next(loader))
            except StopIteration:
                break
        return out


def assert_same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        for k in KEYS:
            assert np.array_equal(getattr(x, k).numpy(), getattr(y, k).numpy()), f"batch {i}: {k} differs"
        assert x.origins == y.origins, f"batch {i}: origins differ"


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    docs = make_docs(70)
    folder = tmp_path_factory.mktemp("job")
    return write_token_job(folder, [docs[:25], docs[25:26], [], docs[26:60]], val=[docs[60:]])


CASES = {
    "pad": dict(epoch_end="pad"),
    "carry": dict(epoch_end="carry"),
    "shuffled": dict(shuffle_window=4, seed=3),
    "warmup": dict(seq_len_warmup_steps=6, seq_len_warmup_start=8, seq_len_warmup_multiple=4),
    "no_boundary": dict(boundary_mask=False, epoch_end="carry"),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("world", [1, 3])
def test_token_shards_give_the_text_loaders_batches(job, case, world):
    for rank in range(world):
        kw = dict(batch_size=2, seq_len=24, num_workers=0, **CASES[case])
        text = batches(LoaderConfig(format="parquet", **kw), job, 150 // world, rank=rank, world_size=world)
        tokens = batches(LoaderConfig(format="tokens", **kw), job, 150 // world, rank=rank, world_size=world)
        assert_same(text, tokens)


def test_auto_picks_token_shards_and_val_pass_matches(job):
    kw = dict(batch_size=3, seq_len=16, num_workers=0)
    with Loader(LoaderConfig(**kw), job, split="val") as auto:
        assert type(auto._sets[0]).__name__ == "TokenStream"
    text = batches(LoaderConfig(format="parquet", **kw), job, 100, split="val")
    tokens = batches(LoaderConfig(format="auto", **kw), job, 100, split="val")
    assert 0 < len(tokens) < 100
    assert_same(text, tokens)


def test_load_time_mixing_matches(job, tmp_path):
    other = write_token_job(tmp_path / "other", [make_docs(30, ("math",), prefix="m")])
    kw = dict(batch_size=4, seq_len=20, num_workers=0, mix_weights=[0.7, 0.3])
    assert_same(
        batches(LoaderConfig(format="parquet", **kw), [job, other], 30, rank=1, world_size=2),
        batches(LoaderConfig(format="tokens", **kw), [job, other], 30, rank=1, world_size=2),
    )


# an epoch is 3380 tokens, ~105 steps of 2x16
@pytest.mark.parametrize("stop", [1, 50, 105, 106, 130])
@pytest.mark.parametrize("epoch_end", ["pad", "carry"])
def test_exact_resume_on_token_shards(job, stop, epoch_end):
    cfg = LoaderConfig(batch_size=2, seq_len=16, num_workers=0, format="tokens", epoch_end=epoch_end, shuffle_window=3)
    reference = global_rows(ranks(cfg, job, 1), 150)
    first = ranks(cfg, job, 1)
    global_rows(first, stop)
    resumed = ranks(cfg, job, 1, first[0].state_dict())
    assert global_rows(resumed, 150 - stop) == reference[2 * stop :]


@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2), (4, 3)])
def test_elastic_resume_on_token_shards_keeps_the_text_loaders_global_order(job, before, after):
    text = LoaderConfig(batch_size=1, seq_len=16, num_workers=0, format="parquet")
    reference = global_rows(ranks(text, job, 1), 400)
    cfg = LoaderConfig(batch_size=2, seq_len=16, num_workers=0, format="tokens")
    first = ranks(cfg, job, before)
    done = global_rows(first, 80 // before)
    resumed = ranks(cfg, job, after, first[0].state_dict())
    assert done + global_rows(resumed, 120 // after) == reference[: len(done) + 2 * after * (120 // after)]


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_each_rank_reads_only_its_share_and_the_ranks_make_the_global_batch(job, world):
    b, seq = 2, 32
    cfg = LoaderConfig(batch_size=b, seq_len=seq, num_workers=0, format="tokens")
    loaders = ranks(cfg, job, world)
    whole = Loader(LoaderConfig(batch_size=b * world, seq_len=seq, num_workers=0, format="parquet"), job)
    for _ in range(12):
        before = [ld.stats()["tokens_read"] for ld in loaders]
        per_rank = [rows_of(next(ld)) for ld in loaders]
        for ld, was in zip(loaders, before):
            assert ld.stats()["tokens_read"] - was <= 1.1 * (world * b * seq) / world
            assert ld.stats()["tokens_tokenized"] == 0
        union = [per_rank[i % world][i // world] for i in range(world * b)]
        assert union == rows_of(next(whole))
    assert whole.stats()["tokens_tokenized"] >= 12 * world * b * seq  # the text path tokenizes the whole stream


def test_token_shards_on_another_file_system_are_read_by_byte_range(job):
    import fsspec

    fs = fsspec.filesystem("memory")
    for path in job.rglob("*"):
        if path.is_file():
            fs.pipe(f"/tokjob/{path.relative_to(job)}", path.read_bytes())
    for window in (0, 3):  # file order (one read per row) and shuffled documents (one read per run)
        kw = dict(batch_size=2, seq_len=24, num_workers=0, format="tokens", shuffle_window=window)
        local = batches(LoaderConfig(**kw), job, 60, rank=1, world_size=2)
        remote_loader = Loader(LoaderConfig(**kw), "memory://tokjob", rank=1, world_size=2)
        assert_same(local, [next(remote_loader) for _ in range(60)])
        assert not remote_loader._sets[0].shards.local


@pytest.mark.parametrize(("saved", "resumed"), [("parquet", "tokens"), ("tokens", "parquet")])
def test_a_state_saved_reading_one_format_resumes_on_the_other(job, saved, resumed):
    """The positions are the same in both formats, and so is the data's fingerprint: a run checkpointed on the
    Parquet shards continues on the token shards of the same job (or the other way) with the very next batch
    (the fingerprints differed, and the resume was refused)."""
    kw = dict(batch_size=2, seq_len=16, num_workers=0, shuffle_window=3)
    reference = global_rows(ranks(LoaderConfig(format=saved, **kw), job, 1), 90)
    first = ranks(LoaderConfig(format=saved, **kw), job, 1)
    global_rows(first, 40)
    again = ranks(LoaderConfig(format=resumed, **kw), job, 1, first[0].state_dict())
    assert global_rows(again, 50) == reference[2 * 40 :]
