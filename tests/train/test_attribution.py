"""Per-source attribution on a tiny model with hand-made batches (``train/attribution/``)."""

import dataclasses
import json

import numpy as np
import pytest
import torch

from winnow.pipelines.report.training import load_run
from winnow.train.attribution import AttributionConfig
from winnow.train.build import build_trainer
from winnow.train.checkpoint import CheckpointConfig
from winnow.train.config import TrainConfig
from winnow.train.data import Batch, LoaderConfig, RepeatBatch
from winnow.train.errors import CheckpointError, ConfigError
from winnow.train.model import ModelConfig
from winnow.train.optim import OptimConfig
from winnow.train.trainer import Trainer

SOURCES = ["target", "copy", "noise"]
L = 32


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors: one intra-op thread avoids spin-waiting on a shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _batch(rows: list[list[int]], source: list[int]) -> Batch:
    seq = torch.tensor(rows)
    B = len(rows)
    source_ids = torch.tensor(source)[:, None].expand(B, L).contiguous()
    return Batch(
        tokens=seq[:, :-1].contiguous(),
        targets=seq[:, 1:].contiguous(),
        source_ids=source_ids,
        loss_mask=torch.ones(B, L, dtype=torch.bool),
        doc_ids=torch.zeros(B, L, dtype=torch.int32),
    )


def _pattern(start: int, n: int = L + 1) -> list[int]:
    """A learnable sequence: counting by 3 modulo 40 from ``start``."""
    return [(start + 3 * i) % 40 for i in range(n)]


def _setting(seed: int = 0):
    """Held-out text of every source; training on a near copy of 'target' (as 'copy') and on uniform noise."""
    g = torch.Generator().manual_seed(seed)

    def noise(n):
        return torch.randint(0, 40, (n, L + 1), generator=g).tolist()

    heldout = [
        _batch([_pattern(s) for s in range(4)], [0] * 4),
        _batch([_pattern(s) for s in range(8, 10)], [1] * 2),
        _batch(noise(2), [2] * 2),
    ]
    copy_rows = [_pattern(s) for s in range(4, 8)]
    copy_rows[0][5] = 7  # a near copy, not an exact one
    train = _batch(copy_rows + noise(4), [1] * 4 + [2] * 4)
    return heldout, train


_MODEL = ModelConfig(vocab_size=40, dim=16, n_layers=1, n_heads=2, ffn_hidden=16, n_experts=4, top_k=2, max_seq_len=64)


def _trainer(
    folder,
    train: Batch,
    heldout: list[Batch],
    *,
    steps: int,
    seed: int = 0,
    model=_MODEL,
    optim: OptimConfig | None = None,
    grad_accum: int = 1,
    parallel=None,
    **attribution,
) -> Trainer:
    cfg = TrainConfig(
        output=str(folder),
        steps=steps,
        eval_every=0,
        model=model,
        grad_accum=grad_accum,
        seed=seed,
        data=LoaderConfig(batch_size=8, seq_len=L, num_workers=0),
        optim=optim or OptimConfig(),
        checkpoint=CheckpointConfig(every=0),
        attribution=AttributionConfig(**attribution),
    )
    return build_trainer(
        cfg, data=RepeatBatch(train), sources=SOURCES, val_data=lambda: list(heldout), parallel=parallel
    )


def _attribution(trainer: Trainer):
    """The run's estimator (``train.attribution.SourceAttribution``)."""
    return trainer.hook("attribution").attribution


def _records(folder) -> list[dict]:
    return [
        json.loads(x)["attribution"] for x in (folder / "metrics.jsonl").read_text().splitlines() if "attribution" in x
    ]


def test_columns_add_up_to_the_measured_change_within_the_residual(tmp_path):
    heldout, train = _setting(5)
    _trainer(tmp_path, train, heldout, steps=20, every=5).fit()
    records = _records(tmp_path)
    assert len(records) == 4
    last = records[-1]
    matrix, measured = np.asarray(last["matrix"]), np.asarray(last["measured"])
    unattributed, residual = np.asarray(last["unattributed"]), np.asarray(last["residual"])
    assert np.all(np.abs(measured) > 0.01), "every held-out source's loss moved"
    np.testing.assert_allclose(matrix.sum(0) + unattributed + residual, measured, rtol=0, atol=1e-9)
    assert np.all(np.abs(residual) < 0.1 * np.abs(measured)), (residual, measured)
    parts = last["unattributed_parts"]
    np.testing.assert_allclose(sum(np.asarray(v) for v in parts.values()), unattributed, atol=1e-9)
    assert np.all(np.abs(parts["rounding"]) < 1e-4 * np.abs(measured)), "the optimizer split is exact"
    # cumulative: the last record is the sum of the stretches, and measured telescopes over them
    np.testing.assert_allclose(sum(np.asarray(r["interval"]["matrix"]) for r in records), matrix, atol=1e-12)
    assert [r["interval"]["steps"] for r in records] == [[1, 5], [6, 10], [11, 15], [16, 20]]


def test_split_sums_to_the_real_adamw_update_with_clipping_and_decay(tmp_path):
    """With router losses off, the sources' parts plus weight decay are the optimizer's whole update."""
    heldout, train = _setting(6)
    model = dataclasses.replace(_MODEL, load_balance="none", z_loss_coef=0.0)
    trainer = _trainer(
        tmp_path,
        train,
        heldout,
        steps=6,
        model=model,
        every=100,
        optim=OptimConfig(grad_clip=0.05, weight_decay=0.1, warmup_steps=2),
    )
    attr = _attribution(trainer)
    theta0 = None
    for _ in range(6):
        trainer.train_step()
        theta0 = theta0 if theta0 is not None else attr._theta0
        assert trainer.last.grad_norm > 0.05  # every step was clipped
    sources, parts = attr.split.parts()
    for i, p in enumerate(attr.params):
        moved = p.detach() - theta0[i]
        explained = sources[i].sum(0) + parts["weight_decay"][i]
        assert float(parts["router"][i].abs().max()) <= 1e-4 * float(moved.abs().max())  # float rounding only
        torch.testing.assert_close(explained, moved, rtol=2e-5, atol=2e-5 * float(moved.abs().max()) + 1e-9)
        torch.testing.assert_close(attr.split.moments()[i], trainer.optimizer.state[p]["exp_avg"], rtol=1e-5, atol=1e-9)
    assert float(sum(s[0].abs().sum() for s in sources)) == 0, "no training tokens of 'target', no part"


class _Alternate(RepeatBatch):
    """``RepeatBatch`` that hands out its batches in turn."""

    def __init__(self, *batches: Batch) -> None:
        super().__init__(batches[0])
        self.batches = batches

    def __next__(self) -> Batch:
        self.position += 1
        return self.batches[(self.position - 1) % len(self.batches)]


def test_rows_of_no_source_go_to_the_router_row_and_the_parts_still_add_up(tmp_path):
    """Steps whose batch has rows of no source (id -1) alternate with steps without: the router part, not
    formed while every row has a source (the split's sum is then the whole gradient), holds what those rows
    did, and sources + router + weight decay are still the optimizer's whole update."""
    heldout, train = _setting(8)
    ids = train.source_ids.clone()
    ids[6:] = -1
    unsourced = dataclasses.replace(train, source_ids=ids)
    model = dataclasses.replace(_MODEL, load_balance="none", z_loss_coef=0.0, doc_mask=True)
    cfg = TrainConfig(
        output=str(tmp_path),
        steps=8,
        eval_every=0,
        model=model,
        data=LoaderConfig(batch_size=8, seq_len=L, num_workers=0),
        optim=OptimConfig(weight_decay=0.1),
        checkpoint=CheckpointConfig(every=0),
        attribution=AttributionConfig(every=100),
    )
    trainer = build_trainer(
        cfg, data=_Alternate(train, train, unsourced), sources=SOURCES, val_data=lambda: list(heldout)
    )
    attr = _attribution(trainer)
    for _ in range(8):
        trainer.train_step()
    assert any(attr.split._captured), "steps without rows of no source skip the router part"
    sources, parts = attr.split.parts()
    router = max(float(r.abs().max()) for r in parts["router"])
    assert router > 1e-4 * max(float(s.abs().max()) for s in sources), "the unsourced rows moved the parameters"
    for i, p in enumerate(attr.params):
        moved = p.detach() - attr._theta0[i]
        explained = sources[i].sum(0) + parts["router"][i] + parts["weight_decay"][i]
        torch.testing.assert_close(explained, moved, rtol=1e-4, atol=1e-4 * float(moved.abs().max()) + 1e-9)


@pytest.mark.parametrize("clip", [1.0, 0.3])
def test_the_backwards_source_sums_give_the_same_step(clip):
    """The router part takes the sources' sum the backward kept (``GradSplit.sums``) or, without one, sums the
    parts itself: the same moments and displacements either way (a plain weight, an expert weight whose
    per-source parts leave the no-source group out, a parameter no source reached, clipping, the momentum
    from before and two data ranks)."""
    from winnow.train.attribution.split import MomentSplit

    def one(kept: bool):
        torch.manual_seed(0)
        params = [
            torch.nn.Parameter(torch.randn(6, 5)),
            torch.nn.Parameter(torch.randn(4, 3, 7)),
            torch.nn.Parameter(torch.randn(9)),
        ]
        opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)
        split = MomentSplit(opt, 3)
        split.pieces.data_ranks = [2, 1, 1]
        for p in params:
            p.grad = torch.randn_like(p) * 0.1
        opt.step()  # momentum from before the stretch
        split.begin_stretch()
        for _ in range(3):
            for p in params:
                p.grad = torch.randn_like(p) * 0.1
            parts = [torch.randn(3, 6, 5) * 0.03, (torch.randn(4, 4, 3, 7) * 0.03)[:3]]  # (S + 1, E, ...) experts
            for key, part in zip(split.keys, parts):  # the last parameter: no source's tokens
                split.buffers()[key] = part
                split.written.add(key)
                if kept:
                    split.sums[key] = part.sum(0)
            split.before_step()
            opt.step()
            split.after_step(clip)
        return split

    kept, summed = one(True), one(False)
    assert kept._before
    for name in ("m_S", "disp_S", "m_router", "disp_router", "m_before", "disp_before", "disp_wd"):
        for a, b in zip(getattr(kept, name), getattr(summed, name)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7 * float(b.abs().max()) + 1e-12)
    assert float(kept.disp_S[1].abs().max()) > 0 and float(kept.disp_router[2].abs().max()) > 0


def test_router_losses_and_weight_decay_are_their_own_rows(tmp_path):
    heldout, train = _setting(7)
    for split in ("losses", "tokens"):
        _trainer(
            tmp_path / split, train, heldout, steps=6, every=3, optim=OptimConfig(weight_decay=0.5), split=split
        ).fit()
    by_loss, by_token = (_records(tmp_path / s)[-1]["unattributed_parts"] for s in ("losses", "tokens"))
    assert np.all(np.abs(by_loss["router"]) > 1e-6) and np.all(np.abs(by_loss["weight_decay"]) > 1e-6)
    assert by_loss["momentum_before"] == [0.0, 0.0, 0.0], "attributed from step 1: no momentum from before"
    # split by token, a router loss goes with the tokens it is computed on: nothing is left for its own row
    assert np.all(np.abs(by_token["router"]) < 1e-3 * np.abs(by_loss["router"]).max())


@pytest.mark.parametrize("interleaved", [False, True])
def test_token_split_is_each_sources_loss_gradient_when_attention_stays_in_documents(
    tmp_path, monkeypatch, interleaved
):
    """One backward split by token position gives the same parts as one backward per source's loss; the
    MoE hands each expert's rows to the backward grouped by source, even when the batch interleaves the
    sources, so the per-(source, expert) weight gradients are slices of them (no gather)."""
    from winnow.train.attribution import hooks

    heldout, train = _setting(11)
    if interleaved:  # rows of the two sources alternating
        order = torch.tensor([0, 4, 1, 5, 2, 6, 3, 7])
        train = Batch(
            **{
                f.name: getattr(train, f.name)[order]
                for f in dataclasses.fields(Batch)
                if isinstance(getattr(train, f.name), torch.Tensor)
            }
        )
    grouped = []
    group_parts = hooks._group_parts
    monkeypatch.setattr(
        hooks,
        "_group_parts",
        lambda x, g, group_A, n: (grouped.append(hooks._sorted(group_A)), group_parts(x, g, group_A, n))[1],
    )
    model = dataclasses.replace(_MODEL, load_balance="none", z_loss_coef=0.0, doc_mask=True)
    splits = {}
    for split in ("losses", "tokens"):
        trainer = _trainer(tmp_path / split, train, heldout, steps=3, model=model, every=100, split=split)
        for _ in range(3):
            trainer.train_step()
        splits[split] = _attribution(trainer).split
    for a, b in zip(splits["losses"].m_S, splits["tokens"].m_S):  # the moments: linear in the gradients
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5 * float(a.abs().max()) + 1e-12)
    assert grouped and all(grouped)


def test_tied_embeddings_split_adds_up(tmp_path):
    """A head tied to the embedding gets per-source parts from both uses; the sources' sum the router part is
    taken against holds both, so nothing lands in the router row (or its opposite in rounding)."""
    heldout, train = _setting(3)
    trainer = _trainer(
        tmp_path, train, heldout, steps=6, model=dataclasses.replace(_MODEL, tie_embeddings=True), every=3
    )
    for _ in range(3):
        trainer.train_step()
    record = trainer.after_step()[0]["attribution"]
    scale = np.abs(record["measured"]).max()
    for part in ("router", "rounding"):
        assert np.abs(record["unattributed_parts"][part]).max() < 1e-5 * scale, part


def test_near_copy_of_heldout_ranks_above_noise(tmp_path):
    heldout, train = _setting(0)
    _trainer(tmp_path, train, heldout, steps=8, every=4).fit()
    matrix = np.asarray(_records(tmp_path)[-1]["matrix"])
    assert matrix[1, 0] < 0, "training on a near copy of the held-out set must lower its loss"
    assert matrix[1, 0] < matrix[2, 0], "the near copy must rank above pure noise for the held-out source"
    assert np.all(matrix[0] == 0), "a source with no training tokens contributes nothing"


def test_start_leaves_steps_out_and_their_momentum_is_its_own_row(tmp_path):
    heldout, train = _setting(8)
    trainer = _trainer(tmp_path, train, heldout, steps=9, every=3, start=2)
    trainer.fit()
    records = _records(tmp_path)
    assert [r["interval"]["steps"] for r in records] == [[3, 5], [6, 8], [9, 9]]  # the last, shorter stretch too
    assert records[-1]["steps_covered"] == 7 == _attribution(trainer).steps_covered
    assert np.all(np.abs(records[-1]["unattributed_parts"]["momentum_before"]) > 0)
    run = load_run(tmp_path)
    assert run.attribution.sources == SOURCES and run.attribution.step == 9
    np.testing.assert_allclose(run.attribution.measured, records[-1]["measured"])


@pytest.mark.parametrize("split,tolerance", [("losses", 0.0), ("tokens", 1e-5)])
def test_attribution_leaves_the_training_untouched(tmp_path, split, tolerance):
    """Split by loss, training is bit-identical; split by token, the weight gradients are the same sums
    in another order (float rounding)."""
    heldout, train = _setting(9)
    with_attr = _trainer(tmp_path / "a", train, heldout, steps=4, every=2, split=split)
    with_attr.fit()
    without = _trainer(tmp_path / "b", train, heldout, steps=4, every=0)
    without.fit()
    assert with_attr.last.loss == pytest.approx(without.last.loss, rel=tolerance, abs=0)
    for p, q in zip(with_attr.model.parameters(), without.model.parameters()):
        torch.testing.assert_close(p, q, rtol=tolerance, atol=tolerance * 1e-2)


def test_run_resumed_mid_stretch_gives_the_same_record(tmp_path):
    heldout, train = _setting(10)
    _trainer(tmp_path / "whole", train, heldout, steps=6, every=2).fit()
    cut = _trainer(tmp_path / "cut", train, heldout, steps=6, every=2)
    for _ in range(3):  # killed after a checkpoint at step 3, inside the stretch of steps 3-4
        cut.train_step()
        cut.after_step()
    cut.save_checkpoint()
    _trainer(tmp_path / "cut", train, heldout, steps=6, every=2).fit()
    whole, resumed = _records(tmp_path / "whole"), _records(tmp_path / "cut")
    assert [r["interval"]["steps"] for r in resumed] == [r["interval"]["steps"] for r in whole]
    for key in ("matrix", "unattributed", "measured", "residual"):
        np.testing.assert_allclose(resumed[-1][key], whole[-1][key], rtol=1e-4, atol=1e-7)


def test_state_dict_round_trip_and_source_mismatch(tmp_path):
    heldout, train = _setting(4)
    trainer = _trainer(tmp_path, train, heldout, steps=3, every=2)
    trainer.fit()
    state = _attribution(trainer).state_dict()
    fresh = _attribution(_trainer(tmp_path / "fresh", train, heldout, steps=3, every=2))
    fresh.load_state_dict(state)
    assert fresh.open_at == _attribution(trainer).open_at and fresh.steps_covered == 3
    np.testing.assert_array_equal(fresh.total["matrix"], _attribution(trainer).total["matrix"])
    for a, b in zip(fresh.split.m_S, _attribution(trainer).split.m_S):
        torch.testing.assert_close(a, b)
    state["sources"] = ["a", "b", "c"]
    with pytest.raises(CheckpointError, match="sources"):
        fresh.load_state_dict(state)


@pytest.mark.parametrize("key,value", [("every", -1), ("heldout_rows", 0), ("start", 1.5), ("split", "rows")])
def test_config_errors_name_the_key(key, value):
    with pytest.raises(ConfigError, match=f"train.attribution.{key}"):
        AttributionConfig(**{key: value})
