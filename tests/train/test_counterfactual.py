"""The counterfactual: each source's share derivative of AdamW's steps, its record, and what it predicts on tiny runs."""

import json

import numpy as np
import pytest
import torch

from train.attribution import counterfactual
from train.attribution.split import MomentSplit


def _adam_run(grads, eps_S, *, steps, lr=1e-2, horizon=None):
    """AdamW (no decay, no clipping) over fixed per-source gradients scaled by ``1 + eps_S[a]``; the split alongside."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(5, 3, dtype=torch.float64)), torch.nn.Parameter(torch.randn(7, dtype=torch.float64))]
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
    own = [[torch.randn(5, 3, generator=g, dtype=torch.float64), torch.randn(7, generator=g, dtype=torch.float64)] for _ in range(S)]
    scale = [1.0, 0.3, 3.0][:S]
    return [[[0.5 * shared[i] + own[a][i] + scale[a] * torch.randn(own[a][i].shape, generator=g, dtype=torch.float64) for i in range(2)]
             for a in range(S)] for _ in range(steps)]


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
            torch.testing.assert_close(derivative[i][a].double(), numeric, rtol=2e-3, atol=2e-3 * float(numeric.abs().max()))


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
    rec = counterfactual.record(sources=["a", "b"], held_out=["a", "b"], slope_SB=slope, error_SB=error,
                                factors=[0.0, 0.5, 2.0], saturation=0.5, steps=(10, 50), horizon=6.0, rows=32)
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
