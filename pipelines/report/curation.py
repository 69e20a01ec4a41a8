"""Reading a curation job folder for the report: the funnel, the mix, the curriculum and score columns.

Everything but the score histograms comes from ``manifest.json`` (``docs/design.md``); the
histograms read only the ``source`` and score columns of the Parquet shards, lazily. A job
whose output is an fsspec URL (``s3://bucket/job``) is read in place through its filesystem.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from winnow.curate.errors import InputError
from winnow.curate.manifest import upgrade
from winnow.curate.wholefile import MANIFEST_BYTES, read_whole
from winnow.curate.workdir import is_url

log = logging.getLogger(__name__)

#: Score columns the report draws histograms of, when the shards carry them.
SCORE_COLUMNS = ("quality", "difficulty")


@dataclass(slots=True)
class CurationJob:
    """A curation job folder (a local ``Path``, or a URL read through ``fs``) and its manifest."""

    path: Path | str
    manifest: dict
    fs: Any = None  # the fsspec filesystem of a URL job; None for a local folder

    @property
    def name(self) -> str:
        return str(self.manifest.get("job") or str(self.path).rstrip("/").rsplit("/", 1)[-1])

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

    def shard_paths(self) -> list[Path | str]:
        names = [s["path"] for s in self.manifest.get("shards", []) if s.get("format") == "parquet"]
        if self.fs is not None:
            return [p for p in (f"{str(self.path).rstrip('/')}/{n}" for n in names) if self.fs.isfile(p)]
        return [p for p in (self.path / n for n in names) if p.is_file()]

    def score_columns(self) -> pl.DataFrame | None:
        """``source`` plus the score columns present in the shards (train and val); None without shards."""
        paths = self.shard_paths()
        if not paths:
            return None
        if self.fs is not None:  # read only the needed columns through the store's filesystem
            import pyarrow.dataset as ds

            dataset = ds.dataset(paths, format="parquet", filesystem=self.fs)
            present = [c for c in SCORE_COLUMNS if c in dataset.schema.names]
            if not present:
                return None
            frame = pl.from_arrow(dataset.to_table(columns=["id", "source", *present])).lazy()
        else:
            frame = pl.scan_parquet(paths, glob=False)
            present = [c for c in SCORE_COLUMNS if c in frame.collect_schema()]
            if not present:
                return None
        # repeats are copies of the same document: the histograms describe distinct rows
        return frame.select("id", "source", *present).unique("id").drop("id").collect()


def is_job_dir(path: Path | str, storage_options: dict[str, Any] | None = None) -> bool:
    if is_url(path):
        fs = _url_fs(str(path), storage_options)
        return fs.isfile(f"{str(path).rstrip('/')}/manifest.json")
    return (Path(path) / "manifest.json").is_file()


def read_job_folder(path: str | Path, storage_options: dict[str, Any] | None = None) -> CurationJob:
    """Read a curation job folder (one holding ``manifest.json``): a local folder or an fsspec URL."""
    fs = None
    if is_url(path):
        fs, path = _url_fs(str(path), storage_options), str(path).rstrip("/")
        where = f"{path}/manifest.json"
        if not fs.isfile(where):
            raise InputError(f"{path} is not a curation job folder: no manifest.json there")
        text = read_whole(where, limit=MANIFEST_BYTES, what="manifest", storage_options=storage_options).decode(
            "utf-8", "replace"
        )
    else:
        path = Path(path)
        where = str(path / "manifest.json")
        if not is_job_dir(path):
            raise InputError(f"{path} is not a curation job folder: no manifest.json there")
        text = read_whole(where, limit=MANIFEST_BYTES, what="manifest").decode("utf-8", "replace")
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(f"{where} is not valid JSON ({err}); re-run the curation job") from err
    if not isinstance(manifest, dict) or not isinstance(manifest.get("shards", []), list):
        raise InputError(
            f"{where} is not a job's manifest (a JSON object with a list of shards); re-run the curation job"
        )
    return CurationJob(path=path, manifest=upgrade(manifest, where=where), fs=fs)


def _url_fs(url: str, storage_options: dict[str, Any] | None) -> Any:
    import fsspec

    return fsspec.core.url_to_fs(url, **(storage_options or {}))[0]
