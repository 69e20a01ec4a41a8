"""First-order per-source attribution on a tiny model with hand-made batches (``train/attribution.py``)."""

import json

import numpy as np
import pytest
import torch

from pipelines.report.training import load_run
from train.attribution import AttributionConfig, SourceAttribution
from train.config import TrainConfig
from train.data import Batch, LoaderConfig, RepeatBatch
from train.errors import CheckpointError, ConfigError
from train.model import ModelConfig, Transformer, cross_entropy_per_token
from train.trainer import Trainer

SOURCES = ["target", "copy", "noise"]


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors: one intra-op thread avoids spin-waiting on a shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
L = 32


def _batch(rows: list[list[int]], source: list[int]) -> Batch:
    seq = torch.tensor(rows)
    B = len(rows)
    source_ids = torch.tensor(source)[:, None].expand(B, L).contiguous()
    return Batch(tokens=seq[:, :-1].contiguous(), targets=seq[:, 1:].contiguous(), source_ids=source_ids,
                 loss_mask=torch.ones(B, L, dtype=torch.bool), doc_ids=torch.zeros(B, L, dtype=torch.int32))


def _pattern(start: int, n: int = L + 1) -> list[int]:
    """A learnable sequence: counting by 3 modulo 40 from ``start``."""
    return [(start + 3 * i) % 40 for i in range(n)]


def _setting(seed: int = 0):
    """Held-out 'target' text, a training source that nearly copies it, and one of uniform noise."""
    g = torch.Generator().manual_seed(seed)
    heldout = _batch([_pattern(s) for s in range(4)], [0] * 4)
    copy_rows = [_pattern(s) for s in range(4, 8)]
    copy_rows[0][5] = 7  # a near copy, not an exact one
    noise_rows = torch.randint(0, 40, (4, L + 1), generator=g).tolist()
    train = _batch(copy_rows + noise_rows, [1] * 4 + [2] * 4)
    return heldout, train


_MODEL = ModelConfig(vocab_size=40, dim=16, n_layers=1, n_heads=2, ffn_hidden=16, n_experts=4, top_k=2, max_seq_len=64)


def _model(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(_MODEL)


def _attribution(model, optimizer, heldout, **cfg) -> SourceAttribution:
    return SourceAttribution(AttributionConfig(every=1, **cfg), model=model, optimizer=optimizer, sources=SOURCES,
                             val_data=lambda: [heldout], device=torch.device("cpu"))


def _data_loss(model, batch: Batch, source: int | None = None) -> torch.Tensor:
    loss_BL = cross_entropy_per_token(model(batch.tokens, batch.doc_ids).logits_BLV, batch.targets)
    mask = batch.loss_mask if source is None else batch.loss_mask & (batch.source_ids == source)
    return (loss_BL * mask).sum() / mask.sum()


def test_near_copy_of_heldout_ranks_above_noise():
    heldout, train = _setting()
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(3):  # a few real steps so the Adam preconditioner exists
        optimizer.zero_grad()
        _data_loss(model, train).backward()
        optimizer.step()
    attr = _attribution(model, optimizer, heldout)
    attr.observe([train], lr=3e-3)
    record = attr.update(step=3)
    matrix = np.asarray(record["attribution"]["matrix"])
    assert record["attribution"]["precondition"] == "adam"
    assert matrix[1, 0] < 0, "training on a near copy of the held-out set must lower its loss"
    assert matrix[1, 0] < matrix[2, 0], "the near copy must rank above pure noise for the held-out source"
    assert np.all(matrix[0] == 0), "a source with no training tokens in the batch contributes nothing"


def test_rows_add_up_to_the_whole_step_gradient():
    heldout, train = _setting(1)
    model = _model(1)
    lr = 0.05
    attr = _attribution(model, None, heldout, precondition="none")
    attr.observe([train], lr=lr)
    record = attr.update(step=1)
    column = np.asarray(record["attribution"]["matrix"])[:, 0]
    params = [p for p in model.parameters()]
    g = torch.autograd.grad(_data_loss(model, train), params, allow_unused=True)
    h = torch.autograd.grad(_data_loss(model, heldout, 0), params, allow_unused=True)
    expected = -lr * sum(float((a * b).sum()) for a, b in zip(g, h) if a is not None and b is not None)
    assert column.sum() == pytest.approx(expected, rel=1e-4, abs=1e-9)


def test_predicts_the_heldout_change_of_a_small_sgd_step():
    heldout, train = _setting(2)
    model = _model(2)
    lr = 1e-2
    attr = _attribution(model, None, heldout, precondition="none")
    attr.observe([train], lr=lr)
    predicted = np.asarray(attr.update(step=1)["attribution"]["matrix"])[:, 0].sum()
    with torch.no_grad():
        before = float(_data_loss(model, heldout, 0))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    optimizer.zero_grad()
    _data_loss(model, train).backward()
    optimizer.step()
    with torch.no_grad():
        after = float(_data_loss(model, heldout, 0))
    assert predicted < 0
    assert after - before == pytest.approx(predicted, rel=0.1)


def test_estimates_weigh_every_observed_step():
    heldout, train = _setting(3)
    model = _model(3)
    attr = _attribution(model, None, heldout, precondition="none")
    attr.observe([train], lr=0.01)
    first = np.asarray(attr.update(step=1)["attribution"]["interval"])
    attr.observe([train], lr=0.01)
    second = attr.update(step=2)["attribution"]
    np.testing.assert_allclose(second["matrix"], 2 * first, rtol=1e-6)
    for lr in (0.01, 0.01, 0.02, 0.01):  # four steps, one at twice the learning rate, one clipped to half
        attr.observe([train], lr=lr, clip_coef=0.5 if lr == 0.02 else 1.0)
    third = attr.update(step=6)["attribution"]
    np.testing.assert_allclose(third["interval"], 4 * first, rtol=1e-5)
    assert third["steps_covered"] == 6 and third["row_sums"] == pytest.approx(np.sum(third["matrix"], axis=1))


def test_a_source_seen_in_an_earlier_step_keeps_its_share():
    heldout, train = _setting(7)
    rows = [r + [t] for r, t in zip(train.tokens.tolist(), train.targets[:, -1].tolist())]
    copy_only, noise_only = _batch(rows[:4], [1] * 4), _batch(rows[4:], [2] * 4)
    attr = _attribution(_model(7), None, heldout, precondition="none")
    attr.observe([copy_only], lr=0.01)
    attr.observe([noise_only], lr=0.01)  # the copy source is absent from the last step, not from the interval
    matrix = np.asarray(attr.update(step=2)["attribution"]["matrix"])
    assert matrix[1, 0] < 0 and matrix[2, 0] != 0


def test_state_dict_round_trip_and_source_mismatch():
    heldout, train = _setting(4)
    model = _model(4)
    attr = _attribution(model, None, heldout, precondition="none")
    attr.observe([train], lr=0.01)
    attr.update(step=1)
    attr.observe([train], lr=0.01)
    fresh = _attribution(model, None, heldout, precondition="none")
    fresh.load_state_dict(attr.state_dict())
    np.testing.assert_array_equal(fresh.total_SS, attr.total_SS)
    assert fresh.steps_covered == 1 and fresh._observed == 1
    np.testing.assert_array_equal(fresh._weight_S, attr._weight_S)
    other = SourceAttribution(AttributionConfig(every=1), model=model, optimizer=None, sources=["a", "b", "c"],
                              val_data=lambda: [heldout], device=torch.device("cpu"))
    with pytest.raises(CheckpointError, match="sources"):
        other.load_state_dict(attr.state_dict())


@pytest.mark.parametrize("key,value", [("every", -1), ("heldout_batches", 0), ("precondition", "lion")])
def test_config_errors_name_the_key(key, value):
    with pytest.raises(ConfigError, match=f"train.attribution.{key}"):
        AttributionConfig(**{key: value})


def test_trainer_logs_attribution_records_the_report_reads(tmp_path):
    heldout, train = _setting(5)

    def fit(folder, every: int, start: int = 0) -> Trainer:
        cfg = TrainConfig(output=str(folder), steps=4, eval_every=0, model=_MODEL,
                          data=LoaderConfig(batch_size=8, seq_len=L, num_workers=0),
                          attribution=AttributionConfig(every=every, start=start))
        trainer = Trainer(cfg, model=_model(5), data=RepeatBatch(train), sources=SOURCES, run_dir=folder,
                          device=torch.device("cpu"), val_data=lambda: [heldout])
        trainer.fit()
        return trainer

    with_attr, without = fit(tmp_path / "a", 2), fit(tmp_path / "b", 0)
    assert with_attr.last.loss == without.last.loss  # attribution leaves the training untouched
    assert with_attr.attribution.steps_covered == 4
    run = load_run(tmp_path / "a")
    assert run.attribution is not None and run.attribution.sources == SOURCES
    assert run.attribution.step == 4
    assert run.attribution.matrix[1, 0] < 0  # the near copy helped the held-out source
    late = fit(tmp_path / "c", 1, start=2)  # steps 1-2 are left out, not folded into the first estimate
    assert late.attribution.steps_covered == 2
    records = [json.loads(x) for x in (tmp_path / "c" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "attribution" in r] == [3, 4]
