"""The report page: one self-contained HTML file (PNG plots embedded as data URIs) for a job, a run, or both.

A tiny inline script records on ``<body>`` whether every image decoded and whether any script
error happened (``data-images-ok``, ``data-errors``), so a headless browser can check the page
with ``--dump-dom`` alone.
"""

from __future__ import annotations

import base64
import datetime
import html
import logging
import math
from pathlib import Path

import numpy as np

from winnow.curate.atomic import write_text_atomic
from winnow.curate.errors import InputError
from winnow.curate.workdir import is_url
from winnow.pipelines.ablate.correlation import above_noise_text, measurement_text, rho_text
from winnow.pipelines.ablate.layout import Study, load_study
from winnow.pipelines.report import continued, plots
from winnow.pipelines.report import counterfactual as cf_text
from winnow.pipelines.report.curation import CurationJob, is_job_dir, read_job_folder
from winnow.pipelines.report.diagnose import DiagnoseConfig, Finding, diagnose
from winnow.pipelines.report.training import TrainingRun, attribution_rows, is_run_dir, load_run

log = logging.getLogger(__name__)

_CSS = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.5em 0 1em}td,th{border:1px solid #ddd;padding:.25em .6em;text-align:right}
th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}img{max-width:100%;display:block;margin:.5em 0}
.finding{border-left:4px solid #e0a000;padding:.3em 1em;margin:1em 0;background:#fffbea}
.critical{border-color:#c00;background:#fff0f0}.muted{color:#777}code{background:#f4f4f4;padding:0 .2em}"""

# Records script errors, console.error calls, failed resources and image decoding into <body> attributes that --dump-dom shows.
CHECK_SCRIPT = """window.__errors=[];var __consoleError=console.error;
console.error=function(){window.__errors.push(Array.prototype.join.call(arguments,' '));
document.body&&document.body.setAttribute('data-errors',window.__errors.length);__consoleError.apply(console,arguments);};
window.addEventListener('error',function(e){window.__errors.push(String(e.message||e.type));
document.body&&document.body.setAttribute('data-errors',window.__errors.length);},true);
window.addEventListener('load',function(){var imgs=document.images,ok=0;
for(var i=0;i<imgs.length;i++){if(imgs[i].complete&&imgs[i].naturalWidth>0){ok++;}}
document.body.setAttribute('data-images-total',imgs.length);document.body.setAttribute('data-images-ok',ok);
document.body.setAttribute('data-errors',window.__errors.length);document.body.setAttribute('data-loaded','1');});"""


#: In the head of every page winnow writes: what ``winnow report`` may replace.
GENERATOR = '<meta name=generator content="winnow report">'
_OLD_PAGE = "<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>"  # pages from before the marker


def _check_replaceable(target: Path, what: str) -> None:
    """Refuse a target that is a folder, lies under a file, or is a file winnow did not write (the user's
    ``report.html`` beside a metrics file, or ``--output metrics.jsonl``)."""
    if target.is_dir():
        raise InputError(f"{what} {target} is a folder; give the page a file name (e.g. {target / 'report.html'})")
    if any(p.is_file() for p in target.parents):
        raise InputError(f"{what} {target} lies under a file; give a path in a folder")
    if not target.exists():
        return
    try:
        with open(target, "rb") as fh:
            head = fh.read(4096)
    except OSError as err:
        raise InputError(f"{what} {target} exists and cannot be read ({err.strerror}); give another path") from err
    _check_winnow_page(head, target, what)


def _check_winnow_page(head: bytes, target: Path | str, what: str) -> None:
    """Refuse ``target``, a file (or a store's object) whose first bytes are ``head``, unless winnow report wrote it."""
    text = head.decode("utf-8", errors="replace")
    if GENERATOR not in text and not (text.startswith(_OLD_PAGE) and _CSS[:60] in text):
        raise InputError(
            f"{what} {target} exists and is not a page winnow report wrote: winnow does not replace it; give another "
            "--output, or move the file"
        )


def locate(
    path: str | Path,
    storage_options: dict | None = None,
) -> tuple[CurationJob | None, TrainingRun | None, Study | None]:
    """The job, run and/or ablation study a folder holds: a run folder (and the job it trained on), a job
    folder (and its default run folder ``<job>/train``), a study folder (whose baseline run is at its top).
    A URL (``s3://...``) names a curation job on an object store, read in place."""
    if is_url(path):
        if not is_job_dir(path, storage_options):
            raise InputError(f"{path} holds no curation job (manifest.json); give the job's [job] output URL")
        return read_job_folder(path, storage_options), None, None
    path = Path(path)
    job = run = None
    study = load_study(path)
    if is_run_dir(path):
        run = load_run(path)
        if run.shards_dir is not None:
            job = read_job_folder(run.shards_dir)
    if is_job_dir(path):
        job = read_job_folder(path)
        if run is None and is_run_dir(path / "train"):
            run = load_run(path / "train")
    if job is None and run is None and study is None:
        if not is_url(path) and not Path(path).exists():
            raise InputError(f"{path} does not exist; give a job folder, a run folder or a study folder")
        raise InputError(
            f"{path} holds neither a curation job (manifest.json), a training run (metrics.jsonl) nor an ablation study"
        )
    return job, run, study


def _img(png: bytes | None, alt: str) -> str:
    if not png:
        return ""
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _table(header: list[str], rows: list[list[object]]) -> str:
    def cell(v: object) -> str:
        if isinstance(v, float):
            return "" if np.isnan(v) else f"{v:.4g}"
        return html.escape("" if v is None else str(v))

    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _findings(findings: list[Finding]) -> str:
    if not findings:
        return "<p>Nothing found: loss, throughput, memory, expert load and held-out losses look normal.</p>"
    parts = []
    for f in findings:
        items = "".join(f"<li>{html.escape(e)}</li>" for e in f.evidence)
        fixes = "".join(f"<li><code>{html.escape(s)}</code></li>" for s in f.settings)
        parts.append(
            f'<div class="finding {f.severity}"><h3>{html.escape(f.title)}</h3>'
            f"<p>Evidence:</p><ul>{items}</ul><p>What to change:</p><ul>{fixes}</ul></div>"
        )
    return "".join(parts)


def curation_section(job: CurationJob) -> str:
    totals = job.manifest.get("totals") or {}
    by_source = job.manifest.get("by_source") or {}
    rows = [[s, f.get("read"), f.get("written"), sum((f.get("rejected") or {}).values())] for s, f in by_source.items()]
    parts = [
        f"<h2>Curation: job {html.escape(job.name)}</h2>",
        f"<p class=muted>{html.escape(str(job.path))} — {totals.get('rows_read', '?')} rows read, "
        f"{totals.get('rows_written', '?')} written, {totals.get('rows_rejected', '?')} rejected, "
        f"{totals.get('repeats', 0)} repeats, {totals.get('seconds', '?')} s</p>",
        _table(["source", "read", "written", "rejected"], rows),
        "<h3>Funnel</h3>",
    ]
    if job.rejects_by_reason():
        parts.append(_img(plots.funnel(job), "rows per stage and rejects by reason"))
    else:
        parts += ["<p>No rejects: every row read reached the output.</p>", _img(plots.funnel(job), "rows per stage")]
    mix = job.mix_report()
    if mix:
        parts += [
            "<h3>Mix</h3>",
            _img(plots.mix_shares(job), "target vs realized shares"),
            _table(
                ["source", "target share", "realized share", "epochs", "rows dropped", "copies added"],
                [
                    [
                        s,
                        r.get("target_share"),
                        r.get("realized_share"),
                        r.get("epochs"),
                        r.get("rows_dropped"),
                        r.get("copies_added"),
                    ]
                    for s, r in mix.get("sources", {}).items()
                ],
            ),
        ]
    scores = job.score_columns()
    if scores is not None:
        parts += ["<h3>Scores</h3>", _img(plots.score_histograms(scores, job.sources), "score histograms")]
    column = job.ordering_column()
    if column:
        parts += ["<h3>Curriculum</h3>", _img(plots.curriculum(job.shard_means(column), column), "curriculum")]
    return "".join(parts)


def _run_summary(run: TrainingRun) -> str:
    last = run.logs[-1] if run.logs else {}
    final_eval = (run.evals[-1]["eval"].get("per_source") or {}) if run.evals else {}
    tokens = dict.fromkeys(run.sources, 0)  # every interval's: the share of the whole run, not of its last interval
    for record in run.logs:
        for source, figures in (record.get("per_source") or {}).items():
            n = (figures or {}).get("tokens") if isinstance(figures, dict) else None
            if isinstance(n, int | float) and math.isfinite(n):  # a hand-edited NaN or 1e400 counts nothing
                tokens[source] = tokens.get(source, 0) + int(n)
    total = sum(tokens.values())
    rows = []
    for source in run.sources:
        figures = (last.get("per_source") or {}).get(source) or {}
        rows.append(
            [
                source,
                figures.get("mean_loss"),
                final_eval.get(source),
                tokens.get(source, 0) / total if total else figures.get("token_share"),
                figures.get("loss_share"),
            ]
        )
    skipped = last.get("skipped_steps") or {}
    return (
        f"<p class=muted>{html.escape(str(run.path))} — step {last.get('step', '?')}, "
        f"{last.get('tokens_seen', '?')} tokens, skipped steps {html.escape(str(skipped))}, "
        f"precision {html.escape(str(run.config.get('precision', '?')))}</p>"
        + _table(
            [
                "source",
                "train loss (last interval)",
                "held-out loss (last eval)",
                "token share (the run)",
                "loss share (last interval)",
            ],
            rows,
        )
    )


def counterfactual_section(cf: cf_text.Counterfactual, study: Study | None = None) -> str:
    """What a change of the mix is predicted to do, in sentences per held-out set (the mean first), then as
    tables with the interval and, where a study measured the same variant, the measurement beside it."""
    steps = f"steps {cf.steps[0]}-{cf.steps[1]}" if cf.steps else f"step {cf.step}"
    if cf.calibrated:
        check = cf.calibrated["check"]
        basis = (
            f"calibrated on this study: the baseline run's counterfactual as the prior, the "
            f"{cf.calibrated['variants']} measured variants as the data (a mixing law per held-out set, the loss an "
            f"exponential of the shares' changes, share ratios bent by p = "
            f"{html.escape(cf_text.shapes_text(cf.calibrated))}). Checked by predicting each variant "
            f"without its own runs: signs right on {check['sign_agree']} of {check['above_noise']} cells above the "
            f"seed noise, sizes within a factor 2 on {check['within_2x']}, Spearman {rho_text(check['spearman'])} "
            f"over all {check['n_cells']} cells. A measurement beside a prediction holds "
            "the baseline seeds' own offset, which the predictions leave out ("
            + html.escape(cf_text.offsets_text(cf.calibrated))
            + " nats)"
        )
    else:
        basis = (
            f"read from this run ({html.escape(steps)}): each update's derivative by the source's share, through "
            "AdamW's first and second moments, with the recent updates counting most, and a response that "
            "saturates toward leaving a source out"
        )
    interval = "two posterior standard deviations" if cf.calibrated else "two standard errors"
    parts = [
        "<h2>Which source helps: what a change of the mix would do</h2>",
        f"<p>Predicted change of each held-out loss at the end of the run (nats, ± {interval}) if one "
        f"source's share of the training tokens were scaled, the others taking up the rest; {basis}. "
        "<i>Can't tell</i>: the interval holds 0.</p>",
    ]
    if study is not None and study.correlation and not study.correlation.get("noise_ok", True):
        parts.append(f'<div class="finding"><p>{html.escape(study.correlation.get("note", ""))}</p></div>')
    for held_out, said in cf_text.sentences(cf):
        title = "Mean over the held-out sets" if held_out == "mean" else f"Held-out set {held_out}"
        parts.append(f"<h3>{html.escape(title)}</h3><ul>" + "".join(f"<li>{_code(x)}</li>" for x in said) + "</ul>")
    for factor in cf.factors:
        measured = any(f == factor for _, f in cf.measured)  # the study measured this factor, not only others
        header = ["source", *[f"{h} (nats)" for h in cf.held_out]]
        rows = []
        for i, source in enumerate(cf.sources):
            row = [source]
            for j, h in enumerate(cf.held_out):
                text = f"{cf.predicted[factor][i, j]:+.3f} ± {cf.interval[factor][i, j]:.3f}"
                found = cf.measured.get((source, factor), {}).get(h)
                if found is not None:
                    text += f" (measured {found[0]:+.3f} ± {found[1]:.3f})"
                row.append(text)
            rows.append(row)
        name = "left out" if factor == 0 else f"share x {factor:g}"
        parts.append(
            f"<p>Each source {html.escape(name)}"
            + (": predicted, and measured by the study" if measured else ": predicted")
            + "</p>"
            + _table(header, rows)
        )
    parts.append(_img(plots.counterfactual(cf), "predicted change of held-out loss per source"))
    return "".join(parts)


def _code(text: str) -> str:
    """Escaped text with `name` spans as code."""
    pieces = html.escape(text).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(pieces))


def _attribution(attr) -> str:
    """The decomposition: the matrix, and per held-out source the measured change beside what the sources explain."""
    parts = [
        "<p>Where this run's held-out loss change came from: the optimizer's actual steps split by the "
        "training source whose gradient caused them, and the held-out gradient integrated along them. The "
        "cells add up to the measured change, but one cell is not what leaving that source out would do: "
        "sources pull against each other, so a cell can be many times larger than any change of the mix "
        "would cause, with a neighbour of the opposite sign (for that, see <i>which source helps</i>).</p>"
    ]
    if attr.measured is None:  # a record of the older contract: an estimate with nothing to check it against
        parts.append("<p>This run's records carry no measured change to check the decomposition against.</p>")
    else:
        steps = f"steps {attr.steps[0]}-{attr.steps[1]}" if attr.steps else f"the steps up to {attr.step}"
        parts.append(
            f"<p>Over {steps}, measured on fixed held-out batches. What no source explains (weight decay, "
            "router losses, momentum from before the first attributed step) is <i>other</i>; "
            "<i>residual</i> is the integration's error: sources + other + residual = measured. "
            "Negative is lower loss.</p>"
        )
        rows = [
            [
                r["source"],
                r["measured"],
                r["attributed"],
                r["unattributed"],
                r["residual"],
                "" if r["share"] is None else f"{100 * r['share']:.0f}%",
            ]
            for r in attribution_rows(attr)
        ]
        parts.append(_table(["held-out source", "measured", "sources", "other", "residual", "attributed"], rows))
        if attr.parts:
            parts.append(
                _table(["other, by part", *attr.sources], [[k, *map(float, v)] for k, v in attr.parts.items()])
            )
    parts.append(_img(plots.attribution(attr), "decomposition matrix"))
    return "".join(parts)


def training_section(run: TrainingRun, findings: list[Finding]) -> str:
    parts = [f"<h2>Training: run {html.escape(run.path.name)}</h2>", _run_summary(run)]
    if run.stop_reason:
        parts.append(f"<p><b>Stopped early</b>: {html.escape(run.stop_reason)}</p>")
    changes = continued.source_changes(run)
    if changes:
        parts += [
            "<h3>Forgetting and gain</h3>",
            "<p>Held-out loss per source at step 0 (the model this run started from, before any update) "
            "and now; the slope is a line through the last evaluations: an interval that holds 0 means "
            "the source has flattened.</p>",
            _table(*continued.table_rows(changes)),
            _img(continued.plot(run, changes), "forgetting and gain per source"),
        ]
    parts += ["<h3>Diagnosis</h3>", _findings(findings)]
    if run.logs:
        parts += [
            "<h3>Loss</h3>",
            _img(plots.loss_curves(run), "loss curves"),
            "<h3>Optimizer</h3>",
            _img(plots.optimizer(run), "learning rate and gradient norm"),
            "<h3>Throughput and memory</h3>",
            _img(plots.throughput(run), "throughput, data wait, memory"),
        ]
        mix = plots.mix_weights(run)
        if mix:
            last = next(r for r in reversed(run.logs) if r.get("mix_weights"))
            parts += [
                "<h3>Adaptive mix</h3>",
                _img(mix, "adaptive mix weights"),
                _table(
                    ["source", "weight now", "mean over the run", "excess loss (nats)"],
                    [
                        [s, w, last["mix_weights_mean"].get(s), (last.get("excess_loss") or {}).get(s)]
                        for s, w in last["mix_weights"].items()
                    ],
                ),
            ]
        experts = plots.expert_load(run)
        if experts:
            parts += ["<h3>Experts</h3>", _img(experts, "expert load and routing")]
    if run.attribution is not None:
        parts += ["<h3>Where the held-out change came from (decomposition)</h3>", _attribution(run.attribution)]
    if run.logs or run.alerts:
        parts += ["<h3>Alerts and skipped steps</h3>", _img(plots.timeline(run), "alerts timeline")]
        parts.append(
            _table(
                ["step", "kind", "message"],
                [[a.get("step"), a.get("kind"), a.get("message")] for a in run.alerts[:200]],
            )
            if run.alerts
            else "<p>No alerts.</p>"
        )
    return "".join(parts)


def study_section(study: Study) -> str:
    frame = study.table
    parts = ["<h3>Ablation</h3>"]
    if study.effects is not None:  # one row per variant, noise and verdict included; then one sentence each
        effects = study.effects
        parts += [
            "<h4>Effect of each variant (against the baseline's seeds)</h4>",
            _table(list(effects.columns), [list(r) for r in effects.iter_rows()]),
        ]
        parts += ["<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in study.summary) + "</ul>"]
        parts.append("<h4>Every run</h4>")
    parts += [
        _table(list(frame.columns), [list(r) for r in frame.iter_rows()]),
        _img(plots.ablation_heatmap(frame), "ablation heatmap"),
    ]
    if study.correlation:
        c = study.correlation
        parts.append(
            f"<p>The run's own counterfactual against the ablations: Spearman {rho_text(c['spearman'])} over "
            f"{c['n_cells']} cells; signs agree "
            f"on {c['sign_agree']} of the {html.escape(above_noise_text(c))}. "
            f"{html.escape(measurement_text(c['measurement']) if c.get('measurement') else '')} "
            f"{html.escape(c.get('note', ''))}</p>"
        )
        if c.get("by_kind"):
            parts.append(
                _table(
                    ["variants", "cells", "Spearman", "signs agree above noise"],
                    [
                        [k, p["n_cells"], rho_text(p["spearman"]), f"{p['sign_agree']} / {p['above_noise']}"]
                        for k, p in c["by_kind"].items()
                    ],
                )
            )
    parts += [_img(p.read_bytes(), p.stem) for p in study.images]
    if study.mixes:
        parts += ["<h3>Random mixes</h3>"] + [f"<p>{html.escape(line)}</p>" for line in study.mixes.get("summary", [])]
    if study.adaptive:
        parts += ["<h3>Adaptive mix</h3>"] + [
            f"<p>{html.escape(line)}</p>" for line in study.adaptive.get("summary", [])
        ]
    return "".join(parts)


def render(
    job: CurationJob | None,
    run: TrainingRun | None,
    study: Study | None = None,
    *,
    diagnose_cfg: DiagnoseConfig | None = None,
) -> str:
    """The whole page as a string."""
    title = "winnow report: " + " / ".join(
        x for x in (job and job.name, (run or study) and (run or study).path.name) if x
    )
    body = []
    changed = run.curated_since() if run is not None and job is not None else None
    if changed:
        log.warning("%s", changed)
        body.append(f'<div class="finding"><p>{html.escape(changed)}</p></div>')
    counterfactual = cf_text.lead(run.counterfactual if run is not None else None, study)
    if counterfactual is not None:
        body.append(counterfactual_section(counterfactual, study))
    elif run is not None and run.attribution is None and run.section("attribution").get("every"):
        body.append(
            "<h2>Which source helps</h2><p>The run ended before its first attributed stretch closed "
            "(train.attribution start and every): nothing to predict from.</p>"
        )
    if run is not None:
        body.append(training_section(run, diagnose(run, diagnose_cfg)))
    if study is not None:
        body.append(study_section(study))
    if job is not None:
        try:
            body.append(curation_section(job))
        except (KeyError, TypeError, AttributeError, ValueError) as err:  # winnow writes none of these shapes
            raise InputError(
                f"{job.path}/manifest.json: a key holds what winnow never writes ({type(err).__name__}: {err}); the "
                "manifest was edited or is not winnow's: re-run the curation job"
            ) from err
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8>{GENERATOR}<title>{html.escape(title)}</title>"
        f"<style>{_CSS}</style><script>{CHECK_SCRIPT}</script></head><body><h1>{html.escape(title)}</h1>"
        f"<p class=muted>generated {stamp}</p>{''.join(body)}</body></html>"
    )


def write_report(
    path: str | Path,
    *,
    output: str | Path | None = None,
    diagnose_cfg: DiagnoseConfig | None = None,
    storage_options: dict | None = None,
    located: tuple | None = None,
) -> Path | str:
    """Write ``report.html`` for the job and/or run in folder ``path``; returns where it went.

    For a job on an object store (``path`` a URL) the page goes to ``<path>/report.html`` on the
    store unless ``output`` names a local file; one PUT, so a reader never sees half a page there either.
    ``located``: what ``locate(path)`` returned, when the caller has read the folder already.
    """
    job, run, study = located if located is not None else locate(path, storage_options)
    page = render(job, run, study, diagnose_cfg=diagnose_cfg)
    if output is None and is_url(path):
        target = f"{str(path).rstrip('/')}/report.html"
        if job.fs.exists(target):
            _check_winnow_page(job.fs.cat_file(target, start=0, end=4096), target, "the report")
        job.fs.pipe_file(target, page.encode("utf-8"))
    else:
        target = Path(output) if output is not None else Path(path) / "report.html"
        _check_replaceable(target, "--output" if output is not None else "the report")
        write_text_atomic(target, page)  # a reader never sees half a page
    log.info("report written to %s", target)
    return target
