"""The shard layout: one folder per format and split, sized by bytes, that tools open as a folder."""

from __future__ import annotations

import re

import orjson
import polars as pl
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from winnow.curate.config import OutputConfig
from winnow.curate.pipeline import run_job
from winnow.curate.writers.layout import even_cuts, group_small_files, write_ranges
from winnow.pipelines.jobfile import load_job

JOB = """
workers = 1
batch_rows = 16

[[inputs]]
source = "web"
path = "{path}"

[[stages]]
kind = "split"
val_fraction = 0.1

[output]
row_group_bytes = 2000
"""


def make_inputs(tmp_path, n_files=4, per_file=50):
    for f in range(n_files):
        lines = [
            orjson.dumps({"id": f"f{f}-{i}", "text": f"document {i} " + "word " * (i % 9), "k": i})
            for i in range(per_file)
        ]
        (tmp_path / f"part{f}.jsonl").write_bytes(b"\n".join(lines) + b"\n")


def test_formats_and_splits_have_their_own_folders_that_tools_open(tmp_path, write_job, nothing_lost):
    make_inputs(tmp_path)
    job = load_job(write_job(JOB.format(path=tmp_path / "*.jsonl")))
    manifest = run_job(job, progress=False)
    nothing_lost(job.output_dir, {f"f{f}-{i}" for f in range(4) for i in range(50)})
    shards = job.output_dir / "shards"
    assert sorted(p.relative_to(shards).parent.as_posix() for p in shards.rglob("part-*")) == sorted(
        f"{s['format']}/{s['split']}" for s in manifest["shards"]
    )
    train, val = shards / "parquet" / "train", shards / "parquet" / "val"
    n_train = sum(s["rows"] for s in manifest["shards"] if s["split"] == "train" and s["format"] == "parquet")
    n_val = sum(s["rows"] for s in manifest["shards"] if s["split"] == "val" and s["format"] == "parquet")
    assert n_train + n_val == 200 and n_val > 0
    assert pl.scan_parquet(train).select(pl.len()).collect().item() == n_train
    assert ds.dataset(val, format="parquet").count_rows() == n_val
    assert {p.suffix for p in (shards / "webdataset" / "train").iterdir()} == {".tar"}
    # four tasks' few validation rows are one shard per format, not four tiny ones
    assert [s["format"] for s in manifest["shards"] if s["split"] == "val"] == ["parquet", "webdataset"]


def test_parquet_row_groups_follow_row_group_bytes_and_carry_page_statistics(tmp_path, write_job):
    make_inputs(tmp_path, n_files=1, per_file=200)
    job = load_job(write_job(JOB.format(path=tmp_path / "*.jsonl")))
    manifest = run_job(job, progress=False)
    entry = next(s for s in manifest["shards"] if s["split"] == "train" and s["format"] == "parquet")
    meta = pq.ParquetFile(job.output_dir / entry["path"]).metadata
    assert meta.num_row_groups > 1  # ~2000 bytes each, not one per 16-row batch nor one per file
    assert meta.num_row_groups < entry["rows"] / 16
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    group = meta.row_group(0)
    stats = {n: group.column(i).is_stats_set for i, n in enumerate(names)}
    assert stats["source"] and stats["id"] and not stats["text"] and not stats["meta"]
    assert group.column(names.index("source")).has_column_index  # page statistics, for page pruning


def test_shard_bytes_rotates_shards(tmp_path, write_job):
    make_inputs(tmp_path, n_files=1, per_file=200)
    body = JOB.format(path=tmp_path / "*.jsonl").replace("row_group_bytes = 2000", "shard_bytes = 3000")
    job = load_job(write_job(body))
    manifest = run_job(job, progress=False)
    train = [s for s in manifest["shards"] if s["split"] == "train" and s["format"] == "parquet"]
    assert len(train) > 2
    assert all(s["row_bytes"] <= 3000 for s in train)
    assert all(s["row_bytes"] > 3000 - 200 for s in train[:-1])  # full up to the last row that fits


def test_write_ranges_cover_every_rank_once():
    out = OutputConfig(shard_bytes=100)
    assert write_ranges(10, 50, out) == [(0, 10)]  # one shard's worth: one write task, one file
    assert write_ranges(10, 200, out) == [(0, 4), (4, 8), (8, 10)]  # 200 B over 0.8 x 100 B a range: 3 ranges
    assert write_ranges(10, 50, OutputConfig(shard_rows=4)) == [(0, 4), (4, 8), (8, 10)]
    assert write_ranges(0, 0, out) == []


def test_even_cuts_halve_a_range_a_little_over_a_shard_instead_of_leaving_a_sliver():
    sizes = pl.Series([10] * 11)  # 110 bytes, shards of 100: two of 50-60, not 100 + 10
    assert even_cuts(sizes, 100) == [(0, 6), (6, 11)]
    assert even_cuts(sizes, 1000) == [(0, 11)] and even_cuts(pl.Series([], dtype=pl.Int64), 100) == []
    assert even_cuts(pl.Series([500, 1, 1]), 100) == [(0, 1), (1, 3)]  # a row over the limit stands alone


def test_small_files_are_grouped_up_to_the_target():
    assert group_small_files([10, 0, 10, 10, 30, 5], 25) == [[0, 2], [3], [4], [5]]
    assert group_small_files([0, 0], 25) == []


def test_dataset_card_lists_sources_stages_and_typed_features(tmp_path, write_job):
    import datasets
    import yaml
    from huggingface_hub import DatasetCard

    make_inputs(tmp_path)
    job = load_job(
        write_job(
            JOB.format(path=tmp_path / "*.jsonl").replace(
                "[output]", '[[stages]]\nkind = "filter.length"\nmin_words = 3\n\n[output]'
            )
        )
    )
    manifest = run_job(job, progress=False)
    card = (job.output_dir / "README.md").read_text()
    assert str(DatasetCard(card)) == card  # the Hub's own reader takes the card as written
    header = yaml.safe_load(card.split("---")[1])
    assert header["configs"][0]["data_files"] == [
        {"split": "train", "path": "shards/parquet/train/*.parquet"},
        {"split": "validation", "path": "shards/parquet/val/*.parquet"},
    ]
    features = {f["name"]: f["dtype"] for f in header["dataset_info"]["features"]}
    assert features == {"id": "string", "source": "string", "text": "string", "meta": "string", "split": "string"}
    sizes = {s["name"]: s["num_examples"] for s in header["dataset_info"]["splits"]}
    assert sizes["train"] + sizes["validation"] == manifest["totals"]["rows_written"]
    length = next(s for s in manifest["stages"] if s["id"] == "02.filter.length")
    assert length["rows_rejected"] > 0 and f"| `02.filter.length` | {length['rows_in']} |" in card
    assert "`filter:length_min_words`" in card and "| web | jsonl | 4 | 200 |" in card
    # the card's header is what `datasets` reads to load the folder (as the Hub does)
    loaded = datasets.load_dataset(str(job.output_dir))
    assert loaded["train"].num_rows == sizes["train"] and loaded["validation"].num_rows == sizes["validation"]


def test_a_readme_winnow_did_not_write_is_left_alone(tmp_path, write_job, capsys):
    make_inputs(tmp_path, n_files=1)
    path = write_job(JOB.format(path=tmp_path / "*.jsonl"))
    job = load_job(path)
    job.output_dir.mkdir(parents=True)
    (job.output_dir / "README.md").write_text("my notes")
    manifest = run_job(job, progress=False)
    assert (job.output_dir / "README.md").read_text() == "my notes"
    from winnow.pipelines.curate import print_summary

    print_summary(manifest, job.job.output)  # the summary does not claim a card it did not write
    said = capsys.readouterr().out
    assert "card:     not written" in said and "dataset card: sources" not in said


def test_the_dataset_card_escapes_names_in_its_header_and_tables(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml
    from huggingface_hub import DatasetCard

    from winnow.curate.card import render_card

    odd = "we|ird: <b>`x`</b>\nnext"
    (tmp_path / "shards").mkdir()
    pq.write_table(pa.table({"text": ["a"], odd: [1]}), tmp_path / "shards" / "part-0.parquet")
    manifest = {
        "job": "j<script>",
        "shards": [{"split": "train", "format": "parquet", "path": "shards/part-0.parquet", "rows": 1, "bytes": 10}],
        "inputs": [{"source": odd, "format": "jsonl", "files": ["a"]}],
        "by_source": {odd: {"read": 1, "written": 1, "rejected": {}}},
        "stages": [{"id": "01.mine", "rows_in": 1, "rows_out": 1, "rows_rejected": 0, "rejected": {odd: 0}}],
    }
    card = render_card(tmp_path, manifest)
    assert str(DatasetCard(card)) == card  # the Hub's own reader takes the card as written
    header = yaml.safe_load(card.split("\n---\n")[0].removeprefix("---\n"))
    assert [f["name"] for f in header["dataset_info"]["features"]] == ["text", odd]
    body = card.split("\n---\n", 1)[1]
    outside_code = re.sub(r"(`+)(.+?)\1", "", body.split("\n", 1)[1])  # HTML in a code span is shown, not run
    assert "<" not in outside_code and "j&lt;script&gt;" in body
    tables = [t.splitlines() for t in re.split(r"\n(?!\|)[^\n]*\n", body) if t.startswith("|")]
    assert len(tables) == 4  # sources, stages, features, files
    for table in tables:  # every row has its header's number of cells: no name opened a new one
        assert len({len(re.findall(r"(?<!\\)\|", row)) for row in table}) == 1, table


def test_a_job_whose_filters_reject_every_row_says_so(tmp_path, write_job, capsys):
    from winnow.pipelines.curate import print_summary

    make_inputs(tmp_path, n_files=1)
    job = load_job(
        write_job(JOB.format(path=tmp_path / "*.jsonl") + '[[stages]]\nkind = "filter.length"\nmin_words = 100000\n')
    )
    manifest = run_job(job, progress=False)
    assert manifest["totals"]["rows_written"] == 0
    print_summary(manifest, job.job.output)
    printed = capsys.readouterr().out
    assert "warning: no row reached the shards after 02.filter.length rejected the last of them" in printed
    assert "shards:   none written" in printed  # it named a shards/ folder that was never made
