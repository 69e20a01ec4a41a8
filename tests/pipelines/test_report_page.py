"""The report page: which sections a job folder, a run folder or both produce; embedded PNGs; the command."""

import argparse
import base64
import json
import re

import pytest

from tests.pipelines.report_util import alert, healthy_records, write_job, write_run
from winnow.curate.errors import InputError
from winnow.pipelines.ablate.layout import StudyLayout
from winnow.pipelines.report import locate, render, write_report
from winnow.pipelines.report.command import register
from winnow.pipelines.report.page import GENERATOR

PNG = b"\x89PNG\r\n\x1a\n"


def images(page: str) -> dict[str, bytes]:
    return {
        alt: base64.b64decode(data)
        for alt, data in re.findall(r'<img alt="([^"]*)" src="data:image/png;base64,([^"]+)">', page)
    }


def test_job_folder_shows_funnel_mix_scores_and_curriculum(tmp_path):
    page = write_report(write_job(tmp_path / "job")).read_text()
    found = images(page)
    assert set(found) == {
        "rows per stage and rejects by reason",
        "target vs realized shares",
        "score histograms",
        "curriculum",
    }
    assert all(png.startswith(PNG) for png in found.values())
    assert "<h2>Curation: job tiny</h2>" in page and "Training:" not in page


def test_job_without_order_stage_has_no_curriculum(tmp_path):
    assert "curriculum" not in images(render(*locate(write_job(tmp_path / "job", order_by=None))))


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """A run (with attribution, ablation and alerts) that records the job it trained on; its page, rendered once."""
    tmp_path = tmp_path_factory.mktemp("full")
    job = write_job(tmp_path / "job")
    alerts = [
        alert("loss_spike", 25, loss=9.0, sources=["code"], origins=[["a.parquet", 1]]),
        alert("data_wait", 5, message="<script>x</script>"),
    ]
    run = write_run(
        tmp_path / "run", healthy_records(), alerts=alerts, config={"shards": str(job), "precision": "fp32"}
    )
    with open(run / "metrics.jsonl", "a") as f:
        f.write(
            json.dumps(
                {
                    "step": 50,
                    "attribution": {"prose": {"prose": -0.25, "code": 0.0}, "code": {"prose": 0.05, "code": -0.5}},
                }
            )
            + "\n"
        )
    StudyLayout(run).tables.mkdir()
    StudyLayout(run).table_csv.write_text(
        "variant,code,prose,delta_code,delta_prose\nbaseline,2.0,2.1,0.0,0.0\nno_code,2.6,2.05,0.6,-0.05\n"
    )
    return job, run, write_report(run).read_text()


def test_run_folder_links_to_the_job_it_trained_on(full):
    job, run, page = full
    found_job, found_run, _ = locate(run)
    assert found_job.path == job and found_run.path == run
    assert "<h2>Training: run run</h2>" in page and "<h2>Curation: job tiny</h2>" in page
    assert {
        "loss curves",
        "learning rate and gradient norm",
        "throughput, data wait, memory",
        "expert load and routing",
        "alerts timeline",
        "curriculum",
    } <= set(images(page))
    assert all(png.startswith(PNG) for png in images(page).values())


def test_job_folder_finds_its_default_run_folder(tmp_path):
    job = write_job(tmp_path / "job")
    write_run(job / "train", healthy_records())
    assert locate(job)[1] is not None


def test_attribution_and_ablation_render_when_present(full):
    page = full[2]
    assert {"decomposition matrix", "ablation heatmap"} <= set(images(page))
    assert "one cell is not what leaving that source out would do" in page
    assert "<td>no_code</td><td>2.6</td>" in page


def test_attribution_shows_the_measured_change_and_what_is_attributed(tmp_path):
    run = write_run(tmp_path / "run", healthy_records())
    with open(run / "metrics.jsonl", "a") as f:
        f.write(
            json.dumps(
                {
                    "step": 40,
                    "attribution": {
                        "sources": ["prose", "code"],
                        "matrix": [[-0.3, 0.02], [-0.05, -0.4]],
                        "steps": [11, 40],
                        "unattributed": [0.01, 0.03],
                        "measured": [-0.33, -0.36],
                        "residual": [-0.01, -0.01],
                        "unattributed_parts": {"weight_decay": [0.01, 0.02], "router": [0.0, 0.01]},
                    },
                }
            )
            + "\n"
        )
    page = render(*locate(run))
    assert "Over steps 11-40" in page
    # held-out prose: measured, the sources' part (-0.35), other, residual, attributed share
    assert "<tr><td>prose</td><td>-0.33</td><td>-0.35</td><td>0.01</td><td>-0.01</td><td>106%</td></tr>" in page
    assert "<tr><td>weight_decay</td><td>0.01</td><td>0.02</td></tr>" in page
    assert "decomposition matrix" in images(page)


def test_run_without_attribution_ablation_or_alerts(tmp_path):
    page = render(*locate(write_run(tmp_path / "run", healthy_records())))
    assert not {"decomposition matrix", "ablation heatmap"} & set(images(page))
    assert (
        "decomposition" not in page
        and "Which source helps" not in page
        and "<h3>Ablation</h3>" not in page
        and "<p>No alerts.</p>" in page
    )


def test_ablation_study_folder_on_its_own(tmp_path):
    StudyLayout(tmp_path / "study").tables.mkdir(parents=True)
    StudyLayout(tmp_path / "study").table_csv.write_text("variant,delta_code\nbaseline,0.0\nno_code,0.4\n")
    page = render(*locate(tmp_path / "study"))
    assert "<h3>Ablation</h3>" in page and set(images(page)) == {"ablation heatmap"}


@pytest.mark.parametrize("damage", [b"[1, 2]", b"\xff\xfe garbage", b'{"summary": [', b"{}"])
def test_a_studys_damaged_table_files_are_left_out_said_once_and_its_table_is_refused(tmp_path, caplog, damage):
    """effects.json as a list, garbage bytes or cut short: AttributeError, UnicodeDecodeError or JSONDecodeError."""
    layout = StudyLayout(tmp_path / "study")
    layout.tables.mkdir(parents=True)
    layout.table_csv.write_text("variant,delta_code\nbaseline,0.0\nno_code,0.4\n")
    for path in (layout.effects_json, layout.correlation_json):
        path.write_bytes(damage)
    layout.effects_csv.write_bytes(b"\xff\x00" * 10)
    page = render(*locate(tmp_path / "study"))
    assert "<h3>Ablation</h3>" in page
    if damage != b"{}":
        assert "correlation.json is not what `winnow ablate` writes" in caplog.text
    layout.table_csv.write_bytes(b"\xff\x00\n" * 3)
    with pytest.raises(InputError, match=r"table\.csv cannot be read .*re-run the study"):
        locate(tmp_path / "study")


def test_a_manifest_that_is_not_an_object_is_an_input_error(tmp_path):
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "manifest.json").write_text("[1, 2, 3]")
    with pytest.raises(InputError, match=r"manifest\.json is not a job's manifest"):
        write_report(tmp_path / "job")


def test_alerts_are_listed_and_diagnosed_on_the_page(full):
    page = full[2]
    assert "<td>25</td><td>loss_spike</td>" in page
    assert '<div class="finding warning"><h3>Loss spikes</h3>' in page


def test_text_from_the_run_is_escaped(full):
    page = full[2]
    assert "<script>x</script>" not in page and "&lt;script&gt;x&lt;/script&gt;" in page


def test_torn_last_metrics_line_is_skipped(tmp_path):
    run = write_run(tmp_path / "run", healthy_records())
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 55, "loss": 1.')
    _, found, _ = locate(run)
    assert found.bad_lines == 1 and found.logs[-1]["step"] == 50


def test_empty_folder_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="neither a curation job"):
        write_report(tmp_path)


def test_command_writes_the_page_and_prints_the_diagnosis(tmp_path, capsys):
    run = write_run(
        tmp_path / "run", healthy_records(), alerts=[alert("loss_spike", 25, loss=9.0, sources=["code"], origins=[])]
    )
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["report", str(run), "--diagnose", "--output", str(tmp_path / "out" / "page.html")])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "[warning] Loss spikes" in out and f"report: {tmp_path / 'out' / 'page.html'}" in out
    assert (tmp_path / "out" / "page.html").is_file() and not (run / "report.html").exists()


def test_the_page_replaces_only_a_page_winnow_wrote(tmp_path):
    """A user's report.html beside a run's files, or --output naming the run's metrics, is refused untouched (they
    were replaced by the page); a folder as --output is named; winnow's own page, old or new, is replaced."""
    run = write_run(tmp_path / "run", healthy_records())
    (run / "report.html").write_text("<html>my notes</html>")
    with pytest.raises(InputError, match="not a page winnow report wrote"):
        write_report(run)
    assert (run / "report.html").read_text() == "<html>my notes</html>"
    metrics = (run / "metrics.jsonl").read_bytes()
    with pytest.raises(InputError, match="not a page winnow report wrote"):
        write_report(run, output=run / "metrics.jsonl")
    assert (run / "metrics.jsonl").read_bytes() == metrics
    with pytest.raises(InputError, match="is a folder"):
        write_report(run, output=tmp_path)
    mine = tmp_path / "page.html"
    write_report(run, output=mine)
    write_report(run, output=mine)  # its own page: replaced
    mine.write_text(mine.read_text().replace(GENERATOR, ""))  # a page written before the generator tag
    write_report(run, output=mine)
    assert GENERATOR in mine.read_text()


def test_a_job_without_rejects_says_so_instead_of_drawing_an_empty_chart(tmp_path):
    folder = write_job(tmp_path / "job")
    manifest = json.loads((folder / "manifest.json").read_text())
    for stage in manifest["stages"]:
        stage["rows_rejected"], stage["rejected"] = 0, {}
    for figures in manifest["by_source"].values():
        figures["rejected"] = {}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    page = render(*locate(folder))
    assert "No rejects: every row read reached the output." in page
    assert "rows per stage" in images(page) and "rows per stage and rejects by reason" not in images(page)


def test_the_curriculum_plot_ticks_whole_shards(monkeypatch):
    from winnow.pipelines.report import plots

    monkeypatch.setattr(plots, "_png", lambda fig: fig)
    fig = plots.curriculum([(f"shard-{i}", 0.1 * i) for i in range(3)], "difficulty")
    ticks = [t for t in fig.axes[0].get_xticks() if 0 <= t <= 2]
    assert ticks == [0, 1, 2]


def _counterfactual_record(step: int = 40) -> dict:
    return {
        "step": step,
        "counterfactual": {
            "sources": ["prose", "code"],
            "held_out": ["prose", "code", "mean"],
            "factors": [0.0, 2.0],
            "slope": [[-0.1, 0.01, -0.045], [0.05, -0.2, -0.075]],
            "slope_se": [[0.01, 0.02, 0.011], [0.01, 0.02, 0.011]],
            "predicted": {
                "0": [[0.2, -0.02, 0.09], [-0.1, 0.4, 0.15]],
                "2": [[-0.08, 0.008, -0.036], [0.04, -0.17, -0.06]],
            },
            "interval": {"0": [[0.04, 0.08, 0.04], [0.04, 0.08, 0.04]], "2": [[0.02, 0.03, 0.02], [0.02, 0.03, 0.02]]},
            "saturation": 0.5,
            "horizon": 6.0,
            "probe_rows": 32,
            "steps": [11, 40],
        },
    }


def test_the_page_leads_with_what_a_change_of_the_mix_would_do(tmp_path):
    run = write_run(tmp_path / "run", healthy_records())
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps(_counterfactual_record()) + "\n")
    page = render(*locate(run))
    first = page.index("<h2>")
    assert page[first:].startswith("<h2>Which source helps: what a change of the mix would do</h2>")
    # sentences per held-out set, the mean first, the largest first; an interval holding 0 is "can't tell"
    mean = page.index("Mean over the held-out sets")
    assert mean < page.index("Held-out set prose") < page.index("<h2>Training")
    assert (
        "Leaving out <code>code</code> would raise held-out loss on <code>prose</code> by 0.100 ± 0.040 nats: it helps"
    ) not in page  # on prose, leaving out code lowers the loss
    assert (
        "Leaving out <code>code</code> would lower held-out loss on <code>prose</code> by 0.100 ± 0.040 nats: it hurts"
    ) in page
    assert "Leaving out <code>prose</code>: can&#x27;t tell on <code>code</code> (-0.020 ± 0.080 nats)" in page
    assert (
        "Doubling <code>code</code> would lower held-out loss on the mean of the held-out sets by 0.060 ± 0.020 nats: it helps"
        in page
    )
    assert "predicted change of held-out loss per source" in images(page)


def test_no_sentence_says_a_source_hurts_everything_when_leaving_it_out_raises_the_losses(tmp_path):
    """A decomposition whose row for prose is all positive (pushes that other sources undo) beside a
    counterfactual where leaving prose out raises every loss: the page calls prose helpful, nowhere harmful."""
    run = write_run(tmp_path / "run", healthy_records())
    record = _counterfactual_record()
    record["counterfactual"]["predicted"]["0"][0] = [0.2, 0.1, 0.15]
    with open(run / "metrics.jsonl", "a") as f:
        f.write(
            json.dumps(
                {
                    "step": 40,
                    "attribution": {
                        "sources": ["prose", "code"],
                        "matrix": [[3.6, 3.6], [-3.9, -3.95]],
                        "steps": [11, 40],
                        "unattributed": [0.0, 0.0],
                        "measured": [-0.3, -0.35],
                        "residual": [0.0, 0.0],
                    },
                }
            )
            + "\n"
        )
        f.write(json.dumps(record) + "\n")
    page = render(*locate(run))
    assert "Leaving out <code>prose</code> would raise held-out loss on <code>code</code>" in page
    assert "Leaving out <code>prose</code> would lower" not in page
    assert "Leaving out <code>prose</code>: can&#x27;t tell" not in page


def test_source_names_with_math_text_are_plain_labels(tmp_path):
    """A source named like TeX (``$\\foo{x}$``) is a label, not math text for matplotlib's parser to fail on."""
    name = r"$\foo{x}$"
    records = json.loads(json.dumps(healthy_records()).replace('"code"', json.dumps(name)))
    page = render(*locate(write_run(tmp_path / "run", records)))
    assert images(page) and all(png.startswith(PNG) for png in images(page).values())
    assert name in page


def test_a_legend_is_drawn_only_over_labelled_lines():
    """A plot with nothing labelled (a study with `eval_every = 0` has no held-out curves) draws no legend
    and prints none of matplotlib's "No artists with labels" warnings."""
    import warnings

    from winnow.pipelines.report import plots

    fig, ax = plots._subplots()
    ax.plot([0, 1], [1, 0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plots.legend(ax)
    assert ax.get_legend() is None
    ax.plot([0, 1], [0, 1], label="held-out code")
    plots.legend(ax, fontsize=7)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["held-out code"]
    plots._png(fig)


def test_the_counterfactual_figure_says_helps_or_hurts_as_its_factor_reads():
    """Bars above 0 at share x 1.5 mean more of the source raises held-out loss: it hurts (the title said helps,
    the opposite of the sentences beside it)."""
    from winnow.pipelines.report.plots import counterfactual_title

    assert counterfactual_title(0.0).endswith("left out: predicted change of held-out loss (above 0: the source helps)")
    assert "share x 0.5" in counterfactual_title(0.5) and counterfactual_title(0.5).endswith("helps)")
    assert "share x 1.5" in counterfactual_title(1.5) and counterfactual_title(1.5).endswith("hurts)")


def test_a_source_that_gave_no_training_tokens_is_not_a_cant_tell():
    """A source with no training rows read "Leaving out `code`: can't tell (+0.000 ± 0.000 nats)"."""
    from winnow.pipelines.report.counterfactual import parse, sentence

    record = _counterfactual_record()
    record["counterfactual"]["predicted"]["0"][0][1], record["counterfactual"]["interval"]["0"][0][1] = 0.0, 0.0
    said = sentence(parse(record), 0.0, "prose", "code")
    assert "nothing to predict" in said and "gave no training tokens" in said and "can't tell" not in said


def test_a_prediction_below_a_thousandth_is_written_in_its_own_digits():
    """0.0002 ± 0.0001 was written "0.000 ± 0.000 nats: it helps"; its digits show what the verdict rests on."""
    from winnow.pipelines.report.counterfactual import parse, sentence

    record = _counterfactual_record()
    record["counterfactual"]["predicted"]["0"][0][1], record["counterfactual"]["interval"]["0"][0][1] = 0.0002, 0.0001
    cf = parse(record)
    said = sentence(cf, 0.0, "prose", "code")
    assert "by 2.0e-04 ± 1.0e-04 nats: it helps" in said and "0.000 ± 0.000" not in said


def test_a_verdicts_printed_interval_leaves_out_zero_as_the_verdict_does():
    """0.0044 ± 0.0036 is a verdict; at three decimals it would print "0.004 ± 0.004", which reads as holding 0."""
    from winnow.pipelines.report.counterfactual import parse, sentence

    record = _counterfactual_record()
    record["counterfactual"]["predicted"]["0"][0][1], record["counterfactual"]["interval"]["0"][0][1] = 0.0044, 0.0036
    said = sentence(parse(record), 0.0, "prose", "code")
    assert "by 0.0044 ± 0.0036 nats: it helps" in said
    record["counterfactual"]["predicted"]["0"][0][1], record["counterfactual"]["interval"]["0"][0][1] = 0.12, 0.03
    assert "by 0.120 ± 0.030 nats: it helps" in sentence(parse(record), 0.0, "prose", "code")
    record["counterfactual"]["predicted"]["0"][0][1], record["counterfactual"]["interval"]["0"][0][1] = 4.44e-4, 4.36e-4
    assert "by 4.44e-04 ± 4.36e-04 nats: it helps" in sentence(parse(record), 0.0, "prose", "code")


def test_a_run_beside_its_job_curated_again_since_says_the_curation_shown_is_not_what_it_saw(tmp_path, caplog):
    from winnow.pipelines.provenance import write_provenance

    job = write_job(tmp_path / "job")
    run = write_run(tmp_path / "run", healthy_records(), config={"shards": str(job)})
    write_provenance(run, job_file=None, data=[job])
    assert "curated again" not in render(*locate(run))
    manifest = json.loads((job / "manifest.json").read_text())
    manifest["seconds"] = 1234.5  # the same job curated again to the same shards: only its timings differ
    (job / "manifest.json").write_text(json.dumps(manifest))
    assert "curated again" not in render(*locate(run))
    manifest["shards"][0]["sha256"] = "1" * 64  # other shards
    (job / "manifest.json").write_text(json.dumps(manifest))
    page = render(*locate(run))
    assert "curated again after this run trained on it, to other shards" in page and "curated again" in caplog.text


def test_a_run_trained_on_a_relative_folder_finds_its_job_from_any_folder(tmp_path, monkeypatch):
    """config.json records `shards = "out/t"` as given: a report made in another folder holding its own `out/t`
    showed that unrelated job (and said it was curated again); from elsewhere, no curation at all."""
    from winnow.pipelines.provenance import write_provenance

    monkeypatch.chdir(tmp_path)
    job = write_job(tmp_path / "out" / "t")
    run = write_run(tmp_path / "run", healthy_records(), config={"shards": "out/t"})
    write_provenance(run, job_file=None, data=["out/t"])
    (tmp_path / "elsewhere").mkdir()
    decoy = write_job(tmp_path / "elsewhere" / "out" / "t", order_by=None)
    for where in (tmp_path / "elsewhere", tmp_path / "run"):
        monkeypatch.chdir(where)
        found = locate(run)[1]
        assert found.shards_dir == job and found.shards_dir != decoy and found.curated_since() is None


def test_the_token_share_is_the_whole_runs_not_its_last_intervals(tmp_path):
    """A curriculum moves the shares through the run: the last interval's share read as the run's was off by 4x."""
    from tests.pipelines.report_util import log_record

    records = []
    for step, (prose, code) in ((10, (900, 100)), (20, (900, 100)), (30, (100, 900))):
        record = log_record(step, loss=2.0)
        for source, n in (("prose", prose), ("code", code)):
            record["per_source"][source].update(tokens=n, token_share=n / 1000)
        records.append(record)
    run = write_run(tmp_path / "run", records)
    page = render(*locate(run))
    assert "token share (the run)" in page and "loss share (last interval)" in page
    row = re.search(r"<tr><td>prose</td>(.*?)</tr>", page).group(1)
    assert ">0.633<" in row or ">0.6333" in row, row  # 1,900 of 3,000 tokens; the last interval's 0.1


@pytest.mark.parametrize("stop", ['"held-out loss plateaued"', '{"reason": [1]}', "null", "{}"])
def test_a_stop_record_of_another_shape_is_skipped_and_counted(tmp_path, caplog, stop):
    """`"stop": "held-out loss plateaued"` or a reason that is a list stopped the report with an AttributeError."""
    run = write_run(tmp_path / "run", healthy_records())
    with open(run / "metrics.jsonl", "a") as f:
        f.write(f'{{"step": 40, "stop": {stop}}}\n{{"step": 50, "stop": {{"reason": "plateaued"}}}}\n')
    _, found, _ = locate(run)
    assert found.bad_lines == 1 and found.stop_reason == "plateaued"
    assert f"{run / 'metrics.jsonl'}: 1 unreadable line(s) skipped" in caplog.text
    assert "<b>Stopped early</b>: plateaued" in render(*locate(run))


def test_config_values_of_another_type_are_read_as_absent_naming_the_key(tmp_path, caplog):
    """`"attribution": 5` stopped the page with an AttributeError, `"grad_clip": "x"` with a ValueError and
    `"shards": 5` with a TypeError."""
    config = {"precision": ["bf16"], "shards": 5, "attribution": 5, "optim": {"grad_clip": "x", "lr": 1e-3}}
    run = write_run(tmp_path / "run", healthy_records(), config=config)
    page = render(*locate(run))
    for key in ("precision", "shards", "attribution", "optim.grad_clip"):
        assert (
            f"{run / 'config.json'}: train.{key} = " in caplog.text and "the report reads it as absent" in caplog.text
        )
    assert "precision ?" in page
    _, found, _ = locate(run)
    assert found.config == {"optim": {"lr": 1e-3}} and found.section("attribution") == {} and found.shards_dir is None
    write_run(tmp_path / "run2", healthy_records(), config={"optim": [1.0], "attribution": {"every": "often"}})
    _, found, _ = locate(tmp_path / "run2")
    assert found.config == {"attribution": {}} and "train.optim = [1.0] is not a table" in caplog.text
    render(*locate(tmp_path / "run2"))
