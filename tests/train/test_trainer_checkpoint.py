"""Checkpoints: kill and resume reproduces the loss trajectory; corrupt checkpoints are skipped; pruning."""

import os
import shutil
import signal

import pytest
import torch

from tests.train.test_trainer_loop import SyntheticBatches, make_trainer, tiny_config
from winnow.train.checkpoint import CheckpointManager
from winnow.train.errors import CheckpointError


def _recorded_fit(trainer) -> tuple[dict, list[float]]:
    losses, step = [], trainer.train_step

    def recording():
        result = step()
        losses.append(result.loss)
        return result

    trainer.train_step = recording
    return trainer.fit(), losses


def test_sigterm_checkpoints_and_resume_gives_identical_losses(tmp_path):
    kw = dict(steps=8, metrics={"log_every": 3}, checkpoint={"every": 0}, model={"router_noise": 0.1, "dropout": 0.1})
    _, reference = _recorded_fit(make_trainer(tiny_config(tmp_path / "ref", **kw)))

    def kill_at_fourth_batch(position):
        if position == 4:
            os.kill(os.getpid(), signal.SIGTERM)

    cfg = tiny_config(tmp_path / "run", **kw)
    summary, first = _recorded_fit(make_trainer(cfg, SyntheticBatches(on_batch=kill_at_fourth_batch)))
    assert summary["preempted"] and summary["step"] == 4
    resumed = make_trainer(cfg)
    resumed.model.reset_parameters()  # whatever the fresh weights, the checkpoint must win
    summary, second = _recorded_fit(resumed)
    assert not summary["preempted"] and summary["step"] == 8
    assert first + second == reference  # exact: fp32 on CPU, RNG and data position restored


def test_corrupt_checkpoint_is_skipped_for_the_previous_one(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=3)
    manager.save(1, {"x": torch.ones(3)})
    newest = manager.save(2, {"x": torch.zeros(3)})
    data = bytearray((newest / "state.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (newest / "state.pt").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum"):
        manager.load(newest)
    path, state = manager.load_latest()
    assert path.name == "step-00000001" and torch.equal(state["x"], torch.ones(3))


def test_keep_last_prunes_and_stale_temp_folders_are_removed(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2)
    (tmp_path / ".tmp-step-00000009-123").mkdir(parents=True)
    for step in (1, 2, 3):
        manager.save(step, {"step": step})
    assert [p.name for p in manager.checkpoints()] == ["step-00000003", "step-00000002"]
    assert not list(tmp_path.glob(".tmp-*"))


def test_resume_restores_counters_and_optimizer_state(tmp_path):
    cfg = tiny_config(tmp_path, steps=3, checkpoint={"every": 3})
    first = make_trainer(cfg)
    first.fit()
    again = make_trainer(cfg)
    assert again.resume() and again.step == 3 and again.data.position == 3
    for a, b in zip(first.optimizer.state_dict()["state"].values(), again.optimizer.state_dict()["state"].values()):
        torch.testing.assert_close(a["exp_avg"], b["exp_avg"])


def test_a_resume_from_a_checkpoint_whose_model_config_is_no_table_is_named(tmp_path):
    """A damaged model_config (a list) stopped the resume with an AttributeError."""
    trainer = make_trainer(tiny_config(tmp_path, steps=1))
    with pytest.raises(CheckpointError, match=r"the checkpoint's model_config is a list, not a table"):
        trainer.load_state_dict({"model_config": [1, 2]})


def test_a_checkpoint_written_under_the_earlier_expert_names_resumes_and_loads_whole(tmp_path):
    from winnow.train import dcp
    from winnow.train.checkpoint import SHARDS_DIR, earlier_names, renamed

    kw = dict(metrics={"log_every": 1}, checkpoint={"every": 2})
    _, reference = _recorded_fit(make_trainer(tiny_config(tmp_path / "ref", steps=4, **kw)))
    make_trainer(tiny_config(tmp_path / "run", steps=2, **kw)).fit()
    # the checkpoint as an earlier version wrote it: the experts' weights and moments under their old names
    manager = CheckpointManager(tmp_path / "run" / "checkpoints")
    path, state = manager.load_latest()
    shards = {"model": state.pop("model"), "optimizer": {"state": state["optimizer"].pop("state")}}
    for old in manager.checkpoints():
        shutil.rmtree(old)
    path = manager.save(2, renamed(state, earlier=True), shards=renamed(shards, earlier=True))
    saved = dcp.SafeReader(str(path / SHARDS_DIR)).read_metadata().state_dict_metadata
    assert earlier_names(saved) and "model.blocks.0.ffn.w13_ED2F" in saved
    whole = manager.load(path)  # init_from, a teacher, export: the one-process state under today's names
    assert "blocks.0.ffn.experts.w13_ED2F" in whole["model"] and not earlier_names(whole["model"])
    _, resumed = _recorded_fit(make_trainer(tiny_config(tmp_path / "run", steps=4, **kw)))
    assert resumed == reference[2:]


def test_rerunning_a_finished_run_writes_its_final_records_once(tmp_path):
    """Re-running the same command on a finished run resumes at its end: the summary still has the held-out
    losses, but metrics.jsonl holds the final evaluation (and every other step's records) once."""
    import json

    held_out = [SyntheticBatches(seed=7).make(i) for i in range(2)]
    cfg = tiny_config(tmp_path, steps=4, checkpoint={"every": 0})
    summaries = [make_trainer(cfg, val_data=lambda: list(held_out)).fit() for _ in range(3)]
    assert summaries[0]["eval"]["eval"] == summaries[2]["eval"]["eval"] and summaries[2]["step"] == 4
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    keys = [(r["step"], *sorted(set(r) - {"step"})) for r in records]
    assert len(keys) == len(set(keys)), keys
    assert sum("eval" in r for r in records) == 1
