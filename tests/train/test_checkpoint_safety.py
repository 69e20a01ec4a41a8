"""Checkpoint safety: loading runs no code, pruning never eats the fresh checkpoint, file modes."""

import hashlib
import json
import os
import shutil
import stat

import numpy as np
import pytest
import torch

from winnow.train.build import load_teacher
from winnow.train.checkpoint import META_FILE, STATE_FILE, CheckpointConfig, CheckpointManager
from winnow.train.errors import CheckpointError, ConfigError
from winnow.train.init import load_init
from winnow.train.rng import rng_state, set_rng_state


class _Payload:
    """Unpickling this creates a file: what a hostile checkpoint would do with os.system instead."""

    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _plant(folder, state) -> None:
    """A checkpoint folder whose meta.json matches its state.pt, as an attacker who can write both makes it."""
    folder.mkdir(parents=True)
    torch.save(state, folder / STATE_FILE)
    data = (folder / STATE_FILE).read_bytes()
    meta = {"format_version": 1, "step": 5, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (folder / META_FILE).write_text(json.dumps(meta))


def test_hostile_checkpoint_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    ckpt = tmp_path / "run" / "checkpoints" / "step-00000005"
    _plant(ckpt, {"model": {"w": torch.ones(2)}, "x": _Payload(marker)})
    manager = CheckpointManager(ckpt.parent)
    with pytest.raises(CheckpointError, match=f"{ckpt / STATE_FILE}.*refused"):
        manager.load(ckpt)
    assert manager.load_latest() is None  # skipped like a corrupt one, with a warning
    with pytest.raises(CheckpointError, match="refused"):  # a teacher goes through the same loader
        load_teacher(str(ckpt))
    with pytest.raises(CheckpointError, match="refused"):  # and so does init_from, from a run folder or one checkpoint
        load_init(str(tmp_path / "run"))
    assert not marker.exists()


@pytest.mark.parametrize("content", [b"hi\n", b"", b'[job]\nname = "x"\n', b"zip"])
def test_a_file_that_is_no_checkpoint_is_named_as_such(tmp_path, content):
    """Text, an empty file, a TOML job file, a zip of other files as init_from or a teacher: one CheckpointError
    naming the file (KeyError, EOFError and RuntimeError tracebacks; a job file was called a dangerous pickle)."""
    import zipfile

    from winnow.train.checkpoint import load_state_file

    path = tmp_path / "model.pt"
    if content == b"zip":
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("a.txt", "x")
    else:
        path.write_bytes(content)
    with pytest.raises(CheckpointError, match=f"{path}: not a checkpoint file winnow wrote, or a damaged one"):
        load_state_file(path)


def test_trainer_state_loads_weights_only_and_rng_round_trips(tmp_path):
    np.random.seed(3)
    state = rng_state()
    expected = np.random.rand(4)
    manager = CheckpointManager(tmp_path)
    manager.save(1, {"rng": state, "counters": {"step": 1}, "sources": ["a"], "t": torch.arange(3)})
    _, loaded = manager.load_latest()
    set_rng_state(loaded["rng"])
    assert np.array_equal(np.random.rand(4), expected)


def test_checkpoint_from_before_tensor_rng_state_still_loads(tmp_path):
    folder = tmp_path / "step-00000001"
    np.random.seed(5)
    _plant(folder, {"rng": {"numpy": np.random.get_state()}})  # NumPy's own tuple, as older winnow saved it
    expected = np.random.rand(3)
    state = CheckpointManager(tmp_path).load(folder)
    np.random.set_state(state["rng"]["numpy"])
    assert np.array_equal(np.random.rand(3), expected)


def _corrupt(path) -> None:
    data = bytearray((path / STATE_FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (path / STATE_FILE).write_bytes(bytes(data[:-7]))  # truncated too: the cheap size check sees it


def test_pruning_counts_only_valid_checkpoints(tmp_path):
    old = CheckpointManager(tmp_path, keep_last=3)
    for step in (30, 40, 50):
        _corrupt(old.save(step, {"step": step}))
    manager = CheckpointManager(tmp_path, keep_last=3)  # a restart: nothing verified yet in this process
    assert manager.load_latest() is None
    fresh = manager.save(10, {"step": 10})
    assert fresh.is_dir()
    path, state = manager.load_latest()
    assert path == fresh and state["step"] == 10
    for step in (20, 60, 70, 80):
        manager.save(step, {"step": step})
    names = [p.name for p in manager.checkpoints()]
    assert names == ["step-00000080", "step-00000070", "step-00000060"]  # corrupt 30-50 were older: gone too


def test_checkpoints_follow_the_umask_or_the_configured_mode(tmp_path):
    previous = os.umask(0o027)
    try:
        plain = CheckpointManager(tmp_path / "plain").save(1, {"x": 1})
        private = CheckpointManager(tmp_path / "private", mode=0o600).save(1, {"x": 1})
    finally:
        os.umask(previous)
    assert stat.S_IMODE((plain / STATE_FILE).stat().st_mode) == 0o640
    assert stat.S_IMODE(plain.stat().st_mode) == 0o750
    for path in (private / STATE_FILE, private / META_FILE):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(private.stat().st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o400, 0o1777, "0600", -1])
def test_bad_checkpoint_mode_names_the_key(mode):
    with pytest.raises(ConfigError, match="train.checkpoint.mode"):
        CheckpointConfig(mode=mode)


def test_hostile_shard_metadata_is_refused_and_runs_nothing(tmp_path):
    import pickle

    from winnow.train.checkpoint import SHARDS_DIR

    marker = tmp_path / "pwned"
    manager = CheckpointManager(tmp_path / "run" / "checkpoints")
    ckpt = manager.save(5, {"counters": {"step": 5}}, shards={"model": {"w": torch.ones(2)}})
    (ckpt / SHARDS_DIR / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    meta = json.loads((ckpt / META_FILE).read_text())  # the attacker rewrites the checksums too
    data = (ckpt / SHARDS_DIR / ".metadata").read_bytes()
    meta["files"][f"{SHARDS_DIR}/.metadata"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (ckpt / META_FILE).write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"\.metadata: refused"):
        CheckpointManager(ckpt.parent).load(ckpt)
    with pytest.raises(CheckpointError, match="refused"):
        load_init(str(tmp_path / "run"))
    assert not marker.exists()


def test_a_corrupt_shard_fails_the_checksum(tmp_path):
    from winnow.train.checkpoint import SHARDS_DIR

    ckpt = CheckpointManager(tmp_path).save(1, {"counters": {"step": 1}}, shards={"model": {"w": torch.arange(8.0)}})
    (shard,) = (ckpt / SHARDS_DIR).glob("*.distcp")
    shard.write_bytes(shard.read_bytes()[:-3])
    with pytest.raises(CheckpointError, match="distcp: corrupt or truncated"):
        CheckpointManager(tmp_path).load(ckpt)
    state = CheckpointManager(tmp_path).save(2, {"x": 1}, shards={"model": {"w": torch.arange(8.0)}})
    assert torch.equal(CheckpointManager(tmp_path).load(state)["model"]["w"], torch.arange(8.0))


def test_a_reader_of_a_live_run_follows_its_checkpoints_as_they_are_pruned(tmp_path, monkeypatch):
    """`winnow export` of a run that is training: the checkpoint it listed is pruned while it reads it, and a newer
    one has arrived; the folder is listed again and the newer one loads (it said "no valid checkpoint")."""
    writer = CheckpointManager(tmp_path / "checkpoints", keep_last=1)
    writer.save(2, {"step": torch.tensor(2)})
    reader = CheckpointManager(tmp_path / "checkpoints")
    load = CheckpointManager.load

    def pruned_meanwhile(self, path, *, full=True):
        if path.name == "step-00000002":  # the run saves step 4 and prunes step 2 while it is being read
            writer.save(4, {"step": torch.tensor(4)})
            raise CheckpointError(f"checkpoint {path} cannot be read: No such file")
        return load(self, path, full=full)

    monkeypatch.setattr(CheckpointManager, "load", pruned_meanwhile)
    path, state = reader.load_latest()
    assert path.name == "step-00000004" and int(state["step"]) == 4


def test_weights_that_are_not_finite_are_refused_by_init_from_a_teacher_and_export(tmp_path, caplog):
    """A checkpoint whose weights hold NaN or infinity (a run that diverged unnoticed, a damaged file) starts no run,
    teaches nothing and is not exported; from a run folder, init_from takes the newest checkpoint that is finite."""
    from winnow.train.export import export_model
    from winnow.train.model import ModelConfig, Transformer

    cfg = ModelConfig(vocab_size=64, dim=16, n_layers=1, n_heads=2, ffn_hidden=16, n_experts=2, top_k=1, max_seq_len=16)
    good = Transformer(cfg).state_dict()
    bad = {**good, "embed.weight": good["embed.weight"].clone()}
    bad["embed.weight"][3, :2] = torch.tensor([float("nan"), float("inf")])
    model_config = {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}
    checkpoints = tmp_path / "run" / "checkpoints"
    _plant(checkpoints / "step-00000009", {"model": bad, "model_config": model_config, "counters": {"step": 9}})
    for given, key in ((checkpoints / "step-00000009", "train.init_from"), (tmp_path / "run", "train.distill.teacher")):
        with pytest.raises(CheckpointError, match=r"NaN or infinite values: embed\.weight \(2 of 1,024 values\)"):
            load_init(str(given), key=key)
    _plant(checkpoints / "step-00000005", {"model": good, "model_config": model_config, "counters": {"step": 5}})
    with caplog.at_level("WARNING"):
        assert load_init(str(tmp_path / "run")).step == 5  # the older one, with a warning naming the newer
    assert "step-00000009" in caplog.text and "NaN or infinite" in caplog.text
    with pytest.raises(CheckpointError, match=r"step 9: its weights hold NaN.*export an earlier checkpoint"):
        export_model({"model": bad, "model_config": model_config}, tmp_path / "export", step=9)
    assert not (tmp_path / "export").exists()


def test_only_winnows_own_names_are_checkpoints_the_users_copies_are_never_loaded_or_pruned(tmp_path):
    """A copy named ``step-00000002.bak`` was pruned with the user's notes in it, and ``step-best`` sorted after
    every numbered checkpoint: resumed from as the newest, and the fresh checkpoints pruned in its favour."""
    manager = CheckpointManager(tmp_path, keep_last=1)
    first = manager.save(2, {"step": 2})
    backup = tmp_path / "step-00000002.bak"
    shutil.copytree(first, backup)
    (backup / "NOTES.txt").write_text("mine")
    shutil.copytree(manager.save(4, {"step": 4}), tmp_path / "step-best")
    (tmp_path / ".tmp-mine").mkdir()  # not the temporary name winnow gives a checkpoint either
    for step in (6, 8, 100_000_000):  # past 8 digits the name grows: still ordered by step
        manager.save(step, {"step": step})
    assert [p.name for p in manager.checkpoints()] == ["step-100000000"]
    assert CheckpointManager(tmp_path).load_latest()[1]["step"] == 100_000_000
    assert (backup / "NOTES.txt").read_text() == "mine" and (tmp_path / "step-best").is_dir()
    assert (tmp_path / ".tmp-mine").is_dir()
