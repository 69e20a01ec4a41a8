"""The report on a real run folder: the trainer's own metrics.jsonl and alerts.jsonl, not constructed ones."""

import dataclasses
import json
import re

import pytest

torch = pytest.importorskip("torch")

from winnow.pipelines.report import diagnose, locate, render  # noqa: E402
from winnow.train.alerts import AlertConfig  # noqa: E402
from winnow.train.build import build_trainer  # noqa: E402
from winnow.train.config import TrainConfig  # noqa: E402
from winnow.train.data import Batch, LoaderConfig  # noqa: E402
from winnow.train.metrics import MetricsConfig  # noqa: E402
from winnow.train.model import ModelConfig  # noqa: E402

SOURCES = ["prose", "code"]


class Counting:
    """Endless batches of counting sequences (step 1 for prose, 2 for code): learnable, source-dependent."""

    def __init__(self, seed: int = 0) -> None:
        self.seed, self.position = seed, 0

    def __iter__(self):
        return self

    def __next__(self) -> Batch:
        g = torch.Generator().manual_seed(self.seed * 10_007 + self.position)
        self.position += 1
        source_ids = (torch.arange(4)[:, None] % 2).expand(4, 16).contiguous()
        seq = (torch.randint(0, 40, (4, 1), generator=g) + (1 + source_ids[:, :1]) * torch.arange(17)) % 40
        return Batch(
            seq[:, :-1].contiguous(),
            seq[:, 1:].contiguous(),
            source_ids,
            torch.ones(4, 16, dtype=torch.bool),
            torch.zeros(4, 16, dtype=torch.int32),
            [("synthetic.parquet", self.position)] * 4,
        )

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


@pytest.mark.slow
def test_report_reads_a_real_trainer_run(tmp_path):
    model = ModelConfig(
        vocab_size=40, dim=32, n_layers=2, n_heads=2, ffn_hidden=32, n_experts=4, top_k=2, max_seq_len=32
    )
    cfg = TrainConfig(
        output=str(tmp_path / "run"),
        model=model,
        steps=6,
        eval_every=3,
        eval_batches=2,
        data=LoaderConfig(batch_size=4, seq_len=16, num_workers=0),
        metrics=MetricsConfig(log_every=2),
        alerts=AlertConfig(spike_min_history=5, spike_window=10),
    )
    trainer = build_trainer(cfg, data=Counting(), sources=SOURCES, val_data=lambda: Counting(seed=1))
    trainer.fit()
    # what pipelines/train.py writes beside the metrics
    (tmp_path / "run" / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), default=str))
    job, run, _ = locate(tmp_path / "run")
    assert job is None and run.sources == SOURCES
    assert [r["step"] for r in run.logs] == [2, 4, 6] and [r["step"] for r in run.evals] == [3, 6]
    assert run.expert_load().shape == (2, 4) and run.routing().shape == (2, 2, 4)
    assert run.memory()[2] == "peak_rss_gib"
    diagnose(run)  # every rule runs on the trainer's real records without a KeyError
    page = render(job, run)
    alts = set(re.findall(r'<img alt="([^"]*)"', page))
    assert {
        "loss curves",
        "learning rate and gradient norm",
        "throughput, data wait, memory",
        "expert load and routing",
        "alerts timeline",
    } <= alts
    assert "<td>prose</td>" in page and "<td>code</td>" in page
