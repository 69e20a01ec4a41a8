"""Per-source sets of a job with token shards: the study and adaptive mixing read tokens, never re-tokenize."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.train.shards_util import make_docs, write_token_job
from tests.train.test_loader_tokens import assert_same, batches
from winnow.curate.errors import OutputError
from winnow.pipelines.ablate.sources import split_by_source
from winnow.train.data import LoaderConfig

SOURCES = ["books", "code", "web"]


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return make_docs(60)


def _job(folder: Path, docs: list[dict], **kw) -> Path:
    return write_token_job(folder, [docs[:25], docs[25:26], [], docs[26:50]], val=[docs[50:]], **kw)


def _tokens_of(view: Path) -> tuple[np.ndarray, np.ndarray]:
    """A view's token shards concatenated, and the rows their documents point at."""
    manifest = json.loads((view / "manifest.json").read_text())
    tokens, rows = [], []
    for entry in manifest["shards"]:
        if entry["format"] == "tokens":
            tokens.append(np.fromfile(view / entry["path"], entry["dtype"]))
            rows.append(np.load(view / entry["path"].replace(".bin", ".doc.npy"))["row"])
    return np.concatenate(tokens), np.concatenate(rows)


def test_views_of_a_token_job_hold_each_sources_tokens_in_order(docs, tmp_path):
    job = _job(tmp_path / "job", docs)
    folders, shares = split_by_source(str(job), tmp_path / "views")
    assert sorted(folders) == SOURCES and sum(shares.values()) == pytest.approx(1.0)
    for source, folder in folders.items():
        texts = [d["text"] for d in docs[:50] if d["source"] == source]
        expected = np.concatenate(
            [np.frombuffer(t.encode(), np.uint8).astype(np.int64).tolist() + [256] for t in texts]
        )
        tokens, rows = _tokens_of(Path(folder))
        assert np.array_equal(tokens, expected)  # byte ids, EOS 256 after each document, the curriculum order
        manifest = json.loads((Path(folder) / "manifest.json").read_text())
        assert manifest["formats"] == ["parquet", "tokens"] and manifest["tokens_of_source"] == len(expected)
        per_shard = [e["rows"] for e in manifest["shards"] if e["format"] == "parquet"]
        assert rows.tolist() == [r for n in per_shard for r in range(n)]  # document j is row j of the Parquet view
        # the loader's contract holds on a view too: token shards give the Parquet shards' batches, origins included
        kw = dict(batch_size=2, seq_len=24, num_workers=0, verify_checksums=True)
        assert_same(
            batches(LoaderConfig(format="parquet", **kw), folder, 40),
            batches(LoaderConfig(format="tokens", **kw), folder, 40),
        )


def test_a_tokens_only_job_splits_by_tokens(docs, tmp_path):
    job = _job(tmp_path / "job", docs, formats=("tokens",))
    folders, shares = split_by_source(str(job), tmp_path / "views")
    tokens = {s: len(_tokens_of(Path(f))[0]) for s, f in folders.items()}
    assert shares == pytest.approx({s: n / sum(tokens.values()) for s, n in tokens.items()})
    assert not list(Path(folders["code"]).rglob("*.parquet"))


def test_a_view_from_before_token_shards_is_rewritten_with_them(docs, tmp_path):
    job = _job(tmp_path / "job", docs)
    folders, _ = split_by_source(str(job), tmp_path / "views")
    path = Path(folders["web"]) / "manifest.json"
    older = json.loads(path.read_text())
    older.pop("formats")
    older["shards"] = [e for e in older["shards"] if e["format"] == "parquet"]
    path.write_text(json.dumps(older))  # what an earlier winnow wrote: Parquet only
    split_by_source(str(job), tmp_path / "views")
    assert json.loads(path.read_text())["formats"] == ["parquet", "tokens"]


def test_a_changed_token_shard_is_named_before_anything_is_copied(docs, tmp_path):
    job = _job(tmp_path / "job", docs, formats=("tokens",))
    shard = min((job / "shards").rglob("train/*.bin"))
    data = bytearray(shard.read_bytes())
    data[3] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(OutputError, match=rf"{shard.name}.*sha256 differs.*curate the job again"):
        split_by_source(str(job), tmp_path / "views")


def test_study_and_adaptive_runs_train_on_a_tokens_only_job(docs, tmp_path, one_thread):
    import dataclasses

    from tests.pipelines.ablate_util import study_toml
    from winnow.pipelines.cli import main
    from winnow.pipelines.train import build_trainer, load_train_config
    from winnow.train.adaptive import MixingConfig

    job = _job(tmp_path / "job", docs, formats=("tokens",))
    toml = study_toml(tmp_path / "study.toml", job, tmp_path / "study", steps=2)
    assert main(["ablate", str(toml)]) == 0
    table = (tmp_path / "study" / "ablation" / "table.csv").read_text()
    assert all(f"without_{s}" in table for s in SOURCES)
    # a variant an earlier winnow trained from Parquet views (data.format = "parquet") is reused, not refused
    saved = tmp_path / "study" / "variants" / "without_code" / "config.json"
    saved.write_text(
        json.dumps(
            {**json.loads(saved.read_text()), "data": {**json.loads(saved.read_text())["data"], "format": "parquet"}}
        )
    )
    result = tmp_path / "study" / "variants" / "without_code" / "result.json"
    mtime = result.stat().st_mtime
    assert main(["ablate", str(toml)]) == 0 and result.stat().st_mtime == mtime
    # a variant's loader reads its sources' token shards: nothing is tokenized on the fly
    cfg = load_train_config(toml, steps=2)
    views = [str(tmp_path / "study" / "sources" / s) for s in SOURCES]
    with build_trainer(cfg, train_data=views, sources=SOURCES) as trainer:
        assert {type(s).__name__ for s in trainer.data._sets} == {"TokenStream"}
        trainer.fit()
        assert trainer.data.stats()["tokens_tokenized"] == 0
    # `winnow train` with adaptive mixing splits the job itself, token shards included
    mixing = MixingConfig(adaptive="doremi", reference=str(tmp_path / "study"), every=1)
    cfg = dataclasses.replace(cfg, output=str(tmp_path / "adaptive"), mixing=mixing)
    with build_trainer(cfg) as trainer:
        assert {type(s).__name__ for s in trainer.data._sets} == {"TokenStream"}
        summary = trainer.fit()
        assert trainer.data.stats()["tokens_tokenized"] == 0
    assert sorted(summary["mixing"]["mix_weights"]) == SOURCES
