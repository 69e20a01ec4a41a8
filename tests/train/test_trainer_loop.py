"""The training loop on synthetic batches: golden losses, learning, accounting, accumulation, NaN skipping."""

import json
from pathlib import Path

import pytest
import torch

from winnow.train.alerts import AlertConfig
from winnow.train.build import build_trainer
from winnow.train.checkpoint import CheckpointConfig
from winnow.train.config import DistillConfig, TrainConfig
from winnow.train.data import Batch, LoaderConfig
from winnow.train.metrics import MetricsConfig
from winnow.train.model import ModelConfig, cross_entropy_per_token
from winnow.train.optim import OptimConfig
from winnow.train.trainer import Trainer

GOLDEN = Path(__file__).parent / "golden" / "trainer_tiny_fp32.json"
SOURCES = ["prose", "code"]
SUBCONFIGS = {
    "optim": OptimConfig,
    "alerts": AlertConfig,
    "metrics": MetricsConfig,
    "checkpoint": CheckpointConfig,
    "distill": DistillConfig,
}


class SyntheticBatches:
    """A deterministic, resumable stand-in for the Loader: batch i depends only on (seed, i)."""

    def __init__(
        self, *, batch_size: int = 4, seq_len: int = 16, vocab: int = 40, seed: int = 0, on_batch=None
    ) -> None:
        self.batch_size, self.seq_len, self.vocab, self.seed = batch_size, seq_len, vocab, seed
        self.position, self.on_batch = 0, on_batch

    def make(self, index: int) -> Batch:
        g = torch.Generator().manual_seed(self.seed * 100_003 + index)
        B, L = self.batch_size, self.seq_len
        source_ids = torch.arange(B)[:, None].expand(B, L) % len(SOURCES)
        start = torch.randint(0, self.vocab, (B, 1), generator=g)
        step = 1 + source_ids[:, :1]  # "prose" counts by 1, "code" by 2: learnable, source-dependent
        seq = (start + step * torch.arange(L + 1)) % self.vocab
        loss_mask = torch.ones(B, L, dtype=torch.bool)
        loss_mask[-1, L - 3 :] = False  # some padding
        doc_ids = (torch.arange(L) >= L // 2).int().expand(B, L).contiguous()
        origins = [("synthetic.parquet", index * B + b) for b in range(B)]
        return Batch(
            seq[:, :-1].contiguous(), seq[:, 1:].contiguous(), source_ids.contiguous(), loss_mask, doc_ids, origins
        )

    def __iter__(self):
        return self

    def __next__(self) -> Batch:
        batch = self.make(self.position)
        self.position += 1
        if self.on_batch is not None:
            self.on_batch(self.position)
        return batch

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


def tiny_config(tmp_path, **kw) -> TrainConfig:
    model = ModelConfig(
        **{
            **dict(vocab_size=40, dim=32, n_layers=2, n_heads=2, ffn_hidden=32, n_experts=4, top_k=2, max_seq_len=64),
            **kw.pop("model", {}),
        }
    )
    kw.setdefault("steps", 20)
    for key, cls in SUBCONFIGS.items():
        if key in kw:
            kw[key] = cls(**kw[key])
    data = LoaderConfig(batch_size=4, seq_len=16, num_workers=0)
    return TrainConfig(output=str(tmp_path), model=model, data=data, eval_every=0, **kw)


def make_trainer(cfg: TrainConfig, data=None, **kw) -> Trainer:
    return build_trainer(cfg, data=data or SyntheticBatches(), sources=SOURCES, **kw)


def run_losses(trainer: Trainer, steps: int) -> list[float]:
    return [trainer.train_step().loss for _ in range(steps)]


def test_first_20_losses_match_golden_file(tmp_path):
    losses = run_losses(make_trainer(tiny_config(tmp_path)), 20)
    if not GOLDEN.exists():  # first run writes it; commit it, and later runs compare
        GOLDEN.write_text(json.dumps({"losses": losses}, indent=1))
    golden = json.loads(GOLDEN.read_text())["losses"]
    assert losses == pytest.approx(golden, rel=1e-4, abs=1e-5)


def test_loss_decreases_on_synthetic_data(tmp_path):
    losses = run_losses(make_trainer(tiny_config(tmp_path, optim={"lr": 1e-2, "warmup_steps": 5})), 30)
    assert sum(losses[-5:]) / 5 < 0.6 * sum(losses[:5]) / 5


def test_per_source_sums_equal_brute_force_per_document(tmp_path):
    cfg = tiny_config(tmp_path, metrics={"log_every": 1000})
    trainer = make_trainer(cfg)
    batch = SyntheticBatches().make(0)
    with torch.no_grad():  # the loss the step will see, before the update
        token_loss = cross_entropy_per_token(trainer.model(batch.tokens).logits_BLV, batch.targets)
    trainer.train_step()
    acct = trainer.accounting.flush()
    for s, name in enumerate(SOURCES):
        total, count = 0.0, 0
        for b in range(batch.tokens.shape[0]):
            for t in range(batch.tokens.shape[1]):
                if batch.source_ids[b, t] == s and batch.loss_mask[b, t]:
                    total += float(token_loss[b, t])
                    count += 1
        assert acct["per_source"][name]["tokens"] == count
        assert acct["per_source"][name]["loss_sum"] == pytest.approx(total, rel=1e-6)
    assert sum(v["token_share"] for v in acct["per_source"].values()) == pytest.approx(1.0)
    routing = acct["routing"]["prose"]  # [layer][expert]: every unmasked token routed to k=2 experts
    assert sum(routing[0]) == 2 * acct["per_source"]["prose"]["tokens"]


def test_grad_accumulation_equals_one_larger_batch(tmp_path):
    # aux/z losses are per micro-batch (nonlinear in batch statistics), so they are off here
    model = {"aux_loss_coef": 0.0, "z_loss_coef": 0.0}
    accum = make_trainer(tiny_config(tmp_path / "a", grad_accum=4, model=model), SyntheticBatches(batch_size=2))
    big = make_trainer(tiny_config(tmp_path / "b", grad_accum=1, model=model), SyntheticBatches(batch_size=8))
    whole = SyntheticBatches(batch_size=8)
    parts = [whole.make(0)]
    splits = [
        Batch(
            *(
                getattr(parts[0], k)[2 * j : 2 * j + 2]
                for k in ("tokens", "targets", "source_ids", "loss_mask", "doc_ids")
            ),
            parts[0].origins[2 * j : 2 * j + 2],
        )
        for j in range(4)
    ]
    accum._batches = iter(splits)
    big._batches = iter(parts)
    a, b = accum.train_step(), big.train_step()
    assert a.loss == pytest.approx(b.loss, rel=1e-6)
    for pa, pb in zip(accum.model.parameters(), big.model.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6)


def test_a_run_whose_steps_stay_non_finite_stops_naming_the_learning_rate(tmp_path):
    """Diverged weights make every later step non-finite: each was skipped and the run ended "done" with exit 0, its
    weights NaN. After ``max_nonfinite`` in a row it stops; an applied step in between starts the count again."""
    from winnow.train.errors import Diverged

    trainer = make_trainer(tiny_config(tmp_path, alerts={"max_nonfinite": 3}))
    poisoned = {2, 4, 5, 6}  # the 2nd forward, then the 4th to 6th
    calls = {"n": 0}

    def poison(module, args, output):
        calls["n"] += 1
        return output * float("nan") if calls["n"] in poisoned else output

    trainer.model.head.register_forward_hook(poison)
    assert [trainer.train_step().skipped for _ in range(5)] == [None, "nonfinite", None, "nonfinite", "nonfinite"]
    state = trainer.hook("stability").state_dict()
    assert state["nonfinite_run"] == 2
    with pytest.raises(Diverged, match=r"steps 4-6: 3 steps in a row .* non-finite .*\[train.optim\] lr"):
        trainer.train_step()
    fresh = make_trainer(tiny_config(tmp_path / "b"))
    fresh.hook("stability").load_state_dict({k: v for k, v in state.items() if k != "nonfinite_run"})  # an old one
    assert fresh.hook("stability").nonfinite_run == 0


def test_injected_nan_is_skipped_and_alerted(tmp_path):
    trainer = make_trainer(tiny_config(tmp_path))
    calls = {"n": 0}

    def poison(module, args, output):
        calls["n"] += 1
        return output * float("nan") if calls["n"] == 3 else output

    trainer.model.head.register_forward_hook(poison)
    before = None
    results = []
    for i in range(4):
        if i == 2:
            before = [p.detach().clone() for p in trainer.model.parameters()]
        results.append(trainer.train_step())
    assert [r.skipped for r in results] == [None, None, "nonfinite", None]
    assert trainer.hook("stability").skipped["nonfinite"] == 1
    alert = json.loads((tmp_path / "alerts.jsonl").read_text().splitlines()[0])
    assert alert["kind"] == "nan" and alert["step"] == 3 and set(alert["sources"]) == set(SOURCES)
    assert alert["origins"][0] == ["synthetic.parquet", 8]
    # the skipped step changed no weight; the per-source sums hold no NaN
    trainer2_params = list(trainer.model.parameters())
    assert not all(torch.equal(a, b) for a, b in zip(before, trainer2_params))  # step 4 did update
    assert torch.isfinite(trainer.accounting.loss_sum_S).all()


def test_loss_spike_is_skipped_with_attribution(tmp_path):
    cfg = tiny_config(tmp_path, alerts={"spike_sigma": 3.0, "spike_window": 10, "spike_min_history": 5})
    trainer = make_trainer(cfg)
    trainer.hook("stability").spikes.history.extend([1.0, 1.01, 0.99, 1.0, 1.02])
    result = trainer.train_step()  # the untrained loss (~ln 40 = 3.7) is far above the planted history
    assert result.skipped == "spike" and trainer.hook("stability").skipped["spike"] == 1
    alert = json.loads((tmp_path / "alerts.jsonl").read_text().splitlines()[0])
    assert alert["kind"] == "loss_spike" and alert["origins"]


def test_fit_writes_metrics_with_per_source_and_expert_load(tmp_path):
    cfg = tiny_config(tmp_path, steps=6, metrics={"log_every": 3, "peak_flops": 1e11})
    summary = make_trainer(cfg, val_data=lambda: iter([SyntheticBatches(seed=9).make(0)])).fit()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [3, 6]
    r = steps[-1]
    assert set(r["per_source"]) == set(SOURCES) and r["tokens_per_s"] > 0 and 0 < r["mfu"]
    assert len(r["expert_load"]) == 2 and sum(r["expert_load"][0]) == pytest.approx(1.0)
    assert len(r["aux_loss"]) == 2 and r["skipped_steps"] == {"nonfinite": 0, "spike": 0}
    assert summary["eval"]["eval"]["per_source"]["code"] is not None


def test_the_logged_learning_rate_is_the_one_the_step_used(tmp_path):
    """It was the scheduler's next one: step 1 of a 2-step warm-up logged the peak, trained at half of it."""
    import dataclasses
    import json

    from winnow.train.optim import lr_factor

    cfg = tiny_config(tmp_path, steps=4, metrics={"log_every": 1})
    cfg = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, warmup_steps=2))
    make_trainer(cfg).fit()
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    lrs = {r["step"]: r["lr"] for r in logged if "lr" in r}
    assert lrs == {s: pytest.approx(cfg.optim.lr * lr_factor(s - 1, cfg.optim, 4)) for s in range(1, 5)}
