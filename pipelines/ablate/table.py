"""The study's results: the effects per variant, the per-run table (CSV, Markdown), the heatmap, the curves and the
comparison with the attribution."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from winnow.pipelines.ablate.calibrate import calibrate, check_text
from winnow.pipelines.ablate.compare import Effect, effects, finite_loss
from winnow.pipelines.ablate.correlation import (
    above_noise_text,
    compare_with_counterfactual,
    figures_text,
    measurement_text,
    rho_text,
    slope_of,
)
from winnow.pipelines.ablate.layout import StudyLayout, write_atomic
from winnow.train.jsonl import json_line


def results_frame(results: list[dict], sources: list[str]) -> pl.DataFrame:
    """One row per run: kind, seed, normalised weights, held-out loss and delta vs the baseline per source."""
    baseline = results[0]["held_out"]
    rows = []
    for r in results:
        weights = (r.get("mixing") or {}).get("mix_weights_mean") or r["weights"]  # an adaptive run: its mean mix
        row = {
            "variant": r["name"],
            "kind": r["kind"],
            "seed": r["seed"],
            "weights": " ".join(f"{k}={w / sum(weights.values()):.3f}" for k, w in weights.items()),
        }
        row |= {f"loss_{s}": r["held_out"].get(s) for s in sources}
        row |= {
            f"delta_{s}": (r["held_out"][s] - baseline[s])
            if r["held_out"].get(s) is not None and baseline.get(s) is not None
            else None
            for s in sources
        }
        rows.append(row)
    return pl.DataFrame(rows, schema_overrides={f"{p}_{s}": pl.Float64 for s in sources for p in ("loss", "delta")})


def _row(cells: list[str]) -> str:
    """One Markdown table row; a ``|`` inside a cell (a source named ``x|y``) is escaped, as GitHub's tables need."""
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def markdown_table(frame: pl.DataFrame) -> str:
    header = list(frame.columns)
    lines = [_row(header), "|" + "---|" * len(header)]
    lines += [
        _row([
            f"{v:+.4f}" if isinstance(v, float) and k.startswith("delta") else f"{v:.4f}" if isinstance(v, float) else str(v)
            for k, v in zip(header, r)
        ])
        for r in frame.iter_rows()
    ]  # fmt: skip
    return "\n".join(lines)


def baseline_attributions(layout: StudyLayout, results: list[dict]) -> tuple[list, list]:
    """The decomposition and the counterfactual of each baseline seed that recorded them (same sources as the first)."""
    from winnow.pipelines.report.training import is_run_dir, load_run

    found, counterfactuals = [], []
    for r in results:
        folder = layout.run_dir(r["name"])
        if r["kind"] in ("baseline", "noise") and is_run_dir(folder):
            run = load_run(folder)
            if run.attribution is not None and (not found or run.attribution.sources == found[0].sources):
                found.append(run.attribution)
            cf = run.counterfactual
            if (
                cf is not None
                and cf.slope is not None
                and (
                    not counterfactuals
                    or (cf.sources, cf.held_out) == (counterfactuals[0]["sources"], counterfactuals[0]["held_out"])
                )
            ):
                counterfactuals.append(
                    {
                        "sources": cf.sources,
                        "held_out": cf.held_out,
                        "slope": cf.slope,
                        "slope_se": cf.slope_se,
                        "saturation": cf.saturation,
                    }
                )
    return found, counterfactuals


def efficiency(attributions: list) -> dict | None:
    """How the attributed changes add up to the measured ones (records that carry ``measured``): per held-out
    source the measured change, the part credited to sources, and the quadrature residual relative to it."""
    rows = [a for a in attributions if getattr(a, "measured", None) is not None]
    if not rows:
        return None
    measured = np.mean([a.measured for a in rows], axis=0)
    attributed = np.mean([a.matrix.sum(axis=0) for a in rows], axis=0)
    residual = np.mean([a.residual if a.residual is not None else np.zeros_like(a.measured) for a in rows], axis=0)
    scale = np.where(np.abs(measured) > 0, np.abs(measured), np.nan)
    return {
        "sources": rows[0].sources,
        "measured": measured.tolist(),
        "attributed": attributed.tolist(),
        "residual": residual.tolist(),
        "residual_relative_max": float(np.nanmax(np.abs(residual) / scale)),
        "attributed_share": (attributed / np.where(measured == 0, np.nan, measured)).tolist(),
    }


def write_study(
    study: Path,
    results: list[dict],
    sources: list[str],
    base: dict[str, float],
    *,
    target: str = "mean",
    curation: dict[str, dict] | None = None,
    interval: str = "auto",
) -> str:
    """Write the effects (one row per variant), the per-run table (CSV, Markdown), heatmap, curves, attribution
    comparison and (random mixes) the regression and proposal; returns the effects and the per-run table in
    Markdown with their summary lines. ``curation``: what each curated job kept (``prepare.summary``)."""
    from winnow.pipelines.report import plots

    layout = StudyLayout(Path(study))
    frame = results_frame(results, sources)
    layout.tables.mkdir(parents=True, exist_ok=True)
    found = effects(results, sources, curation)
    summary = write_effects(layout, found, sources)
    frame.write_csv(layout.table_csv)
    markdown = markdown_table(frame)
    write_atomic(layout.table_md, summary + "\n\n" + markdown + "\n")
    markdown = summary + "\n\n" + markdown
    heatmap = plots.ablation_heatmap(frame.filter(pl.col("variant") != "baseline"))
    if heatmap:
        layout.heatmap_png.write_bytes(heatmap)
    attributions, counterfactuals = baseline_attributions(layout, results)
    if counterfactuals:
        summary = compare_with_counterfactual(results, counterfactuals, base, interval=interval)
        summary |= {"attribution_runs": len(attributions), "efficiency": efficiency(attributions)}
        cells = summary.pop("cells")
        summary["note"] = noise_note(summary)
        slope, error, cf_sources, held_out, q = slope_of(counterfactuals, interval)
        calibrated = calibrate(cells, slope, error, cf_sources, held_out, q, base)
        if calibrated is not None:
            record, cells = calibrated
            summary["calibrated"] = record["check"]
            write_atomic(layout.calibrated_json, json_line(record, indent=1))
        else:
            layout.calibrated_json.unlink(missing_ok=True)
        cells.write_csv(layout.cells_csv)
        rho = summary.get("calibrated", {}).get("spearman")
        layout.scatter_png.write_bytes(plots.attribution_scatter(cells, summary["spearman"], rho))
        write_atomic(layout.correlation_json, json_line(summary, indent=1))
        markdown += "\n\n" + agreement_text(summary)
        if calibrated is not None:
            markdown += "\n" + check_text(calibrated[0])
    elif any(r["kind"] in ("leave_one_out", "weights") for r in results):
        markdown += (
            "\n\nNo counterfactual of the baseline to set beside the measured deltas: its run recorded none "
            "([ablate] attribution_every = 0, or [train.attribution] start at or past the steps, so no stretch closed)"
        )
    if any(r["kind"] == "random_mix" for r in results):
        markdown += "\n\n" + write_mixes(layout, results, base, target)
    if any(r["kind"] == "adaptive" for r in results):
        markdown += "\n\n" + write_adaptive(layout, results, list(base), target)
    return markdown


def agreement_text(summary: dict) -> str:
    """The counterfactual against the study's measurements, in a few lines."""
    if not summary["n_cells"]:  # a study of curation variants alone: nothing the mix counterfactual predicts
        return "Counterfactual: no variant of the mix to compare it with (the study varies the curation)"
    lines = [
        f"Counterfactual (the baseline's, {summary['counterfactual_runs']} seed(s)) against the measured deltas: "
        f"signs agree on {summary['sign_agree']} of the {above_noise_text(summary)}, sizes within "
        f"a factor 2 on {summary['within_2x']}/{summary['above_noise']}; Spearman {rho_text(summary['spearman'])} over "
        f"all {summary['n_cells']} cells"
    ]
    lines += [f"  {figures_text(kind, part)}" for kind, part in summary["by_kind"].items()]
    if summary.get("measurement"):
        lines.append(measurement_text(summary["measurement"]))
    return "\n".join([*lines, summary["note"]])


def write_effects(layout: StudyLayout, found: list[Effect], sources: list[str]) -> str:
    """``effects.csv`` / ``.json`` / ``.md`` and ``curves.png``; returns the Markdown (a table, then one sentence each)."""
    frame = pl.DataFrame([e.row(sources) for e in found], infer_schema_length=None)
    frame.write_csv(layout.effects_csv)
    sentences = [e.sentence() for e in found[1:]]
    write_atomic(
        layout.effects_json,
        json_line({"sources": sources, "effects": [e.to_json() for e in found], "summary": sentences}, indent=1),
    )
    curves = curves_plot(found)
    if curves is not None:
        layout.curves_png.write_bytes(curves)
    else:
        layout.curves_png.unlink(missing_ok=True)
    markdown = effects_markdown(found, sources) + "\n\n" + "\n".join(f"- {line}" for line in sentences)
    write_atomic(layout.effects_md, markdown + "\n")
    return markdown


def effects_markdown(found: list[Effect], sources: list[str]) -> str:
    """One row per variant: the mean held-out delta with its noise and verdict, the curve, the curation, per source."""

    def measured(m) -> str:
        return "" if m is None else f"{m.value:+.4f}" + (f" ± {m.noise:.4f}" if m.noise is not None else "")

    curves = any(e.curve is not None for e in found)
    curated = any(e.curation is not None for e in found)
    header = ["variant", "change", "seeds", "mean held-out Δ", "verdict"]
    header += ["curve area Δ", "first step at baseline final"] if curves else []
    header += ["train rows (Δ)", "train tokens (Δ)"] if curated else []
    header += [f"Δ {s}" for s in sources]
    lines = [_row(header), "|" + "---|" * len(header)]
    for i, e in enumerate(found):
        # the baseline's row: its own mean held-out loss, against which every Δ is measured
        mean = f"loss {np.mean(list(e.held_out.values())):.4f}" if i == 0 else measured(e.mean)
        cells = [e.variant, e.describe, str(e.seeds), mean, "" if i == 0 else e.mean.verdict]
        if curves:
            c = e.curve
            cells += [
                "" if c is None or i == 0 else f"{measured(c.area)} ({c.area.verdict})",
                "" if c is None else str(c.first_step if c.first_step is not None else "never"),
            ]
        if curated:
            c = e.curation
            cells += (
                ["", ""]
                if c is None
                else [f"{c.rows} ({c.rows_change:+.1%})", f"{c.tokens} {c.unit} ({c.tokens_change:+.1%})"]
            )
        cells += ["" if i == 0 else measured(e.delta.get(s)) for s in sources]
        lines.append(_row(cells))
    return "\n".join(lines)


def curves_plot(found: list[Effect]) -> bytes | None:
    """Mean held-out loss over training: the baseline (its seeds' mean) and each variant with a curve."""
    drawn = [e for e in found if e.curve is not None]
    if not drawn:
        return None
    from winnow.pipelines.report import plots

    fig, ax = plots._subplots(figsize=(8, 4.5))
    for e in drawn:
        ax.plot(
            e.curve.steps,
            e.curve.loss,
            label=e.variant,
            linewidth=2.5 if e.kind == "baseline" else 1.2,
            color="black" if e.kind == "baseline" else None,
        )
    if drawn[0].kind == "baseline":  # the final loss every variant's "first step" is measured against
        ax.axhline(drawn[0].curve.loss[-1], color="gray", linestyle=":", linewidth=1)
    ax.set(title="mean held-out loss over training (mean over seeds)", xlabel="step", ylabel="nats")
    plots.legend(ax, fontsize=7)
    return plots._png(fig)


def noise_note(summary: dict) -> str:
    """One sentence on whether the seed noise is well below the effects the study compares."""
    seeds, ratio = summary["seeds"], summary["effect_to_noise"]
    repeats = summary.get("variant_seeds", 1)
    runs = f"{seeds} baseline seeds and {repeats} seed(s) per variant"
    if summary["noise_ok"]:
        return (
            f"Noise from {runs} is well below the effects (the median variant's effect on what it varied is "
            f"{ratio:.1f}x its noise)."
        )
    why = (
        f"only {seeds} baseline seed(s) (at least 3 give a noise estimate; [ablate] noise_seeds)"
        if seeds < 3 or ratio is None
        else f"with {runs}, the median variant's effect on what it varied is only {ratio:.1f}x the noise (2 standard "
        "errors of a delta; "
        "more seeds: [ablate] variant_seeds, or longer runs: [ablate] steps)"
    )
    return f"Warning: the seed noise is not well below the effects: {why}; read the agreement figures with care."


def write_mixes(layout: StudyLayout, results: list[dict], base: dict[str, float], target: str) -> str:
    """``mixes.json`` for a random_mixes study; returns its Markdown summary."""
    from winnow.pipelines.ablate.mixes import fit_mixes, summarize

    steps = next(r["steps"] for r in results if r["kind"] == "random_mix")
    sources = list(base)
    summary = summarize(fit_mixes(results, sources, steps=steps), results, base, target)
    fit = summary["fit"]
    lines = [
        f"Regression over {len(fit['runs'])} runs of {steps} steps: R² "
        + ", ".join(f"{s} {fit['r2'][s]:.2f}" for s in sources)
        + "; leave-one-out error "
        + ", ".join(f"{s} {fit['cv_rmse'][s]:.4f}" for s in sources)
        + " nats."
    ]
    if "proposed" in summary:
        p, b, noise = summary["proposed"], summary["baseline"], summary["noise"]
        lines.append(
            f"Proposed mix for target {target!r}: "
            + ", ".join(f"{k}={w:.3f}" for k, w in p["weights"].items())
            + f"; held-out {target} loss {p['measured']:.4f} vs baseline {b['measured']:.4f} "
            f"({-summary['improvement']:+.4f} nats; seed noise "
            + (f"{noise:.4f})" if noise is not None else "not measured: noise_seeds = 1)")
        )
    summary["summary"] = lines
    write_atomic(layout.mixes_json, json_line(summary, indent=1))
    return "\n".join(lines)


def held_sources(baseline: dict, sources: list[str]) -> list[str]:
    """The ``sources`` the baseline run measured a held-out loss on (those with val rows)."""
    return [s for s in sources if baseline["held_out"].get(s) is not None]


def write_adaptive(layout: StudyLayout, results: list[dict], sources: list[str], target: str) -> str:
    """``adaptive.json``: each adaptive run's mix and its held-out target loss beside the baseline's (and the
    regression's proposal, when the study has one), with the seed noise; returns its Markdown summary."""
    from winnow.pipelines.ablate.mixes import target_of

    baseline = next(r for r in results if r["kind"] == "baseline")
    sources = held_sources(baseline, sources)  # a source with train rows and no val rows has no held-out loss

    def measured(r: dict) -> float:
        losses = [finite_loss(r, s) for s in sources]  # a diverged run's NaN stays NaN: its verdict, not a number
        return float(target_of(np.array([np.nan if v is None else v for v in losses]), sources, target))

    proposed = next((r for r in results if r["kind"] == "proposed"), None)
    noise = max([abs(measured(r) - measured(baseline)) for r in results if r["kind"] == "noise"], default=None)
    noise_text = f"seed noise {noise:.4f}" if noise is not None else "seed noise not measured: noise_seeds = 1"
    out = {"target": target, "noise": noise, "measured": {"baseline": measured(baseline)}, "runs": {}}
    if proposed is not None:
        out["measured"]["proposed"] = measured(proposed)
    lines = []
    for run in (r for r in results if r["kind"] == "adaptive"):
        mean = run.get("mixing", {}).get("mix_weights_mean", {})
        out["runs"][run["name"]] = {
            "mix_weights_mean": mean,
            "mix_weights_final": run.get("mixing", {}).get("mix_weights", {}),
        }
        out["measured"][run["name"]] = measured(run)
        line = (
            f"Adaptive mix ({run['name']}, reference: the baseline run): held-out {target} loss "
            f"{measured(run):.4f} vs baseline {measured(baseline):.4f} ({measured(run) - measured(baseline):+.4f} nats"
        )
        if proposed is not None:
            line += f"; the regression's proposed mix {measured(proposed) - measured(baseline):+.4f}"
        lines.append(
            line
            + f"; {noise_text}). Its mean weights over the run: "
            + ", ".join(f"{k}={w:.3f}" for k, w in mean.items())
        )
    out["summary"] = lines
    write_atomic(layout.adaptive_json, json_line(out, indent=1))
    return "\n".join(lines)
