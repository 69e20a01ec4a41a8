"""Several data sets: training weights with a replay share, held-out sets, and one pass over several val splits."""

import pytest

from train.data.sets import HeldOut, ReplayConfig, ShardSetConfig, eval_sets, training_sets
from train.errors import ConfigError


class _Val(list):
    closed = False

    def close(self):
        self.closed = True


def test_replay_share_scales_the_other_sets():
    folders, weights = training_sets([ShardSetConfig(path="a", weight=3), ShardSetConfig(path="b", weight=1)],
                                     ReplayConfig(path="base", share=0.2), [])
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
