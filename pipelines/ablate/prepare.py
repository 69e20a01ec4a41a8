"""The study's data: the baseline's shards split per source, and each curation variant curated and split.

Every run trains on per-source shard sets mixed at load time by token weight (``sources.py``),
each set in its curated order. A mix variant re-weights the baseline's sets. A curation variant
(``drop``, ``setting``, ``order``) trains on the sets of its own job (``curation.py``), at the
shares its curated shards hold, and is evaluated, like every run, on the baseline's held-out rows.

When the study varies the curation it curates the baseline job itself, with ``keep_work``, so
each variant re-curates only from the first phase its change touches and adopts the earlier
phases' work from the baseline (``curate.reuse``). A curated job is reused while its job
fingerprint and its input files are what they were (``curated/<name>/curation.json``; the
baseline's own work folder); otherwise it is curated again, resuming its work folder.

Refused before anything trains, naming the variant and its ``[ablate]`` key: a variant that
leaves a source the baseline trains on with no train rows, and one whose train split holds a
row of the baseline's held-out split (a split by row counts, or a changed or dropped ``split``,
can move rows across).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from winnow.curate.atomic import write_json_atomic
from winnow.curate.config import Job
from winnow.curate.errors import ConfigError, WinnowError
from winnow.curate.fingerprint import stale_tasks, task_fingerprints
from winnow.curate.outdir import owner
from winnow.curate.pipeline import job_fingerprint, run_job
from winnow.curate.readers import plan_read_tasks
from winnow.curate.workdir import WorkDir
from winnow.pipelines.ablate.curation import CurationJob
from winnow.pipelines.ablate.layout import BASELINE, StudyLayout
from winnow.pipelines.ablate.plan import CURATION_KINDS_PLANNED, check_runnable
from winnow.pipelines.ablate.sources import split_by_source
from winnow.pipelines.provenance import shards_digest
from winnow.train.data.shards import job_manifest

log = logging.getLogger(__name__)


@dataclass(slots=True)
class StudyData:
    """Where every run's training sets are, and what each curated job kept."""

    job_dir: str  # the baseline job folder: every run's held-out rows are its val split
    folders: dict[str, str]  # the baseline's per-source sets
    base: dict[str, float]  # the baseline's token shares
    variant_folders: dict[str, dict[str, str]] = field(default_factory=dict)  # curation variant -> its sets
    curation: dict[str, dict] = field(default_factory=dict)  # baseline / curation variant -> what its job kept
    identity: str | None = None  # the baseline's curation (job fingerprint and inputs), when the study curates it
    shards: str = ""  # the fingerprint of the baseline job's shards (every split): what each result was measured on

    def folders_for(self, run: dict) -> dict[str, str]:
        return self.variant_folders.get(run.get("group", run["name"]), self.folders)


def _kept(job: CurationJob) -> Job:
    """The baseline job as the study curates it: its work kept, for the variants to reuse."""
    return dataclasses.replace(job.job, job=dataclasses.replace(job.job.job, keep_work=True))


def check_before_curating(runs: list[dict], job: CurationJob, layout: StudyLayout) -> None:
    """Before anything is curated, a study that varies the curation refuses, naming what to do:

    * a job folder holding the finished shards of another job, or of this one before its file was edited: the
      study curates its baseline there, and never replaces a job's shards (``winnow curate`` asks for
      ``--overwrite``, which ``winnow ablate`` does not take);
    * a finished run of ``runs`` (``plan.curated_runs``) measured on another curation than the plan's now (the job,
      its inputs or the variant's change edited since), by name: its losses are the old curation's."""
    kept = _kept(job)
    out, found = Path(job.output), owner(Path(job.output))
    fingerprint = job_fingerprint(kept)
    this_job = ((kept.job.name, fingerprint), (kept.job.name, None))  # None: a marker of an older winnow
    if (out / "manifest.json").is_file() and found and (found.get("job"), found.get("fingerprint")) not in this_job:
        what = (
            f"job {kept.job.name!r} as it was before its file changed (fingerprint {found['fingerprint']} -> "
            f"{fingerprint})"
            if found.get("job") == kept.job.name
            else f"job {found['job']!r}"
            if found.get("job")
            else "a job its marker no longer names"
        )
        raise ConfigError(
            f"ablate: {job.output} holds the finished shards of {what}, and the study curates {job.path} there as its "
            f"baseline, replacing no job's shards; curate the job there yourself (`winnow curate {job.path} "
            "--overwrite`) or give it a new [job] output, and give the study a new [ablate] output: its finished "
            "runs measured the shards as they were"
        )
    identities = {BASELINE: _identity(kept)}
    for run in runs:
        result = layout.read_result(run["name"])
        if result is None:
            continue
        group = run.get("group", run["name"]) if run.get("change") is not None else BASELINE
        if group not in identities:
            identities[group] = _identity(job.variant(run["change"], layout.curated_job(group), key=run["key"]))
        if result.get("curation") != identities[group]:
            raise ConfigError(
                f"ablate: variant {run['name']!r} in {layout.run_dir(run['name'])} finished on shards curated as "
                f"{result.get('curation')}, and the study now curates them as {identities[group]} (the job, its "
                "inputs or the variant's change changed since): its losses are the old curation's; give the "
                "changed study a new [ablate] output (nothing has been curated)"
            )


def prepare_baseline(job_dir: str, layout: StudyLayout, job: CurationJob | None, *, progress: bool) -> StudyData:
    """The baseline's per-source sets; a study that varies the curation curates the job first (with ``keep_work``)."""
    identity = None
    if job is not None:
        kept = _kept(job)
        identity = _identity(kept)
        if not _baseline_current(kept):
            print(f"  curating the baseline job {job.path} -> {job.output} (its work kept for the variants to reuse)")
            run_job(kept, progress=progress)
        _check_job(job_dir, job)
    folders, base = split_by_source(job_dir, layout.sources_root)
    data = StudyData(job_dir=job_dir, folders=folders, base=base, identity=identity, shards=shards_digest(job_dir))
    if job is not None:
        data.curation[BASELINE] = summary(job_dir, folders)
    return data


def prepare_variants(
    runs: list[dict], data: StudyData, job: CurationJob, layout: StudyLayout, *, progress: bool
) -> None:
    """Curate and split every curation variant not curated yet; fill in each run's weights and curation identity."""
    held_out = _held_out_ids(data.job_dir)
    for run in runs:  # every run's data comes from a curated job: the baseline's, unless a variant's below
        run["curation"] = data.identity
    for variant in [r for r in runs if r["kind"] in CURATION_KINDS_PLANNED and "group" not in r]:
        name, key = variant["name"], variant["key"]
        out = layout.curated_job(name)
        vjob = job.variant(variant["change"], out, key=key)
        identity = _identity(vjob)
        marker = layout.curation_marker(name)
        done = json.loads(marker.read_text()) if marker.is_file() else {}
        if done.get("identity") != identity or not (out / "manifest.json").is_file():
            print(f"  curating {name}: {variant['describe']}")
            try:  # the study's own folder: a curation of the variant as it was before is replaced
                manifest = run_job(vjob, progress=progress, reuse_from=data.job_dir, overwrite=True)
            except WinnowError as err:
                raise type(err)(f"ablate: curating variant {name!r} ({key}) failed: {err}") from err
            reused = manifest.get("reused") or {}
            if reused:
                print(f"    reused from the baseline: phase(s) {reused['phases']}, plan(s) {reused['plans']}")
            write_json_atomic(marker, {"identity": identity, "change": variant["change"], "reused": reused})
        kept = _train_sources(out)
        lost = [s for s in data.base if s not in kept]
        if lost:
            raise ConfigError(
                f"ablate: variant {name!r} ({key}) leaves source {lost[0]!r} with no train rows (the "
                f"baseline trains on {sorted(data.base)}, the variant on {sorted(kept)}); allowed: "
                f"changes that keep train rows in every source the baseline trains on"
            )
        _check_held_out(str(out), held_out, name, key)
        folders, shares = split_by_source(str(out), layout.curated_sources(name))
        data.variant_folders[name] = folders
        data.curation[name] = summary(str(out), folders)
        for run in runs:
            if run.get("group", run["name"]) == name:
                run["weights"], run["curation"] = dict(shares), identity
                check_runnable(run, shares)


def summary(job_dir: str, folders: dict[str, str]) -> dict:
    """What a curated job kept: train rows, train tokens (or UTF-8 bytes of text without token shards), rejects by reason."""
    manifest = job_manifest(job_dir)
    train = [s for s in manifest["shards"] if s["split"] == "train"]
    fmt = train[0]["format"] if train else None
    views = [json.loads((Path(f) / "manifest.json").read_text()) for f in folders.values()]
    tokens = any(s["format"] == "tokens" for s in train)
    rejected: dict[str, int] = {}
    for stage in manifest["stages"]:
        for reason, n in stage.get("rejected", {}).items():
            rejected[reason] = rejected.get(reason, 0) + n
    return {
        "rows": sum(s["rows"] for s in train if s["format"] == fmt),
        "unit": "tokens" if tokens else "bytes",
        "tokens": sum(v["tokens_of_source"] if tokens else v["bytes_of_text"] for v in views),
        "rows_by_source": {
            src: sum(s["sources"].get(src, 0) for s in train if s["format"] == fmt) for src in manifest["sources"]
        },
        "rejected": dict(sorted(rejected.items())),
        "reused": manifest.get("reused"),
    }


def _identity(job: Job) -> str:
    """What a curated job's shards are a function of: the job and its input files (names, sizes, times, heads, tails)."""
    prints = task_fingerprints(
        plan_read_tasks(job.inputs, job.job.task_bytes, job.job.group_bytes), [i.storage_options for i in job.inputs]
    )
    inputs = hashlib.sha256(json.dumps(prints, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return f"{job_fingerprint(job)}-{inputs}"


def _baseline_current(job: Job) -> bool:
    """Whether the job folder holds this job, finished, with its work kept and its inputs unchanged."""
    work = WorkDir(job.job.output)
    if not (Path(job.job.output) / "manifest.json").is_file() or not work.fingerprint.is_file():
        return False
    if work.fingerprint.read_text() != job_fingerprint(job):
        return False
    prints = task_fingerprints(
        plan_read_tasks(job.inputs, job.job.task_bytes, job.job.group_bytes), [i.storage_options for i in job.inputs]
    )
    return not stale_tasks(work, prints)[0]


def _check_job(job_dir: str, job: CurationJob) -> None:
    """The curated baseline has what the study reads: Parquet shards (row ids) and a held-out split."""
    manifest = job_manifest(job_dir)
    formats = {s["format"] for s in manifest["shards"]}
    if "parquet" not in formats:
        raise ConfigError(
            f"ablate: {job.path} [output] formats = {sorted(formats)}; the curation kinds read row ids "
            "from Parquet shards (to check that no variant trains on a held-out row); allowed: formats "
            "that include 'parquet'"
        )
    if not any(s["split"] == "val" for s in manifest["shards"]):
        raise ConfigError(
            f"ablate: {job.path} holds out no rows, and every variant is measured on the baseline's "
            "held-out split; allowed: a job with a split stage that keeps val rows"
        )


def _train_sources(job_dir: Path) -> set[str]:
    manifest = job_manifest(job_dir)
    return {src for s in manifest["shards"] if s["split"] == "train" for src, n in s["sources"].items() if n}


def _parquet(job_dir: str | Path, split: str) -> list[Path]:
    manifest = job_manifest(job_dir)
    return [Path(job_dir) / s["path"] for s in manifest["shards"] if s["split"] == split and s["format"] == "parquet"]


def _held_out_ids(job_dir: str) -> pl.DataFrame:
    """The ids of the baseline's val rows (a small split: held in memory)."""
    return pl.scan_parquet(_parquet(job_dir, "val"), glob=False).select("id").unique().collect()


def _check_held_out(job_dir: str, held_out: pl.DataFrame, name: str, key: str) -> None:
    """No train row of the variant is a held-out row of the baseline (its train ids are scanned, not held)."""
    paths = _parquet(job_dir, "train")
    if not paths:
        return
    leaked = (
        pl.scan_parquet(paths, glob=False)
        .select("id")
        .join(held_out.lazy(), on="id", how="semi")
        .unique()
        .collect(engine="streaming")["id"]
        .sort()
    )
    if leaked.len():
        raise ConfigError(
            f"ablate: variant {name!r} ({key}) trains on {leaked.len()} row(s) of the baseline's held-out "
            f"split (e.g. {leaked[0]!r}), on which every run is measured; allowed: changes that keep the "
            "split stage (split by val_fraction: a row's split then depends on its id alone)"
        )
