"""The study's results: the table (CSV, Markdown), the heatmap and the comparison with the attribution."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from pipelines.ablate.correlation import compare_with_attribution
from pipelines.ablate.layout import StudyLayout, write_atomic


def results_frame(results: list[dict], sources: list[str]) -> pl.DataFrame:
    """One row per run: kind, seed, normalised weights, held-out loss and delta vs the baseline per source."""
    baseline = results[0]["held_out"]
    rows = []
    for r in results:
        row = {"variant": r["name"], "kind": r["kind"], "seed": r["seed"],
               "weights": " ".join(f"{k}={w / sum(r['weights'].values()):.3f}" for k, w in r["weights"].items())}
        row |= {f"loss_{s}": r["held_out"].get(s) for s in sources}
        row |= {f"delta_{s}": (r["held_out"][s] - baseline[s]) if r["held_out"].get(s) is not None and
                baseline.get(s) is not None else None for s in sources}
        rows.append(row)
    return pl.DataFrame(rows, schema_overrides={f"{p}_{s}": pl.Float64 for s in sources for p in ("loss", "delta")})


def markdown_table(frame: pl.DataFrame) -> str:
    header = list(frame.columns)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(f"{v:+.4f}" if isinstance(v, float) and k.startswith("delta") else
                                f"{v:.4f}" if isinstance(v, float) else str(v) for k, v in zip(header, r)) + " |"
              for r in frame.iter_rows()]
    return "\n".join(lines)


def write_study(study: Path, results: list[dict], sources: list[str], base: dict[str, float]) -> str:
    """Write the table (CSV, Markdown), heatmap and attribution comparison; returns the Markdown table."""
    from pipelines.report import plots
    from pipelines.report.training import is_run_dir, load_run

    layout = StudyLayout(Path(study))
    frame = results_frame(results, sources)
    layout.tables.mkdir(parents=True, exist_ok=True)
    frame.write_csv(layout.table_csv)
    markdown = markdown_table(frame)
    write_atomic(layout.table_md, markdown + "\n")
    heatmap = plots.ablation_heatmap(frame.filter(pl.col("variant") != "baseline"))
    if heatmap:
        layout.heatmap_png.write_bytes(heatmap)
    run = load_run(layout.root) if is_run_dir(layout.root) else None
    if run is not None and run.attribution is not None:
        summary = compare_with_attribution(results, run.attribution.sources, run.attribution.matrix, base)
        cells = summary.pop("cells")
        cells.write_csv(layout.cells_csv)
        layout.scatter_png.write_bytes(plots.attribution_scatter(cells, summary["spearman"]))
        write_atomic(layout.correlation_json, json.dumps(summary, indent=1))
        markdown += (f"\n\nSpearman rank correlation, first-order prediction vs measured delta: {summary['spearman']:.3f} "
                     f"over {summary['n_cells']} cells; signs agree on {summary['sign_agree']}/{summary['above_noise']} "
                     f"cells whose |delta| exceeds the seed-to-seed noise")
    return markdown
