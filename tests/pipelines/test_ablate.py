"""``winnow ablate``: the [ablate] table, per-source shard sets, variants, the study table and its comparison."""

import json
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tests.pipelines.ablate_util import SOURCES, study_toml, tiny_job
from winnow.curate.errors import ConfigError
from winnow.pipelines.ablate.config import AblateConfig
from winnow.pipelines.ablate.correlation import agreement, compare_with_counterfactual, split_half
from winnow.pipelines.ablate.layout import StudyLayout, load_study
from winnow.pipelines.ablate.plan import variants
from winnow.pipelines.ablate.sources import split_by_source
from winnow.pipelines.ablate.table import write_study
from winnow.pipelines.cli import main
from winnow.pipelines.jobfile import build_config
from winnow.train.data.shards import open_shards, read_shard


@pytest.fixture
def job(tmp_path) -> Path:
    return tiny_job(tmp_path / "job")


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="ablate.kind"):
        AblateConfig(kind="drop_everything")
    with pytest.raises(ConfigError, match="ablate.factors"):
        AblateConfig(kind="weights", factors=[1.0])
    with pytest.raises(ConfigError, match="ablate.mixes"):
        AblateConfig(kind="mixes")
    with pytest.raises(ConfigError, match="unknown key 'seeds'"):
        build_config(AblateConfig, {"seeds": 2}, "job.toml [ablate]")
    with pytest.raises(ConfigError, match="ablate.adaptive = 'odm' is invalid"):
        AblateConfig(adaptive="odm")
    with pytest.raises(ConfigError, match="ablate.adaptive = 'doremi' is invalid.*replay"):
        AblateConfig(kind="replay", adaptive="doremi")
    with pytest.raises(ConfigError, match="ablate.adaptive_every"):
        AblateConfig(adaptive="doremi", adaptive_every=0)
    # refused up front: each was found only after the first round had trained
    for name in ("doremi", "proposed", "counterfactual"):
        with pytest.raises(ConfigError, match=rf"ablate.mixes.{name} .*the study's own runs"):
            AblateConfig(kind="mixes", mixes={name: {"code": 1.0}})
    with pytest.raises(ConfigError, match=r"ablate.attribution_every = 0 .*adaptive = 'counterfactual'"):
        AblateConfig(adaptive="counterfactual", attribution_every=0)
    # each was accepted and had no effect, or a confusing one
    with pytest.raises(ConfigError, match=r"ablate.mixes = .* empty unless kind includes 'mixes'"):
        AblateConfig(kind="leave_one_out", mixes={"m": {"code": 1.0}})
    with pytest.raises(ConfigError, match=r"ablate.factors = \[0.0\] .*beside kind 'leave_one_out'"):
        AblateConfig(kind=["leave_one_out", "weights"], factors=[0.0])
    assert AblateConfig(kind="weights", factors=[0.0]).factors == [0.0]  # alone, a factor 0 is the leave-one-out
    with pytest.raises(ConfigError, match=r"ablate.noise_seeds = 0 is invalid"):
        AblateConfig(noise_seeds=0)


def test_variants_per_kind():
    base = {"code": 0.25, "prose": 0.75}
    loo = variants(AblateConfig(noise_seeds=2), base, seed=3)
    assert [v["name"] for v in loo] == ["baseline", "baseline_seed4", "without_code", "without_prose"]
    assert loo[2]["weights"] == {"prose": 0.75} and loo[2]["seed"] == 3
    up = variants(AblateConfig(kind="weights", sources=["code"], factors=[2.0]), base, seed=0)[-1]
    assert up["name"] == "code_x2" and up["weights"] == {"code": 0.5, "prose": 0.75}
    mixed = variants(AblateConfig(kind="mixes", mixes={"code_only": {"code": 1.0, "prose": 0.0}}), base, seed=0)[-1]
    assert mixed["weights"] == {"code": 1.0}
    with pytest.raises(ConfigError, match="unknown source 'web'"):
        variants(AblateConfig(sources=["web"]), base, seed=0)
    seeded = variants(AblateConfig(noise_seeds=2, variant_seeds=2), base, seed=3)
    assert [v["name"] for v in seeded][2:] == [
        "without_code",
        "without_prose",
        "without_code_seed4",
        "without_prose_seed4",
    ]
    assert seeded[4]["seed"] == 4 and seeded[4]["group"] == "without_code" and seeded[4]["weights"] == {"prose": 0.75}
    with pytest.raises(ConfigError, match="ablate.variant_seeds"):
        AblateConfig(variant_seeds=0)


def test_split_by_source_keeps_every_row_once_in_order(job, tmp_path):
    folders, shares = split_by_source(str(job), tmp_path / "views")
    assert sorted(folders) == SOURCES and sum(shares.values()) == pytest.approx(1.0)
    assert shares["prose"] > shares["code"]  # prose documents are longer
    for source, folder in folders.items():
        view = open_shards(folder, split="train", fmt="parquet")
        ids = [
            i
            for k in range(len(view.shards))
            for i in read_shard(view, k, fmt="parquet", verify=True)["id"].to_pylist()
        ]
        assert ids == [f"{source}/{i}" for i in range(12)]  # the curriculum order of the job, one source only
    again, _ = split_by_source(str(job), tmp_path / "views")  # reused, not rewritten
    assert again == folders


def test_a_job_with_token_shards_is_split_at_its_token_shares(tmp_path):
    """A study's baseline ("the curated mix") trained at byte shares where the job had token shards: with a
    tokenizer whose tokens per byte differ by source, a mix nobody curated."""
    from tests.train.shards_util import write_token_job

    rows = [{"id": f"a{i}", "source": "a", "text": "x", "meta": None} for i in range(10)]  # 10 bytes, 20 tokens
    rows.append({"id": "b0", "source": "b", "text": "y" * 20, "meta": None})  # 20 bytes, 21 tokens (with its end)
    job = write_token_job(tmp_path / "job", [rows])
    _, shares = split_by_source(str(job), tmp_path / "views")
    assert shares == pytest.approx({"a": 20 / 41, "b": 21 / 41})


def test_a_token_shard_listed_outside_the_job_folder_is_refused_and_a_damaged_view_is_made_again(tmp_path, caplog):
    """Per-source views copied a token shard's rows from wherever its manifest path pointed (an absolute path, or
    ../), where training the job folder refuses it; a view's own damaged manifest was a JSONDecodeError traceback."""
    from tests.train.shards_util import write_token_job
    from winnow.train.errors import ShardError

    rows = [{"id": f"a{i}", "source": "a", "text": "x" * 10, "meta": None} for i in range(10)]
    job = write_token_job(tmp_path / "job", [rows])
    folders, shares = split_by_source(str(job), tmp_path / "views")
    view = Path(folders["a"]) / "manifest.json"
    view.write_text('{"derived_from": ')
    assert split_by_source(str(job), tmp_path / "views") == (folders, shares)  # made again
    assert "cannot be read" in caplog.text and json.loads(view.read_text())["derived_from"]
    manifest = json.loads((job / "manifest.json").read_text())
    entry = next(e for e in manifest["shards"] if e["format"] == "tokens")
    for path in (str(job / entry["path"]), "../" + entry["path"]):
        entry["path"] = path
        (job / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(ShardError, match="which leaves the job folder"):
            split_by_source(str(job), tmp_path / "other")


@pytest.mark.parametrize("damage", ["replaced", "cut", "missing"])
def test_splitting_by_source_checks_each_shard_against_the_manifest(job, tmp_path, damage):
    """A study, adaptive mixing and per-source weights split the job's Parquet shards into per-source views with
    checksums of their own: a shard replaced by another was trained on without a word (the loader refuses it in
    the job folder), and a missing or cut one was a polars traceback."""
    from winnow.train.errors import ShardError

    shards = sorted((job / "shards" / "train").glob("*.parquet"))
    first, other = shards[0], shards[-1]
    if damage == "replaced":
        first.write_bytes(other.read_bytes())
    elif damage == "cut":
        first.write_bytes(first.read_bytes()[:100])
    else:
        first.unlink()
    said = "is not there, though" if damage == "missing" else "that are not the shard .* lists .*cut short or replaced"
    with pytest.raises(ShardError, match=rf"{first.name}.*{said}"):
        split_by_source(str(job), tmp_path / "views")


def test_ranks_splitting_the_same_job_at_once_never_record_a_half_written_shard(job, tmp_path):
    """Every rank of a distributed run splits the job into per-source sets at the same moment: whatever the
    interleaving, each view's recorded checksums are those of the files that end up on disk."""
    import hashlib
    import threading

    from winnow.pipelines.ablate.sources import _write_view
    from winnow.pipelines.provenance import manifest_sha256

    manifest = json.loads((job / "manifest.json").read_text())
    entries = [e for e in manifest["shards"] if e.get("split") == "train" and e.get("format") == "parquet"]
    folder, views = tmp_path / "prose", []

    def split() -> None:
        for _ in range(20):
            views.append(_write_view(str(job), manifest, entries, "prose", folder, manifest_sha256(job)))

    ranks = [threading.Thread(target=split) for _ in range(3)]
    for rank in ranks:
        rank.start()
    for rank in ranks:
        rank.join()
    for view in views:
        for shard in view["shards"]:
            assert hashlib.sha256((folder / shard["path"]).read_bytes()).hexdigest() == shard["sha256"]


def _cf(slope, sources=("code", "prose", "docs"), q=0.5, se=0.01):
    slope = np.asarray(slope, dtype=float)
    return {
        "sources": list(sources),
        "held_out": [*sources, "mean"],
        "slope": np.concatenate([slope, slope.mean(1, keepdims=True)], 1),
        "slope_se": np.full((len(sources), len(sources) + 1), se),
        "saturation": q,
    }


def _result(name, kind, seed, weights, held, **kw):
    return {"name": name, "kind": kind, "seed": seed, "weights": weights, "held_out": dict(held), "steps": 10, **kw}


def test_prediction_matches_measured_deltas():
    """A source left out or scaled against the others: (r^q - 1)/q times its slope; a mix of several changes: the
    slopes times the log share ratios."""
    slope = [[-0.1, 0.0, 0.01], [-0.02, -0.15, 0.0], [0.0, 0.01, -0.2]]  # each source lowers its own loss most
    base = {"code": 0.4, "prose": 0.4, "docs": 0.2}
    held = lambda c, p, d: {"code": c, "prose": p, "docs": d}  # noqa: E731
    results = [
        _result("baseline", "baseline", 0, base, held(2.0, 3.0, 2.5)),
        _result("baseline_seed1", "noise", 1, base, held(2.01, 3.01, 2.51)),
        _result("without_code", "leave_one_out", 0, {"prose": 0.4, "docs": 0.2}, held(2.2, 2.99, 2.49)),
        _result("docs_x1.5", "weights", 0, {"code": 0.4, "prose": 0.4, "docs": 0.3}, held(2.0, 3.0, 2.44)),
        _result("mix_00", "random_mix", 0, {"code": 0.2, "prose": 0.4, "docs": 0.4}, held(2.1, 3.0, 2.3)),
    ]
    summary = compare_with_counterfactual(results, [_cf(slope)], base)
    cells = summary["cells"]
    key = cells["variant"] + "/" + cells["source"]
    predicted = dict(zip(key, cells["predicted"]))
    assert predicted["without_code/code"] == pytest.approx(-2 * -0.1)  # (0^q - 1)/q = -1/q
    assert predicted["docs_x1.5/docs"] == pytest.approx((1.5**0.5 - 1) / 0.5 * -0.2)
    ratio = np.array([0.2 / 0.4, 1.0, 0.4 / 0.2])  # the mix against the baseline's shares
    assert predicted["mix_00/docs"] == pytest.approx(np.log(ratio) @ np.array(slope)[:, 2])
    varied = dict(zip(cells["variant"], cells["varied"]))
    assert varied["without_code"] == "code" and varied["docs_x1.5"] == "docs" and varied["mix_00"] is None
    measured = dict(zip(key, cells["measured"]))
    assert measured["without_code/code"] == pytest.approx(2.2 - 2.005)
    # two standard errors of a delta: 2 · sd(2.0, 2.01) · sqrt(1/1 + 1/2); deltas are from the baseline seeds' mean
    assert summary["noise"]["code"] == pytest.approx(2 * 0.01 / 2**0.5 * 1.5**0.5)
    assert summary["sign_agree"] == summary["above_noise"] and summary["within_2x"] <= summary["above_noise"]


def test_sizes_within_a_factor_two_are_counted_on_the_cells_above_the_noise():
    cells = pl.DataFrame(
        {
            "measured": [0.2, -0.1, 0.3, 0.001],
            "predicted": [0.35, -0.3, -0.3, 5.0],
            "above_noise": [True, True, True, False],
        }
    )
    found = agreement(cells)
    assert (found["above_noise"], found["sign_agree"], found["within_2x"]) == (3, 2, 1)


@pytest.mark.parametrize("predicted", [[0.3, 0.1], [0.2, 0.2, 0.2]], ids=["two cells", "constant"])
def test_a_spearman_there_is_none_of_is_null_in_json_and_said_so(predicted):
    """Two cells (a one-variant study), or a prediction the same for every cell, gave `"spearman": NaN`, which strict
    JSON readers refuse, and `Spearman nan` in the terminal."""
    from winnow.pipelines.ablate.table import agreement_text

    n = len(predicted)
    cells = pl.DataFrame({"measured": [0.2, -0.1, 0.05][:n], "predicted": predicted, "above_noise": [True] * n})
    found = {**agreement(cells), "counterfactual_runs": 2, "by_kind": {}, "note": ""}
    assert found["spearman"] is None
    json.loads(json.dumps(found), parse_constant=lambda c: pytest.fail(f"{c} in correlation.json"))
    assert "Spearman none (under 3 cells, or one side constant)" in agreement_text(found)


def test_a_study_without_seed_noise_does_not_count_cells_above_it():
    """With one baseline seed every nonzero change was "above the seed noise", a noise nobody measured."""
    from winnow.pipelines.ablate.table import agreement_text

    cells = pl.DataFrame(
        {"measured": [0.2, -0.1], "predicted": [0.3, 0.1], "above_noise": [True, True], "noise": [0.0, 0.0]}
    )
    found = {**agreement(cells), "counterfactual_runs": 1, "by_kind": {}, "note": ""}
    assert not found["noise_measured"]
    text = agreement_text(found)
    assert "signs agree on 1 of the 2 cells that moved (no seed noise measured: [ablate] noise_seeds = 1)" in text
    assert "above the seed noise" not in text
    assert "2 cells above the seed noise" in agreement_text({**found, "noise_measured": True})


def test_a_variant_measured_with_several_seeds_is_one_cell_of_their_mean():
    base = {"code": 0.4, "prose": 0.4, "docs": 0.2}
    held = lambda c, p, d: {"code": c, "prose": p, "docs": d}  # noqa: E731
    results = [
        _result("baseline", "baseline", 0, base, held(2.0, 3.0, 2.5)),
        _result("baseline_seed1", "noise", 1, base, held(2.02, 3.0, 2.5)),
        _result("baseline_seed2", "noise", 2, base, held(2.04, 3.03, 2.5)),
        _result("without_code", "leave_one_out", 0, {"prose": 0.4, "docs": 0.2}, held(2.3, 2.9, 2.5)),
        _result(
            "without_code_seed1",
            "leave_one_out",
            1,
            {"prose": 0.4, "docs": 0.2},
            held(2.4, 2.8, 2.5),
            group="without_code",
        ),
    ]
    # two baseline seeds' counterfactuals: their mean slope, and their spread as its standard error
    cfs = [_cf(np.eye(3) * -0.1), _cf(np.eye(3) * -0.14)]
    summary = compare_with_counterfactual(results, cfs, base)
    cells = summary["cells"]
    assert cells["variant"].to_list() == ["without_code"] * 3 and cells["seeds"].to_list() == [2, 2, 2]
    assert cells["measured"].to_list()[:2] == pytest.approx([2.35 - 2.02, 2.85 - 3.01])
    assert cells["predicted"][0] == pytest.approx(0.24) and cells["interval"][0] == pytest.approx(
        2 * 2 * 0.02
    )  # 2 · (1/q) · sd(-0.1, -0.14)/sqrt(2)
    # the seeds' spread pooled: the baseline's (2.0, 2.02, 2.04: squares 0.0008, 2 degrees of freedom) and the
    # variant's (2.3, 2.4: 0.005, 1), so a variant whose seeds disagree widens the noise of every cell
    sd = np.sqrt((0.0008 + 0.005) / 3)
    assert summary["noise"]["code"] == pytest.approx(2 * sd * np.sqrt(1 / 2 + 1 / 3)) and summary["variant_seeds"] == 2
    assert summary["noise"]["docs"] == 0  # no seed moved it


def test_each_cell_has_the_noise_of_its_own_seeds_and_a_diverged_seed_measures_nothing():
    """A one-seed mix was judged against the noise of the most-seeded variant (understated by ~0.7x), and a
    diverged seed's NaN was averaged into its cell ("+nan ... higher") and ranked into Spearman."""
    from winnow.pipelines.ablate.compare import effects

    base = {"code": 0.4, "prose": 0.4, "docs": 0.2}
    held = lambda c, p, d: {"code": c, "prose": p, "docs": d}  # noqa: E731
    scaled = {"code": 0.2, "prose": 0.4, "docs": 0.2}
    results = [
        _result("baseline", "baseline", 0, base, held(2.0, 3.0, 2.5)),
        _result("baseline_seed1", "noise", 1, base, held(2.02, 3.0, 2.5)),
        _result("baseline_seed2", "noise", 2, base, held(2.04, 3.03, 2.5)),
        _result("code_x0.5", "weights", 0, scaled, held(2.3, 2.9, 2.5), varied="code"),
        _result("code_x0.5_seed1", "weights", 1, scaled, held(2.4, 2.8, 2.5), group="code_x0.5", varied="code"),
        _result("code_x0.5_seed2", "weights", 2, scaled, held(float("nan"), 2.8, 2.5), group="code_x0.5",
                varied="code"),
        _result("mix_a", "mixes", 0, {"code": 0.5, "prose": 0.3, "docs": 0.2}, held(2.1, 3.1, 2.5)),
    ]  # fmt: skip
    summary = compare_with_counterfactual(results, [_cf(np.eye(3) * -0.1)], base)
    cells = {(r["variant"], r["source"]): r for r in summary["cells"].iter_rows(named=True)}
    sd = np.sqrt((0.0008 + 0.005) / 3)  # the baseline's seeds and code_x0.5's two finite ones, pooled
    assert cells["code_x0.5", "code"]["seeds"] == 2 and cells["code_x0.5", "prose"]["seeds"] == 3
    assert cells["code_x0.5", "code"]["measured"] == pytest.approx(2.35 - 2.02)  # the NaN seed left out
    assert cells["code_x0.5", "code"]["noise"] == pytest.approx(2 * sd * np.sqrt(1 / 2 + 1 / 3))
    assert cells["mix_a", "code"]["noise"] == pytest.approx(2 * sd * np.sqrt(1 / 1 + 1 / 3))  # its one seed
    assert summary["noise"]["code"] == pytest.approx(2 * sd * np.sqrt(1 / 3 + 1 / 3))  # a variant of 3 seeds
    assert np.isfinite(summary["cells"]["measured"].to_numpy()).all()
    found = {e.variant: e for e in effects(results, list(base))}
    baseline_mean = np.mean([7.5, 7.52, 7.57]) / 3  # the mean over the held-out sets, per baseline seed
    assert found["code_x0.5"].mean.value == pytest.approx(7.7 / 3 - baseline_mean)  # the diverged seed left out
    diverged = [*results[:3], _result("all_nan", "weights", 0, scaled, held(float("nan"), 2.8, 2.5))]
    assert {e.variant: e for e in effects(diverged, list(base))}["all_nan"].mean.verdict == "diverged"


def test_an_adaptive_run_is_measured_on_the_sources_with_held_out_rows(tmp_path):
    """A source with train rows and no val rows (val_fraction_by_source = 0) stopped a study with a TypeError after
    every run had trained, and no report was written."""
    from winnow.pipelines.ablate.table import write_adaptive

    base = {"code": 0.5, "legal": 0.5}
    results = [
        _result("baseline", "baseline", 0, base, {"code": 2.0, "legal": None}),
        _result("baseline_seed1", "noise", 1, base, {"code": 2.1, "legal": None}),
        _result("doremi", "adaptive", 0, base, {"code": 1.9, "legal": None}, mixing={"mix_weights_mean": base}),
    ]
    text = write_adaptive(StudyLayout(tmp_path), results, list(base), "mean")
    assert "held-out mean loss 1.9000 vs baseline 2.0000 (-0.1000 nats" in text


def _study(effects: dict[str, np.ndarray], base: dict, seeds: int, sd: float, rng) -> list[dict]:
    """Results of a study whose variants change held-out losses by ``effects`` (per variant, per source), each run
    with Gaussian seed noise of ``sd``: the baseline with 4 seeds, each variant with ``seeds``."""
    names = list(base)
    start = {s: 2.0 + i for i, s in enumerate(names)}

    def held(shift):
        return {s: start[s] + shift[i] + sd * rng.standard_normal() for i, s in enumerate(names)}

    out = [_result("baseline", "baseline", 0, base, held(np.zeros(len(names))))]
    out += [_result(f"baseline_seed{k}", "noise", k, base, held(np.zeros(len(names)))) for k in range(1, 4)]
    for name, shift in effects.items():
        left = name.removeprefix("without_")
        weights = {s: w for s, w in base.items() if s != left}
        for k in range(seeds):
            out.append(_result(f"{name}_seed{k}" if k else name, "leave_one_out", k, weights, held(shift), group=name))
    return out


def test_the_measurement_says_how_well_it_agrees_with_itself():
    """Two halves of the seeds measure the same cells: with effects far above the seed noise they rank them alike
    (a perfect prediction could reach ~1), with no effects at all their ranks are unrelated."""
    base = {"code": 0.4, "prose": 0.4, "docs": 0.2}
    rng = np.random.default_rng(0)
    effects = {f"without_{s}": rng.normal(0, 0.3, 3) for s in base}
    strong = compare_with_counterfactual(_study(effects, base, 3, 0.001, rng), [_cf(np.eye(3) * -0.1)], base)
    found = strong["measurement"]
    assert found["split_half"] > 0.95 and found["ceiling"] > 0.95
    assert found["splits"] == 3 * 4  # rotations of the variants' 3 seeds times the baseline's 4
    rhos = []
    for seed in range(20):
        rng = np.random.default_rng(seed)
        noise_only = {f"without_{s}": np.zeros(3) for s in base}
        rhos.append(
            compare_with_counterfactual(_study(noise_only, base, 3, 0.05, rng), [_cf(np.eye(3) * -0.1)], base)[
                "measurement"
            ]["split_half"]
        )
    assert abs(np.mean(rhos)) < 0.15
    # a study with one seed per variant has no two halves to compare
    single = compare_with_counterfactual(_study(effects, base, 1, 0.001, rng), [_cf(np.eye(3) * -0.1)], base)
    assert single["measurement"] is None


def test_split_half_measures_each_half_against_its_own_baseline_seeds():
    """The cells of one half are its variant seeds' mean minus its baseline seeds' mean: with 2 seeds each, the
    first rotation compares (seed 0 - baseline seed 0) with (seed 1 - baseline seed 1)."""
    base_runs = [
        _result("baseline", "baseline", 0, {}, {"a": 1.0, "b": 1.0, "c": 1.0}),
        _result("baseline_seed1", "noise", 1, {}, {"a": 2.0, "b": 2.0, "c": 2.0}),
    ]
    runs = [
        _result("v", "weights", 0, {}, {"a": 1.1, "b": 1.3, "c": 1.2}),
        _result("v_seed1", "weights", 1, {}, {"a": 2.1, "b": 2.3, "c": 2.2}, group="v"),
    ]
    found = split_half({"v": runs}, base_runs, ["a", "b", "c"])
    # every rotation pairs a variant seed with a baseline seed: the same ranks (a < c < b) or, crossed
    # (seed 0 - baseline seed 1), the same ranks shifted by -1: still the same order
    assert found["split_half"] == pytest.approx(1.0) and found["splits"] == 4
    assert split_half({"v": runs}, base_runs[:1], ["a", "b", "c"]) is None


def test_a_study_says_when_its_variants_seeds_spread_far_more_than_the_baseline_seeds_its_noise_comes_from():
    from winnow.pipelines.ablate.correlation import measurement_text, spread

    base_runs = [_result(f"b{k}", "noise", k, {}, {"a": 2.0 + d, "b": 3.0 - d}) for k, d in enumerate((0, 0.01, 0.02))]
    loose = [_result(f"v{k}", "weights", k, {}, {"a": 2.1 + d, "b": 2.9}) for k, d in enumerate((0, 0.04))]
    other = [_result(f"w{k}", "weights", k, {}, {"a": 1.8, "b": 3.2 + d}) for k, d in enumerate((0, 0.02))]
    found = spread([loose, other], base_runs, ["a", "b"])
    # pooled over the variants: a, 0.04 apart in one and equal in the other (sd 0.02) against the baseline's 0.01;
    # b, 0.02 apart in one (sd 0.01) against 0.01
    assert found["spread_by_set"] == pytest.approx({"a": 2.0, "b": 1.0})
    assert found["spread"] == pytest.approx(1.5)
    text = measurement_text({"split_half": 0.8, "splits": 4, "ceiling": 0.94, **found})
    assert "variants' seeds spread 1.5x as much as the baseline's" in text and "the noise pools both" in text
    calm = spread([other], base_runs, ["a", "b"])
    assert "spread" not in measurement_text({"split_half": 0.8, "splits": 4, "ceiling": 0.94, **calm})
    assert spread([loose], base_runs[:1], ["a"]) == {}  # one baseline seed: no spread to compare with


def test_write_study_table_the_report_reads(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(
        json.dumps({"step": 10, "attribution": {"sources": SOURCES, "matrix": [[-0.1, 0.0], [0.0, -0.2]]}})
        + "\n"
        + json.dumps(
            {
                "step": 10,
                "counterfactual": {
                    "sources": SOURCES,
                    "held_out": [*SOURCES, "mean"],
                    "factors": [0.0],
                    "slope": [[-0.1, 0.0, -0.05], [0.0, -0.2, -0.1]],
                    "slope_se": [[0.01] * 3] * 2,
                    "predicted": {"0": [[0.2, 0.0, 0.1], [0.0, 0.4, 0.2]]},
                    "interval": {"0": [[0.04] * 3] * 2},
                    "saturation": 0.5,
                },
            }
        )
        + "\n"
    )
    results = [
        {
            "name": "baseline",
            "kind": "baseline",
            "seed": 0,
            "weights": {"code": 1, "prose": 1},
            "held_out": {"code": 2.0, "prose": 3.0},
            "steps": 10,
        },
        {
            "name": "code_x0.5",
            "kind": "weights",
            "seed": 0,
            "weights": {"code": 0.5, "prose": 1},
            "held_out": {"code": 2.5, "prose": 2.9},
            "steps": 10,
        },
        {
            "name": "without_code",
            "kind": "leave_one_out",
            "seed": 0,
            "weights": {"prose": 1},
            "held_out": {"code": 2.5, "prose": 2.9},
            "steps": 10,
        },
    ]
    markdown = write_study(tmp_path, results, SOURCES, {"code": 0.5, "prose": 0.5})
    table = pl.read_csv(StudyLayout(tmp_path).table_csv)
    assert table.filter(pl.col("variant") == "without_code")["delta_code"].item() == pytest.approx(0.5)
    assert "| without_code |" in markdown and StudyLayout(tmp_path).heatmap_png.stat().st_size > 0
    assert StudyLayout(tmp_path).cells_csv.is_file()
    assert StudyLayout(tmp_path).scatter_png.read_bytes()[:4] == b"\x89PNG"
    assert load_study(tmp_path) is not None
    (tmp_path / "metrics.jsonl").write_text("")  # the baseline recorded no counterfactual: the study says why
    again = write_study(tmp_path, results, SOURCES, {"code": 0.5, "prose": 0.5})
    assert "No counterfactual of the baseline to set beside the measured deltas" in again


@pytest.mark.slow
def test_ablate_command_end_to_end(job, tmp_path, capsys, one_thread):
    toml = study_toml(tmp_path / "study.toml", job, tmp_path / "study", noise_seeds=2, attribution_every=1)
    assert main(["ablate", str(toml)]) == 0
    study = tmp_path / "study"
    layout = StudyLayout(study)
    table = pl.read_csv(layout.table_csv)
    assert table["variant"].to_list() == ["baseline", "baseline_seed1", "without_code", "without_prose"]
    assert table.filter(pl.col("variant") == "baseline")["delta_code"].item() == 0.0
    assert all(table[f"loss_{s}"].is_not_null().all() for s in SOURCES)
    assert json.loads(layout.correlation_json.read_text())["n_cells"] == 4
    assert json.loads((study / "provenance.json").read_text())["data"][0]["manifest_sha256"]
    assert (study / "report.html").is_file() and "report:" in capsys.readouterr().out
    mtime = layout.result_path("without_code").stat().st_mtime
    assert main(["ablate", str(toml)]) == 0  # a re-run reuses finished variants
    assert layout.result_path("without_code").stat().st_mtime == mtime


def test_uncurated_job_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="curate the job first"):
        split_by_source(str(tmp_path / "nothing"), tmp_path / "views")


def test_counterfactual_bad_settings_are_refused_naming_the_key():
    with pytest.raises(ConfigError, match="ablate.attribution_seeds = 1 is invalid; allowed: 2 or more with interval"):
        AblateConfig(interval="seeds", attribution_seeds=1)
    with pytest.raises(ConfigError, match="ablate.factors"):
        AblateConfig(kind="weights", factors=[-0.5])  # a factor that makes a weight negative
    with pytest.raises(ConfigError, match="ablate.adaptive"):
        AblateConfig(adaptive=["doremi", "regmix"])
    with pytest.raises(ConfigError, match="ablate.counterfactual_step_size"):
        AblateConfig(adaptive="counterfactual", counterfactual_step_size=-1.0)
    with pytest.raises(ConfigError, match="ablate.counterfactual_max_factor"):
        AblateConfig(adaptive="counterfactual", counterfactual_max_factor=1.0)
    assert AblateConfig(adaptive=["doremi", "counterfactual"]).adaptive_methods == ("doremi", "counterfactual")


def test_repeated_or_empty_variant_names_are_refused_naming_the_key():
    """A repeated source or factor would name two variants alike; an empty mix name names no folder."""
    with pytest.raises(ConfigError, match=r"ablate.sources = \['web', 'web'\] is invalid; allowed: source names, each"):
        AblateConfig(kind="leave_one_out", sources=["web", "web"])
    with pytest.raises(ConfigError, match=r"ablate.factors = \[0.5, 0.5\] is invalid.*each once"):
        AblateConfig(kind="weights", factors=[0.5, 0.5])
    with pytest.raises(ConfigError, match=r'ablate.mixes."" = .* a non-empty name'):
        AblateConfig(kind="mixes", mixes={"": {"web": 1.0}})


def test_a_source_name_holding_a_pipe_keeps_the_markdown_table_whole():
    import polars as pl

    from winnow.pipelines.ablate.table import markdown_table

    lines = markdown_table(pl.DataFrame({"variant": ["without_x|y"], "delta_x|y": [0.5]})).splitlines()
    assert [line.replace("\\|", "").count("|") for line in lines] == [3, 3, 3]
    assert "without_x\\|y" in lines[2]


@pytest.mark.parametrize(
    ("ablate", "train", "message"),
    [
        (
            {"sources": '["cdoe"]'},
            "",
            r"s\.toml \[ablate\]: ablate\.sources: unknown source 'cdoe' \(did you mean 'code'\?\)",
        ),
        (
            {"kind": '"mixes"', "mixes": "{m1 = {nope = 1.0}}"},
            "",
            r"s\.toml \[ablate\]: ablate\.mixes\.m1: unknown source",
        ),
        (
            {"kind": '"leave-one-out"'},
            "",
            r"ablate\.kind = 'leave-one-out' is invalid; allowed: \(did you mean 'leave_one_out'\?\)",
        ),
        (  # a study refuses [train.stop] itself, before the sources it names
            {"eval_every": "1"},
            "[train.stop]\npatience = 1\nsources = ['prosee']",
            r"s\.toml \[train\.stop\]: a study compares runs of the same steps",
        ),
        ({}, "[train.attribution]\nheld_out = ['nope']", r"train\.attribution\.held_out: no held-out rows"),
    ],
)
@pytest.mark.parametrize("command", ["check", "ablate"])
def test_keys_naming_sources_the_shards_lack_are_refused_before_the_study_writes(
    job, tmp_path, capsys, command, ablate, train, message
):
    study = tmp_path / "study"
    path = study_toml(tmp_path / "s.toml", job, study, train=train, **ablate)
    assert main([command, str(path)]) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not study.exists()


def test_train_refuses_a_stop_source_the_held_out_sets_lack_before_step_one(job, tmp_path, capsys):
    run = tmp_path / "run"
    path = tmp_path / "t.toml"
    path.write_text(
        f'[train]\nshards = "{job}"\noutput = "{run}"\nsteps = 2\n[train.stop]\npatience = 1\nthresholds = {{cod = 1.0}}\n'
    )
    assert main(["train", str(path)]) == 2
    assert (
        "train.stop.thresholds.cod: no held-out rows of source 'cod' (did you mean 'code'?)" in capsys.readouterr().err
    )
    assert not run.exists()


def test_a_study_says_it_evaluates_on_its_own_schedule_and_refuses_what_it_would_drop(job, tmp_path, capsys, caplog):
    from winnow.pipelines.check import validate

    path = study_toml(tmp_path / "s.toml", job, tmp_path / "study", train="eval_every = 2")
    with caplog.at_level("WARNING"):
        assert validate(path).ablate.eval_steps(3) == 0  # the study's schedule: a finished study resumes as it was
    assert "[train] eval_every is not a study's: every run evaluates at its end" in caplog.text
    caplog.clear()
    path = study_toml(tmp_path / "s.toml", job, tmp_path / "study", train=f'output = "{tmp_path / "elsewhere"}"')
    with caplog.at_level("WARNING"):
        assert main(["check", str(path)]) == 0  # it said the study trains in [train] output
    assert f"is not a study's: its runs train in its own folder, {tmp_path / 'study'}" in caplog.text
    assert "steps of batch 2 x 32 tokens -> each run of the study" in capsys.readouterr().out
    stop = "[train.stop]\npatience = 1"
    for eval_every in ({}, {"eval_every": 1}):  # without it, it failed naming train.eval_every, which no run reads
        path = study_toml(tmp_path / "s.toml", job, tmp_path / "study", train=stop, **eval_every)
        for command in ("check", "ablate"):
            assert main([command, str(path)]) == 2
            assert "[train.stop]: a study compares runs of the same steps" in capsys.readouterr().err
    path = study_toml(
        tmp_path / "s.toml", job, tmp_path / "study", train=f'[train.mixing]\nadaptive = "doremi"\nreference = "{job}"'
    )
    for command in ("check", "ablate"):
        assert main([command, str(path)]) == 2
        assert "[train.mixing] key 'adaptive': a study sets every run's mix itself" in capsys.readouterr().err
    assert not (tmp_path / "study").exists()


def test_a_study_says_when_its_runs_read_only_the_start_of_a_source_in_file_order(tmp_path, caplog):
    from types import SimpleNamespace

    from winnow.pipelines.ablate.prepare import StudyData
    from winnow.pipelines.ablate.study import _say_reach, reach

    folders = {}
    for source, tokens in (("code", 4000), ("prose", 1000)):
        folder = tmp_path / source
        folder.mkdir()
        (folder / "manifest.json").write_text(json.dumps({"tokens_of_source": tokens}))
        folders[source] = str(folder)
    data = StudyData(job_dir=str(tmp_path), folders=folders, base={"code": 0.8, "prose": 0.2})

    def cfg(steps: int, window: int = 0) -> SimpleNamespace:
        loader = SimpleNamespace(batch_size=2, seq_len=50, shuffle_window=window)
        return SimpleNamespace(steps=steps, grad_accum=1, data=loader)

    assert reach(cfg(10), data) == pytest.approx({"code": 0.2, "prose": 0.2})  # 1,000 tokens a run
    with caplog.at_level("WARNING"):
        _say_reach(cfg(10), data)
    assert "the baseline reads only the first 20% of each source" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        _say_reach(cfg(10, window=500), data)  # documents in an order the seed draws
        _say_reach(cfg(30), data)  # 60% of each: most of every source
        _say_reach(cfg(10), StudyData(job_dir="", folders={"code": str(tmp_path)}, base={"code": 1.0}))  # no count
    assert caplog.text == ""
    data.base.update(code=0.95, prose=0.05)  # a mix that reads less of one source than of the other
    with caplog.at_level("WARNING"):
        _say_reach(cfg(10), data)
    assert "reads only the first 5% of prose, 24% of code:" in caplog.text


@pytest.mark.parametrize("command", ["check", "ablate"])
def test_stop_rules_in_a_study_are_refused_before_anything_trains(job, tmp_path, capsys, command):
    """With [ablate] eval_every they were kept: a variant that stopped at another step than the baseline left the
    effects without a word, and table.csv measured it against the baseline's loss at another step."""
    study = tmp_path / "study"
    stop = "[train.stop]\nthresholds = { code = 5.0 }"
    path = study_toml(tmp_path / "s.toml", job, study, train=stop, eval_every=1, attribution_every=0)
    assert main([command, str(path)]) == 2
    err = capsys.readouterr().err
    assert "s.toml [train.stop]: a study compares runs of the same steps, and early stopping" in err
    assert "remove [train.stop]" in err and not study.exists()


def test_keys_the_studys_kinds_do_not_read_are_refused_naming_the_kinds_that_do(job, tmp_path, capsys):
    """`sources` was ignored by random and named mixes (every source drawn), `factors` by a leave-one-out study."""
    message = r"ablate.sources = \['code'\] is invalid; allowed: no such key unless kind includes 'leave_one_out' or "
    with pytest.raises(ConfigError, match=message + r"'weights'.*\(kind 'random_mixes' would ignore it\)"):
        AblateConfig(kind="random_mixes", sources=["code"])
    with pytest.raises(ConfigError, match=message):
        AblateConfig(kind="mixes", mixes={"m": {"code": 1.0}}, sources=["code"])
    with pytest.raises(ConfigError, match=r"ablate.factors = \[0.5\] is invalid; allowed: .*kind includes 'weights'"):
        AblateConfig(kind="leave_one_out", factors=[0.5])
    for kind in ("random_mixes", "mixes", "replay", "drop"):  # their defaults are no one's choice: accepted
        assert AblateConfig(
            kind=kind, mixes={"m": {"code": 1.0}} if kind == "mixes" else {}, drop=["x"] * (kind == "drop")
        )
    assert AblateConfig(kind=["leave_one_out", "random_mixes"], sources=["code"]).sources == ["code"]
    assert AblateConfig(kind="weights", sources=["code"], factors=[0.5]).factors == [0.5]
    study = tmp_path / "study"
    path = study_toml(tmp_path / "s.toml", job, study, kind='"random_mixes"', sources='["code"]', n_mixes=3)
    assert main(["check", str(path)]) == 2  # it said ok
    assert "s.toml [ablate]: ablate.sources = ['code'] is invalid" in capsys.readouterr().err


def test_factors_and_shares_are_refused_naming_their_key_where_a_weight_underflows_or_two_give_one_name():
    """A factor of 1e-323 failed only as the variant trained, naming train.data.mix_weights (its weight was 0.0);
    factors 0.5 and 0.5000001 (both `_x0.5`) were refused naming a key the file lacks (ablate.mixes.code_x0.5);
    shares 0.01 and 0.010000001 (both `replay_0.01`) trained one run and tabled it twice."""
    with pytest.raises(ConfigError, match=r"ablate.factors = \[1e-323\] is invalid; allowed: 0 or factors of at least"):
        AblateConfig(kind="weights", factors=[1e-323])
    base = {"code": 0.01, "prose": 0.99}
    with pytest.raises(ConfigError, match=r"ablate.factors = \[1e-307\] is invalid: variant code_x1e-307 scales"):
        variants(AblateConfig(kind="weights", factors=[1e-307]), base, seed=0)  # 1e-309: a subnormal weight
    assert variants(AblateConfig(kind="weights", sources=["prose"], factors=[1e-307]), base, seed=0)[-1]["weights"]
    with pytest.raises(ConfigError, match=r"ablate.factors = \[0.5, 0.5000001\] is invalid; .*<source>_x0.5 here"):
        AblateConfig(kind="weights", factors=[0.5, 0.5000001])
    with pytest.raises(ConfigError, match=r"ablate.shares = \[0.0, 0.01, 0.010000001\] is invalid; .*replay_0/0.01 "):
        AblateConfig(kind="replay", shares=[0.0, 0.01, 0.010000001])


def test_check_refuses_the_study_folder_ablate_would_refuse_writing_nothing(tmp_path, capsys):
    """`winnow check` said ok; `winnow ablate` then refused the folder (a user's files, or the folder of job
    folders)."""
    job = tiny_job(tmp_path / "jobs" / "job")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's")
    for output, found in ((mine, "notes.txt"), (job.parent, "job")):
        path = study_toml(tmp_path / "s.toml", job, output)
        assert main(["check", str(path)]) == 2
        assert f"ablate.output = {str(output)!r} holds files winnow did not write ({found})" in capsys.readouterr().err
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    assert sorted(p.name for p in job.parent.iterdir()) == ["job"]
    (tmp_path / "study").mkdir()
    (tmp_path / "study" / ".winnow-run").write_text("")  # a study's own folder: accepted
    assert main(["check", str(study_toml(tmp_path / "s.toml", job, tmp_path / "study"))]) == 0
