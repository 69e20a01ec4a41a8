"""Tiny job folders and configs for the continued-pretraining tests: a base job and a new-domain job."""

from __future__ import annotations

from pathlib import Path

from tests.train.shards_util import write_job
from winnow.train.checkpoint import CheckpointConfig
from winnow.train.config import TrainConfig
from winnow.train.data import LoaderConfig
from winnow.train.metrics import MetricsConfig
from winnow.train.model import ModelConfig

TEXTS = {
    "prose": lambda i: f"The {i}th sentence of plain prose walks along the river, and then some more words. ",
    "legal": lambda i: f"Section {i}. The licensee shall not sublicense the work without written permission. ",
    "code": lambda i: f"def f{i}(x):\n    return [y * {i % 7} for y in range(x) if y % 3]\n",
}


def docs(sources: tuple[str, ...], n: int, offset: int = 0, repeat: int = 3) -> list[dict]:
    return [
        {"id": f"{s}/{i}", "source": s, "text": TEXTS[s](i) * repeat, "meta": None}
        for i in range(offset, offset + n)
        for s in sources
    ]


def make_job(folder: Path, sources: tuple[str, ...], *, n: int = 24) -> Path:
    """A job folder with two train shards and one val shard per source."""
    return write_job(
        folder,
        [docs(sources, n), docs(sources, n, n)],
        val=[docs((s,), 4, 1000) for s in sources],
        sources=list(sources),
    )


def tiny_config(output: Path, shards, *, steps: int = 8, **kw) -> TrainConfig:
    model = ModelConfig(dim=32, n_layers=2, n_heads=2, ffn_hidden=32, n_experts=4, top_k=2, max_seq_len=64)
    data = LoaderConfig(batch_size=4, seq_len=32, num_workers=0)
    kw.setdefault("eval_every", 0)
    return TrainConfig(
        output=str(output),
        shards=shards,
        steps=steps,
        model=model,
        data=data,
        device="cpu",
        checkpoint=CheckpointConfig(every=0),
        metrics=MetricsConfig(log_every=4),
        **kw,
    )
