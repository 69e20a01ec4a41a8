"""Trainer parts: webhook alerts, LAMB, the LR schedule, weight-decay groups, the planner."""

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
import torch

from winnow.train.alerts import AlertConfig, Alerts
from winnow.train.config import TrainConfig
from winnow.train.errors import ConfigError
from winnow.train.model import ModelConfig, Transformer
from winnow.train.optim import Lamb, OptimConfig, lr_factor, param_groups
from winnow.train.planner import estimate_run


def test_alert_is_written_and_posted_to_webhook(tmp_path):
    received = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.handle_request, daemon=True)
    thread.start()
    alerts = Alerts(AlertConfig(webhook_url=f"http://127.0.0.1:{server.server_port}/hook"), tmp_path)
    alerts.emit("nan", 7, "non-finite loss", sources=["code"])
    thread.join(timeout=10)
    server.server_close()
    assert received and received[0]["kind"] == "nan" and received[0]["step"] == 7
    assert json.loads((tmp_path / "alerts.jsonl").read_text())["sources"] == ["code"]


def _strict(line: str) -> dict:
    """A JSON line as jq or DuckDB reads it: NaN and Infinity are not JSON."""

    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    return json.loads(line, parse_constant=refuse)


def test_non_finite_values_are_written_as_null_and_named(tmp_path):
    from winnow.train.metrics import MetricsWriter

    nan, inf = float("nan"), float("inf")
    writer = MetricsWriter(tmp_path)
    writer.write({"step": 3, "loss": None, "step_loss": nan, "grad_norm": inf, "expert_load": [[0.5, -inf]],
                  "per_source": {"code": {"mean_loss": nan, "tokens": 8}}})  # fmt: skip
    writer.write({"step": 4, "step_loss": 2.5})
    first, second = map(_strict, (tmp_path / "metrics.jsonl").read_text().splitlines())
    assert first["step_loss"] is None and first["grad_norm"] is None and first["expert_load"] == [[0.5, None]]
    assert first["per_source"] == {"code": {"mean_loss": None, "tokens": 8}}
    assert first["nonfinite"] == {"step_loss": "nan", "grad_norm": "inf", "expert_load/0/1": "-inf",
                                  "per_source/code/mean_loss": "nan"}  # fmt: skip
    assert second == {"step": 4, "step_loss": 2.5}  # a finite record is written as it is
    alerts = Alerts(AlertConfig(), tmp_path)
    alerts.emit("nan", 3, "non-finite loss", loss=nan)
    assert _strict((tmp_path / "alerts.jsonl").read_text())["nonfinite"] == {"loss": "nan"}


def _alert_kinds(alerts, rates, wait=5.0):
    for i, rate in enumerate(rates):
        alerts.check_interval(10 * (i + 1), tokens_per_s=rate, data_wait_pct=wait, grad_norm=1.0)
    path = alerts.path
    return [json.loads(line)["kind"] for line in path.read_text().splitlines()] if path.exists() else []


def test_a_lasting_throughput_drop_against_the_recent_median_alerts_once(tmp_path):
    alerts = Alerts(AlertConfig(throughput_drop=0.5, throughput_patience=3), tmp_path)
    assert _alert_kinds(alerts, [300, 1000, 1100, 900, 1000, 400, 420, 380, 390, 410]) == ["throughput_drop"]
    record = json.loads(alerts.path.read_text())
    assert record["step"] == 80 and record["recent_median_tokens_per_s"] == 900  # the slow intervals count too


def test_slow_intervals_shorter_than_the_patience_do_not_alert(tmp_path):
    alerts = Alerts(AlertConfig(throughput_drop=0.5, throughput_patience=3), tmp_path)
    # a shared machine: a neighbour's burst halves two intervals at a time, the rest swing by 30%
    assert _alert_kinds(alerts, [1000, 700, 1300, 300, 350, 1000, 800, 250, 1200, 900, 650]) == []
    restored = Alerts(AlertConfig(), tmp_path)
    restored.load_state_dict(alerts.state_dict())
    assert list(restored.recent_tokens_per_s) == list(alerts.recent_tokens_per_s)


def test_data_wait_alert(tmp_path):
    alerts = Alerts(AlertConfig(data_wait_pct=20), tmp_path)
    assert _alert_kinds(alerts, [1000], wait=30) == ["data_wait"]


def test_lamb_update_is_scaled_by_trust_ratio():
    w = torch.nn.Parameter(torch.full((4,), 2.0))
    opt = Lamb([w], lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    w.grad = torch.full((4,), 0.5)
    opt.step()
    # first Adam step is sign(grad) = 1 per element; trust = ‖w‖/‖update‖ = 4/2 = 2
    torch.testing.assert_close(w.detach(), torch.full((4,), 2.0 - 0.1 * 2.0))


def test_lr_warms_up_then_decays_to_the_floor():
    cfg = OptimConfig(warmup_steps=10, schedule="cosine", min_lr_ratio=0.1)
    assert lr_factor(0, cfg, 100) == pytest.approx(0.1)
    assert lr_factor(9, cfg, 100) == pytest.approx(1.0)
    assert lr_factor(55, cfg, 100) == pytest.approx(0.55)
    assert lr_factor(100, cfg, 100) == pytest.approx(0.1)
    linear = OptimConfig(warmup_steps=0, schedule="linear", min_lr_ratio=0.0)
    assert lr_factor(25, linear, 100) == pytest.approx(0.75)


def test_weight_decay_groups_exclude_norms_and_embeddings():
    model = Transformer(ModelConfig(vocab_size=40, dim=16, n_layers=1, n_heads=2, ffn_hidden=8, n_experts=2, top_k=1))
    decay, no_decay = param_groups(model, OptimConfig())
    assert any(p is model.embed.weight for p in no_decay["params"])
    assert all(p.ndim >= 2 for p in decay["params"]) and any(p.ndim == 1 for p in no_decay["params"])


def test_estimate_run_costs_the_table():
    est = estimate_run(TrainConfig(steps=10), peak_flops=1e12, utilization=0.5)
    assert est["tokens"] == 10 * 8 * 128 and est["hours"] > 0 and est["memory_gib_per_device"] > 0


def test_train_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"train\.precision = 'fp8'"):
        TrainConfig(precision="fp8")
    with pytest.raises(ConfigError, match=r"train\.optim\.schedule"):
        OptimConfig(schedule="step")
