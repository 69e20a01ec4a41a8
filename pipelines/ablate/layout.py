"""The study folder of ``winnow ablate``: where each file lives, written and read through one owner.

::

    <study>/                      the baseline run (seed = [train] seed): metrics.jsonl, checkpoints/, ...
      result.json                 the baseline's held-out losses: its "done" marker
      variants/<name>/            one run per other variant (noise seeds, left-out sources, mixes, curation
        result.json               variants), each with its own result.json; a variant without one is (re)run
      sources/<source>/           the curated train shards split once per source (own manifest.json)
      curated/<name>/             a curation variant (drop, settings, order): the job re-curated with its change
        job/                      its job folder (shards, rejects, manifest.json), phases before the change reused
        sources/<source>/         its train shards split per source, as sources/ for the baseline
        curation.json             what was curated (job fingerprint, manifest sha256): its "done" marker
      ablation/                   the study's tables and figures:
        effects.csv, .md, .json   one row per variant: held-out deltas with the seed noise and a verdict,
                                  the held-out curve's area and first step at the baseline's final loss,
                                  the curation side (rows and tokens kept, rejects by reason)
        curves.png                mean held-out loss over training per variant (runs with eval_every)
        table.csv, table.md       held-out loss per run and source, delta_<source> = run - baseline
        attribution_vs_ablation.csv / .png   predicted vs measured delta per (variant, source)
        correlation.json          Spearman, sign agreement above the seed noise, noise vs effect sizes
        calibrated.json           the counterfactual calibrated on the study, and its leave-one-variant-out check
        mixes.json                random_mixes: the regression, its fit quality and the proposed mix
        adaptive.json             adaptive = "doremi": the adaptive run's mix and loss beside the baseline's
      heatmap.png                 variants x sources of the measured deltas
      report.html                 the study's page (``winnow report <study>``)

Variant and source names are folder names only through ``curate.names.path_name`` (``..``,
``a/b`` or a 300-character domain stay one folder inside the study); tables show them as given.

``result.json`` is written atomically (temp file, fsync, rename): a crash mid-write leaves
either no marker or a valid one, never a truncated file that looks finished.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from winnow.curate.atomic import write_text_atomic as write_atomic  # the one implementation; re-exported for the study
from winnow.curate.errors import InputError
from winnow.curate.names import path_name
from winnow.train.jsonl import json_line

log = logging.getLogger(__name__)

BASELINE = "baseline"


@dataclass(frozen=True, slots=True)
class StudyLayout:
    """Paths of one study folder; the only code that knows them."""

    root: Path

    def run_dir(self, variant: str) -> Path:
        return self.root if variant == BASELINE else self.root / "variants" / path_name(variant)

    def result_path(self, variant: str) -> Path:
        return self.run_dir(variant) / "result.json"

    def source_dir(self, source: str) -> Path:
        return source_folder(self.sources_root, source)

    def curated_dir(self, variant: str) -> Path:
        return self.root / "curated" / variant

    def curated_job(self, variant: str) -> Path:
        """The job folder of a curation variant (the baseline's is the study's job output)."""
        return self.curated_dir(variant) / "job"

    def curated_sources(self, variant: str) -> Path:
        return self.curated_dir(variant) / "sources"

    def curation_marker(self, variant: str) -> Path:
        return self.curated_dir(variant) / "curation.json"

    @property
    def sources_root(self) -> Path:
        return self.root / "sources"

    @property
    def tables(self) -> Path:
        return self.root / "ablation"

    @property
    def table_csv(self) -> Path:
        return self.tables / "table.csv"

    @property
    def table_md(self) -> Path:
        return self.tables / "table.md"

    @property
    def effects_csv(self) -> Path:
        return self.tables / "effects.csv"

    @property
    def effects_md(self) -> Path:
        return self.tables / "effects.md"

    @property
    def effects_json(self) -> Path:
        return self.tables / "effects.json"

    @property
    def curves_png(self) -> Path:
        return self.tables / "curves.png"

    @property
    def cells_csv(self) -> Path:
        return self.tables / "attribution_vs_ablation.csv"

    @property
    def scatter_png(self) -> Path:
        return self.tables / "attribution_vs_ablation.png"

    @property
    def correlation_json(self) -> Path:
        return self.tables / "correlation.json"

    @property
    def calibrated_json(self) -> Path:
        return self.tables / "calibrated.json"

    @property
    def mixes_json(self) -> Path:
        return self.tables / "mixes.json"

    @property
    def adaptive_json(self) -> Path:
        return self.tables / "adaptive.json"

    @property
    def heatmap_png(self) -> Path:
        return self.root / "heatmap.png"  # beside ablation/: the report draws its own from table.csv

    def read_result(self, variant: str) -> dict | None:
        """A finished variant's result, or None when it has not finished (no marker, or one that is not JSON)."""
        path = self.result_path(variant)
        if not path.is_file():
            return None
        try:
            result = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            log.warning(
                "%s is not valid JSON (written by an older winnow that crashed mid-write?); variant %s is run again",
                path,
                variant,
            )
            return None
        if why := _not_a_result(result):
            log.warning("%s is not a finished run's result (%s); variant %s is run again", path, why, variant)
            return None
        return result

    def write_result(self, variant: str, result: dict) -> None:
        write_atomic(self.result_path(variant), json_line(result, indent=1))  # a diverged run: null, named


def _not_a_result(result) -> str | None:
    """Why ``result`` (a ``result.json``'s JSON) is not what a finished variant writes, or None: an object whose
    ``held_out`` maps each held-out set to its loss (a number; null where an evaluation diverged) and whose
    ``weights`` map sources to numbers."""
    if not isinstance(result, dict):
        return f"a JSON {type(result).__name__}, not an object"
    held, weights = result.get("held_out"), result.get("weights")
    if not isinstance(held, dict) or not held:
        return "no held-out losses"
    if bad := next((k for k, v in held.items() if v is not None and not _number(v)), None):
        return f"held_out[{bad!r}] = {held[bad]!r} is not a loss"
    if not isinstance(weights, dict) or not all(_number(v) for v in weights.values()):
        return "its weights are not numbers by source"
    return None


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def source_folder(sources_root: Path, source: str) -> Path:
    """A source's shard set under ``sources_root``: a name from the data is a path component, never a path."""
    return sources_root / path_name(source)


@dataclass(slots=True)
class Study:
    """What the report reads from a study folder: the table, the comparison and the figures."""

    layout: StudyLayout
    table: pl.DataFrame
    effects: pl.DataFrame | None = None  # one row per variant (effects.csv), when the study wrote it
    summary: list[str] = field(default_factory=list)  # its sentences, one per variant
    correlation: dict | None = None
    cells: pl.DataFrame | None = None  # the counterfactual's prediction beside each measured cell
    calibrated: dict | None = None  # the counterfactual calibrated on the study (calibrated.json)
    mixes: dict | None = None
    adaptive: dict | None = None
    images: list[Path] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return self.layout.root


def is_study(path: str | Path) -> bool:
    return StudyLayout(Path(path)).table_csv.is_file()


def result_name(folder: Path) -> str | None:
    """The run name a ``result.json`` in ``folder`` records (a study's baseline or variant), or None."""
    try:
        found = json.loads((folder / "result.json").read_text())
    except (OSError, ValueError):
        return None
    name = found.get("name") if isinstance(found, dict) else None
    return name if isinstance(name, str) else None


def is_study_root(folder: Path) -> bool:
    """Whether ``folder`` is a study's own folder: its tables or variants, or its baseline's ``result.json``."""
    return (folder / "ablation").is_dir() or (folder / "variants").is_dir() or result_name(folder) == BASELINE


#: The folders a study writes beside its baseline run: another run or study inside them would mix with its own.
STUDY_ENTRIES = ("variants", "sources", "curated", "ablation")


def study_owns(folder: str | Path) -> Path | None:
    """The root of the study whose files ``folder`` would mix with: the study's own folder, a variant's, or a
    folder inside ``STUDY_ENTRIES`` (``..`` and links resolved); None otherwise (a folder beside a study's
    entries, ``<study>/notes``, is not the study's). A variant's folder whose study lost its tables still
    counts, by its ``result.json``."""
    folder = Path(folder).resolve()
    for above in (folder, *folder.parents):
        if result_name(above) not in (None, BASELINE):  # a variant's run folder, or inside one
            return above.parent.parent
        if is_study_root(above):
            return above if above == folder or folder.relative_to(above).parts[0] in STUDY_ENTRIES else None
    return None


def load_study(path: str | Path) -> Study | None:
    """The study in ``path`` once its table is written, else None."""
    layout = StudyLayout(Path(path))
    if not layout.table_csv.is_file():
        return None

    def optional_json(p: Path) -> dict | None:
        """The table file's object; an unreadable one (cut short, edited, not an object) is skipped, said once."""
        if not p.is_file():
            return None
        try:
            value = json.loads(p.read_bytes())
        except (ValueError, UnicodeDecodeError) as err:
            value = err
        if isinstance(value, dict):
            return value
        log.warning("%s is not what `winnow ablate` writes (%s); the report leaves it out: re-run the study", p,
                    value if isinstance(value, Exception) else f"a JSON {type(value).__name__}, not an object")  # fmt: skip
        return None

    def optional_csv(p: Path) -> pl.DataFrame | None:
        if not p.is_file():
            return None
        try:
            return pl.read_csv(p)
        except (pl.exceptions.PolarsError, UnicodeDecodeError) as err:
            log.warning(
                "%s is not what `winnow ablate` writes (%s); the report leaves it out: re-run the study", p, err
            )
            return None

    def _calibrated(value: dict | None) -> dict | None:
        from winnow.pipelines.report.counterfactual import calibrated_record

        if value is None or calibrated_record(value) is not None:
            return value
        log.warning(
            "%s is not what `winnow ablate` writes (a key missing, or of another shape); the report leaves it out "
            "and leads with the run's own counterfactual: re-run the study",
            layout.calibrated_json,
        )
        return None

    table = optional_csv(layout.table_csv)
    if table is None:
        raise InputError(f"{layout.table_csv} cannot be read (cut short or edited); re-run the study (`winnow ablate`)")
    effects = optional_json(layout.effects_json)
    correlation = optional_json(layout.correlation_json)
    calibrated = _calibrated(optional_json(layout.calibrated_json))
    if calibrated is None and not layout.calibrated_json.exists() and "calibrated" in (correlation or {}):
        log.warning(
            "%s is missing, though %s holds its check; the report leads with the run's own counterfactual: "
            "re-run `winnow ablate` on the study's file to write it again (the runs it has are not trained again)",
            layout.calibrated_json,
            layout.correlation_json,
        )
    return Study(
        layout=layout,
        table=table,
        effects=optional_csv(layout.effects_csv),
        summary=(effects or {}).get("summary", []),
        correlation=correlation,
        cells=optional_csv(layout.cells_csv),
        calibrated=calibrated,
        mixes=optional_json(layout.mixes_json),
        adaptive=optional_json(layout.adaptive_json),
        images=sorted(layout.tables.glob("*.png")),
    )
