"""The run folder across restarts: metrics hold each step once after a resume; a fresh start archives an older run."""

import json
import os
import stat

import pytest

from tests.train.test_trainer_loop import SyntheticBatches, make_trainer, tiny_config
from winnow.train.checkpoint import STATE_FILE
from winnow.train.runfolder import truncate_jsonl


def _steps(path, kind="loss"):
    return [r["step"] for r in map(json.loads, path.read_text().splitlines()) if kind in r]


def _crash_at(step):
    def on_batch(position):
        if position == step:
            raise RuntimeError("injected crash")

    return on_batch


def test_resume_cuts_metrics_back_to_the_checkpoint(tmp_path):
    kw = dict(steps=7, metrics={"log_every": 1}, checkpoint={"every": 3})
    cfg = tiny_config(tmp_path, **kw)
    with pytest.raises(RuntimeError, match="injected"):
        make_trainer(cfg, SyntheticBatches(on_batch=_crash_at(6))).fit()  # steps 1-5 logged, checkpoint at 3
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "loss": 1.0, "per_sou')  # and a torn line, as a kill mid-write leaves
    make_trainer(cfg).fit()
    assert _steps(tmp_path / "metrics.jsonl") == [1, 2, 3, 4, 5, 6, 7]


def test_fresh_start_next_to_an_older_run_starts_new_metrics(tmp_path):
    old = make_trainer(tiny_config(tmp_path, steps=6, metrics={"log_every": 1}, checkpoint={"every": 2}))
    old.fit()
    for ckpt in old.checkpoints.checkpoints():
        (ckpt / STATE_FILE).write_bytes(b"garbage")  # every checkpoint corrupt: the restart is from scratch
    new = make_trainer(tiny_config(tmp_path, steps=2, metrics={"log_every": 1}, checkpoint={"every": 2}))
    summary = new.fit()
    assert summary["step"] == 2 and _steps(tmp_path / "metrics.jsonl") == [1, 2]
    archived = tmp_path / "previous-1"
    assert _steps(archived / "metrics.jsonl") == [1, 2, 3, 4, 5, 6]
    assert sorted(p.name for p in (archived / "checkpoints").iterdir()) == [
        "step-00000002",
        "step-00000004",
        "step-00000006",
    ]
    assert [p.name for p in new.checkpoints.checkpoints()] == ["step-00000002"]


def test_truncate_keeps_records_up_to_the_step_and_lines_without_one(tmp_path):
    path = tmp_path / "m.jsonl"
    lines = [{"step": 1, "loss": 1}, {"note": "x"}, {"step": 2, "eval": {}}, {"step": 3, "loss": 1}]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"step": 4, "lo')
    assert truncate_jsonl(path, 2) == (1, 1)  # step 3's record, and the torn one
    assert [json.loads(line) for line in path.read_text().splitlines()] == lines[:3]
    assert truncate_jsonl(path, 2) == (0, 0)


def test_a_resume_drops_lines_that_are_not_utf8_with_a_warning_naming_the_file(tmp_path, caplog):
    """What a power loss can leave at the end of an appended file: the resume read it as text and stopped with a
    traceback (UnicodeDecodeError), so the run could not be resumed without editing the file by hand."""
    from winnow.train.runfolder import continue_run_folder

    path = tmp_path / "metrics.jsonl"
    path.write_bytes(
        b'{"step": 1, "loss": 1.0}\n{"step": 2, "loss": 0.9}\n\xff\xfe garbage\n{"step": 3, "loss": 0.8\xc3'
    )
    with caplog.at_level("WARNING"):
        continue_run_folder(tmp_path, 2)
    assert _steps(path) == [1, 2]
    assert f"{path}: dropped 2 line(s) that are not whole JSON records" in caplog.text


def test_run_folder_files_follow_the_umask(tmp_path):
    previous = os.umask(0o027)
    try:
        run = tmp_path / "run"  # pytest makes tmp_path itself 0700
        make_trainer(tiny_config(run, steps=2, metrics={"log_every": 1}, checkpoint={"every": 1})).fit()
    finally:
        os.umask(previous)
    for path in [run, *run.rglob("*")]:
        assert stat.S_IMODE(path.stat().st_mode) == (0o750 if path.is_dir() else 0o640), path


def test_a_run_folder_holding_files_winnow_did_not_write_is_refused_untouched(tmp_path):
    from winnow.train.errors import ConfigError
    from winnow.train.runfolder import MARKER, claim_run_folder

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "job.toml").write_text("the user's job")
    (mine / "metrics.jsonl").write_text("the user's metrics")
    with pytest.raises(ConfigError, match=r"train.output = .* holds files winnow did not write \(job.toml, metrics"):
        claim_run_folder(mine)
    assert sorted(p.name for p in mine.iterdir()) == ["job.toml", "metrics.jsonl"]
    for bad in ("", "."):
        with pytest.raises(ConfigError, match="a folder of its own"):
            claim_run_folder(bad)
    new = claim_run_folder(tmp_path / "new" / "run")  # made and marked; claimed again, it is winnow's
    assert (new / MARKER).is_file() and claim_run_folder(new) == new
    (new / ".winnow-lock").write_text("")  # the lock winnow takes before building the run is not content
    earlier = tmp_path / "earlier"  # a run written before folders were marked: its config.json is a [train] table
    earlier.mkdir()
    model = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_experts": 4, "top_k": 2}
    (earlier / "config.json").write_text(
        json.dumps({"model": model, "optim": {}, "data": {}, "steps": 10, "seed": 0, "output": str(earlier)})
    )
    (earlier / ".winnow-lock").write_text("")
    assert (claim_run_folder(earlier) / MARKER).is_file()
    other = tmp_path / "other"  # another tool's config.json with a "model", "optim" and "data" is not a run of winnow's
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model": "llama-7b", "optim": "adamw", "data": "c4"}))
    with pytest.raises(ConfigError, match="holds files winnow did not write"):
        claim_run_folder(other)
    assert sorted(p.name for p in other.iterdir()) == ["config.json"]


def test_resuming_with_another_model_is_refused_before_the_folder_is_touched(tmp_path):
    import dataclasses

    from winnow.curate.errors import ConfigError
    from winnow.pipelines.train import check_resumable
    from winnow.train.config import TrainConfig
    from winnow.train.model.config import ModelConfig

    cfg = TrainConfig(output=str(tmp_path), model=ModelConfig(dim=32, n_heads=2, n_layers=1, n_experts=2, top_k=1))
    (tmp_path / "config.json").write_text(json.dumps(dataclasses.asdict(cfg)))
    (tmp_path / "checkpoints" / "step-00000003").mkdir(parents=True)
    check_resumable(cfg)  # the same model: resumes
    older = dataclasses.asdict(cfg)
    del older["model"]["bias_update_rate"]  # a run written before a model key was added resumes too
    (tmp_path / "config.json").write_text(json.dumps(older))
    check_resumable(cfg)
    wider = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dim=64))
    with pytest.raises(ConfigError, match=r"differs in dim \(the run's 32, this config's 64\)"):
        check_resumable(wider)
    check_resumable(dataclasses.replace(wider, checkpoint=dataclasses.replace(cfg.checkpoint, resume=False)))
    assert json.loads((tmp_path / "config.json").read_text())["model"]["dim"] == 32


def test_non_finite_numbers_are_refused_in_every_train_table():
    from winnow.train.attribution import AttributionConfig
    from winnow.train.config import TrainConfig
    from winnow.train.errors import ConfigError
    from winnow.train.model.config import ModelConfig
    from winnow.train.optim import OptimConfig

    inf, nan = float("inf"), float("nan")
    for kw, key in (
        ({"optim": OptimConfig(lr=inf)}, "train.optim.lr"),
        ({"model": ModelConfig(rope_theta=nan)}, "train.model.rope_theta"),
        ({"model": ModelConfig(capacity_factor=inf)}, "train.model.capacity_factor"),
        ({"attribution": AttributionConfig(factors=[inf])}, "train.attribution.factors"),
    ):
        with pytest.raises(ConfigError, match=f"{key} = .* allowed: finite numbers"):
            TrainConfig(**kw)


def test_a_capped_read_never_asks_for_its_cap_at_once(tmp_path):
    import fsspec

    from winnow.train.errors import CheckpointError
    from winnow.train.paths import read_capped

    path = tmp_path / "state"
    path.write_bytes(b"x" * 1000)
    fs = fsspec.filesystem("file")
    assert read_capped(fs, str(path), limit=1 << 40, what="checkpoint state", error=CheckpointError) == b"x" * 1000
    with pytest.raises(CheckpointError, match="cap of 999"):
        read_capped(fs, str(path), limit=999, what="checkpoint state", error=CheckpointError)


def test_a_share_factor_named_twice_is_refused():
    from winnow.train.attribution import AttributionConfig
    from winnow.train.errors import ConfigError

    with pytest.raises(ConfigError, match=r"train.attribution.factors = \[0.5, 0.5\] is invalid.*each once"):
        AttributionConfig(factors=[0.5, 0.5])


def test_a_resume_whose_metrics_file_was_removed_says_its_records_start_at_the_checkpoint(tmp_path, caplog):
    from winnow.train.runfolder import continue_run_folder

    (tmp_path / "checkpoints" / "step-00000004").mkdir(parents=True)
    with caplog.at_level("WARNING", logger="winnow.train.runfolder"):
        continue_run_folder(tmp_path, 4)
    assert "metrics.jsonl is missing: the run resumes at step 4" in caplog.text
    caplog.clear()
    (tmp_path / "metrics.jsonl").write_text('{"step": 4, "loss": 1.0}\n')
    with caplog.at_level("WARNING", logger="winnow.train.runfolder"):
        continue_run_folder(tmp_path, 4)
    assert "missing" not in caplog.text
    (tmp_path / "metrics.jsonl").unlink()
    with caplog.at_level("WARNING", logger="winnow.train.runfolder"):
        continue_run_folder(tmp_path, 4, log_every=10)  # stopped before its first record: nothing was lost
    assert "missing" not in caplog.text
