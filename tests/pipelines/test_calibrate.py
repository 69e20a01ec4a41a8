"""The counterfactual calibrated on a study (pipelines/ablate/calibrate.py): the mixing law's fit, its
leave-one-variant-out check, and what the study's tables and report say with it."""

import copy
import dataclasses
import functools
import json

import numpy as np
import polars as pl
import pytest

from winnow.pipelines.ablate.calibrate import (
    calibrate,
    cells_of,
    check_text,
    cross_validated,
    features,
    fit,
    scaled_shares,
)

SOURCES = ["a", "b", "c", "d"]
HELD = ["a", "b", "c", "d", "mean"]
FACTORS = (0.0, 0.5, 1.5)
BASE = {"a": 0.25, "b": 0.25, "c": 0.3, "d": 0.2}  # the baseline's weights
SHARE = np.array(list(BASE.values()))


def _frame(measured: dict, noise: float) -> pl.DataFrame:
    """The cells of a study of every source left out and scaled x0.5 / x1.5, in ``compare_with_counterfactual``'s
    shape; ``measured[(source, r)]``: the (B,) measured deltas."""
    rows = []
    for (source, r), values in measured.items():
        name = f"without_{source}" if r == 0 else f"{source}_x{r:g}"
        for held, value in zip(SOURCES, values):
            rows.append(
                {
                    "variant": name,
                    "kind": "leave_one_out" if r == 0 else "weights",
                    "varied": source,
                    "factor": r,
                    "source": held,
                    "seeds": 3,
                    "measured": float(value),
                    "predicted": 0.0,
                    "interval": 0.0,
                    "noise": noise,
                    "above_noise": bool(abs(value) > noise),
                }
            )
    return pl.DataFrame(rows)


def _law(shares, g, curvature, p):
    """The planted mixing law: each held-out set's change at ``shares`` (N, S), (N, B)."""
    u = features(shares, SHARE, p) @ g
    lam = np.asarray(curvature, dtype=float)
    return np.where(lam == 0, u, np.expm1(lam * u) / np.where(lam == 0, 1.0, lam))


def _planted(p=0.5, kappa=0.5, curvature=(1.0, 0.0, 0.5, 2.0), offset=(0.02, -0.03, 0.0, 0.01), noise_sd=0.004, g=None,
             seed=0):  # fmt: skip
    """A study whose effects follow a mixing law: slopes per unit of share ``g`` (each source helps its own set
    most), a share ratio shape ``p``, a curvature per held-out set, the baseline's offset per held-out set, and
    Gaussian measurement noise; the run's slopes are the true ones / κ. Returns the frame, the run's slope and
    error (S, B + 1), the true slopes by ln share (S, B), the offsets and the truth's law as a function."""
    rng = np.random.default_rng(seed)
    if g is None:
        g = rng.normal(0, 0.2, (4, 4)) - np.diag([1.2, 1.0, 0.8, 1.4])
    g = g - SHARE @ g  # Σ_j s_j g[j, b] = 0: the run's slopes determine g
    slope = (np.diag(SHARE) - np.outer(SHARE, SHARE)) @ g
    offset = np.asarray(offset)

    def truth(source: int, r: float) -> np.ndarray:
        return _law(scaled_shares(SHARE, np.array([source]), np.array([r])), g, curvature, p)[0]

    measured = {
        (s, r): truth(i, r) + offset + rng.normal(0, noise_sd, 4) for i, s in enumerate(SOURCES) for r in FACTORS
    }
    run = slope / kappa + rng.normal(0, 0.002, (4, 4))
    full = np.concatenate([run, run.mean(1, keepdims=True)], 1)
    return _frame(measured, 2 * noise_sd), full, np.full_like(full, 0.005), slope, offset, truth


@functools.cache
def _calibrated_once() -> tuple[dict, pl.DataFrame]:
    frame, slope, se, *_ = _planted()
    return calibrate(frame, slope, se, SOURCES, HELD, 0.5, BASE)


def _default_calibration() -> tuple[dict, pl.DataFrame]:
    """The default planted study calibrated, fitted once per process: the report's tests read it, some edit it."""
    record, cells = _calibrated_once()
    return copy.deepcopy(record), cells  # a polars frame is not changed in place


def test_the_fit_recovers_a_planted_law_scale_and_baseline_offset():
    frame, slope, se, true_slope, offset, _ = _planted()
    cells = cells_of(frame, SOURCES, SOURCES, SHARE)
    model = fit(cells, slope[:, :4], se[:, :4], SHARE, 0.25)
    assert 0.25 <= model.p <= 0.75, model.p
    assert model.kappa == pytest.approx(0.5, rel=0.2)
    np.testing.assert_allclose(model.offset, offset, atol=0.006)
    value, sd = model.slopes()
    np.testing.assert_allclose(value, true_slope, atol=0.02)
    assert np.all(sd > 0) and np.all(sd < 0.05)


@pytest.mark.slow  # over 10 s of CPU: the whole fit and its check, twice or more
def test_each_variant_is_predicted_without_its_own_runs():
    """The check's prediction of a variant does not move when that variant's measurements do; another variant's
    prediction does."""
    frame, slope, se, *_ = _planted()
    cells = cells_of(frame, SOURCES, SOURCES, SHARE)
    before = cross_validated(cells, slope[:, :4], se[:, :4], SHARE, 0.5)
    moved = cells.measured.copy()
    moved[cells.variant == "without_a"] += 0.5
    after = cross_validated(dataclasses.replace(cells, measured=moved), slope[:, :4], se[:, :4], SHARE, 0.5)
    own = cells.variant == "without_a"
    np.testing.assert_array_equal(after[own], before[own])
    assert np.abs(after[~own] - before[~own]).max() > 1e-3


@pytest.mark.slow  # over 10 s of CPU: the whole fit and its check, twice or more
def test_the_check_gets_planted_effects_right_where_the_run_alone_misses_their_size():
    """The run's own slopes are twice the effects and its shape guess (q = 0.25 for p = 1) is off; calibrated, the
    held-back variants' signs and sizes come out right."""
    frame, slope, se, true_slope, _, truth = _planted(p=1.0, kappa=0.5)
    record, cells = calibrate(frame, slope, se, SOURCES, HELD, 0.25, BASE)
    check = record["check"]
    assert check["above_noise"] >= 24
    assert check["sign_agree"] == check["above_noise"]
    assert check["within_2x"] >= 0.9 * check["above_noise"]
    assert check["spearman"] > 0.9
    assert record["kappa"] == pytest.approx(0.5, rel=0.2) and 0.75 <= record["shape"] <= 1.5
    assert cells["calibrated"].null_count() == 0 and cells.height == frame.height
    # the predictions hold no baseline offset: leaving a source out is the planted law's change there
    predicted = np.array(record["predicted"]["0"])
    assert predicted.shape == (4, 5) and np.all(np.diag(predicted) > 0)
    np.testing.assert_allclose(predicted[:, :4], [truth(i, 0.0) for i in range(4)], atol=0.03)
    np.testing.assert_allclose(predicted[:, 4], predicted[:, :4].mean(1))
    assert set(record["predicted"]) == {"0", "0.5", "1.5", "2"} == set(record["interval"])
    assert "signs agree on" in check_text(record) and "p = " in check_text(record)


def test_a_source_measured_only_once_is_predicted_from_the_prior_and_the_other_variants():
    """With its only variant held back, a source has no variant of its own: its cells come from κ · slope, κ learnt
    from the other sources, and from its share moving in every other variant; a run whose slopes are 2x too
    large is corrected."""
    frame, slope, se, _, _, truth = _planted(kappa=0.5, offset=(0, 0, 0, 0))
    frame = frame.filter(~((pl.col("varied") == "d") & (pl.col("factor") != 0)))
    record, cells = calibrate(frame, slope, se, SOURCES, HELD, 0.5, BASE)
    own = cells.filter((pl.col("variant") == "without_d") & (pl.col("source") == "d"))
    assert own["calibrated"][0] == pytest.approx(truth(3, 0.0)[3], rel=0.3)
    assert abs(own["predicted"][0]) == 0.0  # the frame's raw prediction column is left as it was


def test_random_text_is_predicted_to_hurt_the_real_sources_and_its_absence_to_help_them():
    """Source `d` (random letters) raises every other held-out loss; every variant that leaves a real source out
    raises `d`'s share too. Its own left-out variant held back, the law still predicts that leaving `d` out lowers
    the real sources' losses and that doubling it raises them."""
    g = np.full((4, 4), 0.0) - np.diag([1.2, 1.0, 0.8, 0.0])
    g[3, :3] = 1.5  # d's share hurts a, b and c
    g[3, 3] = -3.0  # and only d's own held-out set gains from it
    frame, slope, se, _, _, truth = _planted(g=g, curvature=(0.0, 0.0, 0.0, 0.0))
    record, cells = calibrate(frame, slope, se, SOURCES, HELD, 0.5, BASE)
    left_out = cells.filter((pl.col("variant") == "without_d") & (pl.col("source") != "d"))
    assert np.all(left_out["measured"].to_numpy() < 0) and np.all(left_out["calibrated"].to_numpy() < 0)
    assert np.all(np.array(record["predicted"]["0"])[3, :3] < 0)
    assert np.all(np.array(record["predicted"]["2"])[3, :3] > 0)


def test_a_source_under_two_names_gets_equal_predictions_for_both_copies():
    """`a` and `b` are one source under two names (the same slopes per unit of share, the same share): the two
    copies' predictions agree within their intervals for every factor on every held-out set."""
    g = np.random.default_rng(3).normal(0, 0.2, (4, 4)) - np.diag([1.0, 1.0, 0.8, 1.4])
    g[1] = g[0]  # b's tokens are a's
    g[:, 1] = g[:, 0]  # and so are its held-out rows
    frame, slope, se, *_ = _planted(g=g)
    record, _ = calibrate(frame, slope, se, SOURCES, HELD, 0.5, BASE)
    for r in ("0", "0.5", "1.5", "2"):
        value, half = np.array(record["predicted"][r])[:, :4], np.array(record["interval"][r])[:, :4]
        assert np.all(np.abs(value[0] - value[1]) <= np.hypot(half[0], half[1])), (r, value[:2], half[:2])


def test_a_study_of_one_factor_keeps_the_runs_shape_and_learns_the_scale():
    """Leave-one-out variants alone cannot tell a shape from a scale, nor a curvature: the shape stays the run's,
    κ absorbs the rest, and the left-out predictions of a planted linear law still match its effects."""
    frame, slope, se, _, _, truth = _planted(p=0.5, kappa=0.5, curvature=(0, 0, 0, 0), offset=(0, 0, 0, 0))
    frame = frame.filter(pl.col("factor") == 0)
    record, cells = calibrate(frame, slope, se, SOURCES, HELD, 0.5, BASE)
    assert record["shape"] == 0.5
    own = cells.filter(pl.col("varied") == pl.col("source"))
    ratio = (own["calibrated"] / own["measured"]).to_numpy()
    assert np.all((ratio > 0.7) & (ratio < 1.4)), ratio


@pytest.mark.parametrize("change", ["one seed", "random mixes only", "a source without a baseline share"])
def test_nothing_to_calibrate_on_gives_none(change):
    frame, slope, se, *_ = _planted()
    base = BASE
    if change == "one seed":
        frame = frame.with_columns(noise=pl.lit(0.0))
    elif change == "random mixes only":
        frame = frame.with_columns(kind=pl.lit("random_mix"))
    else:
        base = {**BASE, "d": 0.0}
    assert calibrate(frame, slope, se, SOURCES, HELD, 0.5, base) is None


def test_the_study_writes_calibrated_json_and_its_report_leads_with_it(tmp_path, capsys):
    """A study's tables: calibrated.json, the check in correlation.json and a column beside each cell; the report
    page and `winnow report` lead with the calibrated sentences."""
    from winnow.pipelines.ablate.layout import StudyLayout, load_study
    from winnow.pipelines.report.counterfactual import lead, text

    layout = StudyLayout(tmp_path)
    layout.tables.mkdir(parents=True)
    record, cells = _default_calibration()
    (layout.calibrated_json).write_text(json.dumps(record))
    cells.write_csv(layout.cells_csv)
    pl.DataFrame({"variant": ["baseline"]}).write_csv(layout.table_csv)
    study = load_study(tmp_path)
    cf = lead(None, study)
    assert cf is not None and cf.calibrated is not None
    said = text(cf)
    assert said.startswith("What a change of the mix would do (calibrated on the study's 12 variants;")
    assert "Leaving out `a` would raise held-out loss on `a`" in said and "(measured: +" in said
    assert "(a measurement holds the baseline seeds' own offset, which a prediction leaves out: a +0.0" in said
    from winnow.pipelines.report.page import render

    page = render(None, None, study)
    first = page.index("<h2>")
    assert page[first:].startswith("<h2>Which source helps: what a change of the mix would do</h2>")
    assert "calibrated on this study" in page and "which the predictions leave out (a +0.0" in page
    assert "± two posterior standard deviations" in page and ", Spearman 0." in page
    # each factor's table says whether the study measured it: x2 was not
    assert "<p>Each source left out: predicted, and measured by the study</p>" in page
    assert "<p>Each source share x 2: predicted</p>" in page


def test_the_scatter_shows_the_calibrated_prediction_beside_the_runs_own():
    import io

    from matplotlib.image import imread

    from winnow.pipelines.report.plots import attribution_scatter

    _, cells = _default_calibration()
    one = imread(io.BytesIO(attribution_scatter(cells.drop("calibrated"), 0.5)))
    two = imread(io.BytesIO(attribution_scatter(cells, 0.5, 0.9)))
    assert two.shape[1] > 1.8 * one.shape[1] and two.shape[0] == one.shape[0]  # a second panel beside the first


@pytest.mark.slow  # over 10 s of CPU: the whole fit and its check, twice or more
def test_a_diverged_runs_cell_is_left_out_and_the_file_stays_strict_json():
    """A NaN held-out loss (a diverged seed) made every parameter NaN, and calibrated.json held NaN."""
    frame, slope, se, *_ = _planted()
    poisoned = frame.with_columns(
        measured=pl.when((pl.col("variant") == "a_x0.5") & (pl.col("source") == "b"))
        .then(float("nan"))
        .otherwise(pl.col("measured"))
    )
    record, cells = calibrate(poisoned, slope, se, SOURCES, HELD, 0.5, BASE)
    json.dumps(record, allow_nan=False)
    clean, _ = calibrate(poisoned.filter(pl.col("measured").is_not_nan()), slope, se, SOURCES, HELD, 0.5, BASE)
    assert record["sigma"] == clean["sigma"] and record["shape"] == clean["shape"]
    assert cells.filter(pl.col("measured").is_nan())["calibrated"].to_list() == [None]
    nan_slope = slope.copy()
    nan_slope[0, 0] = float("nan")
    assert calibrate(frame, nan_slope, se, SOURCES, HELD, 0.5, BASE) is None


@pytest.mark.parametrize("factors", [(0.5, 1.5), (0.5, 2.0)])
def test_a_study_without_a_source_left_out_keeps_the_runs_shape(factors):
    """x0.5 and x1.5 (or x2) say little of how the response ends at r = 0: fitted from them, the shape fell to the end
    of its range and leaving a source out was predicted at 10 nats. The run's own shape stays."""
    frame, slope, se, _, _, truth = _planted(p=0.5)
    frame = frame.filter(pl.col("factor") != 0).with_columns(
        factor=pl.when(pl.col("factor") == 1.5).then(factors[1]).otherwise(pl.col("factor"))
    )
    record, _ = calibrate(frame, slope, se, SOURCES, HELD, 0.5, BASE)
    assert record["shape"] == 0.5 and record["shape_at_edge"] is False
    left_out = np.array(record["predicted"]["0"])[:, :4]
    assert np.abs(left_out).max() < 3 * np.abs([truth(i, 0.0) for i in range(4)]).max()


def test_factors_from_share_ratios_count_once():
    """x0.5 comes out of the share ratios as 0.5 for one source and 0.5000000000000001 for another: still one factor,
    which cannot tell a shape from a scale."""
    frame, slope, se, *_ = _planted()
    halves = frame.filter(pl.col("factor") == 0.5).with_columns(
        factor=pl.when(pl.col("varied") == "b").then(0.5000000000000001).otherwise(pl.col("factor"))
    )
    record, _ = calibrate(halves, slope, se, SOURCES, HELD, 0.5, BASE)
    assert record["shape"] == 0.5


@pytest.mark.parametrize(
    "edit",
    [
        lambda r: r.pop("variants"),
        lambda r: r.update(check={}),
        lambda r: r.update(offset=[1, 2]),
        lambda r: r.update(shape="x"),
        lambda r: r.pop("shape"),
        lambda r: r.pop("check"),
        lambda r: r["predicted"].update({"0": [[0.1]]}),
        lambda r: r.update(kappa=float("nan")),
        lambda r: r["predicted"]["0"][0].__setitem__(0, None),
    ],
    ids=[
        "no variants",
        "empty check",
        "offset a list",
        "shape of text",
        "no shape",
        "no check",
        "predicted misshapen",
        "kappa NaN",
        "a prediction null",
    ],
)
def test_an_edited_calibrated_json_is_left_out_of_the_report_said_once(tmp_path, edit, caplog):
    from winnow.pipelines.ablate.layout import StudyLayout, load_study
    from winnow.pipelines.report.counterfactual import lead
    from winnow.pipelines.report.page import render

    layout = StudyLayout(tmp_path)
    layout.tables.mkdir(parents=True)
    record, cells = _default_calibration()
    edit(record)
    layout.calibrated_json.write_text(json.dumps(record))
    cells.write_csv(layout.cells_csv)
    pl.DataFrame({"variant": ["baseline"]}).write_csv(layout.table_csv)
    study = load_study(tmp_path)
    assert study.calibrated is None
    assert [r.message for r in caplog.records if "calibrated.json is not what" in r.message]
    assert lead(None, study) is None
    assert "calibrated on this study" not in render(None, None, study)


def test_a_deleted_calibrated_json_whose_check_correlation_json_still_holds_is_said(tmp_path, caplog):
    from winnow.pipelines.ablate.layout import StudyLayout, load_study

    layout = StudyLayout(tmp_path)
    layout.tables.mkdir(parents=True)
    record, _ = _default_calibration()
    layout.correlation_json.write_text(json.dumps({"spearman": 0.8, "calibrated": record["check"]}))
    pl.DataFrame({"variant": ["baseline"]}).write_csv(layout.table_csv)
    assert load_study(tmp_path).calibrated is None
    said = [r.message for r in caplog.records if "calibrated.json is missing" in r.message]
    assert len(said) == 1 and "correlation.json holds its check" in said[0] and "re-run `winnow ablate`" in said[0]
    caplog.clear()
    layout.correlation_json.write_text(json.dumps({"spearman": 0.8}))  # a study never calibrated: nothing to say
    load_study(tmp_path)
    assert not [r for r in caplog.records if "missing" in r.message]


def test_the_mean_measurement_beside_a_prediction_is_the_effects_tables():
    """The sentences' "(measured: ...)" for the mean over the held-out sets gave another noise than the effects table
    for the same variant (the sets' noises taken as independent): it is now the effects table's figure."""
    from winnow.pipelines.report.counterfactual import attach_measured, calibrated_record

    record, cells = _default_calibration()
    effects = pl.DataFrame({"variant": ["without_a"], "mean_delta": [0.123], "mean_noise": [0.045]})
    cf = calibrated_record(record)
    attach_measured(cf, cells, effects)
    assert cf.measured[("a", 0.0)]["mean"] == (0.123, 0.045)
    own = cells.filter(pl.col("variant") == "without_b")
    assert cf.measured[("b", 0.0)]["mean"][0] == pytest.approx(own["measured"].mean())  # not in the effects given


def test_a_study_calibrated_with_a_shape_per_source_still_leads_its_report(tmp_path):
    """calibrated.json files that hold one response shape per source and no curvature (the per-cell model's) are
    read as before: the page leads with them and names each source's shape."""
    from winnow.pipelines.ablate.layout import StudyLayout, load_study
    from winnow.pipelines.report.counterfactual import curvatures_text, lead, shapes_text
    from winnow.pipelines.report.page import render

    layout = StudyLayout(tmp_path)
    layout.tables.mkdir(parents=True)
    record, cells = _default_calibration()
    record["shape"] = [0.4, 0.5, 0.6, 0.7]
    del record["curvature"]
    layout.calibrated_json.write_text(json.dumps(record))
    cells.write_csv(layout.cells_csv)
    pl.DataFrame({"variant": ["baseline"]}).write_csv(layout.table_csv)
    study = load_study(tmp_path)
    assert study.calibrated is not None and lead(None, study).calibrated is not None
    assert shapes_text(study.calibrated) == "a 0.40, b 0.50, c 0.60, d 0.70"
    assert curvatures_text(study.calibrated) == "none recorded"
    assert "share ratios bent by p = a 0.40, b 0.50" in render(None, None, study)
