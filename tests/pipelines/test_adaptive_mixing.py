"""``[train.mixing] adaptive = "doremi"``: the mix moves toward the sources with excess loss, resumes exactly, and
refuses a reference that cannot score the run's data before training."""

import dataclasses
import json

import numpy as np
import pytest
import torch

from tests.pipelines.continue_util import make_job, tiny_config
from tests.pipelines.tiny import TINY_MODEL
from winnow.pipelines.train import build_trainer
from winnow.train.adaptive import AdaptiveMix, MixingConfig
from winnow.train.data.mixing import MixSchedule
from winnow.train.data.sets import ReplayConfig, ShardSetConfig
from winnow.train.errors import CheckpointError, ConfigError
from winnow.train.model import ModelOutput


def test_reweighting_takes_over_at_once_and_resumes_exactly():
    mix = MixSchedule([1, 1, 1])
    first = mix.assign(9)
    assert np.bincount(first, minlength=3).tolist() == [3, 3, 3]
    mix.advance(first)
    mix.reweight([0.8, 0.1, 0.1])
    state = json.loads(json.dumps(mix.state_dict()))  # checkpoints hold it as JSON
    after = mix.assign(40)
    counts = np.bincount(after, minlength=3)
    assert np.all(np.abs(counts - np.array([0.8, 0.1, 0.1]) * 40) <= 1)  # the new shares from the first sequence on,
    # with no catching up on the 3 sequences each set had before
    again = MixSchedule([1, 1, 1])
    again.load_state_dict(state)
    assert again.assign(40).tolist() == after.tolist()
    with pytest.raises(ConfigError, match="3 positive numbers"):
        mix.reweight([1, 0, 1])


def test_constant_weights_assign_as_before():  # w * (g + 1) - count, the schedule every existing run follows
    weights = np.array([0.5, 0.3, 0.2])
    mix, counts, expected = MixSchedule(weights.tolist()), np.zeros(3), []
    for g in range(50):
        s = int(np.argmax(weights * (g + 1) - counts))
        expected.append(s)
        counts[s] += 1
    assert mix.assign(50).tolist() == expected


class _Reference(torch.nn.Module):
    """Logits that give every token the same loss per source id (the token's value is its source id)."""

    def __init__(self, losses: list[float], vocab: int = 8) -> None:
        super().__init__()
        self.losses, self.vocab = losses, vocab

    def forward(self, tokens_BL, doc_ids_BL=None):
        # target 0 everywhere: loss = logsumexp - logit_0; make logit_0 = 0 and the rest equal to hit each loss
        loss = torch.tensor(self.losses)[tokens_BL]
        rest = torch.log((torch.exp(loss) - 1) / (self.vocab - 1))
        logits = rest[..., None].expand(*tokens_BL.shape, self.vocab).clone()
        logits[..., 0] = 0
        return ModelOutput(logits_BLV=logits, router_loss=torch.zeros(()), moe=[])


def _batch(sources: list[int]):
    ids = torch.tensor([sources])
    return ids, torch.zeros_like(ids), ids, torch.ones_like(ids, dtype=torch.bool)


def test_the_source_with_more_excess_loss_gains_weight_and_an_absent_one_keeps_its_last_excess():
    cfg = MixingConfig(adaptive="doremi", reference="unused", every=1, step_size=1.0, smoothing=0.0)
    mix = AdaptiveMix(
        cfg,
        reference=_Reference([1.0, 1.0, 1.0]),
        set_sources=[0, 1, 2],
        weights=[1, 1, 1],
        n_sources=3,
        device=torch.device("cpu"),
        names=["a", "b", "c"],
    )
    tokens, doc_ids, source_ids, mask = _batch([0, 0, 1, 1, 2, 2])
    model_loss = torch.tensor([[3.0, 3.0, 1.5, 1.5, 0.5, 0.5]])  # excess 2, 0.5, and 0 (clipped: below the reference)
    mix.add(model_loss, tokens, doc_ids, torch.zeros_like(tokens), source_ids, mask)
    weights = mix.update()
    expected = torch.softmax(torch.tensor([2.0, 0.5, 0.0], dtype=torch.float64), 0)
    torch.testing.assert_close(torch.tensor(weights, dtype=torch.float64), expected, atol=1e-5, rtol=1e-5)
    tokens, doc_ids, source_ids, mask = _batch([1, 1, 2, 2])  # source 0 absent: its excess stays 2
    mix.add(torch.tensor([[1.0, 1.0, 1.0, 1.0]]), tokens, doc_ids, torch.zeros_like(tokens), source_ids, mask)
    second = mix.update()
    assert mix.excess.tolist() == pytest.approx([2.0, 0.0, 0.0], abs=1e-5)
    assert second[0] > weights[0]
    report = mix.report()
    assert report["mix_weights_mean"]["a"] == pytest.approx((weights[0] + second[0]) / 2)
    floor = MixingConfig(adaptive="doremi", reference="unused", every=1, step_size=50.0, smoothing=0.3)
    starved = AdaptiveMix(
        floor,
        reference=_Reference([1.0] * 3),
        set_sources=[0, 1, 2],
        weights=[1, 1, 1],
        n_sources=3,
        device=torch.device("cpu"),
    )
    tokens, doc_ids, source_ids, mask = _batch([0, 1, 2])
    starved.add(torch.tensor([[5.0, 1.0, 1.0]]), tokens, doc_ids, torch.zeros_like(tokens), source_ids, mask)
    assert min(starved.update()) == pytest.approx(0.1)  # smoothing / k: no source is starved however large the excess


def _reference_run(tmp_path, job):
    cfg = tiny_config(tmp_path / "reference", str(job), steps=6)
    with build_trainer(cfg) as trainer:
        trainer.fit()
    return cfg.output


def _adaptive(tmp_path, job, reference, *, steps, name="run", **kw):
    mixing = MixingConfig(adaptive="doremi", reference=reference, every=2, step_size=2.0, smoothing=0.05)
    return tiny_config(tmp_path / name, str(job), steps=steps, mixing=mixing, **kw)


def test_a_run_moves_its_mix_logs_it_and_resumes_to_the_same_weights_and_losses(tmp_path):
    job = make_job(tmp_path / "job", ("prose", "legal", "code"))
    reference = _reference_run(tmp_path, job)
    with build_trainer(_adaptive(tmp_path, job, reference, steps=8)) as trainer:
        start = list(trainer.data.mix_weights)
        straight = [trainer.train_step().loss for _ in range(8)]
        weights = trainer.hook("mixing").report()
        assert trainer.data.mix_weights != start and trainer.hook("mixing").updates == 4
        assert trainer.data.mix_weights == pytest.approx(
            [weights["mix_weights"][s] for s in ("prose", "legal", "code")]
        )

    cfg = _adaptive(tmp_path, job, reference, steps=4, name="resumed")  # fit() leaves a checkpoint at its end
    with build_trainer(cfg) as trainer:
        summary = trainer.fit()
    assert set(summary["mixing"]["mix_weights"]) == {"prose", "legal", "code"}
    records = [json.loads(line) for line in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()]
    assert any("mix_weights" in r and "mix_weights_mean" in r for r in records)
    from winnow.pipelines.report.page import write_report

    page = write_report(tmp_path / "resumed").read_text()
    assert '<h3>Adaptive mix</h3><img alt="adaptive mix weights"' in page and "<th>mean over the run</th>" in page
    with build_trainer(dataclasses.replace(cfg, steps=8)) as trainer:
        assert trainer.resume()
        resumed = [trainer.train_step().loss for _ in range(4)]
        assert trainer.hook("mixing").report() == weights
    assert resumed == pytest.approx(straight[4:], rel=1e-5)


def test_a_reference_is_read_from_any_fsspec_url_and_verified(tmp_path):
    import fsspec

    job = make_job(tmp_path / "job", ("prose", "legal"))
    reference = _reference_run(tmp_path, job)
    fs = fsspec.filesystem("memory")
    fs.put(reference, "/ref", recursive=True)
    try:
        with build_trainer(_adaptive(tmp_path, job, "memory://ref", steps=2)) as trainer:
            assert trainer.fit()["mixing"]["mix_weights"]
        state = next(iter(fs.glob("/ref/checkpoints/step-*/state.pt")))
        fs.pipe(state, fs.cat(state)[:-16])  # truncated: fails its checksum, and it is the only checkpoint
        with pytest.raises(CheckpointError, match="train.mixing.reference|fails its checksum"):
            build_trainer(_adaptive(tmp_path, job, "memory://ref", steps=2, name="again"))
    finally:
        fs.rm("/ref", recursive=True)


def test_a_reference_that_cannot_score_the_run_is_refused_before_training(tmp_path):
    job = make_job(tmp_path / "job", ("prose", "legal"))
    other = make_job(tmp_path / "other", ("prose",))
    reference = _reference_run(tmp_path, other)  # never saw 'legal'
    with pytest.raises(ConfigError, match=r"train.mixing.reference = .*without 'legal'"):
        build_trainer(_adaptive(tmp_path, job, reference, steps=2))
    with pytest.raises(ConfigError, match="train.mixing.reference = .*does not exist"):
        build_trainer(_adaptive(tmp_path, job, str(tmp_path / "nothing-here"), steps=2))
    (tmp_path / "untrained" / "checkpoints").mkdir(parents=True)
    with pytest.raises(ConfigError, match="train.mixing.reference = .*holds no checkpoints"):
        build_trainer(_adaptive(tmp_path, job, str(tmp_path / "untrained"), steps=2))
    sets = [ShardSetConfig(path=str(job)), ShardSetConfig(path=str(other))]  # 'prose' in both
    cfg = dataclasses.replace(_adaptive(tmp_path, job, reference, steps=2), shards=sets)
    with pytest.raises(ConfigError, match=r"reweights sources, but source 'prose' is in two \[train\] shards entries"):
        build_trainer(cfg)
    cfg = _adaptive(tmp_path, other, reference, steps=2, replay=ReplayConfig(path=str(job), share=0.1))
    with pytest.raises(ConfigError, match=r"reweights sources, but the replay set holds \['prose', 'legal'\]"):
        build_trainer(cfg)


def test_every_shards_entry_is_split_per_source_for_the_mix(tmp_path):
    reference = _reference_run(tmp_path, make_job(tmp_path / "all", ("prose", "legal", "code")))
    sets = [
        ShardSetConfig(path=str(make_job(tmp_path / "a", ("prose", "legal")))),
        ShardSetConfig(path=str(make_job(tmp_path / "b", ("code",))), weight=0.5),
    ]
    cfg = dataclasses.replace(_adaptive(tmp_path, tmp_path / "a", reference, steps=4), shards=sets)
    with build_trainer(cfg) as trainer:
        assert sorted(trainer.data.set_sources) == [["code"], ["legal"], ["prose"]]
        weights = dict(zip([n[0] for n in trainer.data.set_sources], trainer.data.mix_weights))
        assert weights["code"] == pytest.approx(1 / 3)  # the entry's weight, 0.5 of 1.5
        assert weights["prose"] + weights["legal"] == pytest.approx(2 / 3)  # split by their bytes
        summary = trainer.fit()
    assert summary["mixing"]["mix_weights"] != pytest.approx(weights)  # two updates moved it


@pytest.mark.parametrize(
    "kw, key",
    [
        ({"adaptive": "odm"}, "adaptive"),
        ({"adaptive": "doremi"}, "reference"),
        ({"every": 0}, "every"),
        ({"step_size": 0}, "step_size"),
        ({"smoothing": 1.0}, "smoothing"),
    ],
)
def test_bad_mixing_values_name_the_key(kw, key):
    with pytest.raises(ConfigError, match=f"train.mixing.{key}"):
        MixingConfig(**kw)


def test_winnow_train_splits_a_job_folder_per_source_and_records_the_reference(tmp_path, capsys):
    from winnow.pipelines.cli import main

    job = make_job(tmp_path / "job", ("prose", "legal", "code"))
    reference = _reference_run(tmp_path, job)
    toml = tmp_path / "job.toml"
    toml.write_text(f'''[job]
output = "{job}"
[train]
output = "{tmp_path / "run"}"
steps = 4
eval_every = 0
{TINY_MODEL}
[train.mixing]
adaptive = "doremi"
reference = "{reference}"
every = 2
''')
    assert main(["-q", "train", str(toml)]) == 0
    assert "adaptive mix, mean over the run: prose=" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "run" / "sources" / "set-0").iterdir()) == ["code", "legal", "prose"]
    provenance = json.loads((tmp_path / "run" / "provenance.json").read_text())
    assert provenance["mixing_reference"] == reference


def test_excess_compares_plain_cross_entropy_when_the_run_smooths_its_labels(tmp_path):
    """A reference with the model's own weights has no excess on any source, label smoothing or not."""
    job = make_job(tmp_path / "job", ("prose", "legal"))
    reference = _reference_run(tmp_path, job)
    with build_trainer(_adaptive(tmp_path, job, reference, steps=2, label_smoothing=0.2)) as trainer:
        trainer.train_step()  # every = 2: the second step is scored
        trainer.hook("mixing").reference.load_state_dict(trainer.model.state_dict())
        trainer.train_step()
        excess = trainer.hook("mixing").report()["excess_loss"]
    assert trainer.hook("mixing").updates == 1 and max(excess.values()) < 1e-6


def _counterfactual_reference(tmp_path, job):
    """A tiny run with attribution on to its end: its metrics.jsonl ends with a counterfactual record."""
    from winnow.train.attribution import AttributionConfig

    cfg = tiny_config(
        tmp_path / "cf-reference",
        str(job),
        steps=8,
        attribution=AttributionConfig(every=2, start=1, counterfactual_rows=8),
    )
    with build_trainer(cfg) as trainer:
        trainer.fit()
    return cfg.output


def test_a_counterfactual_mix_starts_where_the_reference_points_and_step_size_0_keeps_it(tmp_path):
    from winnow.train.adaptive import proposal
    from winnow.train.attribution.counterfactual import read_record

    job = make_job(tmp_path / "job", ("prose", "legal", "code"))
    reference = _counterfactual_reference(tmp_path, job)
    record = read_record(reference)
    # the mix as configured (each source's share of the job): a start moved by a factor of 1 + 1e-12 at most
    still = MixingConfig(adaptive="counterfactual", reference=reference, step_size=0.0, max_factor=1 + 1e-12)
    with build_trainer(tiny_config(tmp_path / "plain", str(job), steps=1, mixing=still)) as trainer:
        configured = dict(zip([n[0] for n in trainer.data.set_sources], trainer.data.mix_weights))
    mixing = MixingConfig(adaptive="counterfactual", reference=reference, step_size=0.0, max_factor=1.5)
    with build_trainer(tiny_config(tmp_path / "fixed", str(job), steps=4, mixing=mixing)) as trainer:
        names = [n[0] for n in trainer.data.set_sources]
        start = proposal(
            record["slope"], record["held_out"], record["sources"], configured, target="mean", max_factor=1.5
        )
        assert trainer.data.mix_weights == pytest.approx([start[n] for n in names])
        moved = [start[n] / configured[n] for n in names]
        assert 1.5 - 1e-9 <= max(moved) / min(moved) <= 1.5**2 + 1e-9  # the largest move of a log-share is ln 1.5
        trainer.fit()
        assert trainer.data.mix_weights == pytest.approx([start[n] for n in names])  # no attribution, no moves


def test_a_counterfactual_mix_with_a_step_follows_the_runs_own_counterfactual(tmp_path):
    from winnow.train.attribution import AttributionConfig

    job = make_job(tmp_path / "job", ("prose", "legal", "code"))
    reference = _counterfactual_reference(tmp_path, job)
    mixing = MixingConfig(adaptive="counterfactual", reference=reference, every=2, step_size=5.0)
    cfg = tiny_config(
        tmp_path / "following", str(job), steps=6, mixing=mixing, attribution=AttributionConfig(every=2, start=1)
    )
    with build_trainer(cfg) as trainer:
        start = list(trainer.data.mix_weights)
        summary = trainer.fit()
        assert trainer.hook("mixing").updates >= 2 and trainer.data.mix_weights != pytest.approx(start)
    assert set(summary["mixing"]["mix_weights"]) == {"prose", "legal", "code"}
    nowhere = tiny_config(  # a reference that is no run is named as such (it was "no counterfactual record")
        tmp_path / "nowhere",
        str(job),
        steps=2,
        mixing=MixingConfig(adaptive="counterfactual", reference=str(tmp_path / "nosuch")),
    )
    with pytest.raises(ConfigError, match=r"train.mixing.reference = .*nosuch': no run there"):
        build_trainer(nowhere)
    with pytest.raises(ConfigError, match="train.mixing.step_size"):
        MixingConfig(adaptive="counterfactual", reference=reference, step_size=-1.0)
    with pytest.raises(ConfigError, match="train.mixing.step_size"):
        MixingConfig(adaptive="doremi", reference=reference, step_size=0.0)
