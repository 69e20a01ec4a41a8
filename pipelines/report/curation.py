"""Reading a curation job folder for the report: the funnel, the mix, the curriculum and score columns.

Everything but the score histograms comes from ``manifest.json`` (``docs/design.md``); the
histograms read only the ``source`` and score columns of the Parquet shards, lazily.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from curate.errors import InputError
from curate.manifest import upgrade

log = logging.getLogger(__name__)

#: Score columns the report draws histograms of, when the shards carry them.
SCORE_COLUMNS = ("quality", "difficulty")


@dataclass(slots=True)
class CurationJob:
    """A curation job folder and its manifest."""

    path: Path
    manifest: dict

    @property
    def name(self) -> str:
        return str(self.manifest.get("job") or self.path.name)

    @property
    def sources(self) -> list[str]:
        return list(self.manifest.get("sources") or self.manifest.get("by_source") or [])

    def funnel(self) -> list[dict]:
        """Per stage in order: ``id``, ``rows_in``, ``rows_out``, ``rows_rejected``, ``repeats``."""
        keys = ("rows_in", "rows_out", "rows_rejected", "repeats")
        return [{"id": s["id"], **{k: int(s.get(k) or 0) for k in keys}} for s in self.manifest.get("stages", [])]

    def rejects_by_reason(self) -> dict[str, dict[str, int]]:
        """``{reason: {source: rows}}`` over the whole job, largest reasons first."""
        table: dict[str, dict[str, int]] = {}
        for source, figures in (self.manifest.get("by_source") or {}).items():
            for reason, n in (figures.get("rejected") or {}).items():
                table.setdefault(reason, {})[source] = int(n)
        return dict(sorted(table.items(), key=lambda kv: -sum(kv[1].values())))

    def mix_report(self) -> dict | None:
        """The mix stage's plan report (``sources`` with ``target_share`` / ``realized_share``), if any."""
        for stage in self.manifest.get("stages", []):
            if stage.get("kind") == "mix" and stage.get("report"):
                return stage["report"]
        return None

    def order_report(self) -> dict | None:
        for stage in self.manifest.get("stages", []):
            if stage.get("kind") == "order" and stage.get("report"):
                return stage["report"]
        return None

    def ordering_column(self) -> str | None:
        """The column the curriculum sorts by (the order stage's ``by``), if the job has one."""
        report = self.order_report()
        return report.get("by") if report else None

    def shard_means(self, column: str, *, split: str = "train") -> list[tuple[str, float]]:
        """(shard path, mean of ``column``) for the Parquet shards of ``split``, in read order."""
        out = []
        for shard in self.manifest.get("shards", []):
            if shard.get("split") == split and shard.get("format") == "parquet":
                mean = (shard.get("means") or {}).get(column)
                if mean is not None:
                    out.append((shard["path"], float(mean)))
        return out

    def shard_paths(self) -> list[Path]:
        paths = [self.path / s["path"] for s in self.manifest.get("shards", []) if s.get("format") == "parquet"]
        return [p for p in paths if p.is_file()]

    def score_columns(self) -> pl.DataFrame | None:
        """``source`` plus the score columns present in the shards (train and val); None without shards."""
        paths = self.shard_paths()
        if not paths:
            return None
        frame = pl.scan_parquet(paths)
        present = [c for c in SCORE_COLUMNS if c in frame.collect_schema()]
        if not present:
            return None
        # repeats are copies of the same document: the histograms describe distinct rows
        return frame.select("id", "source", *present).unique("id").drop("id").collect()


def is_job_dir(path: Path) -> bool:
    return (path / "manifest.json").is_file()


def read_job_folder(path: str | Path) -> CurationJob:
    """Read a curation job folder (one holding ``manifest.json``)."""
    path = Path(path)
    if not is_job_dir(path):
        raise InputError(f"{path} is not a curation job folder: no manifest.json there")
    try:
        manifest = json.loads((path / "manifest.json").read_text())
    except json.JSONDecodeError as err:
        raise InputError(f"{path / 'manifest.json'} is not valid JSON ({err}); re-run the curation job") from err
    return CurationJob(path=path, manifest=upgrade(manifest, where=str(path / "manifest.json")))
