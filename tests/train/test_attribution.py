"""First-order per-source attribution on a tiny model with hand-made batches (``train/attribution.py``)."""

import numpy as np
import pytest
import torch

from pipelines.report.training import load_run
from train.attribution import AttributionConfig, SourceAttribution
from train.config import TrainConfig
from train.data import Batch, LoaderConfig
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


class _Repeat:
    """An endless, resumable stand-in for the Loader: the same training batch every step."""

    def __init__(self, batch: Batch) -> None:
        self.batch, self.position = batch, 0

    def __iter__(self):
        return self

    def __next__(self) -> Batch:
        self.position += 1
        return self.batch

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


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
    record = _attribution(model, optimizer, heldout).update([train], step=3, lr=3e-3)
    matrix = np.asarray(record["attribution"]["matrix"])
    assert record["attribution"]["precondition"] == "adam"
    assert matrix[1, 0] < 0, "training on a near copy of the held-out set must lower its loss"
    assert matrix[1, 0] < matrix[2, 0], "the near copy must rank above pure noise for the held-out source"
    assert np.all(matrix[0] == 0), "a source with no training tokens in the batch contributes nothing"


def test_rows_add_up_to_the_whole_step_gradient():
    heldout, train = _setting(1)
    model = _model(1)
    lr = 0.05
    record = _attribution(model, None, heldout, precondition="none").update([train], step=1, lr=lr)
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
    predicted = np.asarray(_attribution(model, None, heldout, precondition="none")
                           .update([train], step=1, lr=lr)["attribution"]["matrix"])[:, 0].sum()
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


def test_estimates_accumulate_and_scale_with_every():
    heldout, train = _setting(3)
    model = _model(3)
    attr = _attribution(model, None, heldout, precondition="none")
    first = np.asarray(attr.update([train], step=1, lr=0.01)["attribution"]["interval"])
    second = attr.update([train], step=2, lr=0.01)["attribution"]
    np.testing.assert_allclose(second["matrix"], 2 * first, rtol=1e-6)
    five = SourceAttribution(AttributionConfig(every=5, precondition="none"), model=model, optimizer=None,
                             sources=SOURCES, val_data=lambda: [heldout], device=torch.device("cpu"))
    np.testing.assert_allclose(five.update([train], step=5, lr=0.01)["attribution"]["matrix"], 5 * first, rtol=1e-5)
    assert second["steps_covered"] == 2 and second["row_sums"] == pytest.approx(np.sum(second["matrix"], axis=1))


def test_state_dict_round_trip_and_source_mismatch():
    heldout, train = _setting(4)
    model = _model(4)
    attr = _attribution(model, None, heldout, precondition="none")
    attr.update([train], step=1, lr=0.01)
    fresh = _attribution(model, None, heldout, precondition="none")
    fresh.load_state_dict(attr.state_dict())
    np.testing.assert_array_equal(fresh.total_SS, attr.total_SS)
    assert fresh.steps_covered == 1
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
    cfg = TrainConfig(output=str(tmp_path), steps=4, eval_every=0, model=_MODEL,
                      data=LoaderConfig(batch_size=8, seq_len=L, num_workers=0), attribution=AttributionConfig(every=2))
    trainer = Trainer(cfg, model=_model(5), data=_Repeat(train), sources=SOURCES, run_dir=tmp_path,
                      device=torch.device("cpu"), val_data=lambda: [heldout])
    losses = [trainer.train_step().loss for _ in range(2)]
    trainer.attribute()
    assert [trainer.train_step().loss for _ in range(1)][0] < losses[0]  # attribution left the training intact
    assert trainer.state_dict()["attribution"]["steps_covered"] == 2
    trainer.fit()
    run = load_run(tmp_path)
    assert run.attribution is not None and run.attribution.sources == SOURCES
    assert run.attribution.step == 4
    assert run.attribution.matrix[1, 0] < 0  # the near copy helped the held-out source


def test_estimates_start_after_the_configured_step():
    heldout, _ = _setting(6)
    attr = SourceAttribution(AttributionConfig(every=5, start=12), model=_model(6), optimizer=None, sources=SOURCES,
                             val_data=lambda: [heldout], device=torch.device("cpu"))
    assert [s for s in range(1, 31) if attr.due(s)] == [15, 20, 25, 30]
