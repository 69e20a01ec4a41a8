"""The counterfactual: each source's share derivative of AdamW's steps, its record, and what it predicts on tiny runs."""

import json

import numpy as np
import pytest
import torch

from winnow.train.attribution import counterfactual
from winnow.train.attribution.split import MomentSplit


def _adam_run(grads, eps_S, *, steps, lr=1e-2, horizon=None):
    """AdamW (no decay, no clipping) over fixed per-source gradients scaled by ``1 + eps_S[a]``; the split alongside."""
    torch.manual_seed(0)
    params = [
        torch.nn.Parameter(torch.randn(5, 3, dtype=torch.float64)),
        torch.nn.Parameter(torch.randn(7, dtype=torch.float64)),
    ]
    opt = torch.optim.AdamW([{"params": params, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95), eps=1e-8)
    split = MomentSplit(opt, len(eps_S), horizon=horizon)
    start = [p.detach().clone() for p in params]
    for t in range(steps):
        for i, p in enumerate(params):
            parts = [grads[t][a][i] * (1 + eps_S[a]) for a in range(len(eps_S))]
            p.grad = sum(parts)
        for a in range(len(eps_S)):
            split.add_grads(a, [grads[t][a][i] * (1 + eps_S[a]) for i in range(len(params))])
        split.before_step()
        opt.step()
        split.after_step(1.0)
    return [p.detach() - s for p, s in zip(params, start)], split


def _grads(S, steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    # a shared direction every source pushes along, plus each source's own part and its noise
    shared = [torch.randn(5, 3, generator=g, dtype=torch.float64), torch.randn(7, generator=g, dtype=torch.float64)]
    own = [
        [torch.randn(5, 3, generator=g, dtype=torch.float64), torch.randn(7, generator=g, dtype=torch.float64)]
        for _ in range(S)
    ]
    scale = [1.0, 0.3, 3.0][:S]
    return [
        [
            [
                0.5 * shared[i] + own[a][i] + scale[a] * torch.randn(own[a][i].shape, generator=g, dtype=torch.float64)
                for i in range(2)
            ]
            for a in range(S)
        ]
        for _ in range(steps)
    ]


def test_share_derivative_of_the_steps_matches_finite_differences():
    """With gradients that do not depend on the weights, the summed derivative is the trajectory's derivative by
    each source's share, first and second moment included, to float rounding."""
    S, steps, h = 3, 12, 1e-3
    grads = _grads(S, steps)
    _, split = _adam_run(grads, [0.0] * S, steps=steps, horizon=1e9)
    derivative = [c.sum(0) for c in split.counterfactual()]  # odd and even steps
    for a in range(S):
        plus, _ = _adam_run(grads, [h if b == a else 0.0 for b in range(S)], steps=steps)
        minus, _ = _adam_run(grads, [-h if b == a else 0.0 for b in range(S)], steps=steps)
        for i in range(2):
            numeric = (plus[i] - minus[i]) / (2 * h)
            torch.testing.assert_close(
                derivative[i][a].double(), numeric, rtol=2e-3, atol=2e-3 * float(numeric.abs().max())
            )


def test_more_of_every_source_changes_nothing():
    """Adam is blind to the gradient's scale: the sources' derivatives sum to about 0."""
    S, steps = 3, 10
    _, split = _adam_run(_grads(S, steps, seed=2), [0.0] * S, steps=steps, horizon=1e9)
    for d in (c.sum(0) for c in split.counterfactual()):
        assert float(d.sum(0).abs().max()) < 1e-4 * float(d.abs().max())


def test_a_noisy_source_shrinks_the_others_steps():
    """A source that is mostly noise fills the second moment: more of it shrinks the displacement along the others'
    common push (its derivative points against it), which the first moment alone would not say."""
    S, steps = 3, 15
    grads = _grads(S, steps, seed=3)
    moved, split = _adam_run(grads, [0.0] * S, steps=steps, horizon=1e9)
    noisy = [c.sum(0) for c in split.counterfactual()]
    along = sum(float((noisy[i][2] * moved[i]).sum()) for i in range(2))
    first_moment = sum(float((split.disp_S[i][2] * moved[i]).sum()) for i in range(2))
    assert along < 0 < first_moment or along < first_moment


def test_the_weight_of_an_old_step_decays_with_the_learning_rate_spent_since():
    S, steps = 2, 8
    grads = _grads(S, steps, seed=4)
    _, long = _adam_run(grads, [0.0] * S, steps=steps, horizon=1e9)
    _, short = _adam_run(grads, [0.0] * S, steps=steps, horizon=2.0)
    assert short.cf_log == pytest.approx(-steps / 2.0)  # constant learning rate: lr / peak = 1 a step
    for a, b in zip(short.counterfactual(), long.counterfactual()):
        assert float(a.abs().sum()) < float(b.abs().sum())


def test_record_predicts_with_saturation_and_intervals():
    slope = np.array([[0.2, -0.1], [-0.05, 0.3]])
    error = np.array([[0.01, 0.2], [0.02, 0.05]])
    rec = counterfactual.record(
        sources=["a", "b"],
        held_out=["a", "b"],
        slope_SB=slope,
        error_SB=error,
        factors=[0.0, 0.5, 2.0],
        saturation=0.5,
        steps=(10, 50),
        horizon=6.0,
        rows=32,
    )
    assert rec["held_out"] == ["a", "b", "mean"]
    left_out = np.asarray(rec["predicted"]["0"])
    np.testing.assert_allclose(left_out[:, :2], -2.0 * slope)  # (0^q - 1)/q = -1/q
    np.testing.assert_allclose(left_out[:, 2], -2.0 * slope.mean(1))
    np.testing.assert_allclose(np.asarray(rec["interval"]["0"])[:, :2], 2 * 2.0 * error)
    doubled = np.asarray(rec["predicted"]["2"])[:, :2]
    np.testing.assert_allclose(doubled, (2**0.5 - 1) / 0.5 * slope)
    json.dumps(rec)  # plain data


def test_slope_error_uses_the_groups_that_hold_rows():
    dots = np.array([[[1.0, 3.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.0]]])  # (S=1, B=2, G=4)
    has = np.array([[True, True, False, False], [True, True, True, True]])
    slope, error, probe = counterfactual.slope_and_error(np.stack([dots / 2, dots / 2]), has)
    np.testing.assert_allclose(slope, [[2.0, 2.0]])
    np.testing.assert_allclose(probe, [[1.0, 0.0]])  # sd 1.414 / sqrt(2)
    np.testing.assert_allclose(error, probe)  # equal halves: the batches' draw adds nothing


# ---- known answers on a tiny model ------------------------------------------------------------------------------
from winnow.train.attribution import AttributionConfig  # noqa: E402
from winnow.train.build import build_trainer  # noqa: E402
from winnow.train.checkpoint import CheckpointConfig  # noqa: E402
from winnow.train.config import TrainConfig  # noqa: E402
from winnow.train.data import Batch, LoaderConfig  # noqa: E402
from winnow.train.model import ModelConfig  # noqa: E402

L, V = 32, 40
MODEL = ModelConfig(vocab_size=V, dim=32, n_layers=1, n_heads=2, ffn_hidden=32, n_experts=4, top_k=2, max_seq_len=64)


def _rows(kind: str, n: int, g: torch.Generator) -> list[list[int]]:
    """``n`` sequences of L + 1 tokens: counting by 1 ("easy"), by 3 ("a"), by 7 ("b"), or uniform noise."""
    if kind == "noise":
        return torch.randint(0, V, (n, L + 1), generator=g).tolist()
    step = {"easy": 1, "a": 3, "b": 7}[kind]
    starts = torch.randint(0, V, (n,), generator=g).tolist()
    return [[(s + step * i) % V for i in range(L + 1)] for s in starts]


def _batch(rows: list[list[int]], sources: list[int]) -> Batch:
    seq = torch.tensor(rows)
    B = len(rows)
    return Batch(
        tokens=seq[:, :-1].contiguous(),
        targets=seq[:, 1:].contiguous(),
        source_ids=torch.tensor(sources)[:, None].expand(B, L).contiguous(),
        loss_mask=torch.ones(B, L, dtype=torch.bool),
        doc_ids=torch.zeros(B, L, dtype=torch.int32),
    )


class _Fresh:
    """Batches of new rows every step: ``counts[s]`` rows of source ``s``'s kind (its name before any '_')."""

    def __init__(self, names: list[str], counts: dict[str, int], seed: int) -> None:
        self.names, self.counts, self.g = names, counts, torch.Generator().manual_seed(100 + seed)

    def __iter__(self):
        return self

    def __next__(self) -> Batch:
        rows, ids = [], []
        for s, n in enumerate(self.names):
            rows += _rows(n.split("_")[0], self.counts.get(n, 0), self.g)
            ids += [s] * self.counts.get(n, 0)
        return _batch(rows, ids)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def _run(folder, counts: dict[str, int], names: list[str], *, seed: int, steps: int = 150):
    """Train on new rows every step, ``counts`` rows per source; every source's held-out rows are the same
    draws of its kind in every run. Returns the trainer after fit() and its final held-out loss per source."""
    held = torch.Generator().manual_seed(7)
    heldout = [_batch(_rows(n.split("_")[0], 8, held), [s] * 8) for s, n in enumerate(names)]
    cfg = TrainConfig(
        output=str(folder),
        steps=steps,
        eval_every=0,
        model=MODEL,
        seed=seed,
        data=LoaderConfig(batch_size=sum(counts.values()), seq_len=L, num_workers=0),
        checkpoint=CheckpointConfig(every=0),
        attribution=AttributionConfig(every=10, start=5, counterfactual_rows=8),
    )
    trainer = build_trainer(cfg, data=_Fresh(names, counts, seed), sources=names, val_data=lambda: list(heldout))
    summary = trainer.fit()
    return trainer, summary["eval"]["eval"]["per_source"]


def _record(folder) -> dict:
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    return next(json.loads(x)["counterfactual"] for x in reversed(lines) if '"counterfactual"' in x)


@pytest.mark.slow
def test_a_source_duplicated_under_two_names_gets_equal_values(tmp_path):
    """The same stream of documents under two names: equal slopes within their intervals, and leaving one copy
    out costs far less than leaving out a source of the same share that nothing else teaches; its predicted
    cost has the sign and size of the measured one (the other copy keeps teaching, at a smaller share)."""
    names = ["easy", "easy_copy", "b", "noise"]
    counts = {"easy": 4, "easy_copy": 4, "b": 4, "noise": 4}
    _, base = _run(tmp_path / "base", counts, names, seed=0)
    cf = _record(tmp_path / "base")
    slope, se = np.asarray(cf["slope"]), np.asarray(cf["slope_se"])
    assert np.all(np.abs(slope[0] - slope[1]) <= 2 * np.hypot(se[0], se[1])), (slope[:2], se[:2])
    left_out = np.asarray(cf["predicted"]["0"])
    copy_out, unique_out = left_out[1, 0], left_out[2, 2]  # on easy's held-out loss / b's on its own
    assert 0 < copy_out < 0.5 * unique_out, left_out
    _, without = _run(tmp_path / "without", {**counts, "easy_copy": 0}, names, seed=0)
    measured = without["easy"] - base["easy"]
    assert measured > 0 and 0.5 < copy_out / measured < 2, (copy_out, measured)


@pytest.mark.slow
def test_a_planted_source_of_random_tokens_is_predicted_to_hurt_and_leaving_it_out_helps(tmp_path):
    names = ["a", "b", "noise"]
    _run(tmp_path / "base", {"a": 4, "b": 4, "noise": 8}, names, seed=0, steps=100)
    cf = _record(tmp_path / "base")
    left_out, half = np.asarray(cf["predicted"]["0"]), np.asarray(cf["interval"]["0"])
    assert np.all(left_out[2, :2] < -half[2, :2]), (left_out[2], half[2])  # leaving it out lowers a's and b's loss
    # measured: the same budget without it (its rows given to a and b), from the same seed
    _, with_noise = _run(tmp_path / "with", {"a": 4, "b": 4, "noise": 8}, names, seed=1, steps=100)
    _, without = _run(tmp_path / "without", {"a": 8, "b": 8}, names, seed=1, steps=100)
    for source in ("a", "b"):
        assert without[source] < with_noise[source] - 0.05, (source, with_noise, without)


def test_bad_settings_are_refused_naming_the_key():
    with pytest.raises(Exception, match="train.attribution.factors"):
        AttributionConfig(every=5, factors=[0.0, -0.5])
    with pytest.raises(Exception, match="train.attribution.saturation"):
        AttributionConfig(every=5, saturation=0.0)
    with pytest.raises(Exception, match="train.attribution.counterfactual_rows"):
        AttributionConfig(every=5, counterfactual_rows=2)


def test_a_run_too_short_for_any_stretch_says_so(tmp_path, caplog):
    names = ["a", "b"]
    trainer, _ = _run(tmp_path, {"a": 2, "b": 2}, names, seed=0, steps=3)  # attribution starts after step 5
    assert not (tmp_path / "metrics.jsonl").read_text().count('"counterfactual"')
    assert "before its first attributed stretch" in caplog.text
