"""Starting a run from another run's checkpoint (``[train] init_from``): find it, check it fits, load it.

``init_from`` is a run folder (its newest checkpoint that verifies), its ``checkpoints/`` folder,
one checkpoint folder (``step-N/`` with ``meta.json``), a ``state.pt`` file, or an export of
``winnow export`` (its folder or its ``winnow-model.safetensors``: weights only); local or any
fsspec URL. The model config and the tokenizer must be the base run's: a continued run that silently
re-shaped the model or re-tokenized the data would not be continuing anything. The weights are
always loaded; the optimizer's moments only with ``init_optimizer`` (its hyperparameters stay
this run's). What was loaded — run folder, checkpoint, step, sha256 — goes into provenance.
The other runs a run reads a model from, the adaptive mix's ``train.mixing.reference`` and the
distillation teacher ``train.distill.teacher``, are found and verified the same way (``key``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import posixpath
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import fsspec

from winnow.train.errors import CheckpointError, ConfigError
from winnow.train.model.config import ModelConfig, saved_model_config
from winnow.train.paths import JSON_BYTES, inside, read_capped

log = logging.getLogger(__name__)

_STATE, _META, _PREFIX = "state.pt", "meta.json", "step-"
STATE_BYTES = 1 << 40  # a state file without a meta.json that sizes it (older checkpoints): a plain file under 1 TiB


@dataclass(slots=True)
class Initialization:
    """A loaded checkpoint a run starts from, with where it came from."""

    given: str  # the init_from value
    checkpoint: str  # the checkpoint folder (or state file) read
    run_dir: str | None  # the run folder holding it, when there is one
    step: int
    sha256: str  # of state.pt
    state: dict
    optimizer: bool = False  # also load the optimizer state
    storage_options: dict = field(default_factory=dict)  # fsspec options for reading the base run folder
    key: str = "train.init_from"  # the setting that named it, for messages

    @property
    def where(self) -> str:
        return f"{self.key} = {self.given!r}"

    @property
    def last_lr(self) -> float | None:
        """The learning rate the base run's next step would have used."""
        lrs = (self.state.get("scheduler") or {}).get("_last_lr")
        return float(lrs[0]) if lrs else None

    def start_factor(self, optim_cfg) -> float:
        """Where this run's warm-up starts, as a fraction of its peak LR (``rewarm_from``)."""
        if optim_cfg.rewarm_from != "current" or self.last_lr is None:
            return 0.0
        return max(0.0, self.last_lr / optim_cfg.lr)

    def provenance(self) -> dict:
        return {
            "given": self.given,
            "run_dir": self.run_dir,
            "checkpoint": self.checkpoint,
            "step": self.step,
            "sha256": self.sha256,
            "init_optimizer": self.optimizer,
        }

    def check(self, model_cfg, tokenizer) -> None:
        """ConfigError naming what differs when this run's tokenizer or model config is not the base's."""
        self.check_tokenizer(tokenizer)
        saved = self.model_config()
        mine = dataclasses.asdict(model_cfg)
        differ = [k for k in sorted(set(saved) | set(mine)) if saved.get(k) != mine.get(k)]
        if differ:
            detail = ", ".join(f"{k} (base {saved.get(k)!r}, this run {mine.get(k)!r})" for k in differ)
            raise ConfigError(
                f"{self.where}: [train.model] differs from the base run's model in {detail}; "
                "set those keys to the base run's values"
            )

    def check_tokenizer(self, tokenizer) -> None:
        """ConfigError when this run's tokenizer is not the one the checkpoint's run trained with: its name in the
        checkpoint, and every file ``tokenizer.save`` writes against the run folder's copy."""
        saved_tok = (self.state.get("data") or {}).get("tokenizer")
        if saved_tok is not None and saved_tok != tokenizer.name:
            raise ConfigError(
                f"{self.where}: that run used tokenizer {saved_tok!r}, this run {tokenizer.name!r}; "
                "set train.tokenizer to that run's (its run folder holds it)"
            )
        if self.run_dir is not None:
            differ = tokenizer_differences(*fsspec.core.url_to_fs(self.run_dir, **self.storage_options), tokenizer)
            if differ:
                raise ConfigError(
                    f"{self.where}: this run's tokenizer differs from that run's ({', '.join(differ)} "
                    f"in {self.run_dir}); set train.tokenizer = {self.run_dir!r}"
                )

    def model_config(self) -> dict:
        """The checkpoint's ``[train.model]`` as it recorded it; CheckpointError when it records none, or one this
        version cannot build (``saved_model_config``: a newer winnow's key, a damaged record)."""
        self.model()
        return self.state["model_config"]

    def model(self) -> ModelConfig:
        """The checkpoint's model config, built (``saved_model_config`` says what stops it)."""
        return saved_model_config(self.state.get("model_config"), f"{self.where}: checkpoint {self.checkpoint}")

    def _run_files(self, names: list[str]) -> dict[str, str]:
        """sha256 of those of ``names`` the base run folder holds."""
        return _files_sha256(*fsspec.core.url_to_fs(self.run_dir, **self.storage_options), names)

    def apply(self, model, optimizer, scheduler, parallel) -> None:
        """Load the weights (and optimizer moments) into a freshly built run."""
        parallel.load_model_state(model, self.state["model"])
        if self.optimizer:
            # the moments and step counts are the base's; lr, betas, weight decay stay this run's
            mine = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
            parallel.load_optim_state(model, optimizer, self.state["optimizer"])
            for group, hyper in zip(optimizer.param_groups, mine):
                group.update(hyper)
            for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr()):
                group["lr"] = lr
        log.info(
            "initialized from %s (step %d%s)", self.checkpoint, self.step, ", with optimizer state" * self.optimizer
        )


def tokenizer_differences(fs, run_dir: str, tokenizer) -> list[str]:
    """The files ``tokenizer.save`` writes that run folder ``run_dir`` (on ``fs``) holds with other bytes."""
    mine = _tokenizer_files(tokenizer)
    theirs = _files_sha256(fs, run_dir, list(mine))
    return sorted(k for k in theirs if theirs[k] != mine[k])


def _files_sha256(fs, folder: str, names: list[str]) -> dict[str, str]:
    """sha256 of those of ``names`` that ``folder`` holds."""
    paths = {n: posixpath.join(folder, n) for n in names}
    return {n: hashlib.sha256(fs.cat_file(p)).hexdigest() for n, p in paths.items() if fs.exists(p)}


def _tokenizer_files(tokenizer) -> dict[str, str]:
    """sha256 of each file ``tokenizer.save`` writes: the same files the base run folder holds."""
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save(tmp)
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in Path(tmp).iterdir() if p.is_file()}


def _read_checkpoint(fs, folder: str, state_file: str, *, weights: bool = True) -> tuple[dict, str, int]:
    """(state, sha256, step) of one checkpoint; CheckpointError when it does not verify. Without ``weights``, a
    checkpoint whose weights and moments are in shards is read without them (its model config, counters, data)."""
    step, meta = -1, {}
    meta_path = posixpath.join(folder, _META)
    try:
        if fs.exists(meta_path):  # first: it says how many bytes the state file may have
            meta = json.loads(
                read_capped(fs, meta_path, limit=JSON_BYTES, what="checkpoint meta", error=CheckpointError)
            )
        limit = meta["bytes"] if isinstance(meta.get("bytes"), int) else STATE_BYTES
        data = read_capped(fs, state_file, limit=limit, what="checkpoint state", error=CheckpointError)
    except (OSError, ValueError) as err:
        raise CheckpointError(f"checkpoint {state_file} cannot be read: {err}") from err
    digest = hashlib.sha256(data).hexdigest()
    if meta:
        if meta.get("bytes") != len(data) or meta.get("sha256") != digest:
            raise CheckpointError(f"checkpoint {folder} fails its checksum (corrupt or truncated)")
        step = int(meta.get("step", -1))
    from winnow.train.checkpoint import load_state_file  # torch: only where a checkpoint is read, not to check a config

    state = load_state_file(io.BytesIO(data), name=state_file)  # tensors and plain data only: runs no code
    if (
        meta.get("files") and weights
    ):  # the weights and moments are in the checkpoint's shards: fetch, verify, read whole
        with tempfile.TemporaryDirectory(prefix="winnow-init-") as tmp:
            for name, expected in meta["files"].items():
                if not inside(name):  # a damaged or hostile meta: never write outside the temporary folder
                    raise CheckpointError(
                        f"checkpoint {folder}: its meta lists the file {name!r}, which is not "
                        "inside the checkpoint folder; the checkpoint is corrupt or not winnow's"
                    )
                blob = read_capped(
                    fs,
                    posixpath.join(folder, name),
                    limit=int(expected["bytes"]),
                    what="checkpoint file",
                    error=CheckpointError,
                )
                if len(blob) != expected["bytes"] or hashlib.sha256(blob).hexdigest() != expected["sha256"]:
                    raise CheckpointError(f"checkpoint {folder} fails its checksum ({name}: corrupt or truncated)")
                (Path(tmp) / name).parent.mkdir(parents=True, exist_ok=True)
                (Path(tmp) / name).write_bytes(blob)
            from winnow.train import dcp
            from winnow.train.checkpoint import SHARDS_DIR, merge_shards

            merge_shards(state, dcp.read_full(Path(tmp) / SHARDS_DIR))
    if weights and isinstance(state.get("model"), dict):
        from winnow.train.checkpoint import check_finite

        check_finite(state["model"], f"checkpoint {folder}", then="give an earlier checkpoint of that run")
    step = int((state.get("counters") or {}).get("step", step))
    return state, digest, step


def _load_export(
    fs: fsspec.AbstractFileSystem, path: str, *, given: str, optimizer: bool, storage_options: dict | None, key: str
) -> Initialization:
    """An ``Initialization`` from an export's ``winnow-model.safetensors``: its weights, model config and step; the
    export folder holds the tokenizer files it is checked against. It has no optimizer state to continue."""
    from winnow.train.export import exported_state

    if optimizer:
        raise ConfigError(
            f"{key} = {given!r} is an export: it holds the weights, not the optimizer's moments; set "
            "train.init_optimizer = false, or give the run folder it was exported from"
        )
    data = read_capped(fs, path, limit=STATE_BYTES, what="export", error=CheckpointError)
    model, meta = exported_state(data, path)
    from winnow.train.checkpoint import check_finite

    check_finite(model, path, then="export an earlier checkpoint of the run it came from")
    unstrip = (lambda p: fs.unstrip_protocol(p)) if "://" in given else (lambda p: p)
    return Initialization(
        given=given,
        checkpoint=unstrip(path),
        run_dir=unstrip(posixpath.dirname(path)),  # the export folder: its tokenizer files
        step=int(meta.get("step", -1)),
        sha256=hashlib.sha256(data).hexdigest(),
        state={"model": model, "model_config": json.loads(meta["model_config"])},
        storage_options=dict(storage_options or {}),
        key=key,
    )


def load_init(
    given: str,
    *,
    optimizer: bool = False,
    storage_options: dict | None = None,
    key: str = "train.init_from",
    weights: bool = True,
) -> Initialization:
    """Find and load the checkpoint ``given`` names (see the module docstring); ``key`` is the setting that
    named it (``train.mixing.reference`` and ``train.distill.teacher`` are found the same way). Without
    ``weights``, enough to ``check`` it: a sharded checkpoint's weights and moments are not fetched."""
    fs, root = fsspec.core.url_to_fs(given, **(storage_options or {}))
    root = root.rstrip("/")
    unstrip = (lambda p: fs.unstrip_protocol(p)) if "://" in given else (lambda p: p)
    if not fs.exists(root):
        raise ConfigError(f"{key} = {given!r} does not exist; give a run folder or a checkpoint")
    from winnow.train.export import WINNOW_FILE  # the model's module: imported by the runs that init from one

    export = root if root.endswith(".safetensors") else posixpath.join(root, WINNOW_FILE)
    if (fs.isfile(root) and root.endswith(".safetensors")) or (fs.isdir(root) and fs.isfile(export)):
        return _load_export(fs, export, given=given, optimizer=optimizer, storage_options=storage_options, key=key)
    if fs.isfile(root):
        candidates, run_dir = [(posixpath.dirname(root), root)], None
    elif fs.exists(posixpath.join(root, _META)):
        candidates, run_dir = [(root, posixpath.join(root, _STATE))], None
    else:
        folder = posixpath.join(root, "checkpoints") if fs.isdir(posixpath.join(root, "checkpoints")) else root
        steps = sorted(
            (p for p in fs.ls(folder, detail=False) if posixpath.basename(p).startswith(_PREFIX)), reverse=True
        )
        if not steps:
            raise ConfigError(f"{key} = {given!r} holds no checkpoints (checkpoints/step-*/); train that run first")
        candidates = [(p, posixpath.join(p, _STATE)) for p in steps]
        run_dir = posixpath.dirname(folder) if folder != root else None
    if run_dir is None and posixpath.basename(posixpath.dirname(candidates[0][0])) == "checkpoints":
        run_dir = posixpath.dirname(posixpath.dirname(candidates[0][0]))
    for i, (folder, state_file) in enumerate(candidates):
        try:
            state, digest, step = _read_checkpoint(fs, folder, state_file, weights=weights)
        except CheckpointError as err:
            if i == len(candidates) - 1 or len(candidates) == 1:
                raise
            log.warning("%s: skipping checkpoint: %s", key, err)
            continue
        return Initialization(
            given=given,
            checkpoint=unstrip(folder if fs.isdir(folder) else state_file),
            run_dir=unstrip(run_dir) if run_dir else None,
            step=step,
            sha256=digest,
            state=state,
            optimizer=optimizer,
            storage_options=dict(storage_options or {}),
            key=key,
        )
    raise CheckpointError(f"{key} = {given!r}: no checkpoint there verifies")  # unreachable: the loop raises
