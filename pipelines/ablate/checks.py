"""What a study checks before it trains: reference runs it builds on, and finished results it reuses.

(The variants themselves are checked as they are planned, ``plan.py``, and as their data is
prepared, ``prepare.py``: both before anything trains.)

A reference run (a distillation teacher, a run to continue from, an adaptive mix's reference) that
does not exist, or was trained on other sources or with another tokenizer, would make every variant's
numbers meaningless; a finished variant in the study folder that was trained with other settings
than the plan now asks for would be compared with runs it does not match (a [train] setting added
since, at its default, or removed since is not a difference: an older study still resumes). Both
fail before anything trains, naming the variant and the key.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath

from winnow.curate.errors import ConfigError
from winnow.pipelines.ablate.layout import BASELINE, StudyLayout
from winnow.pipelines.train import flat_keys

#: [train] keys that point at a run folder the variants build on (read with getattr: dotted paths).
REFERENCE_KEYS = ("distill.teacher", "init_from", "mixing.reference")
#: [train] keys that do not change what a run learns: a finished run is reused across changes of these
#: (token shards and Parquet tokenized on the fly give the same batches: docs/design.md, "Token shards").
_NOT_RESULTS = ("output", "data.num_workers", "data.format", "metrics.", "alerts.", "checkpoint.")


def _get(cfg: object, dotted: str) -> object:
    for part in dotted.split("."):
        cfg = getattr(cfg, part, None)
        if cfg is None:
            return None
    return cfg


def check_references(train_cfg, sources: list[str], first_variant: str) -> None:
    """Every reference run in [train] exists, was trained on the study's sources and with the study's tokenizer.

    A reference is a run folder, its ``checkpoints`` folder, one checkpoint, or a state file, on any
    filesystem fsspec reads (``train.data.storage_options``), as the trainer finds it; only the run's
    ``metrics.jsonl`` and tokenizer files are read, not its weights."""
    import fsspec

    from winnow.train.init import tokenizer_differences

    tokenizer = None
    options = dict(getattr(train_cfg.data, "storage_options", None) or {})
    for key in REFERENCE_KEYS:
        given = _get(train_cfg, key)
        if not isinstance(given, str):
            continue
        where = f"every variant (first: {first_variant!r}): train.{key} = {given!r}"
        fs, root = fsspec.core.url_to_fs(given, **options)
        root = root.rstrip("/")
        if not fs.exists(root):
            raise ConfigError(
                f"ablate: {where} does not exist; give a run folder or a checkpoint (train that run first)"
            )
        run = _run_folder(fs, root)
        if run is None:
            continue  # a bare checkpoint outside any run folder: the trainer checks its tokenizer name
        theirs = _run_sources(fs, run)
        if theirs and theirs != sources:
            raise ConfigError(
                f"ablate: {where} was trained on sources {theirs}, the study trains on {sources}; "
                f"point train.{key} at a run on the same curated sources"
            )
        if tokenizer is None:
            from winnow.train.tokenizer import load_tokenizer

            tokenizer = load_tokenizer(train_cfg.tokenizer)
        if tokenizer_differences(fs, run, tokenizer):
            raise ConfigError(
                f"ablate: {where} was trained with another tokenizer than train.tokenizer = "
                f"{train_cfg.tokenizer!r}; use the reference run's tokenizer or another reference"
            )


def _run_folder(fs, root: str) -> str | None:
    """The run folder (one holding ``metrics.jsonl``) that ``root`` is, or holds as ``checkpoints/``,
    ``checkpoints/step-*/`` or ``checkpoints/step-*/state.pt``: where the trainer looks for its files."""
    folder = posixpath.dirname(root) if fs.isfile(root) else root
    candidates = [folder]
    if posixpath.basename(folder) == "checkpoints":
        candidates.append(posixpath.dirname(folder))
    if posixpath.basename(posixpath.dirname(folder)) == "checkpoints":
        candidates.append(posixpath.dirname(posixpath.dirname(folder)))
    return next((c for c in candidates if fs.exists(posixpath.join(c, "metrics.jsonl"))), None)


def _run_sources(fs, run: str) -> list[str]:
    """The sources the run reported: its first training record's ``per_source`` (an eval's when none has one)."""
    evaluated: list[str] = []
    with fs.open(posixpath.join(run, "metrics.jsonl"), "rt") as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn line of a killed run
            if isinstance(record.get("per_source"), dict) and record["per_source"]:
                return list(record["per_source"])
            if not evaluated and isinstance(record.get("eval"), dict):
                evaluated = list(record["eval"].get("per_source") or {})
    return evaluated


def _unchanged_by_version(cfg: object, key: str, planned: dict, stored: dict) -> bool:
    """A key only one side has, from a [train] setting added (at its default) or removed since the run was
    trained: not a difference in what the run learned."""
    if key in stored and key not in planned:
        return True  # a setting that does not exist cannot be asked for
    if key not in stored and key in planned:
        *path, name = key.split(".")
        owner = _get(cfg, ".".join(path)) if path else cfg
        field = (
            next((f for f in dataclasses.fields(owner) if f.name == name), None)
            if dataclasses.is_dataclass(owner)
            else None
        )
        if field is None or (field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING):
            return False
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        return json.loads(json.dumps(default, default=str)) == planned[key]
    return False


def finished(layout: StudyLayout, variant: dict, cfg) -> dict | None:
    """The variant's saved result when it finished with the settings the plan asks for; None when it has not
    finished; a ``ConfigError`` naming the variant and key when it finished, or started, with other settings."""
    result = layout.read_result(variant["name"])
    state = "finished" if result is not None else "was started (and would resume from its checkpoint)"
    where = f"ablate: variant {variant['name']!r} in {layout.run_dir(variant['name'])} {state} with"
    fix = (
        "use a new [ablate] output folder for the changed study (the baseline trains in the study folder itself)"
        if variant["name"] == BASELINE
        else "use a new [ablate] output folder for the changed study, or remove that variant's folder"
    )
    if result is not None and (
        set(result["weights"]) != set(variant["weights"])
        or any(abs(result["weights"][s] - w) > 1e-9 * max(1.0, abs(w)) for s, w in variant["weights"].items())
    ):
        raise ConfigError(
            f"{where} mix weights {result['weights']}, the study now plans {variant['weights']} "
            f"(the curated shares or the [ablate] table changed); {fix}"
        )
    if result is not None and "data" in result and result["data"] != variant.get("data"):
        raise ConfigError(
            f"{where} the shards of the job folder as they were curated then (fingerprint {result['data']}); they "
            f"were curated again since (now {variant.get('data')}), so the study's results measure other data: "
            "give [ablate] output a new folder for a study of the new shards"
        )
    if result is not None and result.get("curation") != variant.get("curation"):
        raise ConfigError(
            f"{where} shards curated as {result.get('curation')}, the study now curates them as "
            f"{variant.get('curation')} (the job, its inputs or the variant's change changed); {fix}"
        )
    saved = layout.run_dir(variant["name"]) / "config.json"
    if saved.is_file():
        planned = flat_keys(json.loads(json.dumps(dataclasses.asdict(cfg), default=str)))
        stored = flat_keys(json.loads(saved.read_text()))
        ignore = _NOT_RESULTS
        if not planned.get("attribution.every") and not stored.get("attribution.every"):
            ignore += ("attribution.",)  # attribution off in both: its other settings change nothing
        for key in sorted(planned.keys() | stored.keys()):
            if (
                key.startswith(ignore)
                or planned.get(key) == stored.get(key)
                or _unchanged_by_version(cfg, key, planned, stored)
            ):
                continue
            raise ConfigError(
                f"{where} train.{key} = {stored.get(key)!r}, the study now asks for {planned.get(key)!r}; {fix}"
            )
    return result
