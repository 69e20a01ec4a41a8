"""The ``[train]`` table: one dataclass composing each component's own config."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Literal

from winnow.train.adaptive import MixingConfig
from winnow.train.alerts import AlertConfig
from winnow.train.attribution import AttributionConfig
from winnow.train.checkpoint import CheckpointConfig
from winnow.train.data.config import LoaderConfig
from winnow.train.data.sets import ReplayConfig, ShardSetConfig
from winnow.train.errors import ConfigError, checker
from winnow.train.metrics import MetricsConfig
from winnow.train.model.config import ModelConfig
from winnow.train.optim import OptimConfig
from winnow.train.parallel.config import ParallelConfig
from winnow.train.stopping import StopConfig
from winnow.train.tokenizer import TokenizerConfig

_check = checker("train")


def _finite(config, table: str) -> None:
    """Refuse inf and nan in every number of ``config`` and the tables it holds (``table``: its TOML name): no
    [train] setting means anything by them (a run with lr = inf skips every step as non-finite)."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        items = value if isinstance(value, (list, tuple)) else [value]
        for item in items:
            if isinstance(item, float) and not math.isfinite(item):
                raise ConfigError(f"{table}.{f.name} = {value!r} is invalid; allowed: finite numbers")
            if dataclasses.is_dataclass(item):
                _finite(item, f"{table}.{f.name}")


_distill = checker("train.distill")


@dataclass(kw_only=True, slots=True)
class DistillConfig:
    """Soft targets from a teacher checkpoint (``[train.distill]``)."""

    teacher: str  # a run folder (its newest valid checkpoint) or one checkpoint folder
    alpha: float = 0.5  # weight of the soft-target loss; 1 - alpha stays on the data
    temperature: float = 2.0  # softmax temperature of the teacher's and the student's logits

    def __post_init__(self) -> None:
        _distill(0 <= self.alpha <= 1, "alpha", self.alpha, "0..1")
        _distill(self.temperature > 0, "temperature", self.temperature, "> 0")


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    """A training run. Defaults train the tiny demo model on two CPU cores in a few minutes."""

    # the run folder (metrics, alerts, checkpoints, tokenizer); a job file without the key trains in the train/
    # folder of the curated job folder it trains on, or in out/FOLDER/train for another folder of Parquet files
    output: str = "out/train"
    shards: str | list[ShardSetConfig] | None = None  # a job output folder holding manifest.json (or s3://...),
    # or a list of {path, weight} tables mixed at load time; None: the job's output
    replay: ReplayConfig | None = None  # {from = "out/base", share = 0.05}: the base data back at that share
    eval: list[str] = field(default_factory=list)  # job folders whose val splits are held out; []: the training ones
    # start from this run folder or checkpoint, local or an fsspec URL (continued pretraining)
    init_from: str | None = None
    init_optimizer: bool = False  # with init_from: also keep the base run's optimizer state (moments, step counts)
    # [train.tokenizer], or just its path; None: the token shards' own, else byte
    tokenizer: str | TokenizerConfig | None = None
    steps: int = 300  # optimizer steps
    grad_accum: int = 1  # micro-batches per optimizer step
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"  # bf16/fp16: autocast with fp32 master weights
    # recompute each block's activations in the backward: less memory, more compute
    activation_checkpointing: bool = False
    compile: bool = False  # torch.compile each block (and the loss on a GPU); not with attribution
    label_smoothing: float = 0.0  # cross-entropy label smoothing
    seed: int = 0  # model initialization and data order
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto: CUDA when available, else the CPU
    eval_every: int = 100  # steps between per-source held-out evaluations (0: only at the end)
    eval_batches: int | None = None  # cap on val batches per evaluation; None: the whole val split (every source)
    skip_nonfinite: bool = True  # skip (and alert on) steps whose loss or gradient norm is NaN/Inf
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    data: LoaderConfig = field(default_factory=lambda: LoaderConfig(batch_size=8, seq_len=128, num_workers=1))
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    alerts: AlertConfig = field(default_factory=AlertConfig)
    distill: DistillConfig | None = None
    parallel: ParallelConfig = field(default_factory=ParallelConfig)  # under torchrun: DDP/FSDP2, experts
    attribution: AttributionConfig = field(default_factory=AttributionConfig)  # per-source first-order attribution
    stop: StopConfig = field(default_factory=StopConfig)  # early stopping on held-out loss
    mixing: MixingConfig = field(default_factory=MixingConfig)  # adaptive (DoReMi-style) mix weights

    def __post_init__(self) -> None:
        _finite(self, "train")
        _check(
            isinstance(self.output, str) and bool(self.output.strip()) and "://" not in self.output,
            "output",
            self.output,
            "a local folder for the run (not a URL: checkpoints and metrics are written to local disk; copy the "
            "folder to the store once it is written)",
        )
        for key in ("steps", "grad_accum", "eval_batches"):
            value = getattr(self, key)
            if key == "eval_batches" and value is None:
                continue
            _check(isinstance(value, int) and value >= 1, key, value, "an integer >= 1")
        _check(
            isinstance(self.eval_every, int) and self.eval_every >= 0, "eval_every", self.eval_every, "an integer >= 0"
        )
        _check(self.precision in ("fp32", "bf16", "fp16"), "precision", self.precision, "'fp32', 'bf16' or 'fp16'")
        _check(self.device in ("auto", "cpu", "cuda"), "device", self.device, "'auto', 'cpu' or 'cuda'")
        _check(0 <= self.label_smoothing < 1, "label_smoothing", self.label_smoothing, "0 <= value < 1")
        _check(
            not self.init_optimizer or self.init_from is not None,
            "init_optimizer",
            self.init_optimizer,
            "true only together with train.init_from",
        )
        _check(
            not self.stop.active or self.eval_every > 0,
            "stop",
            "patience/thresholds",
            "needs train.eval_every > 0 (the stop rules read the periodic evaluations)",
        )
        _check(
            self.data.seq_len <= self.model.max_seq_len,
            "data.seq_len",
            self.data.seq_len,
            f"at most train.model.max_seq_len ({self.model.max_seq_len})",
        )
        _check(
            not (self.compile and self.attribution.every),
            "compile",
            self.compile,
            "false with train.attribution (its per-source split runs its own ops in place of the model's, which a "
            "compiled graph would not see); attribute an eager run, or set train.attribution.every = 0",
        )
        if self.parallel.compression == "topk":  # each rank accumulates unscaled gradients over steps
            _check(
                self.precision != "fp16",
                "parallel.compression",
                "topk",
                "'none' with train.precision = 'fp16' "
                "(the loss scale changes between the steps a withheld gradient waits); use 'bf16'",
            )
            _check(
                not self.attribution.every,
                "parallel.compression",
                "topk",
                "'none' with train.attribution "
                "(its split needs the step's whole gradient; a top-k step applies parts of earlier ones)",
            )
            _check(
                self.parallel.topk.precondition == "none" or self.optim.name == "adamw",
                "parallel.topk.precondition",
                self.parallel.topk.precondition,
                f"'none' with train.optim.name = {self.optim.name!r} (it moves AdamW's moments before the exchange)",
            )
            _check(
                self.parallel.topk.precondition == "none" or self.optim.betas[0] == 0,
                "parallel.topk.precondition",
                self.parallel.topk.precondition,
                f"'none' while train.optim.betas[0] = {self.optim.betas[0]} (AdamW's first moment moves before the "
                "exchange with it, where train.parallel.topk.momentum sets it); set train.optim.betas = "
                f"[0.0, {self.optim.betas[1]}] and train.parallel.topk.momentum = {self.optim.betas[0]}",
            )
            _check(
                self.parallel.topk.precondition == "none" or not self.init_optimizer,
                "parallel.topk.precondition",
                self.parallel.topk.precondition,
                "'none' with train.init_optimizer = true (each rank keeps its own second moment and the step after "
                "the exchange has no state, so the base run's AdamW moments have nowhere to go); set "
                "init_optimizer = false",
            )
            momentum = self.parallel.topk.momentum
            _check(
                not momentum or self.optim.betas[0] == 0,
                "parallel.topk.momentum",
                momentum,
                f"0 while train.optim.betas[0] = {self.optim.betas[0]}: momentum correction moves the optimizer's "
                "momentum before the sparsification, so set train.optim.betas = [0.0, beta2] with it",
            )
