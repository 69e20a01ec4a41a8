"""Top-k gradient compression with error feedback (DGC): the hook's arithmetic on one gloo rank, bad input,
and 2-process runs: density 1 equals plain DDP, the bytes sent, and a resume that continues exactly."""

import math

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tests.train.parallel_workers import records, reference_run, spawn
from winnow.curate.errors import ConfigError as JobFileError
from winnow.pipelines.jobfile import build_config
from winnow.train.config import TrainConfig
from winnow.train.errors import ConfigError
from winnow.train.parallel import ParallelConfig
from winnow.train.parallel.comm import CommTimer
from winnow.train.parallel.compression import TopKCompression
from winnow.train.parallel.config import TopKConfig


class Known(nn.Module):
    """A model whose gradients are its inputs: ``d/dw (w·x).sum() = x``."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(40))
        self.b = nn.Parameter(torch.zeros(6, 5))

    def forward(self, x, y):
        return (self.w * x).sum() + (self.b * y).sum()


@pytest.fixture
def group(tmp_path):
    """A one-rank gloo group: DDP runs its comm hook as on many ranks."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    pg = dist.group.WORLD
    yield pg
    dist.destroy_process_group()
    # Kept alive: the gloo thread that ran the test's last exchange may still be finishing it, and were its
    # reference the group's last, the group's destructor would join that thread from itself ("Resource
    # deadlock avoided", which aborts the process).
    _GROUPS.append(pg)


_GROUPS: list = []


def _wrapped(group, *, grad_clip: float = 0.0, bucket_mb: float = 25, adam=(0.95, 1e-8), **cfg):
    model = Known()
    timer = CommTimer()
    comp = TopKCompression(TopKConfig(**cfg), model, group=group, timer=timer, grad_clip=grad_clip, adam=adam)
    ddp = DistributedDataParallel(model, process_group=group, bucket_cap_mb=bucket_mb)
    comp.register(ddp)
    return model, ddp, comp, timer


def _step(model, ddp, x, y) -> dict[str, torch.Tensor]:
    """One backward with gradients (x, y); returns the gradients the hook gave each parameter."""
    model.zero_grad(set_to_none=True)
    ddp(x, y).backward()
    return {"w": model.w.grad.clone(), "b": model.b.grad.flatten().clone()}


def _inputs(steps: int, scale: float = 1.0):
    gen = torch.Generator().manual_seed(0)
    return [(torch.randn(40, generator=gen) * scale, torch.randn(6, 5, generator=gen) * scale) for _ in range(steps)]


# ---- bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kw, key",
    [
        ({"density": 0.0}, "density"),
        ({"density": 1.5}, "density"),
        ({"density": -0.01}, "density"),
        ({"warmup_density": 0.0}, "warmup_density"),
        ({"density": 0.5, "warmup_density": 0.1}, "warmup_density"),
        ({"warmup_steps": -1}, "warmup_steps"),
        ({"momentum": 1.0}, "momentum"),
        ({"value_dtype": "float16"}, "value_dtype"),
        ({"precondition": "sgd"}, "precondition"),
    ],
)
def test_bad_topk_settings_name_the_key(kw, key):
    with pytest.raises(ConfigError, match=rf"train\.parallel\.topk\.{key} = "):
        TopKConfig(**kw)


@pytest.mark.parametrize(
    "kw",
    [{"dp_shard": 2}, {"dp_shard": -1}, {"pp": 2}, {"powersgd_rank": 2}, {"compression": "dgc"}],
    ids=["fsdp", "fsdp-all", "pp", "powersgd", "unknown"],
)
def test_topk_outside_plain_ddp_is_refused_naming_the_key(kw):
    with pytest.raises(ConfigError, match=r"train\.parallel\.compression = "):
        ParallelConfig(**{"compression": "topk", **kw})


def test_adam_preconditioning_with_lamb_a_base_runs_optimizer_or_adams_own_momentum_is_refused_naming_the_key():
    with pytest.raises(JobFileError, match=r"train\.parallel\.topk\.precondition = 'adam' .*betas\[0\] = 0\.9"):
        build_config(TrainConfig, {"parallel": {"compression": "topk", "topk": {"precondition": "adam"}}}, "job.toml")
    build_config(
        TrainConfig,
        {
            "parallel": {"compression": "topk", "topk": {"precondition": "adam", "momentum": 0.9}},
            "optim": {"betas": [0, 0.95]},
        },
        "job.toml",
    )
    with pytest.raises(JobFileError, match=r"train\.parallel\.topk\.precondition = 'adam' .*'lamb'"):
        build_config(
            TrainConfig,
            {
                "parallel": {"compression": "topk", "topk": {"precondition": "adam"}},
                "optim": {"name": "lamb", "betas": [0, 0.95]},
            },
            "job.toml [train]",
        )
    with pytest.raises(JobFileError, match=r"train\.parallel\.topk\.precondition = 'adam' .*init_optimizer"):
        build_config(
            TrainConfig,
            {
                "parallel": {"compression": "topk", "topk": {"precondition": "adam"}},
                "optim": {"betas": [0, 0.95]},
                "init_from": "base/checkpoints",
                "init_optimizer": True,
            },
            "job.toml [train]",
        )


def test_a_job_file_density_out_of_range_topk_with_fp16_or_attribution_and_double_momentum_are_refused():
    def build(table: dict) -> TrainConfig:
        return build_config(TrainConfig, table, "job.toml [train]")

    with pytest.raises(JobFileError, match=r"job\.toml \[train\].*train\.parallel\.topk\.density = 0"):
        build({"parallel": {"compression": "topk", "topk": {"density": 0}}})
    for extra in ({"precision": "fp16"}, {"attribution": {"every": 5}}):
        with pytest.raises(JobFileError, match=r"train\.parallel\.compression = 'topk'"):
            build({"parallel": {"compression": "topk"}, **extra})
    with pytest.raises(JobFileError, match=r"train\.parallel\.topk\.momentum = 0\.9 .*betas\[0\] = 0\.9"):
        build({"parallel": {"compression": "topk", "topk": {"momentum": 0.9}}})  # the momentum would apply twice
    build({"parallel": {"compression": "topk", "topk": {"momentum": 0.9}}, "optim": {"betas": [0.0, 0.95]}})
    cfg = build({"parallel": {"compression": "topk", "topk": {"density": 0.001, "warmup_steps": 10}}})
    assert cfg.parallel.topk == TopKConfig(density=0.001, warmup_steps=10)


# ---- the hook on one rank ---------------------------------------------------------------------------
def test_warmup_density_decreases_exponentially_then_stays():
    cfg = TopKConfig(density=0.001, warmup_density=0.25, warmup_steps=4)
    got = [cfg.density_at(step) for step in range(7)]
    assert got[0] == 0.25 and got[4:] == [0.001] * 3
    assert got[1] / got[0] == pytest.approx(got[2] / got[1]) == pytest.approx(got[3] / got[2])  # a constant ratio
    assert got[2] == pytest.approx(math.sqrt(0.25 * 0.001))
    assert TopKConfig(density=0.1, warmup_steps=0).density_at(0) == 0.1  # no warm-up


def test_the_hook_sends_the_warmup_schedule_of_entries_per_tensor(group):
    model, ddp, _, timer = _wrapped(group, density=0.05, warmup_density=0.5, warmup_steps=3)
    cfg = TopKConfig(density=0.05, warmup_density=0.5, warmup_steps=3)
    for step, (x, y) in enumerate(_inputs(5)):
        got = _step(model, ddp, x, y)
        for name, n in (("w", 40), ("b", 30)):
            assert int((got[name] != 0).sum()) == math.ceil(cfg.density_at(step) * n)
    k = math.ceil(0.05 * 40) + math.ceil(0.05 * 30)
    timer.reset()
    _step(model, ddp, *_inputs(1)[0])
    # one block's int32 count, 16-bit indices and fp32 values, each part padded to 8 bytes, and an 8-byte flag;
    # against 70 fp32 gradients
    assert (timer.bytes_sent, timer.bytes_uncompressed) == (8 + -(-2 * k // 8) * 8 + -(-4 * k // 8) * 8 + 8, 70 * 4)


@pytest.mark.parametrize("bucket_mb", [25, 1e-6], ids=["one-bucket", "a-bucket-each"])
def test_what_is_not_sent_is_kept(group, bucket_mb):
    model, ddp, comp, _ = _wrapped(group, density=0.1, bucket_mb=bucket_mb)
    sent = {"w": torch.zeros(40, dtype=torch.float64), "b": torch.zeros(30, dtype=torch.float64)}
    given = {"w": torch.zeros(40, dtype=torch.float64), "b": torch.zeros(30, dtype=torch.float64)}
    for x, y in _inputs(12):
        got = _step(model, ddp, x, y)
        given["w"] += x.double()
        given["b"] += y.flatten().double()
        for name, total in sent.items():
            total += got[name].double()
            assert int((got[name] != 0).sum()) == math.ceil(0.1 * total.numel())  # sparse every step
    for name, total in sent.items():  # every gradient is either applied or still waiting in the residual
        assert total + comp.residual[name].double() == pytest.approx(given[name], abs=1e-5)
    assert comp.residual["w"].abs().sum() > 0  # and some still waits


class Wide(nn.Module):
    """Gradients are the inputs, over more positions than one 2^16 block of the message's indices."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.zeros(70_001))
        self.c = nn.Parameter(torch.zeros(3, 50_000))

    def forward(self, x, y):
        return (self.a * x).sum() + (self.c * y).sum()


@pytest.mark.parametrize("value_dtype", ["float32", "bfloat16"])
def test_indices_across_blocks_arrive_and_bfloat16_rounding_stays_in_the_residual(group, value_dtype):
    model = Wide()
    comp = TopKCompression(TopKConfig(density=0.01, value_dtype=value_dtype), model, group=group, timer=CommTimer())
    ddp = DistributedDataParallel(model, process_group=group, bucket_cap_mb=0.3)  # several buckets, one message
    comp.register(ddp)
    gen = torch.Generator().manual_seed(1)
    given = {"a": torch.zeros(70_001, dtype=torch.float64), "c": torch.zeros(150_000, dtype=torch.float64)}
    sent = {k: torch.zeros_like(v) for k, v in given.items()}
    for _ in range(3):
        x, y = torch.randn(70_001, generator=gen), torch.randn(3, 50_000, generator=gen)
        v = {"a": comp.residual.get("a", torch.zeros(70_001)) + x, "c": comp.residual.get("c", torch.zeros(150_000))}
        v["c"] = v["c"] + y.flatten()
        model.zero_grad(set_to_none=True)
        ddp(x, y).backward()
        got = {"a": model.a.grad.clone(), "c": model.c.grad.flatten().clone()}
        for name in got:  # exactly the top entries of each residual, wherever in the flattened model they fall
            top = v[name].abs().topk(math.ceil(0.01 * v[name].numel())).indices
            want = torch.zeros_like(v[name])
            want[top] = v[name][top].to(getattr(torch, value_dtype)).float()
            assert torch.equal(got[name], want)
        given["a"] += x.double()
        given["c"] += y.flatten().double()
        for name in got:
            sent[name] += got[name].double()
    for name in given:  # nothing lost: what went, its rounding and what waits add up to what was given
        assert sent[name] + comp.residual[name].double() == pytest.approx(given[name].numpy(), abs=1e-4)


def test_momentum_correction_and_masking_follow_the_paper(group):
    m, density = 0.9, 0.2
    model, ddp, comp, _ = _wrapped(group, density=density, momentum=m)
    u, v = torch.zeros(40), torch.zeros(40)  # the paper's equations, for w alone
    for x, y in _inputs(6):
        got = _step(model, ddp, x, y)["w"]
        u = m * u + x
        v = v + u
        top = v.abs().topk(math.ceil(density * 40)).indices
        want = torch.zeros(40)
        want[top] = v[top]
        assert torch.equal(got, want)
        v[top], u[top] = 0, 0  # sent: cleared, and its momentum too
    assert torch.equal(comp.residual["w"], v) and torch.equal(comp.velocity["w"], u)


def test_adam_preconditioning_then_the_plain_step_is_adamw(group):
    """Density 1 on one rank: the hook's direction and build_optimizer's plain step move the weights as AdamW
    (β1 = 0, its moment moved into the velocity) does on the raw gradients, weight decay and a learning rate
    that changes every step included."""
    from winnow.train.optim import OptimConfig, build_optimizer

    cfg = OptimConfig(lr=0.05, betas=(0.0, 0.9), weight_decay=0.1, eps=1e-8)
    model, ddp, comp, _ = _wrapped(group, density=1.0, warmup_density=1.0, precondition="adam", adam=(0.9, 1e-8))
    plain = Known()
    model.w.data.normal_(generator=torch.Generator().manual_seed(2))
    model.b.data.normal_(generator=torch.Generator().manual_seed(3))
    plain.load_state_dict(model.state_dict())
    step = build_optimizer(model, cfg, preconditioned=frozenset({"w", "b"}))
    comp.follow(step)
    adamw = build_optimizer(plain, cfg)
    assert all(group["preconditioned"] for group in step.param_groups) and isinstance(adamw, torch.optim.AdamW)
    for t, (x, y) in enumerate(_inputs(8)):
        for optimizer in (step, adamw):
            for g in optimizer.param_groups:
                g["lr"] = 0.05 * (t + 1) / 8
        _step(model, ddp, x, y)
        step.step()
        plain.zero_grad(set_to_none=True)
        plain(x, y).backward()
        adamw.step()
    for name, param in plain.named_parameters():
        assert getattr(model, name).detach() == pytest.approx(param.detach(), abs=1e-5)
    assert plain.b.detach().abs().sum() > 0


def test_parameters_outside_the_exchange_step_as_adamw():
    """Expert-parallel experts are reduced beside the preconditioning hook: the optimizer steps them as AdamW."""
    from winnow.train.optim import OptimConfig, PreconditionedAdamW, build_optimizer

    cfg = OptimConfig(lr=0.05, betas=(0.9, 0.95), weight_decay=0.1)
    mine, plain = Known(), Known()
    gen = torch.Generator().manual_seed(4)
    for model in (mine, plain):
        model.w.data.copy_(torch.randn(40, generator=torch.Generator().manual_seed(5)))
        model.b.data.copy_(torch.randn(6, 5, generator=torch.Generator().manual_seed(6)))
    opt = build_optimizer(mine, cfg, preconditioned=frozenset({"w"}))  # b: outside the exchange
    assert isinstance(opt, PreconditionedAdamW)
    assert sorted((g["preconditioned"], g["weight_decay"]) for g in opt.param_groups) == [(False, 0.1), (True, 0.0)]
    adamw = torch.optim.AdamW([plain.b], lr=0.05, betas=(0.9, 0.95), weight_decay=0.1)
    w = mine.w.detach().clone()
    for _ in range(5):
        x, y = torch.randn(40, generator=gen), torch.randn(6, 5, generator=gen)
        for model in (mine, plain):
            model.zero_grad(set_to_none=True)
            model(x, y).backward()
        opt.step()
        adamw.step()
        w -= 0.05 * x  # the plain step: the gradient as it is (no decay on vectors)
    assert mine.b.detach() == pytest.approx(plain.b.detach(), abs=1e-6)
    assert mine.w.detach() == pytest.approx(w, abs=1e-5)


def test_adam_preconditioning_accumulates_adams_momentum_of_the_directions_unmasked(group):
    """With momentum and ``precondition = "adam"`` the velocity is AdamW's first moment of the scaled gradient and
    keeps decaying after a send (as AdamW's does), so over time every gradient is applied at its full weight."""
    m, b2, eps, density = 0.9, 0.95, 0.5, 0.2  # a large eps: Adam's first directions are signs, all tied
    model, ddp, comp, _ = _wrapped(group, density=density, momentum=m, precondition="adam", adam=(b2, eps))
    s, u, v = torch.zeros(40), torch.zeros(40), torch.zeros(40)  # for w alone
    for t, (x, y) in enumerate(_inputs(6), start=1):
        got = _step(model, ddp, x, y)["w"]
        s = b2 * s + (1 - b2) * x * x
        u = m * u + (1 - m) * x / ((s / (1 - b2**t)).sqrt() + eps)
        v = v + u
        top = v.abs().topk(math.ceil(density * 40)).indices
        want = torch.zeros(40)
        want[top] = v[top]
        assert got == pytest.approx(want, abs=1e-6)
        v[top] = 0  # sent; the velocity stays
    assert comp.velocity["w"] == pytest.approx(u, abs=1e-6) and comp.moment["w"] == pytest.approx(s, abs=1e-7)


def test_with_adam_preconditioning_a_withheld_step_moves_the_weights_at_its_own_learning_rate(group):
    """Under a schedule, what waits in the residual is each step's direction times that step's learning rate, and
    the optimizer's step after the exchange (``lr_t`` times what arrives) applies exactly that: every step moves
    the weights by its own learning rate's worth, whichever later step sends it."""
    from winnow.train.optim import OptimConfig, build_optimizer

    model, ddp, comp, _ = _wrapped(group, density=0.2, precondition="adam", adam=(0.95, 1e-8))
    opt = build_optimizer(
        model, OptimConfig(lr=1.0, betas=(0.0, 0.95), weight_decay=0.0), preconditioned=frozenset({"w", "b"})
    )
    comp.follow(opt)
    rates = [0.05, 0.5, 1.0, 1.0, 0.3, 0.1, 0.02, 0.0, 0.4]  # a warm-up, a decay, a step at 0
    s, moved, start = torch.zeros(40), torch.zeros(40, dtype=torch.float64), model.w.detach().clone()
    for t, ((x, y), lr) in enumerate(zip(_inputs(len(rates)), rates, strict=True), start=1):
        for g in opt.param_groups:
            g["lr"] = lr
        got = _step(model, ddp, x, y)["w"]
        opt.step()
        s = 0.95 * s + 0.05 * x * x
        moved += lr * (x / ((s / (1 - 0.95**t)).sqrt() + 1e-8)).double()  # AdamW's step of this gradient
        if lr == 0:
            assert not got.any()  # nothing moves at learning rate 0, so nothing is sent
    applied = (start - model.w.detach()).double()
    assert applied + comp.residual["w"].double() == pytest.approx(moved, abs=1e-5)
    assert comp.residual["w"].abs().sum() > 0


def test_a_residual_checkpointed_in_gradient_units_is_sent_at_the_learning_rate_it_resumes_at(group):
    """A checkpoint whose state has no ``scaled`` count kept the residual unscaled: its first exchange scales it."""
    from winnow.train.optim import OptimConfig, build_optimizer

    model, ddp, comp, _ = _wrapped(group, density=0.2, precondition="adam")
    opt = build_optimizer(model, OptimConfig(lr=0.5, betas=(0.0, 0.95)), preconditioned=frozenset({"w", "b"}))
    comp.follow(opt)
    old = {"step": 4, "velocity": {}, "moment": {}, "residual": {"w": torch.arange(40.0), "b": torch.zeros(30)}}
    comp.load_state_dict(old)
    got = _step(model, ddp, torch.zeros(40), torch.zeros(6, 5))["w"]  # no new gradient: the residual alone
    top = torch.arange(40.0).topk(8).indices
    assert got[top] == pytest.approx(torch.arange(40.0)[top], abs=1e-6)  # sent as it was saved, to be applied at 0.5
    assert comp.residual["w"][top].abs().max() < 1e-6 and comp.residual["w"][5] == pytest.approx(2.5)
    assert comp.state_dict()["scaled"] == 1


def test_each_rank_clips_its_gradient_before_accumulating(group):
    model, ddp, comp, _ = _wrapped(group, density=0.1, grad_clip=1.0)
    x, y = _inputs(1, scale=10.0)[0]
    got = _step(model, ddp, x, y)
    factor = 1.0 / (math.hypot(x.norm(), y.norm()) + 1e-6)  # one rank: the threshold is grad_clip itself
    assert got["w"] + comp.residual["w"] == pytest.approx(x * factor, abs=1e-6)
    assert got["b"] + comp.residual["b"] == pytest.approx(y.flatten() * factor, abs=1e-6)


def test_a_non_finite_step_changes_nothing_and_gives_nan(group):
    model, ddp, comp, _ = _wrapped(group, density=0.1, momentum=0.5)
    (x, y), (x2, y2) = _inputs(2)
    _step(model, ddp, x, y)
    before = {k: v.clone() for k, v in comp.state_dict()["residual"].items()}
    bad = x2.clone()
    bad[3] = float("inf")
    got = _step(model, ddp, bad, y2)
    assert got["w"].isnan().all() and got["b"].isnan().all()  # every rank skips the step (skip_nonfinite)
    assert all(torch.equal(comp.residual[k], before[k]) for k in before)
    assert _step(model, ddp, x2, y2)["w"].isfinite().all()


@pytest.mark.parametrize("precondition", ["none", "adam"])
def test_state_dict_and_dcp_shards_restore_the_exchange_exactly(group, tmp_path, precondition):
    import torch.distributed.checkpoint as dcp

    steps = _inputs(6)
    cfg = {"density": 0.1, "momentum": 0.9, "warmup_steps": 4, "precondition": precondition}
    model, ddp, comp, _ = _wrapped(group, **cfg)
    want = [_step(model, ddp, x, y) for x, y in steps]
    coords = {"dp_rank": 0, "tp_rank": 0, "tp_size": 1}
    model, ddp, comp, _ = _wrapped(group, **cfg)
    for x, y in steps[:3]:
        _step(model, ddp, x, y)
    assert bool(comp.moment) == (precondition == "adam")
    dcp.save(comp.shards(**coords), checkpoint_id=str(tmp_path / "ckpt"))
    for restore in ("state_dict", "dcp"):
        model, ddp, fresh, _ = _wrapped(group, **cfg)
        if restore == "dcp":
            fresh.load_shards(tmp_path / "ckpt", **coords)
        else:
            fresh.load_state_dict(comp.state_dict())
        assert fresh.step == 3
        for (x, y), expected in zip(steps[3:], want[3:], strict=True):
            got = _step(model, ddp, x, y)
            assert all(torch.equal(got[k], expected[k]) for k in got)


def test_residuals_saved_on_more_ranks_keep_their_mean(group, tmp_path):
    import torch.distributed.checkpoint as dcp

    _, _, comp, _ = _wrapped(group, density=0.1)
    r0, r1 = torch.arange(40.0), torch.ones(40)
    saved = {
        "compression.step": torch.tensor(7),
        "compression.ranks": torch.tensor([2, 1]),
        "compression.0.0.residual.w": r0,
        "compression.0.1.residual.w": r1,
    }
    dcp.save(saved, checkpoint_id=str(tmp_path / "ckpt"))
    comp.load_shards(tmp_path / "ckpt", dp_rank=0, tp_rank=0, tp_size=1)
    assert comp.step == 7 and torch.equal(comp.residual["w"], (r0 + r1) / 2)  # one rank now holds the mean


# ---- 2 gloo processes --------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("layout", [{}, {"ep": 2}], ids=["ddp", "ddp+ep"])  # under ep the experts bypass the hook
def test_density_one_equals_plain_ddp(tmp_path, layout):
    no_clip = {"optim": {"grad_clip": 0.0}}  # clipping moves before the exchange under top-k
    ref = reference_run(tmp_path, steps=5, grad_accum=2, config=no_clip)  # = plain DDP on 2 ranks (test_parallel_ddp)
    topk = TopKConfig(density=1.0, warmup_density=1.0, momentum=0.9)
    got = spawn(
        {
            "run_dir": str(tmp_path / "topk"),
            "steps": 5,
            "config": no_clip,
            "parallel": {"compression": "topk", "topk": topk, **layout},
        },
        tmp_path / "out.json",
    )
    assert got["losses"] == pytest.approx(ref["losses"], abs=1e-6)
    assert got["norms"] == pytest.approx(ref["norms"], rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize(
    "precondition, layout", [("none", {}), ("adam", {}), ("adam", {"ep": 2})], ids=["none", "adam", "adam+ep"]
)
def test_a_resumed_topk_run_continues_exactly_and_reports_bytes(tmp_path, precondition, layout):
    cfg = TopKConfig(density=0.05, warmup_steps=3, momentum=0.9, precondition=precondition)
    topk = {"compression": "topk", "topk": cfg, **layout}
    whole = spawn({"run_dir": str(tmp_path / "whole"), "steps": 6, "parallel": topk}, tmp_path / "whole.json")
    first = spawn(
        {"run_dir": str(tmp_path / "run"), "steps": 6, "stop_after": 3, "parallel": topk}, tmp_path / "first.json"
    )
    second = spawn(
        {"run_dir": str(tmp_path / "run"), "steps": 6, "resume": True, "parallel": topk}, tmp_path / "second.json"
    )
    assert first["losses"] + second["losses"] == whole["losses"]  # bit for bit: residuals and velocities restored
    assert second["norms"] == whole["norms"][3:]
    comm = [r["comm"] for r in records(tmp_path / "whole") if "comm" in r]
    # the expert-parallel experts' dense all-reduce goes beside the exchange and is counted with it
    factor = 5 if not layout else 1
    assert len(comm) == 6 and all(0 < c["bytes_sent"] < c["bytes_uncompressed"] / factor for c in comm[3:])
