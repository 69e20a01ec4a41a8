"""Trackers: TensorBoard, MLflow (local file store) and W&B (offline) get the scalars of metrics.jsonl."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from winnow.train.metrics import MetricsConfig, MetricsWriter
from winnow.train.trackers import load_image, scalars

RECORDS = [
    {
        "step": 1,
        "loss": 3.5,
        "lr": 1e-3,
        "per_source": {"web": {"mean_loss": 3.2, "tokens": 100}},
        "expert_load": [[0.5, 0.25, 0.25, 0.0], [0.1, 0.2, 0.3, 0.4]],
        "routing": {"web": [[1, 2]]},
    },
    {
        "step": 2,
        "loss": 3.1,
        "lr": 1e-3,
        "per_source": {"web": {"mean_loss": 3.0, "tokens": 120}},
        "expert_load": [[0.25, 0.25, 0.25, 0.25], [0.1, 0.2, 0.3, 0.4]],
        "routing": {"web": [[2, 1]]},
    },
    {"step": 2, "eval": {"loss": 3.3, "per_source": {"web": 3.3}}},
]


def test_scalars_are_the_records_numbers_and_expert_load_is_one_image():
    assert scalars(RECORDS[0]) == {
        "loss": 3.5,
        "lr": 1e-3,
        "per_source/web/mean_loss": 3.2,
        "per_source/web/tokens": 100,
    }
    assert scalars(RECORDS[2]) == {"eval/loss": 3.3, "eval/per_source/web": 3.3}
    image = load_image(RECORDS[0]["expert_load"], cell=2)
    assert image.shape == (4, 8) and image.dtype == np.uint8 and image.max() == 255 and image[0, 6] == 0
    assert load_image([]) is None


def test_unknown_tracker_is_refused():
    from winnow.train.errors import ConfigError

    with pytest.raises(ConfigError, match=r"train.metrics.trackers = \['neptune'\] is invalid; allowed: any of"):
        MetricsConfig(trackers=["neptune"])
    assert MetricsConfig(tensorboard=True).trackers == ["tensorboard"]


def _write(run_dir, trackers, **kw):
    writer = MetricsWriter(run_dir, MetricsConfig(trackers=trackers, **kw))
    for r in RECORDS:
        writer.write(r)
    writer.close()
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_tensorboard_reads_back_the_same_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    records = _write(tmp_path, ["tensorboard"])
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    for name in ("loss", "per_source/web/mean_loss", "eval/loss"):
        got = [(e.step, round(e.value, 6)) for e in events.Scalars(name)]
        want = [(r["step"], round(scalars(r)[name], 6)) for r in records if name in scalars(r)]
        assert got == want, name
    assert [e.step for e in events.Images("expert_load")] == [1, 2]
    assert not [t for t in events.Tags()["scalars"] if t.startswith("expert_load")]  # one image, not scalars


def test_tensorboard_after_a_resume_holds_each_step_once(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def log(step, loss):
        return {"step": step, "loss": loss}

    for records in ([log(1, 3.0), log(2, 2.9), log(3, 2.8)], [log(2, 2.5), log(3, 2.4), log(4, 2.3)]):
        writer = MetricsWriter(tmp_path, MetricsConfig(trackers=["tensorboard"]))  # killed after 3, resumed from 1
        for r in records:
            writer.write(r)
        writer.close()
        time.sleep(1.1)  # event files are named by the second they were opened
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    assert [(e.step, round(e.value, 4)) for e in events.Scalars("loss")] == [(1, 3.0), (2, 2.5), (3, 2.4), (4, 2.3)]


def test_mlflow_file_store_reads_back_the_same_scalars(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    import mlflow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    records = _write(tmp_path / "run", ["mlflow"], project="tests")
    client = mlflow.MlflowClient(tracking_uri=(tmp_path / "run" / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("tests").experiment_id])
    assert run.info.run_name == "run" and run.info.status == "FINISHED"
    for name in ("loss", "per_source/web/mean_loss", "eval/loss"):
        got = sorted((m.step, round(m.value, 6)) for m in client.get_metric_history(run.info.run_id, name))
        assert got == [(r["step"], round(scalars(r)[name], 6)) for r in records if name in scalars(r)], name
    images = [a.path for a in client.list_artifacts(run.info.run_id, "images")]
    assert len([p for p in images if p.endswith(".png")]) == 2


@pytest.mark.slow  # starts W&B's service process
def test_wandb_offline_run_reads_back_the_same_scalars(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from wandb.proto import wandb_internal_pb2

    monkeypatch.setenv("WANDB_SILENT", "true")
    records = _write(tmp_path / "run", ["wandb"], wandb_mode="offline")
    (path,) = (tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb")
    deadline = time.monotonic() + 60
    while True:  # W&B's service process writes the log after finish() returns; its last record is "exit"
        parsed = []
        for data in _wandb_records(path.read_bytes()):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(data)
            parsed.append(record)
        if (parsed and parsed[-1].WhichOneof("record_type") == "exit") or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    history = [
        {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
        for r in parsed
        if r.WhichOneof("record_type") == "history"
    ]
    by_step = {}
    for h in history:
        by_step.setdefault(h["_step"], {}).update(h)
    assert sorted(by_step) == [1, 2], history
    for name in ("loss", "per_source/web/mean_loss", "eval/loss"):
        want = {r["step"]: scalars(r)[name] for r in records if name in scalars(r)}
        assert {s: pytest.approx(v) for s, v in want.items()} == {
            s: h[name] for s, h in by_step.items() if name in h
        }, name
    assert by_step[1]["expert_load/_type"] == "image-file"


def _wandb_records(buf: bytes):
    """Records of a W&B transaction log: a 7-byte file header, then LevelDB-log-style 32 KiB blocks
    of records, each with a 7-byte header (crc, length, type: 1 full, 2 first, 3 middle, 4 last)."""
    import struct

    assert buf[:4] == b":W&B"
    pos, parts = 7, []
    while pos + 7 <= len(buf):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left  # zero padding at a block's end
            continue
        _, length, kind = struct.unpack("<IHB", buf[pos : pos + 7])
        if kind == 0 and length == 0:
            break
        parts.append(buf[pos + 7 : pos + 7 + length])
        pos += 7 + length
        if kind in (1, 4):
            yield b"".join(parts)
            parts = []
