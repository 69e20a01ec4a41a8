"""The dataset card: a ``README.md`` in the job folder that the Hugging Face Hub renders and loads.

The YAML header (``configs`` with ``data_files`` per split, ``dataset_info`` with typed features
and split sizes) is what the Hub reads to show the viewer and to let
``datasets.load_dataset(<repo or folder>)`` find the Parquet shards; the body says, for a person,
where the rows came from, what every stage did to them, and what each column holds. Everything
comes from the manifest and the shards' Parquet footers, so the card never disagrees with them.

The header is written by ``huggingface_hub``'s ``DatasetCardData``, which quotes any name YAML would
misread, and the Hub's ``DatasetCard`` reads the card back unchanged. Names from the job (sources,
columns, reasons, folders) are escaped in the body, so none can break a Markdown table or open raw HTML.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from winnow.curate.atomic import write_text_atomic
from winnow.curate.errors import WinnowError
from winnow.curate.wholefile import README_BYTES, read_whole
from winnow.curate.workdir import WorkDir

log = logging.getLogger(__name__)

CARD = "README.md"
MARK = "<!-- dataset card written by winnow curate; it is rewritten on every run -->"
_HF_SPLITS = {"train": "train", "val": "validation"}
_DOCS = {
    "id": "stable, unique id (the input's id field, else `<source>/<file>@<byte offset>`, or `/<row>` for Parquet)",
    "source": "the source name from the job file",
    "text": "the document text after cleaning",
    "meta": "JSON object: the input's other fields, verbatim",
    "split": "train or val",
    "quality": "quality score (higher is better)",
    "difficulty": "difficulty score used by the curriculum",
    "dsir_weight": "DSIR importance weight",
    "lang": "language code",
    "lang_score": "language-id confidence",
    "n_tokens": "tokens in the text",
    "order": "rank in the curriculum (read order)",
    "repeat": "n-th up-sampled copy of the row (0 = the original)",
}


def hf_dtype(t: pa.DataType) -> str:
    """The ``datasets`` Value dtype name of an Arrow type (``double`` is ``float64`` there, and so on)."""
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    return _ARROW_TO_HF.get(str(t), str(t))


_ARROW_TO_HF = {"double": "float64", "float": "float32", "halffloat": "float16"}


def remove_card(out: Path, *, work: WorkDir | None = None) -> None:
    """Remove a card an earlier run wrote (never a README the user put there); ``work``: also from its store."""
    path = Path(out) / CARD
    if work is not None and work.remote:
        work.fetch(path, missing_ok=True)
    if is_card(path):
        if work is not None:
            work.remove(path)
        else:
            path.unlink()


def is_card(path: Path) -> bool:
    """Whether ``path`` is a card winnow wrote (a README of the user's, a link, a huge file: never)."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        return MARK in read_whole(str(path), limit=README_BYTES, what="README").decode("utf-8", errors="replace")
    except WinnowError:
        return False


def write_card(out: Path, manifest: dict[str, Any]) -> Path | None:
    """Write ``<out>/README.md`` from the manifest; leaves a README winnow did not write alone."""
    path = Path(out) / CARD
    if (path.exists() or path.is_symlink()) and not is_card(path):
        log.warning("%s exists and was not written by winnow; the dataset card is not written", path)
        return None
    write_text_atomic(path, render_card(out, manifest))
    return path


def render_card(out: Path, manifest: dict[str, Any]) -> str:
    # only when a card is written; the card data's module alone (``huggingface_hub.DatasetCard`` imports the Hub's
    # whole client, ~0.3 s a job): the card is its YAML header and the body, as ``DatasetCard`` writes it
    from huggingface_hub.repocard_data import DatasetCardData

    shards = manifest.get("shards") or []
    parquet = [s for s in shards if s["format"] == "parquet"]
    schema = pq.read_schema(Path(out) / parquet[0]["path"]) if parquet else None
    splits = list(dict.fromkeys(s["split"] for s in shards))
    files = []
    for split in splits if parquet else []:
        folder = str(Path(next(s["path"] for s in parquet if s["split"] == split)).parent)
        files.append({"split": _HF_SPLITS.get(split, split), "path": f"{folder}/*.parquet"})
    info: dict[str, Any] = {}
    if schema is not None:
        info["features"] = [{"name": field.name, "dtype": hf_dtype(field.type)} for field in schema]
    info["splits"] = [
        {
            "name": _HF_SPLITS.get(split, split),
            "num_examples": sum(s["rows"] for s in parquet or shards if s["split"] == split),
            "num_bytes": sum(s.get("row_bytes", s["bytes"]) for s in parquet or shards if s["split"] == split),
        }
        for split in splits
    ]
    data = DatasetCardData(configs=[{"config_name": "default", "data_files": files}], dataset_info=info)
    job_file = manifest.get("job_file") or ""
    lines = [
        MARK,
        "",
        f"# {_text(str(manifest.get('job')))}",
        "",
        f"Curated by {_code(f'winnow curate {job_file}'.rstrip())}; counts and checksums of "
        "every file are in `manifest.json`, every removed row with its reason in `rejects/`.",
        "",
    ]
    lines += _sources(manifest) + _stages(manifest) + _features(schema) + _files(shards)
    return f"---\n{data.to_yaml()}\n---\n" + "\n".join(lines) + "\n"


def _text(name: str) -> str:
    """``name`` as plain Markdown text in a table cell or a heading: no table break, no HTML, no emphasis."""
    name = " ".join(name.splitlines())
    name = name.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"([\\`*_\[\]|#])", r"\\\1", name)


def _code(name: str) -> str:
    """``name`` as a code span that holds any text: backquotes longer than any run in it, ``|`` escaped for tables."""
    name = " ".join(name.splitlines()).replace("|", "\\|")
    ticks = "`" * (max((len(run) for run in re.findall("`+", name)), default=0) + 1)
    pad = " " if name.startswith("`") or name.endswith("`") else ""
    return f"{ticks}{pad}{name}{pad}{ticks}"


def _sources(manifest: dict[str, Any]) -> list[str]:
    inputs = {i["source"]: i for i in manifest.get("inputs") or []}
    out = [
        "## Sources",
        "",
        "| source | input | files | rows read | rows written | rejected |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for src, c in (manifest.get("by_source") or {}).items():
        inp = inputs.get(src, {})
        rejected = (
            sum((c.get("rejected") or {}).values()) if isinstance(c.get("rejected"), dict) else c.get("rejected", 0)
        )
        out.append(
            f"| {_text(src)} | {inp.get('format', '')} | {len(inp.get('files') or [])} | {c.get('read', 0)} | "
            f"{c.get('written', 0)} | {rejected} |"
        )
    t = manifest.get("totals") or {}
    out += [
        "",
        f"Total: {t.get('rows_read', 0)} rows read, {t.get('repeats', 0)} repeats, {t.get('rows_written', 0)} "
        f"written, {t.get('rows_rejected', 0)} rejected.",
        "",
    ]
    return out


def _stages(manifest: dict[str, Any]) -> list[str]:
    out = ["## Stages", "", "| stage | rows in | rows out | rejected | reasons |", "| --- | ---: | ---: | ---: | --- |"]
    for st in manifest.get("stages") or []:
        reasons = ", ".join(
            f"{_code(r)} {n}" for r, n in sorted((st.get("rejected") or {}).items(), key=lambda kv: -kv[1])
        )
        out.append(
            f"| {_code(st['id'])} | {st.get('rows_in', 0)} | {st.get('rows_out', 0)} | {st.get('rows_rejected', 0)} | {reasons} |"
        )
    return out + [""]


def _features(schema: pa.Schema | None) -> list[str]:
    if schema is None:
        return []
    out = ["## Features", "", "| column | type | holds |", "| --- | --- | --- |"]
    out += [f"| {_code(f.name)} | {hf_dtype(f.type)} | {_DOCS.get(f.name, '')} |" for f in schema]
    return out + [""]


def _files(shards: list[dict]) -> list[str]:
    out = ["## Files", "", "| folder | files | rows | bytes on disk |", "| --- | ---: | ---: | ---: |"]
    folders: dict[str, list[dict]] = {}
    for s in shards:
        folders.setdefault(str(Path(s["path"]).parent), []).append(s)
    for folder, group in folders.items():
        out.append(
            f"| {_code(folder + '/')} | {len(group)} | {sum(s['rows'] for s in group)} | {sum(s['bytes'] for s in group)} |"
        )
    return out
