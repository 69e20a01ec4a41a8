"""The user's own metadata and stages: keep_fields columns, filter.expr, and plugin stages by entry point."""

from __future__ import annotations

import io
import json
import tarfile
import textwrap

import orjson
import polars as pl
import pytest

from winnow.curate.errors import ConfigError, StageError
from winnow.curate.pipeline import run_job
from winnow.curate.stages import plugins, stage_class
from winnow.pipelines.jobfile import load_job


def make_inputs(tmp_path, n=40):
    lines = []
    for i in range(n):
        rec = {
            "id": f"d{i}",
            "text": f"document {i} " + "word " * (i % 7),
            "url": f"https://x.org/{i}",
            "language_score": 0.5 + (i % 10) / 20,
            "dump": "CC-MAIN-2024-10" if i % 3 else "CC-MAIN-2023-50",
            "tokens": i,
            "other": {"nested": i},
        }
        if i == 5:
            rec["language_score"] = "high"  # does not fit the inferred float64: stays in meta
        lines.append(orjson.dumps(rec))
    (tmp_path / "in.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return {f"d{i}" for i in range(n)}


JOB = """
[[inputs]]
source = "web"
path = "{path}"
keep_fields = ["url", "language_score", "dump", "tokens"]
"""


def test_keep_fields_become_typed_columns_and_leave_meta(tmp_path, write_job):
    make_inputs(tmp_path)
    job = load_job(write_job(JOB.format(path=tmp_path / "in.jsonl")))
    run_job(job, progress=False)
    df = pl.read_parquet(job.output_dir / "shards" / "parquet" / "train").sort("id")
    assert df.schema["url"] == pl.String and df.schema["language_score"] == pl.Float64
    assert df.schema["tokens"] == pl.Int64 and df.schema["dump"] == pl.String
    row = df.filter(pl.col("id") == "d1").row(0, named=True)
    assert row["url"] == "https://x.org/1" and row["language_score"] == 0.55 and row["tokens"] == 1
    assert json.loads(row["meta"]) == {"other": {"nested": 1}}  # moved, not copied
    odd = df.filter(pl.col("id") == "d5").row(0, named=True)
    assert odd["language_score"] is None and json.loads(odd["meta"])["language_score"] == "high"  # nothing lost
    # the tar's json member holds meta once, as an object (not a string of JSON)
    tar_path = next((job.output_dir / "shards" / "webdataset" / "train").glob("*.tar"))
    with tarfile.open(tar_path) as tar:
        member = next(m for m in tar.getmembers() if m.name == "d1.json")
        record = json.load(io.TextIOWrapper(tar.extractfile(member)))
    assert record["meta"] == {"other": {"nested": 1}} and record["language_score"] == 0.55


@pytest.mark.parametrize("fields", ['["url"]', '{url = "string"}'])
def test_keep_fields_leave_a_meta_that_is_no_json_object_as_it_is(tmp_path, write_job, nothing_lost, fields):
    """A winnow-layout Parquet file's meta of free text stopped the job with orjson's JSONDecodeError."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    metas = ["scraped 2024, see notes", "[1]", '"x"', "5", "null", "{", None, '{"url": "http://x", "n": 1}']
    ids = [f"r{i}" for i in range(len(metas))]
    rows = {"id": ids, "source": ["web"] * len(ids), "text": [f"document {i}" for i in ids], "meta": metas}
    pq.write_table(pa.table(rows), tmp_path / "a.parquet")
    body = JOB.format(path=tmp_path / "a.parquet").replace('["url", "language_score", "dump", "tokens"]', fields)
    job = load_job(write_job(body + 'format = "parquet"\n'))
    run_job(job, progress=False)
    nothing_lost(job.output_dir, set(ids))
    df = pl.read_parquet(job.output_dir / "shards" / "parquet" / "train").sort("id")
    assert df["url"].to_list() == [None] * 7 + ["http://x"]
    assert df["meta"].to_list() == [*metas[:7], '{"n":1}']


def test_keep_fields_refuse_winnow_columns_and_unknown_types(tmp_path, write_job):
    with pytest.raises(ConfigError, match=r"keep_fields: 'quality' is one of winnow's own columns"):
        load_job(write_job(JOB.format(path=tmp_path / "in.jsonl").replace('"tokens"]', '"quality"]')))
    with pytest.raises(ConfigError, match=r"keep_fields: '_count' starts with '_', which winnow reserves"):
        load_job(
            write_job(JOB.format(path=tmp_path / "in.jsonl").replace('"tokens"]', '"_count"]'))
        )  # the mix's column
    with pytest.raises(ConfigError, match=r"keep_fields: 'url' is listed twice; list each field once"):
        load_job(write_job(JOB.format(path=tmp_path / "in.jsonl").replace('"tokens"]', '"url"]')))
    with pytest.raises(ConfigError, match=r"keep_fields.url = 'text' is not a type; allowed: string, int64"):
        load_job(
            write_job(
                JOB.format(path=tmp_path).replace('["url", "language_score", "dump", "tokens"]', '{url = "text"}')
            )
        )


def test_filter_expr_keeps_rows_where_the_predicate_holds(tmp_path, write_job, nothing_lost):
    ids = make_inputs(tmp_path)
    body = JOB.format(path=tmp_path / "in.jsonl") + textwrap.dedent("""
        [[stages]]
        kind = "filter.expr"
        name = "lang"
        where = "language_score > 0.8 AND dump LIKE 'CC-MAIN-2024%'"
        """)
    job = load_job(write_job(body))
    manifest = run_job(job, progress=False)
    nothing_lost(job.output_dir, ids)
    kept = pl.read_parquet(job.output_dir / "shards" / "parquet" / "train")
    expected = {f"d{i}" for i in range(40) if i != 5 and 0.5 + (i % 10) / 20 > 0.8 and i % 3}
    assert set(kept["id"]) == expected
    stage = next(s for s in manifest["stages"] if s["id"] == "01.filter.expr")
    assert stage["rejected"] == {"filter:expr_lang": 40 - len(expected)}  # d5's null score is rejected too


def test_filter_expr_errors_name_the_problem(tmp_path, write_job):
    make_inputs(tmp_path, 5)
    stage = '\n[[stages]]\nkind = "filter.expr"\nwhere = "{where}"\n'
    with pytest.raises(ConfigError, match=r"\[\[stages\]\] #1 \(filter.expr\).*not a SQL predicate"):
        load_job(write_job(JOB.format(path=tmp_path / "in.jsonl") + stage.format(where="score >")))
    for across in ("x = MAX(x)", "ROW_NUMBER() OVER (ORDER BY id) <= 10", "COUNT(*) > 1", "SUM(x) OVER () > 1"):
        with pytest.raises(ConfigError, match="reads other rows .* would depend on how the job is cut into batches"):
            load_job(write_job(JOB.format(path=tmp_path / "in.jsonl") + stage.format(where=across)))
    load_job(write_job(JOB.format(path=tmp_path / "in.jsonl") + stage.format(where="GREATEST(x, 1) > LENGTH(text)")))
    job = load_job(write_job(JOB.format(path=tmp_path / "in.jsonl") + stage.format(where="lang_score2 > 1")))
    with pytest.raises(StageError, match=r"names a column the rows lack.*keep_fields"):
        run_job(job, progress=False)
    job = load_job(write_job(JOB.format(path=tmp_path / "in.jsonl") + stage.format(where="tokens + 1")))
    with pytest.raises(StageError, match="not true/false"):
        run_job(job, progress=False)
    for where in ("dump > 9.0", "9.0 < dump", "dump > 9"):  # as text, '10' < '9.0': the wrong rows kept, silently
        job = load_job(write_job(JOB.format(path=tmp_path / "in.jsonl") + stage.format(where=where)))
        with pytest.raises(StageError, match=r"compares the text column\(s\) \['dump'\] with a number"):
            run_job(job, progress=False, overwrite=True)


PLUGIN = '''
from dataclasses import dataclass
import polars as pl
from winnow.curate.schema import make_rejects
from winnow.curate.stages import Stage, StageConfig, StageOutput

@dataclass(kw_only=True, slots=True)
class ShoutConfig(StageConfig):
    max_upper: float = 0.5

class ShoutFilter(Stage):
    """Rejects documents that are mostly upper case."""
    kind = "acme.shout"
    Config = ShoutConfig
    reasons = ("acme:shouting",)

    def apply(self, batch):
        share = batch["text"].str.count_matches("[A-Z]") / batch["text"].str.len_chars()
        bad = share > self.config.max_upper
        return StageOutput(batch.filter(~bad), make_rejects(batch.filter(bad), "acme:shouting"))

class Leaky(ShoutFilter):
    def apply(self, batch):
        return StageOutput(batch.head(1), make_rejects(batch.clear(), "acme:shouting"))

class Blanker(ShoutFilter):
    def apply(self, batch):
        return StageOutput(batch.with_columns(text=pl.lit(None, pl.String)), make_rejects(batch.clear(), "acme:shouting"))
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A tiny installed package registering two stages (a dist-info on sys.path, as pip would leave it)."""
    site = tmp_path / "site"
    (site / "acme_winnow").mkdir(parents=True)
    (site / "acme_winnow" / "__init__.py").write_text(PLUGIN)
    info = site / "acme_winnow-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-winnow\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[winnow.stages]\nacme.shout = acme_winnow:ShoutFilter\nacme.leaky = acme_winnow:Leaky\n"
        "acme.blanker = acme_winnow:Blanker\n"
    )
    monkeypatch.syspath_prepend(str(site))
    plugins.plugin_entry_points.cache_clear()
    yield
    plugins.plugin_entry_points.cache_clear()


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.slow)])  # 2: spawned workers find it too
def test_plugin_stage_is_used_by_kind_with_the_runners_checks(tmp_path, write_job, plugin, nothing_lost, workers):
    texts = ["quiet words here", "LOUD WORDS HERE", "Mixed Case Words", "ALL CAPS AGAIN"]
    (tmp_path / "in.jsonl").write_bytes(
        b"\n".join(orjson.dumps({"id": str(i), "text": t}) for i, t in enumerate(texts))
    )
    body = f'[[inputs]]\nsource = "web"\npath = "{tmp_path / "in.jsonl"}"\n[[stages]]\nkind = "acme.shout"\nmax_upper = 0.6\n'
    job = load_job(write_job(body), workers=workers)
    manifest = run_job(job, progress=False)
    nothing_lost(job.output_dir, {"0", "1", "2", "3"})
    stage = next(s for s in manifest["stages"] if s["id"] == "01.acme.shout")
    assert stage["kind"] == "acme.shout" and stage["rejected"] == {"acme:shouting": 2}
    assert manifest["config"]["resolved"]["stages"][0]["max_upper"] == 0.6
    with pytest.raises(ConfigError, match=r"unknown key 'max_uper' \(did you mean 'max_upper'\?\)"):
        load_job(write_job(body.replace("max_upper", "max_uper")))
    leaky = load_job(write_job(body.replace("acme.shout", "acme.leaky").replace("max_upper = 0.6\n", "")))
    with pytest.raises(StageError, match="lost rows"):
        run_job(leaky, progress=False, overwrite=True)  # the same folder, on purpose
    blanker = load_job(write_job(body.replace("acme.shout", "acme.blanker").replace("max_upper = 0.6\n", "")))
    with pytest.raises(StageError, match=r"01.acme.blanker: column 'text' holds \d+ null value\(s\)"):
        run_job(blanker, progress=False, overwrite=True)  # a shard would hold rows without text


def test_import_paths_in_job_files_stay_refused(plugin):
    with pytest.raises(ConfigError, match="never import paths.*winnow.stages"):
        stage_class("acme_winnow:ShoutFilter")
    with pytest.raises(ConfigError, match="unknown stage kind 'os.system'"):
        stage_class("os.system")
    assert stage_class("acme.shout").__name__ == "ShoutFilter"
