"""The ``[train.parallel]`` table: the degrees of the run's one device mesh, and how each is carried out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from winnow.train.errors import ConfigError, checker

_check = checker("train.parallel")
_topk = checker("train.parallel.topk")


@dataclass(frozen=True, slots=True)
class MeshDims:
    """The resolved degrees of the mesh ``(pp, dp_replicate, dp_shard, tp)``; ``ep`` borrows from the dp ranks.

    The data-parallel degree ``dp = dp_replicate · dp_shard`` is what reads different data;
    ``tp`` and ``pp`` ranks of one data-parallel rank read the same batches. Expert parallelism
    (as in torchtitan) does not multiply the world: the experts of each MoE layer are split
    over ``ep`` of the ``dp`` ranks, and ``edp = dp / ep`` ranks hold the same experts.
    """

    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def edp(self) -> int:
        return self.dp // self.ep

    @property
    def world(self) -> int:
        return self.pp * self.dp * self.tp

    def describe(self) -> str:
        return (
            f"pp={self.pp} x dp_replicate={self.dp_replicate} x dp_shard={self.dp_shard} x tp={self.tp} "
            f"(ep={self.ep} of the dp ranks)"
        )


@dataclass(kw_only=True, slots=True)
class TopKConfig:
    """Deep Gradient Compression's settings (``[train.parallel.topk]``), used with ``compression = "topk"``.

    Each step every rank sends the ``density`` share of each tensor's accumulated gradient with the
    largest magnitudes (after the warm-up: from ``warmup_density`` down to ``density``, exponentially,
    over ``warmup_steps``): 2 bytes an index and the value as ``value_dtype``; see
    ``train/parallel/compression.py``.
    """

    density: float = 0.01  # share of each tensor's entries sent per step once warmed up (1/66 of the bytes in fp32)
    warmup_density: float = 0.25  # the density of the first step (the paper starts at 75% sparsity)
    warmup_steps: int = 0  # steps over which the density decreases exponentially to `density` (0: none)
    momentum: float = 0.0  # momentum correction: each rank accumulates u = m·u + g (needs optim.betas[0] = 0)
    value_dtype: Literal["float32", "bfloat16"] = "float32"  # bfloat16: half the value bytes, the rounding kept
    # "adam": each rank divides its gradient by the root of its own AdamW second moment before the
    # accumulation, and the step after the exchange applies only the learning rate and weight decay;
    # "none": AdamW steps on the exchanged gradient
    precondition: Literal["none", "adam"] = "none"

    def __post_init__(self) -> None:
        for key in ("density", "warmup_density"):
            value = getattr(self, key)
            _topk(
                isinstance(value, (int, float)) and 0 < value <= 1,
                key,
                value,
                "0 < value <= 1 (the share of each gradient tensor sent per step)",
            )
        _topk(
            self.warmup_density >= self.density,
            "warmup_density",
            self.warmup_density,
            f">= train.parallel.topk.density ({self.density!r}): the warm-up sends more, not less",
        )
        _topk(
            isinstance(self.warmup_steps, int) and self.warmup_steps >= 0,
            "warmup_steps",
            self.warmup_steps,
            "an integer >= 0",
        )
        _topk(
            isinstance(self.momentum, (int, float)) and 0 <= self.momentum < 1,
            "momentum",
            self.momentum,
            "0 <= value < 1",
        )
        _topk(self.precondition in ("none", "adam"), "precondition", self.precondition, "'none', 'adam'")
        _topk(self.value_dtype in ("float32", "bfloat16"), "value_dtype", self.value_dtype, "'float32', 'bfloat16'")

    def density_at(self, step: int) -> float:
        """The density of exchange ``step`` (0-based): ``warmup_density · (density / warmup_density)^(step / warmup_steps)``."""
        if step >= self.warmup_steps:
            return self.density
        return self.warmup_density * (self.density / self.warmup_density) ** (step / self.warmup_steps)


# keys of the table before the mesh degrees replaced them; build_config reports these texts (pipelines/jobfile.py)
_REMOVED = {
    "mode": "train.parallel.mode was replaced by the mesh degrees: mode = 'ddp' is dp_replicate = -1 (the default: "
    "every rank replicates), mode = 'fsdp' is dp_shard = -1 (every rank shards), mode = 'none' is one "
    "process without torchrun (leave [train.parallel] out)",
    "expert_parallel": "train.parallel.expert_parallel was renamed: write ep = N (experts split over N of the "
    "data-parallel ranks)",
    "tensor_parallel": "train.parallel.tensor_parallel was renamed: write tp = N",
    "pipeline_parallel": "train.parallel.pipeline_parallel was renamed: write pp = N",
}


@dataclass(kw_only=True, slots=True)
class ParallelConfig:
    """How a ``torchrun`` launch splits its work (``[train.parallel]``).

    The product ``dp_replicate · dp_shard · tp · pp`` is the number of processes (``WORLD_SIZE``);
    one of ``dp_replicate``/``dp_shard`` may be -1 to take what the others leave (``dp_replicate``
    by default, so a bare ``torchrun`` run is DDP over every rank; when both are -1, ``dp_shard``
    takes it). ``ep`` divides the data-parallel degree. See ``MeshDims``.
    """

    REMOVED_KEYS: ClassVar[dict[str, str]] = _REMOVED

    dp_replicate: int = -1  # ranks holding a full copy of the dense parameters (DDP; HSDP's replicas with dp_shard)
    dp_shard: int = 1  # ranks the dense parameters are sharded over (FSDP2)
    tp: int = 1  # tensor parallel: attention heads, FFN and expert hidden widths split over these ranks
    sequence_parallel: bool = False  # tp > 1: activations between the split regions cut along the sequence
    pp: int = 1  # pipeline parallel: the layers split into this many stages
    pp_schedule: Literal["gpipe", "1f1b", "interleaved_1f1b"] = "1f1b"  # micro-batches = train.grad_accum
    pp_stages_per_rank: int = 1  # > 1 only with "interleaved_1f1b" (virtual stages, looped placement)
    ep: int = 1  # expert parallel: each MoE layer's experts split over this many of the dp ranks
    cpu_offload: bool = False  # dp_shard > 1 only: parameters, gradients and optimizer state live on the CPU
    powersgd_rank: int = 0  # DDP only: >0 compresses gradients with PowerSGD at this rank
    powersgd_start_iter: int = 10  # plain all-reduce for the first steps (PowerSGD's warm start), at least 2
    compression: Literal["none", "topk"] = "none"  # "topk": DDP sends each step's top-k gradient entries (DGC)
    # Deep Gradient Compression's settings, used with compression = "topk"
    topk: TopKConfig = field(default_factory=TopKConfig)
    bucket_mb: int = 25  # DDP bucket size
    backend: Literal["auto", "gloo", "nccl"] = "auto"  # auto: nccl on CUDA, gloo on CPU

    def __post_init__(self) -> None:
        _check(self.backend in ("auto", "gloo", "nccl"), "backend", self.backend, "'auto', 'gloo' or 'nccl'")
        for key in ("dp_replicate", "dp_shard"):
            value = getattr(self, key)
            _check(
                isinstance(value, int) and (value >= 1 or value == -1),
                key,
                value,
                "an integer >= 1, or -1 (whatever the world size leaves)",
            )
        for key in ("tp", "pp", "ep", "bucket_mb", "pp_stages_per_rank"):
            value = getattr(self, key)
            _check(isinstance(value, int) and value >= 1, key, value, "an integer >= 1")
        _check(
            isinstance(self.powersgd_rank, int) and self.powersgd_rank >= 0,
            "powersgd_rank",
            self.powersgd_rank,
            "an integer >= 0",
        )
        _check(
            isinstance(self.powersgd_start_iter, int) and self.powersgd_start_iter >= 2,
            "powersgd_start_iter",
            self.powersgd_start_iter,
            "an integer >= 2 (DDP settles its gradient buckets in the first two steps, so torch's PowerSGD "
            "compresses from the third at the earliest)",
        )
        _check(
            self.pp_schedule in ("gpipe", "1f1b", "interleaved_1f1b"),
            "pp_schedule",
            self.pp_schedule,
            "'gpipe', '1f1b' or 'interleaved_1f1b'",
        )
        _check(
            (self.pp_schedule == "interleaved_1f1b") == (self.pp_stages_per_rank > 1),
            "pp_stages_per_rank",
            self.pp_stages_per_rank,
            "1 with pp_schedule 'gpipe' or '1f1b', 2 or more with 'interleaved_1f1b'",
        )
        _check(isinstance(self.sequence_parallel, bool), "sequence_parallel", self.sequence_parallel, "true or false")
        _check(
            not self.sequence_parallel or self.tp > 1,
            "sequence_parallel",
            self.sequence_parallel,
            "true only with tp > 1 (it cuts the activations along the sequence over the tp ranks)",
        )
        _check(
            not self.cpu_offload or self.dp_shard != 1,
            "cpu_offload",
            self.cpu_offload,
            "true only with dp_shard > 1 or -1 (FSDP2's CPUOffloadPolicy)",
        )
        _check(
            not self.powersgd_rank or self.dp_shard == 1,
            "powersgd_rank",
            self.powersgd_rank,
            "0 unless dp_shard = 1 (PowerSGD is a DDP communication hook)",
        )
        _check(self.compression in ("none", "topk"), "compression", self.compression, "'none' or 'topk'")
        if self.compression == "topk":
            _check(
                self.dp_shard == 1 and self.pp == 1,
                "compression",
                self.compression,
                "'none' unless dp_shard = 1 and pp = 1 (top-k compression is a DDP communication hook: "
                "FSDP2 reduce-scatters and pipeline stages do not go through it)",
            )
            _check(
                not self.powersgd_rank,
                "compression",
                self.compression,
                "'none' with powersgd_rank > 0 (PowerSGD and top-k are alternatives; set powersgd_rank = 0)",
            )

    def resolve(self, world_size: int, *, n_experts: int = 0) -> MeshDims:
        """The degrees for a launch of ``world_size`` processes; ConfigErrors say what does not fit and what would."""
        fixed = self.tp * self.pp
        rep, shard = self.dp_replicate, self.dp_shard
        if rep == -1 and shard == -1:
            rep = 1
        known = fixed * max(rep, 1) * max(shard, 1)
        if (rep == -1 or shard == -1) and world_size % known == 0:
            rep, shard = (world_size // known, shard) if rep == -1 else (rep, world_size // known)
        dims = MeshDims(dp_replicate=rep, dp_shard=shard, tp=self.tp, pp=self.pp, ep=self.ep)
        if dims.world != world_size:
            launch = "one process (no torchrun)" if world_size == 1 else f"{world_size} processes"
            raise ConfigError(
                f"train.parallel: dp_replicate ({rep}) x dp_shard ({shard}) x tp ({self.tp}) x "
                f"pp ({self.pp}) does not make this launch's {launch}; the product must equal the "
                f"number of processes (torchrun --nproc_per_node N), where -1 takes what the other "
                f"degrees leave if they divide it"
            )
        self._check_ep(dims, n_experts)
        return dims

    def _check_ep(self, dims: MeshDims, n_experts: int) -> None:
        ep = dims.ep
        if ep == 1:
            return
        _check(
            dims.dp % ep == 0,
            "ep",
            ep,
            f"a divisor of the data-parallel degree dp_replicate x dp_shard "
            f"({dims.dp_replicate} x {dims.dp_shard} = {dims.dp}): expert parallelism borrows data-parallel ranks",
        )
        _check(
            dims.dp_shard % ep == 0 or ep % dims.dp_shard == 0,
            "ep",
            ep,
            f"a divisor or a multiple of dp_shard ({dims.dp_shard}), so each expert group nests inside or "
            "contains whole FSDP groups",
        )
        _check(n_experts > 1 and n_experts % ep == 0, "ep", ep, f"a divisor of train.model.n_experts ({n_experts})")
