"""Constructed run and job folders for the report tests, with exactly the records the trainer and curator write.

Log records carry the fields of ``Trainer.log_metrics`` (``train/trainer.py``), evaluation records
those of ``Trainer.evaluate``, alerts those of ``Alerts.emit``; the manifest has the keys of
``docs/design.md`` that the report reads.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl

SOURCES = ["prose", "code"]


def log_record(
    step: int,
    *,
    loss: float,
    per_source_loss: dict[str, float] | None = None,
    lr: float = 1e-3,
    grad_norm: float = 1.0,
    tokens_per_s: float = 5000.0,
    data_wait_pct: float = 1.0,
    memory: dict | None = None,
    expert_load: list[list[float]] | None = None,
    routing: dict | None = None,
    skipped: dict | None = None,
    sources: list[str] = SOURCES,
) -> dict:
    per_source_loss = per_source_loss or dict.fromkeys(sources, loss)
    share = 1 / len(sources)
    load = expert_load or [[0.25] * 4, [0.25] * 4]
    return {
        "step": step,
        "loss": loss,
        "step_loss": loss,
        "lr": lr,
        "grad_norm": grad_norm,
        "tokens_seen": step * 512,
        "tokens_per_s": tokens_per_s,
        "flops_per_s": tokens_per_s * 1e6,
        "mfu": tokens_per_s * 1e6 / 5.2e11,
        "data_wait_pct": data_wait_pct,
        "memory": memory or {"peak_rss_gib": 0.5},
        "aux_loss": [1.0] * len(load),
        "z_loss": [1.9] * len(load),
        "dropped": [0.0] * len(load),
        "expert_load": load,
        "per_source": {
            s: {
                "tokens": 256,
                "loss_sum": 256 * per_source_loss[s],
                "mean_loss": per_source_loss[s],
                "token_share": share,
                "loss_share": share,
            }
            for s in sources
        },
        "routing": routing or {s: [[64] * len(load[0])] * len(load) for s in sources},
        "skipped_steps": skipped or {"nonfinite": 0, "spike": 0},
    }


def eval_record(step: int, per_source: dict[str, float]) -> dict:
    return {"step": step, "eval": {"loss": float(np.mean(list(per_source.values()))), "per_source": per_source}}


def counterfactual_record(
    step: int, sources: list[str], slope: list[list[float]], *, error: float, factors: tuple[float, ...] = (0.0,)
) -> dict:
    """A ``counterfactual`` metrics record with ``slope`` (source x held-out set, the sources held out too) and
    a uniform standard error, as the trainer writes it (``train.attribution.counterfactual.record``)."""
    from winnow.train.attribution.counterfactual import record

    return {
        "step": step,
        "counterfactual": record(
            sources=sources,
            held_out=sources,
            slope_SB=np.array(slope),
            error_SB=np.full((len(sources), len(sources)), error),
            factors=list(factors),
            saturation=0.5,
            steps=(1, step),
            horizon=6.0,
            rows=32,
        ),
    }


def healthy_records(steps: int = 50, every: int = 5) -> list[dict]:
    """A run whose losses fall smoothly for every source, balanced experts, no waiting."""
    records = []
    for step in range(every, steps + 1, every):
        loss = 4.0 * np.exp(-step / 40) + 1.0
        records.append(log_record(step, loss=loss, per_source_loss={"prose": loss, "code": loss + 0.1}))
        if step % 10 == 0:
            records.append(eval_record(step, {"prose": loss + 0.05, "code": loss + 0.15}))
    return records


def write_run(folder: Path, records: list[dict], *, alerts: list[dict] = (), config: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if alerts:
        (folder / "alerts.jsonl").write_text("".join(json.dumps(a) + "\n" for a in alerts))
    (folder / "config.json").write_text(json.dumps(config or {"precision": "fp32", "grad_accum": 1}))
    return folder


def alert(kind: str, step: int, **data) -> dict:
    return {"time": 0.0, "step": step, "kind": kind, "message": f"{kind} at {step}", **data}


def write_job(folder: Path, *, order_by: str | None = "difficulty") -> Path:
    """A job folder: two train shards and one val shard with score columns, and a manifest describing them."""
    rng = np.random.default_rng(0)
    shards = []
    for i, (split, lo) in enumerate([("train", 0.0), ("train", 0.5), ("val", 0.0)]):
        n = 40
        frame = pl.DataFrame(
            {
                "id": [f"{split}-{i}-{k}" for k in range(n)],
                "source": [SOURCES[k % 2] for k in range(n)],
                "text": ["some words here"] * n,
                "meta": [None] * n,
                "quality": rng.uniform(0.3, 1.0, n),
                "difficulty": lo + rng.uniform(0, 0.5, n),
            },
            schema_overrides={"meta": pl.String},
        )
        path = f"shards/{split}/part-{i:05d}.parquet"
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        frame.write_parquet(folder / path)
        shards.append(
            {
                "split": split,
                "format": "parquet",
                "path": path,
                "rows": n,
                "bytes": 1,
                "sha256": "0" * 64,
                "sources": dict.fromkeys(SOURCES, n // 2),
                "means": {"quality": float(frame["quality"].mean()), "difficulty": float(frame["difficulty"].mean())},
            }
        )
    stages = [
        {"id": "00.read", "kind": "read", "rows_in": 150, "rows_out": 150, "rows_rejected": 0, "repeats": 0},
        {
            "id": "01.filter.length",
            "kind": "filter.length",
            "rows_in": 150,
            "rows_out": 130,
            "rows_rejected": 20,
            "repeats": 0,
            "rejected": {"filter:length_min_words": 20},
        },
        {
            "id": "02.mix",
            "kind": "mix",
            "rows_in": 130,
            "rows_out": 120,
            "rows_rejected": 10,
            "repeats": 0,
            "rejected": {"mix:not_selected": 10},
            "report": {
                "scheme": "explicit",
                "sources": {
                    "prose": {
                        "target_share": 0.6,
                        "realized_share": 0.58,
                        "epochs": 1.0,
                        "rows_dropped": 0,
                        "copies_added": 0,
                    },
                    "code": {
                        "target_share": 0.4,
                        "realized_share": 0.42,
                        "epochs": 0.8,
                        "rows_dropped": 10,
                        "copies_added": 0,
                    },
                },
            },
        },
    ]
    if order_by:
        stages.append(
            {
                "id": "03.order",
                "kind": "order",
                "rows_in": 120,
                "rows_out": 120,
                "rows_rejected": 0,
                "repeats": 0,
                "report": {"by": order_by, "direction": "easy_to_hard"},
            }
        )
    manifest = {
        "format_version": 1,
        "job": "tiny",
        "job_file": "tiny.toml",
        "sources": SOURCES,
        "totals": {"rows_read": 150, "rows_written": 120, "rows_rejected": 30, "repeats": 0, "seconds": 1.0},
        "by_source": {
            "prose": {"read": 75, "written": 60, "rejected": {"filter:length_min_words": 15}},
            "code": {"read": 75, "written": 60, "rejected": {"filter:length_min_words": 5, "mix:not_selected": 10}},
        },
        "stages": stages,
        "shards": shards,
        "rejects": [],
        "skipped_files": [],
        "inputs": [],
        "config": {},
        "packages": {},
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder
