"""Several data sets: training weights with a replay share, held-out sets, and one pass over several val splits."""

import pytest

from winnow.train.data.sets import HeldOut, ReplayConfig, ShardSetConfig, eval_sets, training_sets
from winnow.train.errors import ConfigError


class _Val(list):
    closed = False

    def close(self):
        self.closed = True


def test_replay_share_scales_the_other_sets():
    folders, weights = training_sets(
        [ShardSetConfig(path="a", weight=3), ShardSetConfig(path="b", weight=1)],
        ReplayConfig(path="base", share=0.2),
        [],
    )
    assert folders == ["a", "b", "base"] and weights == pytest.approx([0.6, 0.2, 0.2])
    assert training_sets("a", ReplayConfig(path="base", share=0.0), []) == (["a"], [1.0])
    assert eval_sets([], ["a"], ReplayConfig(path="base", share=0.0)) == ["a", "base"]  # still measured
    with pytest.raises(ConfigError, match="train.replay.from"):
        training_sets([ShardSetConfig(path="base")], ReplayConfig(path="base", share=0.1), [])
    with pytest.raises(ConfigError, match="train.replay.share"):
        ReplayConfig(path="base", share=1.0)


def test_held_out_reads_every_folder_once_and_shares_a_cap():
    made = {}

    def make(folder):
        made[folder] = _Val(f"{folder}{i}" for i in range(4))
        return made[folder]

    assert list(HeldOut(["x", "y"], make)) == ["x0", "x1", "x2", "x3", "y0", "y1", "y2", "y3"]
    assert all(v.closed for v in made.values())
    assert list(HeldOut(["x", "y"], make, max_batches=4)) == ["x0", "x1", "y0", "y1"]  # a cap still reads y


@pytest.mark.parametrize("fmt", ["parquet", "tokens"])
def test_a_capped_held_out_pass_reads_every_source_of_a_shard(tmp_path, fmt):
    from tests.train.shards_util import write_job, write_token_job
    from winnow.train.data import Loader, LoaderConfig

    # one val shard whose first rows (2,000 tokens) are all one source's: more than the 3 batches of 2 x 64 read
    rows = [{"id": f"a/{i}", "source": "a", "text": "a" * 100, "meta": None} for i in range(20)]
    rows += [{"id": f"b/{i}", "source": "b", "text": "b" * 200, "meta": None} for i in range(5)]
    train = [[{"id": "t/0", "source": "a", "text": "x" * 100, "meta": None}]]
    folder = (write_job if fmt == "parquet" else write_token_job)(tmp_path / "job", train, val=[rows])
    cfg = LoaderConfig(batch_size=2, seq_len=64, num_workers=0, format=fmt)
    first = list(HeldOut([str(folder)], lambda f: Loader(cfg, f, split="val"), max_batches=3))
    seen = {int(s) for batch in first for s in batch.source_ids[batch.loss_mask].unique()}
    assert len(first) == 3 and len(seen) == 2  # a and b within the first 3 batches of 2 x 64 tokens
    full = list(Loader(cfg, str(folder), split="val"))
    assert sum(int(b.loss_mask.sum()) for b in full) >= 20 * 100 + 5 * 200  # the whole pass reads every row


def test_huge_relative_weights_are_normalised_without_overflow():
    sets = [ShardSetConfig(path="a", weight=1e308), ShardSetConfig(path="b", weight=3e307)]
    folders, weights = training_sets(sets, None, [])
    assert folders == ["a", "b"] and weights == pytest.approx([1 / 1.3, 0.3 / 1.3])


def test_a_folder_written_two_ways_is_one_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="lists a folder twice"):
        training_sets([ShardSetConfig(path="out/a"), ShardSetConfig(path="./out/a/")], None, [])
    with pytest.raises(ConfigError, match="train.replay.from"):
        training_sets([ShardSetConfig(path="base/")], ReplayConfig(path=str(tmp_path / "base"), share=0.1), [])
    assert eval_sets(["out/a", "out/a/", "./out/b", "out/b"], [], None) == ["out/a", "./out/b"]


@pytest.mark.parametrize(
    ("kw", "key"),
    [({"sources": {"docs": float("inf")}}, "sources"), ({"sources": {"docs": float("nan")}}, "sources"),
     ({"weight": float("inf")}, "weight")],
)  # fmt: skip
def test_a_weight_that_is_not_finite_is_refused_naming_its_key(kw, key):
    with pytest.raises(ConfigError, match=rf"train\.shards\[\]\.{key} = .* for 'a' is invalid"):
        ShardSetConfig(path="a", **kw)
