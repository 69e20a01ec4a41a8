"""The report's figures: matplotlib (Agg) PNGs, one function per figure, one colour per source throughout.

Every function takes plain arrays or the readers' objects and returns PNG bytes, so the page
can embed them and tests can decode them; nothing here reads files.
"""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")  # headless: CI and `winnow run` have no display
matplotlib.rcParams["text.parse_math"] = False  # labels are names from data (`$\foo{x}$`): plain text, never math

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from winnow.pipelines.report.curation import CurationJob  # noqa: E402
from winnow.pipelines.report.training import Attribution, TrainingRun  # noqa: E402
from winnow.train.alerts import AlertKind  # noqa: E402

#: One colour per alert kind; tests/pipelines/test_report_alerts.py fails when a kind has none.
ALERT_COLORS = {
    AlertKind.LOSS_SPIKE: "tab:red",
    AlertKind.NONFINITE: "black",
    AlertKind.GRAD_NORM: "tab:orange",
    AlertKind.THROUGHPUT_DROP: "tab:purple",
    AlertKind.DATA_WAIT: "tab:brown",
}


def palette(sources: list[str]) -> dict[str, tuple]:
    """A fixed colour per source name (sorted, so a source keeps its colour across pages)."""
    cmap = plt.get_cmap("tab10")
    return {name: cmap(i % 10) for i, name in enumerate(sorted(sources))}


def _subplots(*args, **kw):
    # constrained layout: long tick labels (reject reasons, stage ids) never overlap a neighbouring panel
    return plt.subplots(*args, layout="constrained", **kw)


def legend(ax, **kw) -> None:
    """The axes' legend, when something on them carries a label (matplotlib warns on an empty one)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kw)


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


# ---- curation -------------------------------------------------------------------------------
def funnel(job: CurationJob) -> bytes:
    """Rows after each stage, and the rows each reject reason removed (stacked by source; no panel without rejects)."""
    stages = job.funnel()
    reasons = job.rejects_by_reason()
    colors = palette(job.sources)
    height = max(3.5, 0.3 * max(len(stages), len(reasons)) + 1)
    if not reasons:  # a chart of nothing would only show empty axes
        fig, ax1 = _subplots(figsize=(6.5, height))
        ax2 = None
    else:
        fig, (ax1, ax2) = _subplots(1, 2, figsize=(13, height))
    names = [s["id"] for s in stages][::-1]
    ax1.barh(names, [s["rows_out"] for s in stages][::-1], color="tab:blue", label="rows out")
    ax1.barh(
        names,
        [s["rows_rejected"] for s in stages][::-1],
        left=[s["rows_out"] for s in stages][::-1],
        color="tab:gray",
        alpha=0.6,
        label="rejected",
    )
    ax1.set(title="Rows per stage", xlabel="rows")
    legend(ax1, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=2)
    if ax2 is None:
        return _png(fig)
    labels = list(reasons)[::-1]
    left = np.zeros(len(labels))
    for source in job.sources:
        counts = np.asarray([reasons[r].get(source, 0) for r in labels], dtype=float)
        ax2.barh(labels, counts, left=left, color=colors[source], label=source)
        left += counts
    ax2.set(title="Rejected rows by reason", xlabel="rows")
    ax2.tick_params(axis="y", labelsize=7)
    legend(ax2, loc="lower right", fontsize=8)
    return _png(fig)


def mix_shares(job: CurationJob) -> bytes | None:
    """Target vs realized share of training tokens per source (the mix stage's report)."""
    report = job.mix_report()
    if not report or not report.get("sources"):
        return None
    sources = list(report["sources"])
    colors = palette(job.sources or sources)
    x = np.arange(len(sources))
    target = [report["sources"][s].get("target_share", np.nan) for s in sources]
    realized = [report["sources"][s].get("realized_share", np.nan) for s in sources]
    fig, ax = _subplots(figsize=(6.5, 3.5))
    ax.bar(x - 0.2, target, 0.4, color=[colors[s] for s in sources], alpha=0.45, edgecolor="black", label="target")
    ax.bar(x + 0.2, realized, 0.4, color=[colors[s] for s in sources], edgecolor="black", hatch="//", label="realized")
    ax.set_xticks(x, sources)
    ax.set(title=f"Mix: share of training tokens ({report.get('scheme', '')})", ylabel="share")
    legend(ax)
    return _png(fig)


def score_histograms(frame, sources: list[str]) -> bytes | None:
    """One panel per score column, a step histogram per source."""
    columns = [c for c in frame.columns if c != "source"] if frame is not None else []
    if not columns:
        return None
    colors = palette(sources)
    fig, axes = _subplots(1, len(columns), figsize=(5.5 * len(columns), 3.5), squeeze=False)
    for ax, column in zip(axes[0], columns):
        values = frame.get_column(column).to_numpy()
        finite = values[np.isfinite(values)]
        edges = np.histogram_bin_edges(finite, bins=30) if finite.size else np.linspace(0, 1, 31)
        src = frame.get_column("source").to_numpy()
        for source in sources:
            part = values[(src == source) & np.isfinite(values)]
            if part.size:
                ax.hist(part, bins=edges, histtype="step", linewidth=1.5, color=colors[source], label=source)
        ax.set(title=f"{column} by source", xlabel=column, ylabel="documents")
        legend(ax, fontsize=8)
    return _png(fig)


def curriculum(means: list[tuple[str, float]], column: str) -> bytes | None:
    """Mean of the ordering column per training shard, in the order the loader reads them."""
    if not means:
        return None
    fig, ax = _subplots(figsize=(6.5, 3.2))
    ax.plot(np.arange(len(means)), [m for _, m in means], marker="o")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # shards are counted: no tick at shard 0.5
    ax.set(title=f"Curriculum: mean {column} by shard", xlabel="training shard (read order)", ylabel=f"mean {column}")
    return _png(fig)


# ---- training -------------------------------------------------------------------------------
def loss_curves(run: TrainingRun) -> bytes:
    """Training (solid) and held-out (dashed) loss, overall and per source."""
    colors = palette(run.sources)
    fig, ax = _subplots(figsize=(8, 4))
    ax.plot(*run.column("loss"), color="black", linewidth=2, label="train (all)")
    steps, held = run.eval_column()
    if steps.size:
        ax.plot(steps, held, color="black", linestyle="--", marker="o", label="held-out (all)")
    for source in run.sources:
        ax.plot(*run.per_source(source), color=colors[source], linewidth=1, label=f"train {source}")
        steps, held = run.eval_column(source)
        if steps.size:
            ax.plot(steps, held, color=colors[source], linestyle="--", marker=".", label=f"held-out {source}")
    ax.set(title="Loss", xlabel="step", ylabel="cross-entropy (nats/token)")
    legend(ax, fontsize=7, ncol=2)
    return _png(fig)


def mix_weights(run: TrainingRun) -> bytes | None:
    """An adaptive run's mix weights per source (solid) and their running mean (dotted); None without them."""
    rows = [r for r in run.logs if r.get("mix_weights")]
    if not rows:
        return None
    colors = palette(run.sources)
    fig, ax = _subplots(figsize=(8, 3.2))
    steps = [r["step"] for r in rows]
    for source in rows[-1]["mix_weights"]:
        color = colors.get(source)
        ax.plot(steps, [r["mix_weights"].get(source) for r in rows], color=color, label=source)
        ax.plot(steps, [(r.get("mix_weights_mean") or {}).get(source) for r in rows], color=color, linestyle=":")
    ax.set(
        title="Adaptive mix: weight per source (dotted: mean so far)",
        xlabel="step",
        ylabel="share of sequences",
        ylim=(0, 1),
    )
    legend(ax, fontsize=7, ncol=2)
    return _png(fig)


def optimizer(run: TrainingRun) -> bytes:
    """Learning rate and (pre-clip) gradient norm."""
    fig, (ax1, ax2) = _subplots(1, 2, figsize=(11, 3.2))
    ax1.plot(*run.column("lr"), color="tab:blue")
    ax1.set(title="Learning rate", xlabel="step", ylabel="lr")
    ax2.plot(*run.column("grad_norm"), color="tab:orange")
    clip = run.section("optim").get("grad_clip")
    if clip:
        ax2.axhline(clip, color="gray", linestyle=":", label=f"grad_clip = {clip:g}")
        legend(ax2)
    ax2.set(title="Gradient norm (before clipping)", xlabel="step", ylabel="global L2 norm")
    return _png(fig)


def throughput(run: TrainingRun) -> bytes:
    """Tokens/s, the share of time spent waiting for data, and memory."""
    fig, (ax1, ax2, ax3) = _subplots(1, 3, figsize=(13, 3.2))
    ax1.plot(*run.column("tokens_per_s"), color="tab:green")
    ax1.set(title="Throughput", xlabel="step", ylabel="tokens/s")
    ax2.plot(*run.column("data_wait_pct"), color="tab:brown", label="data wait")
    steps, comm = run.column("comm_pct")
    if steps.size:
        ax2.plot(steps, comm, color="tab:purple", label="communication")
    ax2.set(title="Time waiting", xlabel="step", ylabel="% of interval", ylim=(0, 100))
    legend(ax2)
    steps, gib, what = run.memory()
    ax3.plot(steps, gib, color="tab:red")
    ax3.set(title=f"Memory ({what or 'not logged'})", xlabel="step", ylabel="GiB")
    return _png(fig)


def expert_load(run: TrainingRun) -> bytes | None:
    """Mean load share per expert per layer, and each source's routing per layer."""
    load_ME = run.expert_load()
    routing_SME = run.routing()
    if not load_ME.size:
        return None
    n_layers, n_experts = load_ME.shape
    fig, axes = _subplots(1, 1 + n_layers, figsize=(4.5 + 3.2 * n_layers, 3.4), squeeze=False)
    ax = axes[0, 0]
    image = ax.imshow(
        load_ME * n_experts, cmap="viridis", vmin=0, vmax=max(2.0, float(load_ME.max() * n_experts)), aspect="auto"
    )
    ax.set(title="Expert load (1 = uniform)", xlabel="expert", ylabel="MoE layer")
    ax.set_yticks(np.arange(n_layers))
    ax.set_xticks(np.arange(n_experts))
    fig.colorbar(image, ax=ax)
    if routing_SME.size:
        total_SM1 = routing_SME.sum(axis=2, keepdims=True)
        # a source with no tokens yet is blank, not "routed nowhere"
        share_SME = np.where(total_SM1 > 0, routing_SME / np.maximum(total_SM1, 1), np.nan)
        for layer in range(n_layers):
            ax = axes[0, 1 + layer]
            image = ax.imshow(share_SME[:, layer, :], cmap="magma", vmin=0, aspect="auto")
            ax.set(title=f"Routing, layer {layer}", xlabel="expert")
            ax.set_xticks(np.arange(n_experts))
            ax.set_yticks(np.arange(len(run.sources)), run.sources, fontsize=8)
            fig.colorbar(image, ax=ax, label="share of the source's assignments")
    return _png(fig)


def _signed_heatmap(ax, matrix: np.ndarray, limit: float):
    """A diverging map centred on 0 (blue = lower loss) with each cell's value in a colour that reads on it."""
    image = ax.imshow(matrix, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto")
    for (i, j), value in np.ndenumerate(matrix):
        if np.isfinite(value):
            dark = abs(value) > 0.55 * limit  # the map's ends are dark: white text there, black elsewhere
            ax.text(j, i, f"{value:+.3g}", ha="center", va="center", fontsize=8, color="white" if dark else "black")
    return image


def attribution(attr: Attribution) -> bytes:
    """The decomposition matrix (rows train on, columns held-out sets, blue = loss lowered), with the
    unattributed rest and the measured change as two more rows when the record has them."""
    labels, rows = list(attr.sources), [attr.matrix]
    if attr.measured is not None and attr.unattributed is not None:
        labels += ["(other)", "= measured"]
        rows += [attr.unattributed[None], attr.measured[None]]
    matrix = np.concatenate(rows)
    limit = float(np.nanmax(np.abs(matrix))) or 1.0
    fig, ax = _subplots(figsize=(1.2 * len(attr.sources) + 3, 0.6 * len(labels) + 2))
    image = _signed_heatmap(ax, matrix, limit)
    ax.set_xticks(np.arange(len(attr.sources)), attr.sources, rotation=30)
    ax.set_yticks(np.arange(len(labels)), labels)
    if len(labels) > len(attr.sources):
        ax.axhline(len(attr.sources) - 0.5, color="black", linewidth=1)
    ax.set(
        title=f"Decomposition at step {attr.step}: held-out loss change by cause",
        xlabel="held-out set",
        ylabel="caused by training on",
    )
    fig.colorbar(image, ax=ax, label="nats (negative: lowered)")
    return _png(fig)


def counterfactual_title(factor: float) -> str:
    """What the bars of the counterfactual at share x ``factor`` say: less of a source raising held-out loss means
    it helps; more of it raising held-out loss means it hurts."""
    name = "left out" if factor == 0 else f"share x {factor:g}"
    verdict = "helps" if factor < 1 else "hurts"
    return f"Each training source {name}: predicted change of held-out loss (above 0: the source {verdict})"


def counterfactual(cf) -> bytes:
    """Per training source, the predicted change of each held-out loss if it were left out (bars, with the
    interval as error bars; the mean over the held-out sets hatched)."""
    factor = 0.0 if 0.0 in cf.predicted else cf.factors[0]
    S, B = len(cf.sources), len(cf.held_out)
    fig, ax = _subplots(figsize=(max(6.0, 1.3 * S + 3), 4))
    width = 0.8 / B
    colors = palette([h for h in cf.held_out if h != "mean"])
    for j, held_out in enumerate(cf.held_out):
        x = np.arange(S) + (j - (B - 1) / 2) * width
        ax.bar(
            x,
            cf.predicted[factor][:, j],
            width,
            yerr=cf.interval[factor][:, j],
            capsize=2,
            color=colors.get(held_out, "white"),
            edgecolor="black",
            hatch="//" if held_out == "mean" else None,
            label="mean of the held-out sets" if held_out == "mean" else held_out,
        )
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(np.arange(S), cf.sources)
    ax.set(
        title=counterfactual_title(factor),
        xlabel="training source",
        ylabel="nats",
    )
    legend(ax, fontsize=7, title="held-out set", ncols=2)
    return _png(fig)


def timeline(run: TrainingRun) -> bytes:
    """Step loss with every alert and skipped step marked where it happened."""
    fig, ax = _subplots(figsize=(10, 3.5))
    ax.plot(*run.column("step_loss"), color="gray", linewidth=1, label="step loss")
    seen = set()
    for alert in run.alerts:
        kind = alert.get("kind", "?")
        ax.axvline(
            alert.get("step", 0),
            color=ALERT_COLORS.get(kind, "tab:olive"),
            alpha=0.6,
            linewidth=1,
            label=None if kind in seen else f"alert: {kind}",
        )
        seen.add(kind)
    skipped = run.skipped_steps()
    if skipped:
        ymax = np.nanmax(run.column("step_loss")[1]) if run.logs else 1.0
        ax.scatter(
            [s for s, _ in skipped], [ymax] * len(skipped), marker="x", color="red", zorder=3, label="skipped step"
        )
    ax.set(title="Alerts and skipped steps", xlabel="step", ylabel="loss")
    legend(ax, fontsize=7, loc="upper right")
    return _png(fig)


def ablation_heatmap(frame) -> bytes | None:
    """Variants x sources of the held-out loss difference from the baseline (``delta_*`` / ``diff_*`` columns)."""
    if frame is None or frame.is_empty():
        return None
    columns = [c for c in frame.columns if c.startswith(("delta_", "diff_"))]
    label = "variant" if "variant" in frame.columns else frame.columns[0]
    if not columns:
        return None
    matrix = frame.select(columns).cast(float).to_numpy()
    limit = float(np.nanmax(np.abs(matrix))) if np.isfinite(matrix).any() else 1.0
    fig, ax = _subplots(figsize=(1.1 * len(columns) + 3, 0.5 * frame.height + 2))
    image = ax.imshow(matrix, cmap="RdBu_r", vmin=-(limit or 1.0), vmax=limit or 1.0, aspect="auto")
    ax.set_xticks(np.arange(len(columns)), [c.split("_", 1)[1] for c in columns], rotation=30)
    ax.set_yticks(np.arange(frame.height), [str(v) for v in frame.get_column(label)])
    ax.set(title="Ablation: held-out loss minus baseline (nats)", xlabel="held-out source")
    fig.colorbar(image, ax=ax)
    return _png(fig)


def attribution_scatter(cells, spearman: float | None, calibrated: float | None = None) -> bytes:
    """Predicted vs measured held-out loss change per (variant, source); hollow markers are within the noise.
    With a ``calibrated`` column (the study's calibrated counterfactual, each variant predicted without its own
    runs), a second panel shows it, titled with its Spearman ``calibrated``."""
    panels = [("predicted", "the run's counterfactual (nats)", "Attribution vs ablation", spearman)]
    if "calibrated" in cells.columns and cells["calibrated"].null_count() < cells.height:
        panels.append(("calibrated", "calibrated on the study, variant held back (nats)", "Calibrated", calibrated))
    fig, axes = _subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    colors = palette(cells["source"].unique().to_list())
    for ax, (column, xlabel, title, rho) in zip(axes[0], panels):
        for source in cells["source"].unique(maintain_order=True).to_list():
            part = cells.filter((cells["source"] == source) & cells[column].is_not_null())
            for above in (True, False):
                sel = part.filter(part["above_noise"] == above)
                if sel.height:
                    ax.scatter(
                        sel[column],
                        sel["measured"],
                        label=source if above else None,
                        edgecolors=[colors[source]],
                        facecolors=[colors[source]] if above else "none",
                    )
        ax.axhline(0, color="gray", linewidth=0.8)
        ax.axvline(0, color="gray", linewidth=0.8)
        ax.set(
            title=title + (f" (Spearman {rho:.2f})" if rho is not None else ""),
            xlabel=xlabel,
            ylabel="measured change vs baseline (nats)",
        )
        legend(ax, fontsize=8, title="held-out source")
    return _png(fig)
