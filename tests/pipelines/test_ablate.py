"""``winnow ablate``: the [ablate] table, per-source shard sets, variants, the study table and its comparison."""

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from curate.errors import ConfigError
from pipelines.ablate.config import AblateConfig
from pipelines.ablate.correlation import compare_with_attribution
from pipelines.ablate.layout import StudyLayout, load_study
from pipelines.ablate.plan import variants
from pipelines.ablate.sources import split_by_source
from pipelines.ablate.table import write_study
from pipelines.cli import main
from pipelines.jobfile import build_config
from tests.pipelines.ablate_util import SOURCES, study_toml, tiny_job
from train.data.shards import open_shards, read_shard


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
    assert [v["name"] for v in seeded][2:] == ["without_code", "without_prose", "without_code_seed4", "without_prose_seed4"]
    assert seeded[4]["seed"] == 4 and seeded[4]["group"] == "without_code" and seeded[4]["weights"] == {"prose": 0.75}
    with pytest.raises(ConfigError, match="ablate.variant_seeds"):
        AblateConfig(variant_seeds=0)


def test_split_by_source_keeps_every_row_once_in_order(job, tmp_path):
    folders, shares = split_by_source(str(job), tmp_path / "views")
    assert sorted(folders) == SOURCES and sum(shares.values()) == pytest.approx(1.0)
    assert shares["prose"] > shares["code"]  # prose documents are longer
    for source, folder in folders.items():
        view = open_shards(folder, split="train", fmt="parquet")
        ids = [i for k in range(len(view.shards)) for i in read_shard(view, k, fmt="parquet", verify=True)["id"].to_pylist()]
        assert ids == [f"{source}/{i}" for i in range(12)]  # the curriculum order of the job, one source only
    again, _ = split_by_source(str(job), tmp_path / "views")  # reused, not rewritten
    assert again == folders


def test_prediction_matches_measured_deltas():
    matrix = np.array([[-0.2, 0.0], [-0.05, -0.3]])  # code helps code; prose helps both
    base = {"code": 0.5, "prose": 0.5}
    results = [{"name": "baseline", "kind": "baseline", "seed": 0, "weights": base, "held_out": {"code": 2.0, "prose": 3.0}},
               {"name": "baseline_seed1", "kind": "noise", "seed": 1, "weights": base,
                "held_out": {"code": 2.01, "prose": 3.01}},
               {"name": "without_code", "kind": "leave_one_out", "seed": 0, "weights": {"prose": 0.5},
                "held_out": {"code": 2.15, "prose": 2.75}},
               {"name": "without_prose", "kind": "leave_one_out", "seed": 0, "weights": {"code": 0.5},
                "held_out": {"code": 1.9, "prose": 3.4}}]
    summary = compare_with_attribution(results, ["code", "prose"], matrix, base)
    cells = summary["cells"]
    predicted = dict(zip(cells["variant"] + "/" + cells["source"], cells["predicted"]))
    assert predicted["without_code/code"] == pytest.approx(0.2 - 0.05)  # -A[code, code] + A[prose, code]
    assert predicted["without_prose/prose"] == pytest.approx(0.3)  # r = (2, 0): +A[code, prose] - A[prose, prose]
    # two standard errors of a delta: 2 · sd(2.0, 2.01) · sqrt(1/1 + 1/2); deltas are from the baseline seeds' mean
    assert summary["noise"] == pytest.approx({"code": 2 * 0.01 / 2 ** 0.5 * 1.5 ** 0.5, "prose": 2 * 0.01 / 2 ** 0.5 * 1.5 ** 0.5})
    measured = dict(zip(cells["variant"] + "/" + cells["source"], cells["measured"]))
    assert measured["without_code/code"] == pytest.approx(2.15 - 2.005)
    assert summary["spearman"] > 0.7 and summary["sign_agree"] == summary["above_noise"]


def test_a_variant_measured_with_several_seeds_is_one_cell_of_their_mean():
    base = {"code": 0.5, "prose": 0.5}
    run = lambda name, kind, seed, weights, code, prose, **kw: {"name": name, "kind": kind, "seed": seed,  # noqa: E731
                                                               "weights": weights, "held_out": {"code": code, "prose": prose}, **kw}
    results = [run("baseline", "baseline", 0, base, 2.0, 3.0), run("baseline_seed1", "noise", 1, base, 2.02, 3.0),
               run("baseline_seed2", "noise", 2, base, 2.04, 3.03),
               run("without_code", "leave_one_out", 0, {"prose": 0.5}, 2.3, 2.9),
               run("without_code_seed1", "leave_one_out", 1, {"prose": 0.5}, 2.4, 2.8, group="without_code")]
    summary = compare_with_attribution(results, ["code", "prose"], np.array([[-0.2, 0.0], [-0.05, -0.3]]), base)
    cells = summary["cells"]
    assert cells["variant"].to_list() == ["without_code", "without_code"] and cells["seeds"].to_list() == [2, 2]
    assert cells["measured"].to_list() == pytest.approx([2.35 - 2.02, 2.85 - 3.01])
    sd = np.std([2.0, 2.02, 2.04], ddof=1)
    assert summary["noise"]["code"] == pytest.approx(2 * sd * np.sqrt(1 / 2 + 1 / 3)) and summary["variant_seeds"] == 2


def test_write_study_table_the_report_reads(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps(
        {"step": 10, "attribution": {"sources": SOURCES, "matrix": [[-0.1, 0.0], [0.0, -0.2]]}}) + "\n")
    results = [{"name": "baseline", "kind": "baseline", "seed": 0, "weights": {"code": 1, "prose": 1},
                "held_out": {"code": 2.0, "prose": 3.0}},
               {"name": "without_code", "kind": "leave_one_out", "seed": 0, "weights": {"prose": 1},
                "held_out": {"code": 2.5, "prose": 2.9}}]
    markdown = write_study(tmp_path, results, SOURCES, {"code": 0.5, "prose": 0.5})
    table = pl.read_csv(StudyLayout(tmp_path).table_csv)
    assert table.filter(pl.col("variant") == "without_code")["delta_code"].item() == pytest.approx(0.5)
    assert "| without_code |" in markdown and StudyLayout(tmp_path).heatmap_png.stat().st_size > 0
    assert StudyLayout(tmp_path).cells_csv.is_file()
    assert StudyLayout(tmp_path).scatter_png.read_bytes()[:4] == b"\x89PNG"
    assert load_study(tmp_path) is not None


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
