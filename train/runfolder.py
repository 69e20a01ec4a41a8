"""The run folder across restarts: after a resume each step is logged once, and a fresh start never mixes runs.

``metrics.jsonl`` and ``alerts.jsonl`` grow as a run goes. A run killed after its last
checkpoint has logged steps it will redo once resumed, so ``continue_run_folder`` cuts both
back to the checkpoint's step (a temporary file renamed over the old one: a kill during the cut
leaves the old file or the new one, never a mix). A run starting from step 0 in a folder that
holds an earlier run's logs or checkpoints (``resume = false``, or every checkpoint corrupt)
first moves them into ``previous-<k>/``: its metrics start at step 1, and nothing is deleted.

A run folder is winnow's when it carries ``.winnow-run`` (``claim_run_folder`` writes it into a new or empty
folder before anything else), or holds an earlier winnow run (its ``config.json`` a ``[train]`` table). A folder
holding anything else is refused, never written into: a user's own files there are not overwritten or moved. A job
folder ``winnow curate`` wrote is refused too, and ``winnow curate`` refuses a run folder: neither clears the other's.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from winnow.train.errors import ConfigError
from winnow.train.paths import replace_file

log = logging.getLogger(__name__)

MARKER = ".winnow-run"
CURATED = ".winnow-output"  # the marker of a job folder winnow curate wrote (curate.outdir.MARKER)
#: The folders a curated job clears and rewrites (curate.outdir.OWN_ENTRIES; train never imports curate).
CURATED_ENTRIES = ("_work", "shards", "rejects", "artifacts")

LOGS = ("metrics.jsonl", "alerts.jsonl")
# one run's history; not tensorboard/: its writer (opened with the trainer) already holds a file there
RUN_STATE = ("metrics.jsonl", "alerts.jsonl", "checkpoints")
#: The history and the records of one run, and what was made from it: moved together when a run starts afresh in
#: the folder before it writes its own records (``winnow train``), so no earlier export or report sits beside it.
RUN_FILES = (*RUN_STATE, "config.json", "provenance.json", "job.toml", "tokenizer_meta.json", "tokenizer.json",
             "report.html", "export")  # fmt: skip


def _record_step(line: bytes) -> int | None:
    """The record's step; None for a line to keep as it is (no step); -1 for a torn or unreadable line (cut short,
    or bytes that are not UTF-8: what a power loss can leave at the end of an appended file)."""
    try:
        record = json.loads(line.decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        return -1
    step = record.get("step") if isinstance(record, dict) else None
    return step if isinstance(step, int) else None


def truncate_jsonl(path: Path, step: int) -> tuple[int, int]:
    """Drop the records of steps after ``step``, and torn lines, from ``path``; returns how many of each went."""
    if not path.is_file():
        return 0, 0
    kept, later, torn = [], 0, 0
    for line in path.read_bytes().split(b"\n"):
        if not line.strip():
            continue
        s = _record_step(line)
        if s == -1:
            torn += 1
        elif s is not None and s > step:
            later += 1
        else:
            kept.append(line + b"\n")
    if later or torn:
        replace_file(path, b"".join(kept))
    return later, torn


def _has_history(run_dir: Path, names: tuple[str, ...] = RUN_STATE) -> list[Path]:
    if not any((run_dir / name).exists() for name in RUN_STATE):  # records alone (a run built, never stepped)
        return []
    found = []
    for name in names:
        path = run_dir / name
        if (path.is_file() and path.stat().st_size) or (path.is_dir() and any(path.iterdir())):
            found.append(path)
    return found


def archive_previous(run_dir: Path, names: tuple[str, ...] = RUN_STATE) -> Path | None:
    """Move an earlier run's logs and checkpoints (``names`` of it: ``RUN_FILES`` for all it left) into
    ``previous-<k>/`` (k = 1, 2, ...); None if there was none."""
    run_dir = Path(run_dir)
    found = _has_history(run_dir, names)
    if not found:
        return None
    k = 1
    while (run_dir / f"previous-{k}").exists():
        k += 1
    target = run_dir / f"previous-{k}"
    target.mkdir()
    for path in found:
        os.replace(path, target / path.name)
    log.warning(
        "%s held an earlier run (%s) and this one starts from step 0: moved it to %s",
        run_dir,
        ", ".join(p.name for p in found),
        target,
    )
    return target


def continue_run_folder(run_dir: str | Path, step: int, log_every: int = 1) -> None:
    """Before the first step: cut the logs back to ``step`` (a resume), or archive an earlier run (step 0).
    ``log_every``: the first step with a record (a run stopped before it has no ``metrics.jsonl`` yet)."""
    run_dir = Path(run_dir)
    if step == 0:
        archive_previous(run_dir)
        return
    if step >= log_every and not (run_dir / "metrics.jsonl").is_file():  # removed or moved: its records are gone
        log.warning(
            "%s is missing: the run resumes at step %d and its records start there (the report shows from there on)",
            run_dir / "metrics.jsonl",
            step,
        )
    for name in LOGS:
        later, torn = truncate_jsonl(run_dir / name, step)
        if later:
            log.info(
                "%s: dropped %d record(s) after step %d (logged before the run was stopped; redone now)",
                run_dir / name,
                later,
                step,
            )
        if torn:
            log.warning(
                "%s: dropped %d line(s) that are not whole JSON records (cut short, or bytes that are not UTF-8)",
                run_dir / name,
                torn,
            )


def _earlier_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run or study winnow wrote before it marked its folders: a ``config.json`` of a
    [train] table, or a study's ``result.json`` (a variant's name, kind and held-out losses)."""
    for name, keys in (("config.json", _TRAIN_KEYS), ("result.json", {"name", "kind", "held_out"})):
        try:
            found = json.loads((run_dir / name).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(found, dict) and keys <= set(found):
            # a [train] table: its model a table of winnow's model keys (other tools' config.json have a "model")
            return name == "result.json" or isinstance(found["model"], dict) and _MODEL_KEYS <= set(found["model"])
    return False


#: What every winnow ``config.json`` has held: the [train] table, with its model's table.
_TRAIN_KEYS = {"model", "optim", "data", "steps", "seed", "output"}
_MODEL_KEYS = {"dim", "n_layers", "n_heads", "n_experts", "top_k"}


def claim_run_folder(run_dir: str | Path, key: str = "train.output") -> Path:
    """Make ``run_dir`` a winnow run folder: create it (or take an empty one) and mark it, or accept one already
    winnow's; a folder holding files winnow did not write is refused, naming ``key`` and a few of the files."""
    run_dir = Path(run_dir)
    if not check_run_folder(run_dir, key):
        return run_dir
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except (NotADirectoryError, FileExistsError) as err:
        raise ConfigError(f"{key} = {str(run_dir)!r} is a file, or lies under one; choose a folder") from err
    (run_dir / MARKER).write_text("a winnow run folder: winnow may write, move and replace what is in it\n")
    return run_dir


def _inside_curated(run_dir: Path) -> tuple[Path, str] | None:
    """``(job folder, entry)`` when ``run_dir`` lies in one of the entries a curated job folder above it owns."""
    folder = run_dir.resolve()
    for above in folder.parents:
        if (above / CURATED).is_file():
            entry = folder.relative_to(above).parts[0]
            return (above, entry) if entry in CURATED_ENTRIES else None
    return None


def check_run_folder(run_dir: str | Path, key: str = "train.output") -> bool:
    """``claim_run_folder``'s checks, writing nothing: a ``ConfigError`` naming ``key`` where the folder would be
    refused; returns whether it still needs its marker (False: it is already a winnow run folder)."""
    run_dir = Path(run_dir)
    if not str(run_dir).strip() or str(run_dir) == ".":
        raise ConfigError(f"{key} = {str(run_dir)!r} is invalid; allowed: a folder of its own for the run")
    if any(p.is_file() for p in (run_dir, *run_dir.parents)):
        raise ConfigError(f"{key} = {str(run_dir)!r} is a file, or lies under one; choose a folder")
    inside = _inside_curated(run_dir)
    if inside is not None:
        job, entry = inside
        raise ConfigError(
            f"{key} = {str(run_dir)!r} lies in {entry} of the job folder {job}, which `winnow curate` clears and "
            f"rewrites; give the run a folder beside it, e.g. {job / 'train'}"
        )
    if not run_dir.is_dir():
        return True
    # winnow's own lock file (curate.lock's, taken before the run is built) is not content
    entries = sorted(p.name for p in run_dir.iterdir() if not p.name.startswith(".winnow-lock"))
    if CURATED in entries:  # checked first: a study that failed before curating may have marked the job's folder
        raise ConfigError(
            f"{key} = {str(run_dir)!r} is a job folder `winnow curate` wrote (it holds {CURATED}); a run writes its "
            "checkpoints and metrics into a folder of its own, such as a new folder inside it"
        )
    if MARKER in entries:
        return False
    if entries and not _earlier_run(run_dir):
        shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
        raise ConfigError(
            f"{key} = {str(run_dir)!r} holds files winnow did not write ({shown}); choose a new or empty folder, "
            "or move them away: winnow writes its run there and would overwrite them"
        )
    return True
