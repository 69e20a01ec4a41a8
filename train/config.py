"""The ``[train]`` table: one dataclass composing each component's config.

The configs of components whose modules import torch (adaptive mixing, checkpoints, metrics, the optimizer,
early stopping) are defined here, and re-exported there: reading a job file (``winnow check``, ``winnow
config``) loads no torch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Literal

from winnow.train.alerts import AlertConfig
from winnow.train.attribution import AttributionConfig
from winnow.train.data.config import LoaderConfig
from winnow.train.data.sets import ReplayConfig, ShardSetConfig
from winnow.train.errors import ConfigError, checker
from winnow.train.model.config import ModelConfig
from winnow.train.parallel.config import ParallelConfig
from winnow.train.tokenizer import TokenizerConfig

_check = checker("train")
MIXING_METHODS = ("doremi", "counterfactual")  # [train.mixing] adaptive


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


@dataclass(kw_only=True, slots=True)
class MixingConfig:
    """The ``[train.mixing]`` table: reweight the training sources during the run (off by default)."""

    # "doremi": excess loss against `reference`'s model; "counterfactual": from `reference`'s counterfactual, then the
    # run's own; "": the configured weights throughout
    adaptive: Literal["", "doremi", "counterfactual"] = ""
    reference: str | None = None  # a finished run folder (doremi: its newest checkpoint, or one checkpoint folder)
    every: int = 5  # steps between updates (doremi: one more forward of the step's batch; counterfactual: the probe's)
    # how far one update moves the log-weights: per nat of excess (doremi), per nat of slope (counterfactual; 0: the
    # reference's mix throughout)
    step_size: float = 1.0
    smoothing: float = 1e-3  # DoReMi's c: the share of the uniform mix kept in the weights (no source starves)
    target: str = "mean"  # counterfactual: the held-out loss to lower: "mean" over the held-out sets, or one set's
    max_factor: float = 2.0  # counterfactual: the start moves each share by at most this factor (the slope's range)

    def __post_init__(self) -> None:
        check = checker("train.mixing")
        check(
            self.adaptive in ("",) + MIXING_METHODS,
            "adaptive",
            self.adaptive,
            "'' (off) or " + ", ".join(map(repr, MIXING_METHODS)),
        )
        check(
            not self.adaptive or bool(self.reference),
            "reference",
            self.reference,
            "a finished run folder or checkpoint (doremi: the model the excess loss is measured against; "
            "counterfactual: a run trained with [train.attribution], whose counterfactual sets the start)",
        )
        check(
            isinstance(self.target, str) and bool(self.target),
            "target",
            self.target,
            "'mean' or the name of a held-out set",
        )
        check(self.max_factor > 1 and math.isfinite(self.max_factor), "max_factor", self.max_factor, "a number > 1")
        check(isinstance(self.every, int) and self.every >= 1, "every", self.every, "an integer >= 1")
        # counterfactual: 0 keeps the start's mix (the reference's counterfactual) throughout; doremi: every update moves
        holds = self.adaptive == "counterfactual"
        ok = (self.step_size >= 0 if holds else self.step_size > 0) and math.isfinite(self.step_size)
        check(ok, "step_size", self.step_size, "a number >= 0" if holds else "a number > 0")
        check(0 <= self.smoothing < 1, "smoothing", self.smoothing, "0 <= value < 1")

    @property
    def active(self) -> bool:
        return bool(self.adaptive)


@dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    """When to checkpoint and how many to keep (``[train.checkpoint]``)."""

    every: int = 100  # steps between checkpoints; 0: only at the end and on SIGTERM/SIGINT
    keep_last: int = 3  # checkpoints kept; older ones are pruned
    resume: bool = True  # start from the newest valid checkpoint in the run folder, if any
    mode: int | None = None  # file mode of checkpoint files, e.g. 0o600 (TOML: mode = 0o600); None: the umask

    def __post_init__(self) -> None:
        check = checker("train.checkpoint")
        if self.mode is not None and not (
            isinstance(self.mode, int) and 0o600 <= self.mode <= 0o777 and self.mode & 0o600 == 0o600
        ):
            raise ConfigError(
                f"train.checkpoint.mode = {self.mode!r} is invalid; allowed: a file mode such as 0o600 "
                "or 0o640 (TOML octal) that lets the owner read and write"
            )
        check(isinstance(self.every, int) and self.every >= 0, "every", self.every, "an integer >= 0")
        check(isinstance(self.keep_last, int) and self.keep_last >= 1, "keep_last", self.keep_last, "an integer >= 1")


@dataclass(kw_only=True, slots=True)
class MetricsConfig:
    """What is logged and how often (``[train.metrics]``)."""

    log_every: int = 10  # steps between metrics.jsonl records (and progress lines in a log file)
    tensorboard: bool = False  # the same as "tensorboard" in trackers
    trackers: list[str] = field(default_factory=list)  # any of "tensorboard", "mlflow", "wandb"
    project: str = "winnow"  # the MLflow experiment / W&B project
    mlflow_tracking_uri: str | None = None  # None: MLFLOW_TRACKING_URI, else a file store in <run>/mlruns
    wandb_mode: Literal["online", "offline", "disabled"] | None = None  # None: WANDB_MODE or W&B's default
    # per device, for MFU; None: the accelerator table's peak for this GPU, else measured
    peak_flops: float | None = None

    def __post_init__(self) -> None:
        check = checker("train.metrics")
        from winnow.train.trackers import TRACKERS

        check(
            all(t in TRACKERS for t in self.trackers) and len(set(self.trackers)) == len(self.trackers),
            "trackers",
            self.trackers,
            f"any of {list(TRACKERS)}, each once",
        )
        if self.tensorboard and "tensorboard" not in self.trackers:
            self.trackers = ["tensorboard", *self.trackers]
        check(isinstance(self.log_every, int) and self.log_every >= 1, "log_every", self.log_every, "an integer >= 1")
        check(self.peak_flops is None or self.peak_flops > 0, "peak_flops", self.peak_flops, "None or > 0")


@dataclass(kw_only=True, slots=True)
class OptimConfig:
    """Optimizer, weight decay, clipping and the learning-rate schedule (``[train.optim]``)."""

    # the optimizer: AdamW, or LAMB (AdamW scaled per tensor by its trust ratio)
    name: Literal["adamw", "lamb"] = "adamw"
    lr: float = 3e-3  # peak learning rate
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])  # the two moment decay rates
    eps: float = 1e-8  # added to the second moment's square root
    weight_decay: float = 0.1  # decoupled weight decay of matrices (not of norms, biases or, by default, embeddings)
    decay_embeddings: bool = False  # embeddings are lookups: decaying them mostly shrinks rare tokens
    grad_clip: float = 1.0  # max global gradient norm; 0 disables clipping (the norm is still measured)
    warmup_steps: int = 20  # linear warm-up from 0 to lr over these steps
    # after warm-up: cosine or linear decay to lr x min_lr_ratio, constant, or wsd (stable, then a decay)
    schedule: Literal["cosine", "linear", "constant", "wsd"] = "cosine"
    min_lr_ratio: float = 0.1  # the decay ends at lr · min_lr_ratio
    decay_fraction: float = 0.2  # wsd: the decay takes the last this much of the steps
    decay_shape: Literal["linear", "cosine", "sqrt"] = "sqrt"  # wsd: the decay's shape (sqrt: 1 - √progress)
    # "current": a continued run warms up from the LR its init_from run ended at
    rewarm_from: Literal["zero", "current"] = "zero"

    def __post_init__(self) -> None:
        check = checker("train.optim")
        check(self.name in ("adamw", "lamb"), "name", self.name, "'adamw' or 'lamb'")
        check(self.lr > 0, "lr", self.lr, "> 0")
        check(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "betas", self.betas, "two values in [0, 1)")
        check(self.eps > 0, "eps", self.eps, "> 0")
        check(self.weight_decay >= 0, "weight_decay", self.weight_decay, ">= 0")
        check(self.grad_clip >= 0, "grad_clip", self.grad_clip, ">= 0 (0 = no clipping)")
        check(self.warmup_steps >= 0, "warmup_steps", self.warmup_steps, ">= 0")
        check(
            self.schedule in ("cosine", "linear", "constant", "wsd"),
            "schedule",
            self.schedule,
            "'cosine', 'linear', 'constant' or 'wsd'",
        )
        check(0 <= self.min_lr_ratio <= 1, "min_lr_ratio", self.min_lr_ratio, "0..1")
        check(0 < self.decay_fraction <= 1, "decay_fraction", self.decay_fraction, "0 < value <= 1")
        check(
            self.decay_shape in ("linear", "cosine", "sqrt"),
            "decay_shape",
            self.decay_shape,
            "'linear', 'cosine' or 'sqrt'",
        )
        check(self.rewarm_from in ("zero", "current"), "rewarm_from", self.rewarm_from, "'zero' or 'current'")


@dataclass(kw_only=True, slots=True)
class StopConfig:
    """Early stopping (``[train.stop]``); with no keys set it never stops a run."""

    patience: int = 0  # evaluations without improvement before stopping; 0: no patience rule
    min_delta: float = 0.0  # an improvement smaller than this (nats) does not count
    sources: list[str] = field(default_factory=list)  # watch the mean held-out loss of these; []: the total
    thresholds: dict[str, float] = field(default_factory=dict)  # source -> stop once its held-out loss <= value

    def __post_init__(self) -> None:
        check = checker("train.stop")
        check(isinstance(self.patience, int) and self.patience >= 0, "patience", self.patience, "an integer >= 0")
        check(self.min_delta >= 0, "min_delta", self.min_delta, ">= 0")
        check(len(set(self.sources)) == len(self.sources), "sources", self.sources, "source names, each once")
        for source, value in self.thresholds.items():
            check(math.isfinite(value), f"thresholds.{source}", value, "a finite number")

    @property
    def active(self) -> bool:
        return bool(self.patience or self.thresholds)


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
        if isinstance(self.tokenizer, str):  # its path alone: checked as [train.tokenizer] path is
            TokenizerConfig(path=self.tokenizer)
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
