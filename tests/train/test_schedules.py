"""Learning-rate schedules for continuing: WSD's curve against its definition, re-warming from the current LR."""

import math

import pytest
import torch

from winnow.train.errors import ConfigError
from winnow.train.optim import OptimConfig, build_scheduler
from winnow.train.schedules import decay_start, lr_factor


def _curve(cfg: OptimConfig, total: int, **kw) -> list[float]:
    """The learning rates the scheduler hands the optimizer, step by step, as a run would see them."""
    w = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([w], lr=cfg.lr)
    sched = build_scheduler(opt, cfg, total, **kw)
    lrs = []
    for _ in range(total):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


@pytest.mark.parametrize("shape", ["linear", "cosine", "sqrt"])
def test_wsd_curve_matches_its_definition(shape):
    cfg = OptimConfig(
        lr=1e-3, warmup_steps=10, schedule="wsd", decay_fraction=0.25, decay_shape=shape, min_lr_ratio=0.1
    )
    total = 100
    start = decay_start(total, 10, 0.25)
    assert start == 75
    shapes = {
        "linear": lambda p: 1 - p,
        "cosine": lambda p: 0.5 * (1 + math.cos(math.pi * p)),
        "sqrt": lambda p: 1 - math.sqrt(p),
    }
    expected = []
    for step in range(total):
        if step < 10:
            f = (step + 1) / 10  # warm-up
        elif step < start:
            f = 1.0  # stable
        else:
            f = 0.1 + 0.9 * shapes[shape]((step - start + 1) / (total - start))  # decay to the floor
        expected.append(1e-3 * f)
    assert _curve(cfg, total) == pytest.approx(expected, rel=1e-12)
    assert _curve(cfg, total)[-1] == pytest.approx(1e-4)  # the last step is at the floor
    assert max(_curve(cfg, total)[10:75]) == min(_curve(cfg, total)[10:75]) == pytest.approx(1e-3)


def test_rewarm_starts_from_the_given_fraction():
    cfg = OptimConfig(lr=1e-3, warmup_steps=4, schedule="wsd", decay_fraction=0.5)
    lrs = _curve(cfg, 20, start_factor=0.2)
    assert lrs[:4] == pytest.approx([1e-3 * (0.2 + 0.8 * k / 4) for k in (1, 2, 3, 4)])
    assert lr_factor(0, cfg, 20) == pytest.approx(0.25)  # from zero by default


def test_stable_phase_does_not_depend_on_the_total():
    """What makes resuming a WSD run at its stable phase and decaying later work: before the decay
    starts, the LR is the same whatever ``steps`` the run will end up with."""
    cfg = OptimConfig(warmup_steps=5, schedule="wsd", decay_fraction=0.2)
    short, longer = [lr_factor(s, cfg, 100) for s in range(80)], [lr_factor(s, cfg, 400) for s in range(80)]
    assert short == longer


def test_wsd_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="train.optim.decay_fraction"):
        OptimConfig(schedule="wsd", decay_fraction=0)
    with pytest.raises(ConfigError, match="train.optim.decay_shape"):
        OptimConfig(decay_shape="exp")
    with pytest.raises(ConfigError, match="train.optim.rewarm_from"):
        OptimConfig(rewarm_from="peak")
