"""Reading a training run folder: ``metrics.jsonl``, ``alerts.jsonl`` and ``config.json``.

``metrics.jsonl`` mixes three kinds of records (``train/metrics.py``, ``train/trainer.py``):
log records (``loss``, ``lr``, ``grad_norm``, ``per_source``, ``expert_load``, ``routing``, ...),
evaluation records (``{"step", "eval": {"loss", "per_source"}}``), attribution records
(``{"step", "attribution": ...}``, a source x source matrix of held-out loss changes) and counterfactual
records (``{"step", "counterfactual": ...}``, ``pipelines/report/counterfactual.py``). They are split here once, so plots and diagnosis work on plain arrays and never re-parse JSON.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from winnow.curate.errors import InputError
from winnow.pipelines.report.counterfactual import Counterfactual, step_span
from winnow.pipelines.report.counterfactual import parse as parse_counterfactual
from winnow.train.alerts import SKIP_ALERT, AlertKind

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Attribution:
    """Accumulated attribution: ``matrix[i, j]`` = change of held-out loss on ``sources[j]`` (nats)
    credited to training on ``sources[i]``; negative means training on i helped j.

    Records of the current contract also carry, per held-out source, the ``measured`` change over
    the same steps, the ``unattributed`` part and the quadrature's ``residual`` (``matrix.sum(0) +
    unattributed + residual = measured``); older records hold only the matrix (these stay None).
    """

    step: int
    sources: list[str]
    matrix: np.ndarray  # (S, S)
    measured: np.ndarray | None = None  # (S,)
    unattributed: np.ndarray | None = None  # (S,)
    residual: np.ndarray | None = None  # (S,)
    parts: dict[str, np.ndarray] = field(default_factory=dict)  # the unattributed part's rows
    steps: tuple[int, int] | None = None  # first and last attributed step

    @property
    def attributed(self) -> np.ndarray:
        """Per held-out source: the sum over training sources (the column sums)."""
        return self.matrix.sum(axis=0)

    @property
    def attributed_share(self) -> np.ndarray | None:
        """Per held-out source: the attributed part of the measured change (1.0 = all of it); NaN where
        nothing was measured to move."""
        if self.measured is None:
            return None
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.measured != 0, self.attributed / self.measured, np.nan)

    @property
    def diagonal(self) -> np.ndarray:
        return np.diag(self.matrix)

    @property
    def row_sums(self) -> np.ndarray:
        return self.matrix.sum(axis=1)


@dataclass(slots=True)
class TrainingRun:
    """Everything the report reads from one run folder, already split by record kind."""

    path: Path
    logs: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    attribution: Attribution | None = None
    counterfactual: Counterfactual | None = None
    alerts: list[dict] = field(default_factory=list)
    config: dict = field(default_factory=dict)
    bad_lines: int = 0
    stop_reason: str | None = None  # why [train.stop] ended the run early

    @property
    def sources(self) -> list[str]:
        """Source names in the order the trainer reported them."""
        for record in self.logs:
            if record.get("per_source"):
                return list(record["per_source"])
        for record in self.evals:
            return list(record["eval"].get("per_source") or {})
        return []

    def column(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of a scalar log field; records without it are left out, None becomes NaN."""
        rows = [(r["step"], r[key]) for r in self.logs if key in r]
        return _arrays(rows)

    def per_source(self, source: str, key: str = "mean_loss") -> tuple[np.ndarray, np.ndarray]:
        rows = [(r["step"], (r.get("per_source") or {}).get(source, {}).get(key)) for r in self.logs]
        return _arrays(rows)

    def eval_column(self, source: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(steps, held-out loss) overall (``source=None``) or for one source."""
        if source is None:
            rows = [(r["step"], r["eval"].get("loss")) for r in self.evals]
        else:
            rows = [(r["step"], (r["eval"].get("per_source") or {}).get(source)) for r in self.evals]
        return _arrays(rows)

    def memory(self) -> tuple[np.ndarray, np.ndarray, str]:
        """(steps, GiB, what the figure is): peak GPU memory when logged, else peak host RSS."""
        for key in ("peak_gib", "allocated_gib", "peak_rss_gib"):
            rows = [(r["step"], r["memory"][key]) for r in self.logs if key in (r.get("memory") or {})]
            if rows:
                return (*_arrays(rows), key)
        return np.zeros(0), np.zeros(0), ""

    def expert_load(self, *, skip: int = 0) -> np.ndarray:
        """Mean expert load share over the run after the first ``skip`` log records (while any remain),
        (layers, experts); empty for a dense model."""
        logs = self.logs[skip:] if len(self.logs) > skip else self.logs
        loads = [_array(r["expert_load"]) for r in logs if r.get("expert_load")]
        loads = [x for x in loads if x is not None and x.ndim == 2 and x.size]
        loads = [x for x in loads if x.shape == loads[-1].shape]  # a record of another model's shape: not averaged
        return np.mean(np.stack(loads), axis=0) if loads else np.zeros((0, 0))

    def routing(self) -> np.ndarray:
        """Token-to-expert assignments summed over the run, (sources, layers, experts)."""
        sources = self.sources
        total = None
        for record in self.logs:
            routing = record.get("routing")
            if not routing or not isinstance(routing, dict):
                continue
            counts = _array([routing.get(s, []) for s in sources])
            if counts is None or counts.ndim != 3 or (total is not None and counts.shape != total.shape):
                continue
            total = counts if total is None else total + counts
        return total if total is not None else np.zeros((len(sources), 0, 0))

    def skipped_steps(self) -> list[tuple[int, str]]:
        """(step, kind) of every skipped optimizer step the alerts name."""
        reason = {alert: skip for skip, alert in SKIP_ALERT.items()}
        return [(a["step"], reason[a["kind"]]) for a in self.alerts if a["kind"] in reason]

    def section(self, name: str) -> dict:
        """A table of ``config.json`` (``optim``, ``attribution``); {} where the run recorded none."""
        value = self.config.get(name)
        return value if isinstance(value, dict) else {}

    @property
    def shards_dir(self) -> Path | None:
        """The curation job folder this run trained on, when the run recorded it and it is local: where
        ``provenance.json`` records it (an absolute path), else ``config.json``'s (as given, from the folder the run
        was started in, when that is here)."""
        try:
            data = json.loads((self.path / "provenance.json").read_text()).get("data") or []
            recorded = Path(data[0]["path"]) if isinstance(data[0], dict) and "://" not in data[0]["path"] else None
        except (OSError, ValueError, AttributeError, IndexError, KeyError, TypeError):
            recorded = None
        if recorded is not None and recorded.is_absolute():
            return recorded if (recorded / "manifest.json").is_file() else None
        shards = self.config.get("shards")
        if isinstance(shards, list):  # several training sets: the report shows the first one's curation
            shards = shards[0].get("path") if shards and isinstance(shards[0], dict) else None
        if not isinstance(shards, str) or not shards or "://" in shards:
            return None
        path = Path(shards)
        if not path.is_absolute() and not path.exists():
            path = self.path / path
        return path if (path / "manifest.json").is_file() else None

    def curated_since(self) -> str | None:
        """A sentence when ``shards_dir`` holds other shards than the ones this run read (their fingerprint is not
        the one ``provenance.json`` recorded for its first training set); None when they are the same or unknown."""
        from winnow.pipelines.provenance import shards_digest

        shards = self.shards_dir
        try:
            data = json.loads((self.path / "provenance.json").read_text()).get("data") or []
            recorded = data[0].get("shards") if isinstance(data[0], dict) else None
        except (OSError, ValueError, AttributeError, IndexError):  # no record, or not one winnow wrote
            return None
        if shards is None or not recorded or shards_digest(shards) == recorded:
            return None
        return (
            f"The job folder {shards} was curated again after this run trained on it, to other shards (their "
            f"fingerprint is not the one {self.path / 'provenance.json'} records): the curation shown here is of "
            "the new shards, not of the data this run saw."
        )


def _arrays(rows: list[tuple[Any, Any]]) -> tuple[np.ndarray, np.ndarray]:
    if not rows:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    steps, values = zip(*rows)
    return np.asarray(steps, dtype=np.int64), np.asarray([np.nan if v is None else v for v in values], dtype=float)


def _read_jsonl(path: Path, well_formed: Callable[[dict], bool] | None = None) -> tuple[list[dict], int]:
    """Records of a JSON-lines file; a line that is not a JSON object (a torn last line of a run killed
    mid-write, bytes that are not UTF-8), or not ``well_formed``, is counted, not fatal."""
    records, bad = [], 0
    if not path.is_file():
        return records, bad
    with open(path, "rb") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
                record = None
            if isinstance(record, dict) and (well_formed is None or well_formed(record)):
                records.append(record)
            else:
                bad += 1
    if bad:
        log.warning("%s: %d unreadable line(s) skipped (not JSON, or not of the shapes the trainer writes)", path, bad)
    return records, bad


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _array(x: object) -> np.ndarray | None:
    """``x`` as an array of floats, or None when it is not a regular table of numbers (a record edited by hand)."""
    try:
        return np.asarray(x, dtype=float)
    except (ValueError, TypeError):
        return None


def _numbers(x: object) -> bool:
    """A number, or a table or list of them (nested, null where there is none: a source with no held-out rows):
    what the trainer writes under a figure's key."""
    if isinstance(x, dict):
        return all(_numbers(v) for v in x.values())
    if isinstance(x, list):
        return all(_numbers(v) for v in x)
    return x is None or _number(x)


#: Keys of metrics records the report reads, and their shapes: a number, or a table or list of numbers.
_FIGURES: dict[str, type | None] = {
    "loss": None, "step_loss": None, "lr": None, "grad_norm": None, "tokens_seen": None, "tokens_per_s": None,
    "mfu": None, "memory": dict, "expert_load": list, "mix_weights": dict, "mix_weights_mean": dict,
}  # fmt: skip


def _shaped(x: object, container: type | None) -> bool:
    """A number (or null: the trainer writes ``"loss": null`` for an interval whose every step it skipped), or a
    ``container`` of numbers."""
    return (x is None or _number(x)) if container is None else isinstance(x, container) and _numbers(x)


def _step(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1 << 62


def _well_formed(record: dict) -> bool:
    """Whether ``record`` has the shapes the report reads: an integer step, numbers under the figures' keys, an
    evaluation's losses as numbers, a stop's reason as text. A record edited by hand into another shape is skipped,
    counted."""
    if not _step(record.get("step")):  # every record the trainer writes has one: the report orders and pairs by it
        return False
    if "stop" in record and not (isinstance(record["stop"], dict) and isinstance(record["stop"].get("reason"), str)):
        return False
    if not all(_shaped(record[k], c) for k, c in _FIGURES.items() if k in record):
        return False
    if not all(isinstance(record[k], dict) for k in ("attribution", "counterfactual", "routing") if k in record):
        return False
    per_source = record.get("per_source", {})
    if not isinstance(per_source, dict) or not all(isinstance(v, dict) and _numbers(v) for v in per_source.values()):
        return False
    if "eval" not in record:
        return True
    held_out = record["eval"]
    return (
        isinstance(held_out, dict)
        and _shaped(held_out.get("loss", 0.0), None)
        and _shaped(held_out.get("per_source", {}), dict)
    )


def _well_formed_alert(record: dict) -> bool:
    """Whether an ``alerts.jsonl`` record has the shapes the report reads (``Alerts.emit``): a text ``kind``, a
    non-negative integer step, and where given, the batch's ``sources`` as names and its ``origins`` as (shard, row)
    pairs. A record edited by hand into another shape is skipped, counted."""
    sources, origins = record.get("sources", []), record.get("origins", [])
    return (
        isinstance(record.get("kind"), str)
        and _step(record.get("step"))
        and isinstance(sources, list)
        and all(isinstance(s, str) for s in sources)
        and isinstance(origins, list)
        and all(isinstance(o, list) and len(o) == 2 and isinstance(o[0], str) for o in origins)
    )


#: ``config.json`` keys the report reads: the check of each value, and what it must be in words.
_SETTINGS: dict[str, tuple[Callable[[object], bool], str]] = {
    "precision": (lambda x: isinstance(x, str), "text"),
    "shards": (lambda x: isinstance(x, (str, list)), "a folder or a list of {path, weight} tables"),
    "optim": (lambda x: isinstance(x, dict), "a table"),
    "optim.grad_clip": (_number, "a number"),
    "attribution": (lambda x: isinstance(x, dict), "a table"),
    "attribution.every": (_number, "a number"),
}


def _checked_config(config: object, path: Path) -> dict:
    """``config`` less the values of ``_SETTINGS``'s keys of another type (edited by hand), each named in a warning:
    the report reads such a value as absent, as it reads a key the run did not record."""
    if not isinstance(config, dict):
        log.warning(
            "%s: not a JSON object (%s); the report reads the run's settings as absent", path, type(config).__name__
        )
        return {}
    for dotted, (fits, what) in _SETTINGS.items():
        *parents, key = dotted.split(".")
        table = config
        for part in parents:  # a parent of another type is already gone: _SETTINGS lists parents first
            table = table.get(part, {})
        if key in table and not fits(table[key]):
            log.warning("%s: train.%s = %r is not %s; the report reads it as absent", path, dotted, table[key], what)
            del table[key]
    return config


def _each_step_once(records: list[dict]) -> list[dict]:
    """Records as the trainer would have left them after a resume: each (kind, step) once, in step order.

    The trainer cuts ``metrics.jsonl`` back to the checkpoint when it resumes; a file written
    before it did (or copied mid-run) can still hold a killed stretch followed by its redo. A
    record whose step does not advance past the last one of its kind starts such a redo, so
    every earlier record from that step on is dropped: the latest attempt wins.
    """

    def kind(record: dict) -> str:
        return next((k for k in ("eval", "attribution", "counterfactual", "stop") if k in record), "log")

    kept: list[dict] = []
    last: dict[str, int] = {}
    for record in records:
        step = record.get("step")
        if not isinstance(step, int):
            kept.append(record)
            continue
        if step <= last.get(kind(record), -1):
            kept = [r for r in kept if not (isinstance(r.get("step"), int) and r["step"] >= step)]
            last = {}
            for r in kept:
                if isinstance(r.get("step"), int):
                    last[kind(r)] = r["step"]
        kept.append(record)
        last[kind(record)] = step
    return kept


def parse_attribution(record: dict) -> Attribution | None:
    """An attribution record as a matrix: ``{"sources", "matrix"}`` or ``{train: {heldout: value}}``."""
    try:
        return _parse_attribution(record)
    except (ValueError, TypeError, AttributeError) as err:
        log.warning(
            "attribution record at step %s: not of the shape the trainer writes (%s); ignored", record.get("step"), err
        )
        return None


def _parse_attribution(record: dict) -> Attribution | None:
    value = record.get("attribution")
    if isinstance(value, dict) and "matrix" in value:
        sources = list(value.get("sources") or [])
        matrix = np.asarray(value["matrix"], dtype=float)
    elif isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
        sources = list(value)
        matrix = np.asarray([[value[a].get(b, np.nan) for b in sources] for a in sources], dtype=float)
    else:
        return None
    if matrix.shape != (len(sources), len(sources)):
        log.warning(
            "attribution record at step %s: matrix %s does not match %d sources; ignored",
            record.get("step"),
            matrix.shape,
            len(sources),
        )
        return None
    columns = {}
    for key in ("measured", "unattributed", "residual"):
        column = np.asarray(value.get(key, []), dtype=float) if "matrix" in value else np.zeros(0)
        columns[key] = column if column.shape == (len(sources),) else None
    parts = (
        {
            k: np.asarray(v, dtype=float)
            for k, v in (value.get("unattributed_parts") or {}).items()
            if np.shape(v) == (len(sources),)
        }
        if "matrix" in value
        else {}
    )
    steps = step_span(value.get("steps")) if "matrix" in value else None
    return Attribution(
        step=int(record.get("step", 0)), sources=sources, matrix=matrix, parts=parts, steps=steps, **columns
    )


def attribution_rows(attr: Attribution) -> list[dict]:
    """Per held-out source: the measured change beside the estimate and how much of it is attributed
    (``measured`` etc. are None for records of the older, matrix-only contract)."""
    rows = []
    share = attr.attributed_share
    for j, source in enumerate(attr.sources):
        column = attr.matrix[:, j]
        top = int(np.argmin(column)) if np.isfinite(column).any() and column.min() < 0 else None

        def pick(v: np.ndarray | None, j: int = j) -> float | None:
            return None if v is None else float(v[j])

        rows.append(
            {
                "source": source,
                "measured": pick(attr.measured),
                "attributed": float(attr.attributed[j]),
                "unattributed": pick(attr.unattributed),
                "residual": pick(attr.residual),
                "share": None if share is None or np.isnan(share[j]) else float(share[j]),
                "helped_most_by": None if top is None else attr.sources[top],
                "helped_most": None if top is None else float(column[top]),
            }
        )
    return rows


def is_run_dir(path: Path) -> bool:
    return (path / "metrics.jsonl").is_file()


def load_run(path: str | Path) -> TrainingRun:
    """Read a run folder (one holding ``metrics.jsonl``)."""
    path = Path(path)
    if not is_run_dir(path):
        raise InputError(f"{path} is not a training run folder: no metrics.jsonl there")
    records, bad = _read_jsonl(path / "metrics.jsonl", _well_formed)
    records = _each_step_once(records)
    alerts, bad_alerts = _read_jsonl(path / "alerts.jsonl", _well_formed_alert)
    unknown = sorted({a["kind"] for a in alerts} - set(AlertKind))
    if unknown:  # written by a newer trainer, or by hand: shown as they are, without a colour or a diagnosis
        log.warning(
            "%s: alert kind(s) %s unknown to this report; known: %s",
            path / "alerts.jsonl",
            unknown,
            ", ".join(AlertKind),
        )
    run = TrainingRun(path=path, alerts=alerts, bad_lines=bad + bad_alerts)
    for record in records:
        if "eval" in record:
            run.evals.append(record)
        elif "attribution" in record:
            run.attribution = parse_attribution(record) or run.attribution  # accumulated: the last one wins
        elif "counterfactual" in record:
            run.counterfactual = parse_counterfactual(record) or run.counterfactual
        elif "loss" in record:
            run.logs.append(record)
        elif "stop" in record:
            run.stop_reason = record["stop"]["reason"]
    if (path / "config.json").is_file():
        try:
            config = json.loads((path / "config.json").read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            log.warning(
                "%s: not readable as the run's config (%s); the report leaves it out", path / "config.json", err
            )
            config = {}
        run.config = _checked_config(config, path / "config.json")
    return run
