"""The catalogue of bad inputs, training side: shards, token ids, checkpoints and files a run reads.

Each kind builds a tiny bad input and asserts the clear error (naming the file and what to do)
that winnow gives at the first point it can, never a crash deep inside a step. The curation
kinds are in ``tests/curate/test_bad_input_catalogue.py``, which counts every area's kinds.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests.train.shards_util import make_docs, write_job, write_token_job
from winnow.train.checkpoint import META_FILE, STATE_FILE
from winnow.train.data import Loader, LoaderConfig
from winnow.train.errors import CheckpointError, ConfigError, ShardError
from winnow.train.init import load_init
from winnow.train.tokenizer import META_FILE as META
from winnow.train.tokenizer import load_tokenizer


@dataclass(frozen=True)
class Kind:
    """One bad input: ``run(tmp_path)`` builds it and asserts what happens."""

    name: str
    run: Callable[[Path], None]


KINDS: list[Kind] = []


def kind(fn: Callable[[Path], None]) -> Callable[[Path], None]:
    KINDS.append(Kind(fn.__name__, fn))
    return fn


def loader(folder: Path, fmt: str = "parquet", **kw) -> Loader:
    return Loader(LoaderConfig(**{"batch_size": 2, "seq_len": 16, "num_workers": 0, "format": fmt, **kw}), folder)


def manifest_of(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


# -- the run folder's device ------------------------------------------------------------------------------
@kind
def disk_full_during_a_checkpoint(tmp: Path) -> None:
    from tests.disk import small_disk
    from tests.train.test_trainer_loop import make_trainer, tiny_config

    run = tmp / "disk" / "run"
    with small_disk(tmp / "disk", "160k") as disk:
        trainer = make_trainer(tiny_config(run, steps=4, checkpoint={"every": 2}))
        with pytest.raises(CheckpointError, match=r"cannot write checkpoint .*step-0+2: .*MiB were free on its dev"):
            trainer.fit()
        assert not list((run / "checkpoints").glob(".tmp-*"))  # the half-written checkpoint is gone
        disk.resize("64m")
        make_trainer(tiny_config(run, steps=4, checkpoint={"every": 2})).fit()  # room made: the run goes on
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-00000002", "step-00000004"]


# -- shards -------------------------------------------------------------------------------------------
@kind
def shard_listed_but_missing(tmp: Path) -> None:
    folder = write_job(tmp / "job", [make_docs(4), make_docs(4), make_docs(4)])
    (folder / "shards/train/part-00000-00002.parquet").unlink()
    with pytest.raises(ShardError, match="part-00000-00002.parquet: missing .*incomplete"):
        loader(folder)  # at start, before the first batch


@kind
def token_shard_listed_but_missing(tmp: Path) -> None:
    folder = write_token_job(tmp / "job", [make_docs(4), make_docs(4)])
    bins = [e["path"] for e in manifest_of(folder)["shards"] if e["format"] == "tokens"]
    (folder / bins[1]).unlink()
    with pytest.raises(ShardError, match=f"{Path(bins[1]).name}: missing"):
        loader(folder, "tokens")


@kind
def shard_path_leaves_the_folder(tmp: Path) -> None:
    folder = write_job(tmp / "job", [make_docs(4)])
    manifest = manifest_of(folder)
    (tmp / "outside.parquet").write_bytes((folder / manifest["shards"][0]["path"]).read_bytes())
    manifest["shards"][0]["path"] = "../outside.parquet"
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match="leave the job folder"):
        loader(folder)


# -- checkpoints ----------------------------------------------------------------------------------------
@kind
def checkpoint_lists_a_file_outside(tmp: Path) -> None:
    ckpt = tmp / "run" / "checkpoints" / "step-00000001"
    ckpt.mkdir(parents=True)
    torch.save({"model": {"w": torch.ones(2)}, "model_config": {}}, ckpt / STATE_FILE)
    data, blob = (ckpt / STATE_FILE).read_bytes(), b"planted"
    target = Path(tempfile.gettempdir()) / f"winnow-escaped-{tmp.name}.txt"  # where it lands from the extraction folder
    files = {f"../{target.name}": {"bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}}
    (ckpt.parent / target.name).write_bytes(blob)  # what the name points at from the checkpoint folder
    meta = {
        "format_version": 1,
        "step": 1,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "files": files,
    }
    (ckpt / META_FILE).write_text(json.dumps(meta))
    try:
        with pytest.raises(CheckpointError, match="not inside the checkpoint folder"):
            load_init(str(tmp / "run"))
        assert not target.exists()
    finally:
        target.unlink(missing_ok=True)


# -- files read whole: a regular file under a cap -------------------------------------------------------------
@kind
def manifest_linked_to_dev_zero(tmp: Path) -> None:
    folder = write_job(tmp / "job", [make_docs(4)])
    (folder / "manifest.json").unlink()
    os.symlink("/dev/zero", folder / "manifest.json")
    with pytest.raises(ShardError, match="manifest .*not a regular file"):
        loader(folder)


@kind
def shard_larger_than_the_manifest_says(tmp: Path) -> None:
    folder = write_job(tmp / "job", [make_docs(4), make_docs(4)])
    path = folder / manifest_of(folder)["shards"][0]["path"]
    path.write_bytes(path.read_bytes() + b"\0" * 4096)  # replaced by something bigger: found at the start
    with pytest.raises(
        ShardError, match=r"part-00000-00000.parquet: \d+ bytes where .* says \d+ \(cut short or replaced"
    ):
        next(loader(folder))


@kind
def study_source_folder_cut_short(tmp: Path) -> None:
    """A study's folder of one source (its manifest derived_from the job's), damaged: the advice was to curate the
    job again, which makes every finished run of the study stale; removing the folder is what remakes it."""
    folder = write_job(tmp / "study" / "sources" / "a", [make_docs(4), make_docs(4)])
    manifest = manifest_of(folder) | {"derived_from": {"path": str(tmp / "job"), "manifest_sha256": "0" * 64}}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    path = folder / manifest["shards"][0]["path"]
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ShardError, match=rf"remove {folder} and run the study again .*again from {tmp / 'job'}"):
        next(loader(folder))


@kind
def token_shard_cut_short(tmp: Path) -> None:
    """A .bin two bytes short is found when the shards open, not when the loader reaches it hours in."""
    folder = write_token_job(tmp / "job", [make_docs(4), make_docs(4)])
    path = folder / [e["path"] for e in manifest_of(folder)["shards"] if e["format"] == "tokens"][1]
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(ShardError, match=rf"{path.name}: \d+ bytes where .* says \d+ \(cut short"):
        loader(folder, "tokens")


@kind
def tokenizer_meta_linked_to_dev_zero(tmp: Path) -> None:
    (tmp / "tok").mkdir()
    os.symlink("/dev/zero", tmp / "tok" / META)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_tokenizer(str(tmp / "tok"))


@kind
def tokenizer_meta_damaged(tmp: Path) -> None:
    """A tokenizer folder whose tokenizer_meta.json is not JSON, or JSON but not an object: an error naming it."""
    (tmp / "tok").mkdir()
    for damaged in ('{"kind": "bpe\x01', "[]", '{"kind": 3}'):
        (tmp / "tok" / META).write_text(damaged)
        with pytest.raises(ConfigError, match=r"tokenizer_meta.json is damaged"):
            load_tokenizer(str(tmp / "tok"))


@kind
def checkpoint_meta_linked_to_dev_zero(tmp: Path) -> None:
    ckpt = tmp / "run" / "checkpoints" / "step-00000001"
    ckpt.mkdir(parents=True)
    torch.save({"model": {}}, ckpt / STATE_FILE)
    os.symlink("/dev/zero", ckpt / META_FILE)
    with pytest.raises(CheckpointError, match="not a regular file"):
        load_init(str(ckpt))


@kind
def checkpoint_state_linked_to_dev_zero(tmp: Path) -> None:
    ckpt = tmp / "run" / "checkpoints" / "step-00000001"
    ckpt.mkdir(parents=True)
    os.symlink("/dev/zero", ckpt / STATE_FILE)
    with pytest.raises(CheckpointError, match="not a regular file"):
        load_init(str(tmp / "run"))


@kind
def checkpoint_without_meta_that_is_not_one(tmp: Path) -> None:
    ckpt = tmp / "run" / "checkpoints" / "step-00000001"
    ckpt.mkdir(parents=True)
    (ckpt / STATE_FILE).write_bytes(b"[train]\nsteps = 3\n")  # no meta.json: read under the 1 TiB cap, in pieces
    with pytest.raises(CheckpointError, match="not a checkpoint file winnow wrote"):
        load_init(str(tmp / "run"))


@kind
def checkpoint_meta_that_is_not_an_object(tmp: Path) -> None:
    """A meta.json that is JSON but not an object (``[]``): the checkpoint is skipped for the one before, as a
    meta.json that is not JSON is."""
    from winnow.train.checkpoint import CheckpointManager

    manager = CheckpointManager(tmp / "ckpt", keep_last=3)
    manager.save(1, {"x": torch.ones(2)})
    newest = manager.save(2, {"x": torch.zeros(2)})
    (newest / META_FILE).write_text("[]")
    path, state = manager.load_latest()
    assert path.name == "step-00000001" and torch.equal(state["x"], torch.ones(2))
    assert not CheckpointManager(tmp / "ckpt", keep_last=3)._looks_valid(newest)


# -- where the data is --------------------------------------------------------------------------------------
@kind
def attribution_without_held_out_rows(tmp: Path) -> None:
    """Attribution on shards with no val split: refused before training (it trained, then said nothing)."""
    from winnow.pipelines.train import build_trainer
    from winnow.train.attribution.config import AttributionConfig
    from winnow.train.config import TrainConfig
    from winnow.train.model.config import ModelConfig

    folder = write_job(tmp / "job", [make_docs(8)])
    model = ModelConfig(vocab_size=258, dim=16, n_layers=1, n_heads=2, ffn_hidden=16, n_experts=2, top_k=1)
    cfg = TrainConfig(output=str(tmp / "run"), shards=str(folder), steps=2, model=model,
                      data=LoaderConfig(batch_size=2, seq_len=16, num_workers=0, format="parquet"),
                      attribution=AttributionConfig(every=1, start=0))  # fmt: skip
    with pytest.raises(ConfigError, match="hold no held-out rows; add a split stage"):
        build_trainer(cfg)


@kind
def stop_rules_without_held_out_rows(tmp: Path) -> None:
    """[train.stop] on shards with no val split: refused (it trained to the end, its rules never able to fire)."""
    from winnow.pipelines.train import build_trainer
    from winnow.train.config import StopConfig, TrainConfig
    from winnow.train.model.config import ModelConfig

    folder = write_job(tmp / "job", [make_docs(8)])
    model = ModelConfig(vocab_size=258, dim=16, n_layers=1, n_heads=2, ffn_hidden=16, n_experts=2, top_k=1)
    cfg = TrainConfig(output=str(tmp / "run"), shards=str(folder), steps=2, model=model, eval_every=1,
                      data=LoaderConfig(batch_size=2, seq_len=16, num_workers=0, format="parquet"),
                      stop=StopConfig(patience=1))  # fmt: skip
    with pytest.raises(ConfigError, match=r"train.stop: its rules read held-out losses, .* could never stop"):
        build_trainer(cfg)
    assert not (tmp / "run" / "checkpoints").exists()


@kind
def eval_naming_a_folder_without_held_out_rows(tmp: Path) -> None:
    """train.eval naming a folder that is there but holds no val split (a wrong folder): refused naming the key
    (a warning, and a run with no evaluation at all)."""
    from winnow.pipelines.train import build_trainer
    from winnow.train.config import TrainConfig
    from winnow.train.model.config import ModelConfig

    folder = write_job(tmp / "job", [make_docs(8)], val=[make_docs(4)])
    (tmp / "logs").mkdir()
    model = ModelConfig(vocab_size=258, dim=16, n_layers=1, n_heads=2, ffn_hidden=16, n_experts=2, top_k=1)
    cfg = TrainConfig(output=str(tmp / "run"), shards=str(folder), steps=2, model=model, eval_every=1,
                      eval=[str(folder), str(tmp / "logs")],
                      data=LoaderConfig(batch_size=2, seq_len=16, num_workers=0, format="parquet"))  # fmt: skip
    with pytest.raises(ConfigError, match=r"train.eval\[1\] = .*logs.* holds no held-out rows"):
        build_trainer(cfg)


@kind
def manifest_that_is_not_an_object(tmp: Path) -> None:
    folder = write_job(tmp / "job", [make_docs(4)])
    (folder / "manifest.json").write_text("[1, 2]")
    with pytest.raises(ShardError, match="manifest is not a JSON object"):
        loader(folder)


@kind
def manifest_entries_of_the_wrong_type(tmp: Path) -> None:
    """A hand-edited manifest (an entry that is a string, a path that is a number, a token shard without its
    dtype, a count that is text, sources that are one string): a ShardError naming the entry and key, in
    training and in the report, not a KeyError or AttributeError."""
    from winnow.pipelines.cli import main

    folder = write_token_job(tmp / "job", [make_docs(4)])
    good = manifest_of(folder)
    token = next(i for i, e in enumerate(good["shards"]) if e["format"] == "tokens")
    damages = {
        "shards[0] = 'x' is not an object": lambda m: m["shards"].__setitem__(0, "x"),
        "shards[0].path = 5 is not a JSON string": lambda m: m["shards"][0].__setitem__("path", 5),
        f"shards[{token}].dtype is missing": lambda m: m["shards"][token].pop("dtype"),
        f"shards[{token}].tokens = 'many' is not a JSON integer": lambda m: m["shards"][token].__setitem__("tokens", "many"),
        "sources = 'web' is not a JSON list": lambda m: m.__setitem__("sources", "web"),
    }  # fmt: skip
    for message, damage in damages.items():
        manifest = json.loads(json.dumps(good))
        damage(manifest)
        (folder / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(ShardError, match=re.escape(message)):
            loader(folder, "tokens")
    manifest = json.loads(json.dumps(good))
    manifest["by_source"] = 3
    (folder / "manifest.json").write_text(json.dumps(manifest))
    assert main(["-q", "report", str(folder), "--output", str(tmp / "report.html")]) == 2
    assert not (tmp / "report.html").exists()


@kind
def manifest_without_its_sources_list(tmp: Path) -> None:
    """A manifest without the job's ``sources`` (an older or hand-made one): the sources its shard entries count,
    for token shards as for Parquet (the token path refused every batch)."""
    folder = write_token_job(tmp / "job", [make_docs(4)])
    manifest = manifest_of(folder)
    expected = manifest.pop("sources")
    (folder / "manifest.json").write_text(json.dumps(manifest))
    tokens = loader(folder, "tokens")
    assert tokens.sources == expected
    next(tokens)


@kind
def shards_path_that_is_a_file(tmp: Path) -> None:
    (tmp / "a.parquet").write_bytes(b"not a folder")
    with pytest.raises(ShardError, match="a.parquet is a file; give the job folder"):
        loader(tmp / "a.parquet")


@kind
def corrupt_parquet_in_a_folder_of_parquet(tmp: Path) -> None:
    (tmp / "data").mkdir()
    (tmp / "data" / "train-0.parquet").write_bytes(b"PAR1 cut short")
    with pytest.raises(ShardError, match="train-0.parquet: not a readable Parquet file"):
        loader(tmp / "data")


@kind
def shards_url_without_a_driver_or_empty(tmp: Path) -> None:
    from winnow.curate.errors import ConfigError as JobError
    from winnow.pipelines.train import _check_locations
    from winnow.train.config import TrainConfig

    with pytest.raises(JobError, match="train.shards = 'nosuch://b/x': no fsspec driver for nosuch://"):
        _check_locations(TrainConfig(output=str(tmp / "run"), shards="nosuch://b/x"))
    with pytest.raises(JobError, match="train.init_from = '  ' is invalid"):
        _check_locations(TrainConfig(output=str(tmp / "run"), shards=str(tmp), init_from="  "))


@pytest.mark.parametrize("case", [pytest.param(k, id=k.name) for k in KINDS])
def test_bad_input(case: Kind, tmp_path: Path) -> None:
    case.run(tmp_path)
