"""Load-time mixing of several shard sets by token weight, with the same resumable, elastic state."""

from __future__ import annotations

import numpy as np
import pytest

from tests.train.shards_util import make_docs, write_job
from winnow.train.data import Loader, LoaderConfig
from winnow.train.data.mixing import MixSchedule
from winnow.train.errors import ConfigError


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    a = make_docs(30, sources=("web",), prefix="a")
    b = make_docs(30, sources=("code",), prefix="b")
    root = tmp_path_factory.mktemp("mix")
    return [write_job(root / "a", [a[:15], a[15:]]), write_job(root / "b", [b])], (a, b)


def cfg(**kw):
    return LoaderConfig(**{"batch_size": 4, "seq_len": 16, "num_workers": 0, "mix_weights": [3.0, 1.0], **kw})


def seqs(loaders, steps):
    """Global sequence order from all ranks: (source id of the first target, tokens, targets)."""
    out = []
    for _ in range(steps):
        batches = [next(ld) for ld in loaders]
        for b in range(batches[0].tokens.shape[0]):
            for bt in batches:
                out.append((int(bt.source_ids[b, 0]), tuple(bt.tokens[b].tolist()), tuple(bt.targets[b].tolist())))
    return out


def test_schedule_follows_weights_within_one_sequence():
    mix = MixSchedule([3, 1])
    assigned = mix.assign(400)
    counts = np.cumsum(np.eye(2, dtype=int)[assigned], axis=0)
    expected = np.outer(np.arange(1, 401), [0.75, 0.25])
    assert np.abs(counts - expected).max() <= 1


def test_each_set_keeps_its_own_order_and_documents(sets):
    folders, (a, b) = sets
    loader = Loader(cfg(), folders)
    got = seqs([loader], 150)  # enough for the lighter set to go through a whole epoch
    for sid, docs in ((loader.sources.index("web"), a), (loader.sources.index("code"), b)):
        stream = np.concatenate([np.array(t) for s, _, t in got if s == sid])
        text = stream.astype(np.uint8).tobytes().split(b"\0")
        assert [t.decode() for t in text[: len(docs)]] == [d["text"] for d in docs]
    n_web = sum(s == loader.sources.index("web") for s, _, _ in got)
    assert abs(n_web - 0.75 * len(got)) <= 1


def test_mixed_resume_and_elastic_resume_keep_the_global_order(sets):
    folders, _ = sets
    reference = seqs([Loader(cfg(batch_size=2), folders)], 100)
    first = [Loader(cfg(batch_size=1), folders, rank=r, world_size=2) for r in range(2)]
    done = seqs(first, 37)
    resumed = Loader(cfg(batch_size=2), folders)
    resumed.load_state_dict(first[0].state_dict())
    assert done + seqs([resumed], 50) == reference[: 74 + 100]


def test_mix_weights_must_match_the_data_sets(sets):
    folders, _ = sets
    with pytest.raises(ConfigError, match="mix_weights"):
        Loader(cfg(mix_weights=[1.0, 2.0, 3.0]), folders)
    with pytest.raises(ConfigError, match="mix_weights"):
        LoaderConfig(mix_weights=[1.0, -1.0])


def test_two_sets_holding_a_source_of_one_name_are_said_to_merge_it(tmp_path, sets, caplog):
    folders, _ = sets
    other = write_job(tmp_path / "c", [make_docs(10, sources=("web",), prefix="c")])
    with caplog.at_level("WARNING", logger="winnow.train.data.loader"):
        Loader(cfg(), folders)  # web and code: nothing shared
        assert not caplog.records
        Loader(cfg(), [folders[0], other])
    assert "both hold a source named 'web'" in caplog.text and str(other) in caplog.text


def test_a_resume_with_other_weights_takes_them_over_from_there():
    """A replay share raised on resume gave the new data none of the rest of the run: the new weights were compared
    with the counts the old ones had made, so the favoured set waited to catch up."""
    before = MixSchedule([0.75, 0.25])
    before.advance(before.assign(200))
    state = before.state_dict()
    after = MixSchedule([0.25, 0.75])
    after.load_state_dict(state)
    assert np.bincount(after.assign(100), minlength=2).tolist() == [25, 75]
    same = MixSchedule([0.75, 0.25])  # the same weights: exactly where the run was
    same.load_state_dict(state)
    assert same.assign(8).tolist() == before.assign(8).tolist() and not same.reweighted
    old = MixSchedule([0.25, 0.75])  # a checkpoint from before `configured` was kept: as it was read then
    old.load_state_dict({"counts": state["counts"]})
    assert not old.reweighted


def test_epoch_counts_the_passes_over_the_set_passed_over_most(sets, tmp_path):
    """A tiny second set passed over many times read epoch 0: only the first set's passes were counted."""
    folders, _ = sets
    tiny = write_job(tmp_path / "tiny", [make_docs(2, sources=("tiny",), prefix="t")])
    loader = Loader(cfg(mix_weights=[1.0, 1.0]), [folders[0], tiny])
    for _ in range(15):
        next(loader)
    state = loader.state_dict()
    first, second = (s["epoch"] for s in state["sets"])
    assert first == 0 and second >= 5
    assert loader.epoch == state["epoch"] == loader.stats()["epoch"] == second
    assert loader.most_repeated == f"{tiny} (sources: tiny)"
    resumed = Loader(cfg(mix_weights=[1.0, 1.0]), [folders[0], tiny])
    resumed.load_state_dict(state)
    assert resumed.epoch == second and seqs([resumed], 3) == seqs([loader], 3)
