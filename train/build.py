"""Building a run from its ``[train]`` config: the model (parallelized, then initialised), the optimizer, the
extras as hooks, and the loaders, composed into a ``Trainer``.

``build_trainer`` takes the data as given (any iterable of batches: tests, benchmarks); ``build_run``
reads everything else from the config (tokenizer, loaders over the shards, the process group of a
``torchrun`` launch, ``init_from``, the distillation teacher, the adaptive mix's reference).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Iterable

import torch

from winnow.train.adaptive import AdaptiveMix, CounterfactualMix, MixingConfig, proposal
from winnow.train.alerts import Alerts
from winnow.train.attribution import SourceAttribution
from winnow.train.attribution.counterfactual import MEAN
from winnow.train.attribution.hook import AttributionHook, CounterfactualHook
from winnow.train.config import TrainConfig
from winnow.train.distill import Distillation
from winnow.train.errors import ConfigError, ShardError
from winnow.train.heldout import held_out_sets, train_format
from winnow.train.hooks import CompileTime, TrainHook
from winnow.train.init import Initialization, load_init
from winnow.train.model import ModelConfig, Transformer
from winnow.train.optim import build_optimizer, build_scheduler
from winnow.train.parallel import Parallel
from winnow.train.parallel.mesh import pick_device
from winnow.train.progress import TrainProgress
from winnow.train.runfolder import claim_run_folder
from winnow.train.stability import Stability
from winnow.train.stopping import EarlyStopping
from winnow.train.trainer import Trainer, autocast

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
_HEAP_KEEP = 1 << 30


def keep_freed_memory() -> bool:
    """Let glibc's allocator reuse freed blocks up to 1 GiB from the process's heap (no ``mmap`` per block, no
    trimming); True where it took the settings.

    A CPU training step allocates and frees its activations every step, each tens of MB. By default
    glibc serves blocks above its mmap threshold (at most 32 MiB) from fresh pages and trims freed heap
    tops, so every step faults those pages in again: on the demo's model on 2 CPU cores, 8,000-16,000
    faults a step, and 20,000-26,000 with attribution's per-source buffers, 2-4% and 5-7% of the step's
    time. The settings keep the step's high-water mark resident, which is what a training process holds
    anyway; they last for the process. Other C libraries (musl, macOS) have no ``mallopt``: nothing changes
    there. PyTorch's performance guide suggests preloading jemalloc or tcmalloc for the same reason; this
    needs neither.
    """
    import ctypes

    try:
        libc = ctypes.CDLL(None)  # the C library already loaded
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _HEAP_KEEP)) and bool(mallopt(_M_TRIM_THRESHOLD, _HEAP_KEEP))


def build_model(cfg: TrainConfig, parallel: Parallel) -> tuple[Transformer, torch.nn.Module]:
    """(this rank's model, what forward is called on): the plain model built on the meta device, the run's
    layout applied, then only this rank's parts given memory and initialised (``Parallel.parallelize``)."""
    with torch.device("meta"):
        model = Transformer(cfg.model)
    net = parallel.parallelize(
        model,
        grad_accum=cfg.grad_accum,
        activation_checkpointing=cfg.activation_checkpointing,
        compile=cfg.compile,
        seed=cfg.seed,
        grad_clip=cfg.optim.grad_clip,
        adam=(cfg.optim.betas[1], cfg.optim.eps),
    )
    return model, net


def build_trainer(
    cfg: TrainConfig,
    *,
    data: Iterable,
    sources: list[str],
    val_data: Callable[[], Iterable] | None = None,
    probe_data: Callable[[], Iterable] | None = None,
    parallel: Parallel | None = None,
    teacher: torch.nn.Module | None = None,
    mixer: AdaptiveMix | None = None,
    init: Initialization | None = None,
    progress: TrainProgress | None = None,
) -> Trainer:
    """A ``Trainer`` on ``data`` (an endless iterable of ``Batch`` with ``state_dict``) from ``cfg``.

    ``probe_data``: the held-out data attribution's probes read their rows from (``val_data`` when None); not
    capped by ``[train] eval_batches``, so every source's rows are found.

    ``parallel``: the layout (one process on ``cfg.device`` when None). ``teacher``: the distillation
    teacher (loaded from ``cfg.distill.teacher`` when None); ``mixer``: the adaptive mix ``cfg.mixing``
    asks for (``build_mixer``); ``init``: the checkpoint ``init_from`` found (``train.init.load_init``).
    """
    parallel = parallel or Parallel.local(pick_device(cfg.device, 0))
    if parallel.world.device.type == "cpu":
        keep_freed_memory()
    torch.manual_seed(cfg.seed)
    model, net = build_model(cfg, parallel)
    if cfg.optim.name == "lamb" and parallel.tp_layouts:
        raise ConfigError(
            "train.optim.name = 'lamb' with train.parallel.tp > 1: LAMB's trust ratio needs each "
            "whole parameter's norm and every tp rank holds a part of the split ones; use 'adamw'"
        )
    attributing = bool(cfg.attribution.every and val_data is not None)
    if (attributing or cfg.mixing.active) and MEAN in sources:
        raise ConfigError(
            f"a training source is named {MEAN!r}, the name attribution and adaptive mixing give the average over the "
            "held-out sets; rename the source (its [[inputs]] source) to use [train.attribution] or [train.mixing]"
        )
    if parallel.pipeline is not None:
        from winnow.train.parallel.pipeline import check_pipeline_run

        check_pipeline_run(cfg, attribution=attributing)
    compression, preconditioned = parallel.compression, frozenset()
    if compression is not None and compression.preconditions:  # what goes through its DDP hook
        preconditioned = frozenset(name for name, _ in model.named_parameters()) - set(parallel.experts)
    optimizer = build_optimizer(model, cfg.optim, preconditioned=preconditioned)
    if preconditioned:  # the hook accumulates steps scaled by the learning rate the optimizer will apply
        compression.follow(optimizer)
    scheduler = build_scheduler(
        optimizer, cfg.optim, cfg.steps, start_factor=init.start_factor(cfg.optim) if init else 0.0
    )
    if init is not None:  # a continued run: the base's weights now; a resume replaces them with its own
        init.apply(model, optimizer, scheduler, parallel)
    alerts = Alerts(cfg.alerts, cfg.output)
    hooks = _hooks(
        cfg,
        model=model,
        optimizer=optimizer,
        parallel=parallel,
        sources=list(sources),
        alerts=alerts,
        val_data=(probe_data or val_data) if attributing else None,
        teacher=teacher,
        mixer=mixer,
    )
    return Trainer(
        cfg,
        model=model,
        net=net,
        parallel=parallel,
        optimizer=optimizer,
        scheduler=scheduler,
        data=data,
        sources=sources,
        alerts=alerts,
        hooks=hooks,
        val_data=val_data,
        init=init,
        progress=progress,
        scaler=parallel.grad_scaler() if cfg.precision == "fp16" else None,
    )


def _hooks(
    cfg: TrainConfig,
    *,
    model,
    optimizer,
    parallel: Parallel,
    sources: list[str],
    alerts: Alerts,
    val_data,
    teacher,
    mixer: AdaptiveMix | CounterfactualMix | None,
) -> list[TrainHook]:
    """The run's extras, in the order the step calls them: skipping, distillation, mixing, attribution, stopping."""
    if cfg.mixing.active != (mixer is not None):
        raise ConfigError(
            f"train.mixing.adaptive = {cfg.mixing.adaptive!r} but no adaptive mix was given; build it "
            "with train.build.build_mixer(cfg.mixing, loader, tokenizer, device), or pass none"
        )
    device = parallel.world.device
    # under pipeline parallelism only the last stage scores with a teacher or a mix's reference: the
    # other stages drop theirs rather than hold a whole model on the device for nothing
    scores = parallel.pipeline is None or parallel.pipeline.is_last
    hooks: list[TrainHook] = [Stability(cfg.alerts, alerts, sources, skip_nonfinite=cfg.skip_nonfinite)]
    if cfg.distill is not None:
        if teacher is None:
            teacher = load_teacher(cfg.distill.teacher, cfg.data.storage_options)
        hooks.append(
            Distillation(
                teacher.to(device).eval() if scores else None,
                alpha=cfg.distill.alpha,
                temperature=cfg.distill.temperature,
            )
        )
    if isinstance(mixer, AdaptiveMix):
        mixer.reference = mixer.reference.to(device) if scores else None
        hooks.append(mixer)
    attribution = None
    if val_data is not None:
        attribution = SourceAttribution(
            cfg.attribution,
            model=model,
            optimizer=optimizer,
            sources=sources,
            val_data=val_data,
            device=device,
            parallel=parallel,
            micro_batch_shape=(cfg.data.batch_size, cfg.data.seq_len),
            autocast=autocast(device, cfg.precision),
        )
        hooks += [AttributionHook(attribution), CounterfactualHook(attribution)]
    if isinstance(mixer, CounterfactualMix):  # after attribution: it reads the step attribution just took in
        mixer.attach(attribution)
        hooks.append(mixer)
    return hooks + [EarlyStopping(cfg.stop)] + ([CompileTime()] if cfg.compile else [])


def load_teacher(path: str, storage_options: dict | None = None, tokenizer=None) -> Transformer:
    """A trained model from a run folder (its newest checkpoint that verifies) or one checkpoint, local or fsspec.

    ``tokenizer``: this run's; a teacher trained with another (or another vocabulary) is a ConfigError: its
    logits would score other tokens than the student's ids name."""
    found = load_init(path, key="train.distill.teacher", storage_options=storage_options)
    teacher_cfg = found.model()
    if tokenizer is not None:
        found.check_tokenizer(tokenizer)
        if teacher_cfg.vocab_size != tokenizer.vocab_size:
            raise ConfigError(
                f"{found.where}: the teacher has a vocabulary of {teacher_cfg.vocab_size}, this run's tokenizer "
                f"{tokenizer.vocab_size}; distil from a teacher trained with this run's tokenizer"
            )
    model = Transformer(teacher_cfg)
    model.load_state_dict(found.state["model"])
    return model.eval()


def build_mixer(
    cfg: MixingConfig, data, tokenizer, device: torch.device, *, storage_options: dict | None = None, reduce=lambda t: t
) -> AdaptiveMix | CounterfactualMix:
    """The adaptive mix over the loader's training sets: scored against ``cfg.reference``'s model (doremi), or
    starting where the reference's counterfactual points (counterfactual); a ConfigError names the key when the
    reference cannot serve this run's data (other tokenizer, vocabulary or sources, no counterfactual)."""
    held = data.set_sources
    many = next((names for names in held if len(names) != 1), None)
    if many is not None:  # the replay set: every [train] shards entry was split per source
        raise ConfigError(
            f"train.mixing.adaptive = {cfg.adaptive!r} reweights sources, but the replay set holds "
            f"{many} at a fixed share; drop train.replay and list its job folder under [train] shards, "
            "e.g. shards = [{path = 'out/job'}, {path = 'out/base'}]: the mix then moves its sources too"
        )
    names = [n[0] for n in held]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None:
        raise ConfigError(
            f"train.mixing.adaptive = {cfg.adaptive!r} reweights sources, but source {twice!r} is in "
            "two [train] shards entries; give each source once (an entry's sources = {...} picks them)"
        )
    set_sources = [data.sources.index(n) for n in names]
    if cfg.adaptive == "counterfactual":
        return _counterfactual_mix(cfg, data, names, set_sources, storage_options)
    found = load_init(cfg.reference, key="train.mixing.reference", storage_options=storage_options)
    where, state = found.where, found.state
    found.check_tokenizer(tokenizer)
    reference_cfg = found.model()  # any size: only the vocabulary must be this run's
    if reference_cfg.vocab_size != tokenizer.vocab_size:
        raise ConfigError(
            f"{where}: the reference model has a vocabulary of {reference_cfg.vocab_size}, this run's "
            f"tokenizer {tokenizer.vocab_size}; train the reference with this run's tokenizer"
        )
    unknown = [name for name in names if name not in state.get("sources", [])]
    if unknown:
        raise ConfigError(
            f"{where}: the reference run was trained on sources {state.get('sources')}, without "
            f"{unknown[0]!r}, which this run trains on; use a reference trained on this run's sources"
        )
    reference = Transformer(reference_cfg)
    reference.load_state_dict(state["model"])
    return AdaptiveMix(
        cfg,
        reference=reference,
        set_sources=set_sources,
        weights=data.mix_weights,
        n_sources=len(data.sources),
        device=device,
        data=data,
        names=list(data.sources),
        reduce=reduce,
    )


def _counterfactual_mix(
    cfg: MixingConfig, data, names: list[str], set_sources: list[int], storage_options: dict | None
) -> CounterfactualMix:
    """Start at the mix the reference run's counterfactual favours (``train.adaptive.proposal``)."""
    import fsspec

    from winnow.train.attribution.counterfactual import read_record

    fs, where = fsspec.core.url_to_fs(f"{str(cfg.reference).rstrip('/')}/metrics.jsonl", **(storage_options or {}))
    if not fs.exists(where):
        raise ConfigError(
            f"train.mixing.reference = {cfg.reference!r}: no run there (no metrics.jsonl); give the folder of a run "
            "trained with [train.attribution] on (`winnow train`, or a study's baseline: its [ablate] output)"
        )
    record = read_record(cfg.reference, storage_options)
    if record is None:
        raise ConfigError(
            f"train.mixing.reference = {cfg.reference!r}: no counterfactual record in its metrics.jsonl; "
            "give a run folder trained with [train.attribution] on to the end"
        )
    missing = [n for n in names if n not in record["sources"]]
    if missing or (cfg.target != "mean" and cfg.target not in record["held_out"]):
        what = f"source {missing[0]!r}" if missing else f"held-out set {cfg.target!r} (train.mixing.target)"
        raise ConfigError(
            f"train.mixing.reference = {cfg.reference!r}: its counterfactual has no {what} (it covers "
            f"{record['sources']}, held out {record['held_out']}); use a reference trained on this "
            "run's sources"
        )
    start = proposal(
        record["slope"],
        record["held_out"],
        record["sources"],
        dict(zip(names, data.mix_weights)),
        target=cfg.target,
        max_factor=cfg.max_factor,
    )
    log.info(
        "counterfactual mix: starting at %s (from %s)",
        ", ".join(f"{k}={w:.3f}" for k, w in start.items()),
        cfg.reference,
    )
    weights = [start[n] for n in names]
    data.reweight(weights)
    return CounterfactualMix(cfg, set_sources=set_sources, weights=weights, data=data, names=list(data.sources))


def run_tokenizer(cfg: TrainConfig, job_folder: str):
    """The run's tokenizer: ``[train.tokenizer]``, else the one ``job_folder``'s token shards were written with
    (byte-level without any); a warning, once per tokenizer, where it does not give back what it encodes."""
    from winnow.train.data.tokenshards import shards_tokenizer
    from winnow.train.tokenizer import HFTokenizer, load_tokenizer

    tokenizer = load_tokenizer(
        cfg.tokenizer if cfg.tokenizer is not None else shards_tokenizer(job_folder, cfg.data.storage_options)
    )
    if isinstance(tokenizer, HFTokenizer):
        _warn_lossy(tokenizer.name, tuple(tokenizer.lost_characters()))
    return tokenizer


@functools.cache
def _warn_lossy(name: str, lost: tuple[str, ...]) -> None:
    if lost:
        log.warning(
            "the tokenizer %s does not give back what it encodes: %s come back changed or not at all (no byte "
            "fallback or unknown token, or a normalizer that changes text); the run trains on the shards' text "
            "without them. A byte-level tokenizer (`winnow tokenizer train`, or train.tokenizer = 'byte') keeps "
            "every character",
            name,
            " ".join(repr(c) for c in lost[:12]) + (" ..." if len(lost) > 12 else ""),
        )


def checked_init(cfg: TrainConfig, tokenizer, *, weights: bool = True) -> Initialization | None:
    """The checkpoint ``[train] init_from`` names (None without one); a ``ConfigError`` naming what differs when
    its model is not ``[train.model]`` (its vocabulary the tokenizer's) or its run's tokenizer not ``tokenizer``.
    ``winnow check`` calls it too, without ``weights`` (a sharded checkpoint's are not fetched), so the mismatch
    is found before anything runs."""
    if cfg.init_from is None:
        return None
    init = load_init(
        cfg.init_from, optimizer=cfg.init_optimizer, storage_options=cfg.data.storage_options, weights=weights
    )
    init.check(dataclasses.replace(cfg.model, vocab_size=tokenizer.vocab_size), tokenizer)
    return init


def build_run(
    cfg: TrainConfig,
    *,
    train_sets=None,
    train_data: list[str] | None = None,
    sources: list[str] | None = None,
    progress: bool = False,
) -> Trainer:
    """Tokenizer, loaders, model (and teacher, adaptive mix) from the config, composed into a ``Trainer``.

    ``train_sets`` replaces ``cfg.shards`` as the training sets (e.g. split one per source); ``train_data``
    replaces both for the train split only (several folders mixed by ``train.data.mix_weights``; held-out
    data stays ``cfg.shards``), ``sources`` then fixes the source ids. Otherwise the training sets are
    ``cfg.shards`` and ``cfg.replay`` with their weights, and the held-out sets ``cfg.eval`` (default: the
    training folders); see ``train/data/sets.py``. ``progress`` shows the progress bar on rank 0.
    Under ``torchrun`` this joins the process group; each data-parallel rank reads its own part of the
    loader's global order (the tensor- and pipeline-parallel ranks of one dp rank read the same batches).
    """
    from winnow.train.data import Loader
    from winnow.train.data.sets import HeldOut, eval_sets, training_sets

    sets = cfg.shards if train_sets is None else train_sets
    if train_data is None:
        folders, _ = training_sets(cfg.shards, cfg.replay, cfg.data.mix_weights)
        held_out = eval_sets(cfg.eval, folders, cfg.replay)  # the job folders: per-source views hold no val split
        views = sets is not cfg.shards  # per-source sets: Parquet and token shards, no WebDataset tars
        folders, weights = training_sets(sets, cfg.replay, cfg.data.mix_weights)
    else:
        folders, weights, held_out = list(train_data), cfg.data.mix_weights, eval_sets(cfg.eval, [cfg.shards], None)
        views = True
    parallel = Parallel.from_env(cfg.parallel, device=cfg.device, n_experts=cfg.model.n_experts)
    device, world = parallel.world.device, parallel.world
    claim_run_folder(cfg.output)  # a folder holding files winnow did not write is refused here
    # the job folder decides even when train_data replaces it (ablation variants' per-source views)
    tokenizer = run_tokenizer(cfg, cfg.shards if isinstance(cfg.shards, str) else folders[0])
    given, default = (
        cfg.model.vocab_size,
        next(f.default for f in dataclasses.fields(ModelConfig) if f.name == "vocab_size"),
    )
    if given not in (tokenizer.vocab_size, default):  # the default is the byte tokenizer's
        log.warning(
            "train.model.vocab_size = %d differs from the tokenizer's %d; the model takes the tokenizer's (every id "
            "it writes needs a row of the embedding); drop the key",
            given,
            tokenizer.vocab_size,
        )
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_size=tokenizer.vocab_size))
    init = checked_init(cfg, tokenizer)
    fmt = train_format(cfg, views=views)
    held_out, names = held_out_sets(cfg, folders, held_out, sources, train_format=fmt)
    train_cfg = dataclasses.replace(cfg.data, mix_weights=list(weights) if len(folders) > 1 else [], format=fmt)
    data = Loader(
        train_cfg,
        folders if len(folders) > 1 else folders[0],
        split="train",
        tokenizer=tokenizer,
        rank=world.dp_rank,
        world_size=world.dp_size,
        sources=names,
    )
    # Held-out batches are read inline: a few batches per eval, and forking loader workers
    # after training has started its thread pools is how forked children deadlock.
    # one folder at a time: no load-time mixing; and the same batches in every run whatever its seed,
    # shuffling or sequence-length warm-up, so held-out losses compare across runs (step 0 of a continued
    # run is its base's last evaluation exactly; a study's seeds differ in training only)
    val_cfg = dataclasses.replace(cfg.data, num_workers=0, mix_weights=[], shuffle_window=0, seq_len_warmup_steps=0)

    first_seen: dict[str, list[str]] = {}  # held-out folder -> the fingerprints of its val shards at the first pass

    def held_out_loader(folder: str, rank: int, size: int) -> Loader:
        loader = Loader(
            val_cfg, folder, split="val", tokenizer=tokenizer, sources=data.sources, rank=rank, world_size=size
        )
        if first_seen.setdefault(folder, loader.fingerprints) != loader.fingerprints:
            loader.close()
            raise ShardError(
                f"{folder}: its held-out (val) shards changed while the run trained (the job was curated again): "
                "evaluations from here on would not compare with the earlier ones; train on the new shards in a run "
                "of their own (a new train.output, or [train.checkpoint] resume = false)"
            )
        return loader

    def held_out_pass(max_batches: int | None, *, shared: bool):
        # evaluation: each data-parallel rank its share of the pass (the trainer sums over them), as in training,
        # so a layout's held-out loss is the one-process run's with the same global batch, at 1/dp of the cost;
        # attribution's probes (``shared``): every rank the same rows, as its estimate is made the same everywhere
        rank, size = (0, 1) if shared else (world.dp_rank, world.dp_size)
        return HeldOut(held_out, lambda folder: held_out_loader(folder, rank, size), max_batches=max_batches)

    val_data = functools.partial(held_out_pass, cfg.eval_batches, shared=False)

    teacher = load_teacher(cfg.distill.teacher, cfg.data.storage_options, tokenizer) if cfg.distill else None
    mixer = (
        build_mixer(
            cfg.mixing, data, tokenizer, device, storage_options=cfg.data.storage_options, reduce=parallel.reduce_sum
        )
        if cfg.mixing.active
        else None
    )
    return build_trainer(
        cfg,
        data=data,
        sources=data.sources,
        val_data=val_data if held_out else None,
        probe_data=functools.partial(held_out_pass, None, shared=True) if held_out else None,
        parallel=parallel,
        teacher=teacher,
        mixer=mixer,
        init=init,
        progress=TrainProgress(total=cfg.steps, every=cfg.metrics.log_every, enabled=progress),
    )
