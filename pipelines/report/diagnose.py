"""Diagnosis: rules that read a run's metrics and alerts and name the likely cause, the evidence and the fix.

Each rule is a function of ``(run, cfg)`` returning at most one ``Finding``; ``diagnose`` runs
them all. Thresholds live in ``DiagnoseConfig`` so tests and users can move them.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import PurePath

import numpy as np

from winnow.curate.errors import ConfigError
from winnow.pipelines.report.training import TrainingRun
from winnow.train.alerts import SKIP_ALERT, AlertKind


@dataclass(frozen=True, slots=True)
class Finding:
    """One diagnosed problem: what is wrong, why we think so, and which setting to change."""

    rule: str
    title: str
    evidence: list[str]
    settings: list[str]
    severity: str = "warning"  # "warning" or "critical"


@dataclass(kw_only=True, slots=True)
class DiagnoseConfig:
    """Thresholds of the diagnosis rules (``winnow report --diagnose`` options)."""

    data_wait_pct: float = 20.0  # mean share of step time spent waiting for batches
    comm_pct: float = 30.0  # mean share of step time in collective communication
    memory_fraction: float = 0.9  # peak memory over the device (or host) limit
    memory_limit_gib: float | None = None  # None: logged by the run, else this host's RAM for CPU runs
    imbalance: float = 2.0  # busiest expert's load over the uniform share, in any layer
    regression_nats: float = 0.02  # a source's held-out loss rising this much above its best
    skip_first: int = 1  # log records left out of averages (worker start-up, compilation)

    def __post_init__(self) -> None:
        for key in ("data_wait_pct", "comm_pct"):
            value = getattr(self, key)
            if not 0 < value <= 100:
                raise ConfigError(f"report.{key} = {value!r} is invalid; allowed: 0 < value <= 100")
        if not 0 < self.memory_fraction <= 1:
            raise ConfigError(f"report.memory_fraction = {self.memory_fraction!r} is invalid; allowed: 0 < value <= 1")
        if self.memory_limit_gib is not None and not 0 < self.memory_limit_gib < math.inf:  # nan fails too
            raise ConfigError(
                f"report.memory_limit_gib = {self.memory_limit_gib!r} is invalid; allowed: None or a finite number > 0"
            )
        if self.imbalance <= 1:
            raise ConfigError(f"report.imbalance = {self.imbalance!r} is invalid; allowed: > 1 (1 is uniform load)")
        if self.regression_nats <= 0:
            raise ConfigError(f"report.regression_nats = {self.regression_nats!r} is invalid; allowed: > 0")
        if not (isinstance(self.skip_first, int) and self.skip_first >= 0):
            raise ConfigError(f"report.skip_first = {self.skip_first!r} is invalid; allowed: an integer >= 0")


def _setting(run: TrainingRun, dotted: str, default: object = "default") -> str:
    """``train.a.b = value`` as the run recorded it (``config.json``)."""
    value: object = run.config
    for part in dotted.split("."):
        value = value.get(part, default) if isinstance(value, dict) else default
    return f"train.{dotted} = {value!r}" if value != default else f"train.{dotted} (default)"


def _steady(values: np.ndarray, skip: int) -> np.ndarray:
    values = values[skip:] if values.size > skip else values
    return values[np.isfinite(values)]


def no_records(run: TrainingRun, cfg: DiagnoseConfig) -> Finding | None:
    """A run with no training records: the other rules find nothing because there is nothing to read."""
    if run.logs:
        return None
    return Finding(
        rule="no_records",
        title="nothing to diagnose: metrics.jsonl holds no training records",
        evidence=[f"{run.path / 'metrics.jsonl'}: no record with a training loss (the run logged none, or lost them)"],
        settings=["train the run further, or log more often ([train.metrics] log_every)"],
    )


def loss_spikes(run: TrainingRun, cfg: DiagnoseConfig) -> Finding | None:
    """Loss spikes and non-finite steps: which sources and shards were in those batches; precision."""
    events = [a for a in run.alerts if a.get("kind") in SKIP_ALERT.values()]
    if not events:  # alerts.jsonl missing or unreadable: the metrics still say which intervals trained nothing
        return _untrained_intervals(run)
    sources = Counter(s for a in events for s in set(a.get("sources") or []))
    shards = Counter(PurePath(str(o[0])).name for a in events for o in {tuple(o) for o in a.get("origins") or []})
    steps = ", ".join(str(a["step"]) for a in events[:10]) + (" ..." if len(events) > 10 else "")
    evidence = [f"{len(events)} spike/non-finite step(s) at step {steps}"]
    share = {s: (run.logs[-1]["per_source"].get(s) or {}).get("token_share") for s in sources} if run.logs else {}
    for source, n in sources.most_common():
        token_share = share.get(source)
        evidence.append(
            f"source {source!r} was in {n} of {len(events)} spiking batches"
            + (f" (its token share: {token_share:.0%})" if token_share is not None else "")
        )
    if shards:
        evidence.append("shards in those batches: " + ", ".join(f"{name} ({n})" for name, n in shards.most_common(5)))
    precision = run.config.get("precision", "fp32")
    settings = [
        _setting(run, "optim.lr") + ": lower it, or lengthen " + _setting(run, "optim.warmup_steps"),
        _setting(run, "optim.grad_clip") + ": clip harder",
    ]
    if precision == "fp16":
        settings.insert(0, "train.precision = 'fp16': fp16 overflows; use 'bf16' (same speed on recent GPUs) or 'fp32'")
    elif precision == "bf16":
        settings.insert(0, "train.precision = 'bf16': if spikes persist, compare with 'fp32' on the same seed")
    always = [s for s, n in sources.items() if n == len(events)]
    if len(events) >= 2 and len(always) == 1:
        settings.append(
            f"source {always[0]!r} is in every spiking batch: inspect its shards above, filter it "
            f"harder, or lower its weight in the mix stage"
        )
    nonfinite = sum(a["kind"] == AlertKind.NONFINITE for a in events)
    return Finding(
        rule="loss_spike",
        title="Loss spikes" + (" and non-finite losses" if nonfinite else ""),
        evidence=evidence,
        settings=settings,
        severity="critical" if nonfinite else "warning",
    )


def _untrained_intervals(run: TrainingRun) -> Finding | None:
    """Log intervals whose every step the trainer skipped (``"loss": null``), where no alert tells more. A NaN or
    infinite loss (``NaN`` in the JSON: older writers, and Python's ``json``, write the literal) is the same."""
    skipped = [r["step"] for r in run.logs if "loss" in r and (r["loss"] is None or not math.isfinite(r["loss"]))]
    if not skipped:
        return None
    steps = ", ".join(map(str, skipped[:10])) + (" ..." if len(skipped) > 10 else "")
    return Finding(
        rule="loss_spike",
        title="Steps skipped: non-finite losses or spikes",
        evidence=[
            f"{len(skipped)} log interval(s) in which every step was skipped (their loss is null or not finite), "
            f"ending at step {steps}; alerts.jsonl, which names the sources and shards of such steps, has none of them"
        ],
        settings=[
            _setting(run, "optim.lr") + ": lower it, or lengthen " + _setting(run, "optim.warmup_steps"),
            _setting(run, "optim.grad_clip") + ": clip harder",
        ],
        severity="critical",
    )


def slow_input(run: TrainingRun, cfg: DiagnoseConfig) -> Finding | None:
    """Throughput below expectation because the trainer waits for batches: the loader."""
    steps, wait = run.column("data_wait_pct")
    steady = _steady(wait, cfg.skip_first)
    alerts = [a for a in run.alerts if a.get("kind") == AlertKind.DATA_WAIT]
    if not (steady.size and steady.mean() > cfg.data_wait_pct) and not alerts:
        return None
    evidence = [
        f"mean data wait {steady.mean():.0f}% of step time (threshold {cfg.data_wait_pct:.0f}%), "
        f"max {steady.max():.0f}%"
        if steady.size
        else "no data-wait figures logged"
    ]
    _, tps = run.column("tokens_per_s")
    if tps.size:
        evidence.append(f"tokens/s: median {np.nanmedian(tps):.0f}, best {np.nanmax(tps):.0f}")
    if alerts:
        evidence.append(f"{len(alerts)} data_wait alert(s), first at step {alerts[0]['step']}")
    return Finding(
        rule="data_wait",
        title="Throughput limited by the data loader",
        evidence=evidence,
        settings=[
            _setting(run, "data.num_workers") + ": add reading/tokenizing workers",
            _setting(run, "data.prefetch") + ": queue more pieces ahead",
            "train.data.format = 'parquet' reads faster than WebDataset tars",
        ],
    )


def slow_communication(run: TrainingRun, cfg: DiagnoseConfig) -> Finding | None:
    """Throughput below expectation because of collectives (``comm_pct`` when the run logs it)."""
    _, comm = run.column("comm_pct")
    steady = _steady(comm, cfg.skip_first)
    if not (steady.size and steady.mean() > cfg.comm_pct):
        return None
    return Finding(
        rule="communication",
        title="Throughput limited by communication (the parallel layout)",
        evidence=[f"mean communication {steady.mean():.0f}% of step time (threshold {cfg.comm_pct:.0f}%)"],
        settings=[
            _setting(run, "grad_accum") + ": accumulate more micro-batches per all-reduce",
            "the parallel layout: keep expert-parallel all-to-all within a node, shard (FSDP) only "
            "as far as memory requires, use fewer, larger data-parallel groups across nodes",
        ],
    )


def _memory_limit(run: TrainingRun, cfg: DiagnoseConfig, what: str) -> tuple[float | None, str]:
    limits = [r["memory"].get("limit_gib") for r in run.logs if (r.get("memory") or {}).get("limit_gib")]
    if limits:
        return float(limits[-1]), "logged by the run"
    if cfg.memory_limit_gib is not None:
        return cfg.memory_limit_gib, "given"
    if what == "peak_rss_gib" and hasattr(os, "sysconf") and "SC_PHYS_PAGES" in os.sysconf_names:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30, "this host's RAM"
    return None, ""


def memory_pressure(run: TrainingRun, cfg: DiagnoseConfig) -> Finding | None:
    """Peak memory near the device (or host) limit."""
    _, gib, what = run.memory()
    if not gib.size:
        return None
    limit, where = _memory_limit(run, cfg, what)
    peak = float(np.nanmax(gib))
    if limit is None or peak < cfg.memory_fraction * limit:
        return None
    settings = [
        _setting(run, "activation_checkpointing") + ": recompute activations in the backward pass",
        _setting(run, "grad_accum")
        + " with a smaller "
        + _setting(run, "data.batch_size")
        + ": same tokens per step, less activation memory",
        "offload optimizer state or parameters to the host (FSDP CPU offload) if the model itself is the bulk",
    ]
    if run.config.get("precision", "fp32") == "fp32":
        settings.append("train.precision = 'fp32': 'bf16' autocast halves activation memory")
    return Finding(
        rule="memory",
        title="Memory near the limit",
        evidence=[
            f"peak {what} {peak:.2f} GiB = {peak / limit:.0%} of {limit:.2f} GiB ({where}); "
            f"threshold {cfg.memory_fraction:.0%}"
        ],
        settings=settings,
        severity="critical",
    )


def expert_imbalance(run: TrainingRun, cfg: DiagnoseConfig) -> Finding | None:
    """Uneven expert load: the busiest expert's share over uniform, per layer, and who routes to it."""
    load_ME = run.expert_load(skip=cfg.skip_first)  # routing right after initialisation is noise
    if not load_ME.size:
        return None
    ratio_ME = load_ME * load_ME.shape[1]
    worst_M = ratio_ME.max(axis=1)
    if worst_M.max() <= cfg.imbalance:
        return None
    evidence = []
    routing_SME = run.routing()
    for layer in np.flatnonzero(worst_M > cfg.imbalance):
        expert = int(ratio_ME[layer].argmax())
        loads = ", ".join(f"{x:.2f}" for x in ratio_ME[layer])
        line = f"layer {layer}: expert {expert} carries {worst_M[layer]:.1f}x the uniform load (loads: {loads})"
        if routing_SME.size:
            share_S = routing_SME[:, layer, expert] / np.maximum(routing_SME[:, layer, :].sum(axis=1), 1)
            top = int(share_S.argmax())
            line += f"; {run.sources[top]!r} sends {share_S[top]:.0%} of its tokens there"
        evidence.append(line)
    return Finding(
        rule="expert_imbalance",
        title="Expert load imbalance",
        evidence=evidence,
        settings=[
            _setting(run, "model.aux_loss_coef") + ": raise the load-balancing loss weight",
            _setting(run, "model.bias_update_rate") + ": faster loss-free bias balancing",
            _setting(run, "model.router_noise") + ": noise spreads early routing",
        ],
    )


def source_regression(run: TrainingRun, cfg: DiagnoseConfig) -> Finding | None:
    """A source whose held-out loss rises while the others' falls."""
    if len(run.evals) < 2:
        return None
    changes = {}
    for source in run.sources:
        _, loss = run.eval_column(source)
        loss = loss[np.isfinite(loss)]
        if loss.size >= 2:
            changes[source] = (float(loss[-1] - loss.min()), float(loss[-1] - loss[0]), loss)
    rising = [s for s, (above_best, _, _) in changes.items() if above_best > cfg.regression_nats]
    for source in sorted(rising, key=lambda s: -changes[s][0]):
        others = [changes[o][1] for o in changes if o != source]
        if not others or np.mean(others) >= 0:
            continue
        loss = changes[source][2]
        evidence = [
            f"held-out loss on {source!r} rose {changes[source][0]:+.3f} nats from its best "
            f"{loss.min():.3f} to {loss[-1]:.3f}",
            f"the other sources' held-out loss changed {np.mean(others):+.3f} nats on average over the run",
        ]
        settings = [f"raise {source!r}'s weight in the mix stage (or lower max_epochs if it is repeated and overfit)"]
        cf = run.counterfactual
        if cf is not None and source in cf.held_out and 0.0 in cf.predicted:
            # the source whose removal is predicted to lower this loss the most, beyond its interval
            left_out = cf.predicted[0.0][:, cf.held_out.index(source)]
            half = cf.interval[0.0][:, cf.held_out.index(source)]
            worst = int(np.nanargmin(left_out))
            if left_out[worst] < -half[worst]:
                evidence.append(
                    f"counterfactual: leaving out {cf.sources[worst]!r} would lower it by "
                    f"{-left_out[worst]:.3g} ± {half[worst]:.2g} nats"
                )
                settings.append(f"lower {cf.sources[worst]!r}'s weight in the mix stage")
        return Finding(
            rule="source_regression",
            title=f"Held-out loss on {source!r} rises while others fall",
            evidence=evidence,
            settings=settings,
        )
    return None


RULES = (no_records, loss_spikes, slow_input, slow_communication, memory_pressure, expert_imbalance, source_regression)


def diagnose(run: TrainingRun, cfg: DiagnoseConfig | None = None) -> list[Finding]:
    """Every rule's finding for ``run``, most severe first."""
    cfg = cfg or DiagnoseConfig()
    findings = [f for rule in RULES if (f := rule(run, cfg)) is not None]
    return sorted(findings, key=lambda f: f.severity != "critical")


def format_findings(findings: list[Finding]) -> str:
    """Plain text for the terminal (``winnow report --diagnose``)."""
    if not findings:
        return "diagnosis: nothing found (loss, throughput, memory, expert load and held-out losses look normal)"
    lines = []
    for f in findings:
        lines.append(f"[{f.severity}] {f.title}")
        lines += [f"    evidence: {e}" for e in f.evidence]
        lines += [f"    change:   {s}" for s in f.settings]
    return "\n".join(lines)
