"""``manifest.json``: per-stage counts, per-shard checksums, inputs, config and versions.

It is also where the job-level nothing-is-lost identity is checked:
``rows read + repeats == rows written + rows rejected``, for the job and for every stage.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import platform
from typing import Any

from winnow.curate.config import Job
from winnow.curate.errors import InputError, StageError
from winnow.curate.readers import list_files
from winnow.curate.stages import Stage
from winnow.curate.stats import StageStats, merge_stats, nest
from winnow.curate.tasks import READ_STAGE_ID

# Of manifest.json and the shard layout: bump it when either changes, and teach ``upgrade`` the old one.
# 2: shards/<format>/<split>/ folders, row_bytes. 3: stage counters nested by key ({"lines_removed": {"docs": 4}}).
FORMAT_VERSION = 3
_PACKAGES = (
    "winnow",
    "polars",
    "pyarrow",
    "numpy",
    "numba",
    "orjson",
    "datasketch",
    "webdataset",
    "datasets",
    "fsspec",
)


def package_versions(names: tuple[str, ...] = _PACKAGES) -> dict[str, str]:
    """Installed versions of ``names`` (those that are installed) and of Python."""
    versions = {"python": platform.python_version()}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def build_manifest(
    job: Job,
    stages: list[Stage],
    phase_results: list[list[dict]],
    write_results: list[dict],
    plan_seconds: dict[str, float],
    *,
    reports: dict[str, dict],
    seconds: float,
) -> dict[str, Any]:
    """Assemble the manifest from every task's stats and check the identities."""
    all_results = [r for phase in phase_results for r in phase]
    stats = merge_stats([r["stats"] for r in all_results])
    for sid, s in plan_seconds.items():
        stats.setdefault(sid, StageStats()).seconds += s
    order = [READ_STAGE_ID] + [s.ctx.stage_id for s in stages]
    stage_entries = []
    for sid in order:
        s = stats.get(sid, StageStats())
        check_identity(sid, s)
        entry = {"id": sid, "kind": "read" if sid == READ_STAGE_ID else sid.split(".", 1)[1], **s.summary()}
        if sid in reports:
            entry["report"] = reports[sid]
        stage_entries.append(entry)

    shards = [s for r in phase_results[-1] for s in r["shards"]] + [s for r in write_results for s in r["shards"]]
    shards.sort(key=lambda s: (s["split"] != "train", s["split"], s["format"], s["path"]))
    rows_out = sum(s["rows"] for s in shards if s["format"] == shards[0]["format"]) if shards else 0
    read = stats.get(READ_STAGE_ID, StageStats())
    rejected = sum(s.rows_rejected for s in stats.values())
    repeats = sum(s.repeats for s in stats.values())
    if read.rows_in + repeats != rows_out + rejected:
        raise StageError(
            f"job {job.job.name}: {read.rows_in} rows read + {repeats} repeats != {rows_out} written + {rejected} rejected"
        )
    last = stats.get(order[-1], StageStats())  # a stage no row reached has no stats: it kept nothing
    if last.rows_out != rows_out:
        raise StageError(f"job {job.job.name}: the last stage kept {last.rows_out} rows but {rows_out} were written")
    sources = sorted({src for s in shards for src in s["sources"]} | set(read.source_in) | set(job.declared_sources))
    return {
        "format_version": FORMAT_VERSION,
        "job": job.job.name,
        "job_file": job.source_file,
        "sources": sources,
        "totals": {
            "rows_read": read.rows_in,
            "rows_written": rows_out,
            "rows_rejected": rejected,
            "repeats": repeats,
            "seconds": round(seconds, 3),
        },
        "by_source": _by_source(read, stats, shards),
        **({"tokens": token_totals(shards)} if any(s["format"] == "tokens" for s in shards) else {}),
        "stages": stage_entries,
        "shards": shards,
        "rejects": [rj for r in all_results for rj in r["rejects"]],
        "skipped_files": [sk for r in all_results for sk in r["skipped_files"]],
        "inputs": [
            {
                "source": i.label,
                "format": i.format,
                "files": [{"path": f.url, "bytes": f.size, "mtime": f.mtime} for f in list_files(i)],
            }
            for i in job.inputs
        ],
        "config": {"file": job.raw, "resolved": _resolved(job)},
        "packages": package_versions(),
    }


def upgrade(manifest: dict[str, Any], *, where: str = "manifest.json") -> dict[str, Any]:
    """A manifest of any format version this winnow reads, in the current shape (``format_version`` kept)."""
    version = manifest.get("format_version", 1)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise InputError(
            f"{where}: format_version {version!r} is newer than this winnow reads (up to "
            f"{FORMAT_VERSION}); upgrade winnow"
        )
    if version < 3:  # counters were flat "name/qualifier" strings
        for stage in manifest.get("stages") or []:
            flat = stage.get("counters") or {}
            stage["counters"] = nest({tuple(k.split("/", 1)) if "/" in k else k: v for k, v in flat.items()})
    return manifest


def token_totals(shards: list[dict]) -> dict[str, Any]:
    """Tokens written per split and source, the tokenizer, and the tokenizing rate (summed over workers)."""
    tok = [s for s in shards if s["format"] == "tokens"]
    by_split: dict[str, dict[str, int]] = {}
    for s in tok:
        split = by_split.setdefault(s["split"], {})
        for src, n in s["tokens_by_source"].items():
            split[src] = split.get(src, 0) + n
    total, seconds = sum(s["tokens"] for s in tok), sum(s["tokenize_seconds"] for s in tok)
    return {
        "tokenizer": tok[0]["tokenizer"],
        "dtype": tok[0]["dtype"],
        "total": total,
        "by_split": {k: dict(sorted(v.items())) for k, v in sorted(by_split.items())},
        "tokenize_seconds": round(seconds, 3),
        "tokens_per_second": round(total / seconds) if seconds else None,
    }


def check_identity(sid: str, s: StageStats) -> None:
    if s.rows_in + s.repeats != s.rows_out + s.rows_rejected:
        raise StageError(
            f"stage {sid}: {s.rows_in} in + {s.repeats} repeats != {s.rows_out} out + {s.rows_rejected} rejected"
        )


def _by_source(read: StageStats, stats: dict[str, StageStats], shards: list[dict]) -> dict[str, Any]:
    fmt = shards[0]["format"] if shards else None
    out: dict[str, Any] = {}
    for src in sorted(set(read.source_in) | {k for s in shards for k in s["sources"]}):
        written = sum(s["sources"].get(src, 0) for s in shards if s["format"] == fmt)
        rejected: dict[str, int] = {}
        for s in stats.values():
            for (k_src, reason), n in s.source_rejected.items():
                if k_src == src:
                    rejected[reason] = rejected.get(reason, 0) + n
        out[src] = {"read": read.source_in.get(src, 0), "written": written, "rejected": dict(sorted(rejected.items()))}
    return out


def _resolved(job: Job) -> dict[str, Any]:
    data = dataclasses.asdict(job)
    data.pop("raw", None)
    data["stages"] = [{"kind": s.kind, **dataclasses.asdict(s.config)} for s in job.stages]
    return data
