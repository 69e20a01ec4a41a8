"""``winnow export``: the single-file model round-trips, and the Mixtral folder gives winnow's logits in transformers."""

import dataclasses
import json
import os
import re
import shutil

import pytest
import torch

from tests.train.test_trainer_loop import make_trainer, tiny_config
from winnow.pipelines.cli import main
from winnow.train.export import MARKER, WINNOW_FILE, export_model, hf_blockers, load_exported
from winnow.train.model import ModelConfig, Transformer
from winnow.train.tokenizer import ByteTokenizer, load_tokenizer, train_bpe

TEXTS = ["The quick brown fox jumps over the lazy dog.", "héllo wörld, ünïcode 🎉\n\ttabs  and  spaces", ""]


def _trained_run(tmp_path, **model):
    cfg = tiny_config(tmp_path / "run", steps=3, checkpoint={"every": 0})
    cfg = dataclasses.replace(cfg, model=ModelConfig(**{**dataclasses.asdict(cfg.model), **model}))
    trainer = make_trainer(cfg)
    trainer.fit()
    return trainer


def _tokens():
    return torch.randint(0, 40, (2, 24), generator=torch.Generator().manual_seed(1))


def _hf_logits(folder, tokens):
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    assert type(model).__name__ == "MixtralForCausalLM"
    with torch.no_grad():
        return model(input_ids=tokens).logits


@pytest.mark.parametrize(
    "model",
    [
        {},
        {"n_kv_heads": 1, "tie_embeddings": True, "rope_theta": 500.0, "top_k": 3},
        {"n_experts": 0, "dense_hidden": 48},
    ],
    ids=["moe", "gqa-tied-rope-top3", "dense"],
)
def test_export_command_writes_a_mixtral_whose_logits_match(tmp_path, model, capsys):
    trainer = _trained_run(tmp_path, **model)
    assert main(["export", str(tmp_path / "run")]) == 0
    out = tmp_path / "run" / "export"
    said = capsys.readouterr().out
    assert str(out / "hf") in said
    # a run without tokenizer files: the export says so, and does not offer an AutoTokenizer it did not write
    assert "no tokenizer:" in said and "Mixtral, without a tokenizer" in said and "AutoTokenizer" not in said
    tokens = _tokens()
    with torch.no_grad():
        expected = trainer.model.eval()(tokens).logits_BLV
    hf = _hf_logits(out / "hf", tokens)
    real = expected[..., : trainer.model.cfg.vocab_size]  # the tokenizer's ids: hf/ has no padding rows
    assert hf.shape == real.shape
    assert (hf - real).abs().max().item() < 1e-4
    reloaded, meta = load_exported(out / WINNOW_FILE)
    assert json.loads(meta["sources"]) == trainer.sources and int(meta["step"]) == 3
    with torch.no_grad():
        assert torch.equal(reloaded(tokens).logits_BLV, expected)  # the single file is the model, bit for bit


def test_export_names_the_key_that_prevents_mixtral_and_still_writes_the_file(tmp_path, capsys):
    trainer = _trained_run(tmp_path, n_shared_experts=1, load_balance="bias")
    assert main(["export", str(tmp_path / "run"), "--output", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "train.model.n_shared_experts = 1" in printed and "train.model.load_balance = 'bias'" in printed
    assert not (tmp_path / "out" / "hf").exists()
    reloaded, _ = load_exported(tmp_path / "out" / WINNOW_FILE)
    tokens = _tokens()
    with torch.no_grad():
        assert torch.equal(reloaded(tokens).logits_BLV, trainer.model.eval()(tokens).logits_BLV)


@pytest.mark.parametrize(
    ("key", "value"), [("n_dense_layers", 1), ("score_func", "sigmoid"), ("capacity_factor", 1.0), ("top_k", 1)]
)
def test_each_feature_mixtral_lacks_is_named(key, value):
    cfg = ModelConfig(vocab_size=40, dim=16, n_layers=2, n_heads=2, ffn_hidden=16, n_experts=4, **{key: value})
    assert [line.split(" =")[0] for line in hf_blockers(cfg)] == [f"train.model.{key}"]


def test_export_without_a_checkpoint_says_what_to_give(tmp_path, capsys):
    assert main(["export", str(tmp_path)]) == 2
    assert "no valid checkpoint" in capsys.readouterr().err
    (tmp_path / "result.json").write_text(json.dumps({"name": "without_code", "kind": "leave_one_out"}))
    assert main(["export", str(tmp_path)]) == 2  # a study's variant, whose checkpoints the study removed
    assert "unless [ablate] keep_checkpoints = true" in capsys.readouterr().err


def test_export_refuses_a_state_without_model(tmp_path):
    from winnow.train.errors import CheckpointError

    with pytest.raises(CheckpointError, match="model_config"):
        export_model({"model": Transformer(ModelConfig()).state_dict()}, tmp_path)


def _run_with_tokenizer(tmp_path, kind):
    """A trained run whose folder holds its tokenizer: the byte-level one, or a small BPE."""
    tokenizer = ByteTokenizer() if kind == "byte" else train_bpe([TEXTS * 4], vocab_size=300)
    trainer = _trained_run(tmp_path, vocab_size=tokenizer.vocab_size)
    tokenizer.save(tmp_path / "run")
    assert main(["export", str(tmp_path / "run")]) == 0
    return trainer, tokenizer, tmp_path / "run" / "export"


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_the_export_loads_in_auto_tokenizer_and_generated_ids_round_trip_as_in_winnow(tmp_path, kind):
    transformers = pytest.importorskip("transformers")
    _, tokenizer, out = _run_with_tokenizer(tmp_path, kind)
    hf_tok = transformers.AutoTokenizer.from_pretrained(out / "hf")
    assert (hf_tok.eos_token_id, hf_tok.pad_token_id) == (tokenizer.eos_id, tokenizer.pad_id)
    for text in TEXTS:
        assert hf_tok(text)["input_ids"] == tokenizer.encode_batch([text])[0].tolist()  # no BOS/EOS added
    config = json.loads((out / "hf" / "config.json").read_text())
    generation = json.loads((out / "hf" / "generation_config.json").read_text())
    assert config["eos_token_id"] == generation["eos_token_id"] == tokenizer.eos_id
    assert config["pad_token_id"] == generation["pad_token_id"] == tokenizer.pad_id
    model = transformers.AutoModelForCausalLM.from_pretrained(out / "hf", torch_dtype=torch.float32).eval()
    prompt = hf_tok("The quick", return_tensors="pt")["input_ids"]
    ids = model.generate(prompt, max_new_tokens=12, do_sample=False)[0].tolist()
    text = hf_tok.decode(ids, skip_special_tokens=True)
    assert text == tokenizer.decode(ids) and text.startswith("The quick")
    assert hf_tok(text)["input_ids"] == tokenizer.encode_batch([text])[0].tolist()
    assert load_tokenizer(out).name == tokenizer.name  # winnow's own files beside the single-file model


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_the_hf_export_has_the_tokenizers_vocabulary_not_the_padded_one(tmp_path, kind):
    """Padding rows (the embedding is a multiple of 64) would let sampling pick ids the tokenizer lacks."""
    transformers = pytest.importorskip("transformers")
    trainer, tokenizer, out = _run_with_tokenizer(tmp_path, kind)
    assert trainer.model.cfg.padded_vocab > tokenizer.vocab_size  # the case: there are padding rows
    hf_tok = transformers.AutoTokenizer.from_pretrained(out / "hf")
    config = json.loads((out / "hf" / "config.json").read_text())
    assert config["vocab_size"] == len(hf_tok) == tokenizer.vocab_size
    model = transformers.AutoModelForCausalLM.from_pretrained(out / "hf", torch_dtype=torch.float32).eval()
    assert model.get_output_embeddings().weight.shape[0] == tokenizer.vocab_size


@pytest.mark.slow
def test_the_export_runs_in_a_text_generation_pipeline(tmp_path):
    transformers = pytest.importorskip("transformers")
    _, tokenizer, out = _run_with_tokenizer(tmp_path, "byte")
    generate = transformers.pipeline("text-generation", model=str(out / "hf"), device="cpu")
    result = generate("The quick", max_new_tokens=8, do_sample=False)
    assert result[0]["generated_text"].startswith("The quick")


def test_a_failed_export_leaves_the_earlier_one_and_no_temporary_folder(tmp_path, monkeypatch):
    from winnow import train

    _trained_run(tmp_path / "a")
    _trained_run(tmp_path / "b", n_kv_heads=1)  # another model: an export written in place would change the files
    out = tmp_path / "export"
    assert main(["export", str(tmp_path / "a" / "run"), "--output", str(out)]) == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    monkeypatch.setattr(train.export, "mixtral_state", lambda *a, **k: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        main(["export", str(tmp_path / "b" / "run"), "--output", str(out)])
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "export"]  # no temporary folder left


def test_export_refuses_an_output_holding_other_files(tmp_path, capsys):
    _trained_run(tmp_path)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("the user's")
    assert main(["export", str(tmp_path / "run"), "--output", str(tmp_path / "mine")]) == 2
    assert "holds files an export does not write (notes.txt)" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("name", ["tokenizer.json", "hf"])
def test_export_refuses_an_output_whose_files_only_share_an_exports_names(tmp_path, capsys, name):
    """A user's tokenizer folder (``tokenizer.json``) or model folder (``hf/``) is not an earlier export: kept."""
    _trained_run(tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    if name == "hf":
        (mine / "hf").mkdir()
        (mine / "hf" / "config.json").write_text("the user's")
    else:
        (mine / name).write_text("the user's")
    before = {p: p.read_bytes() for p in mine.rglob("*") if p.is_file()}
    assert main(["export", str(tmp_path / "run"), "--output", str(mine)]) == 2
    assert "no export of winnow's" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in mine.rglob("*") if p.is_file()} == before


def test_an_export_starts_a_continued_run_with_the_checkpoints_weights(tmp_path, capsys):
    """``init_from`` an export (its folder or its file): the weights and model config of the checkpoint it was
    written from, checked against the export's tokenizer files; an export has no optimizer state to continue."""
    from winnow.train.errors import ConfigError as TrainConfigError
    from winnow.train.init import load_init

    trainer = _trained_run(tmp_path)
    assert main(["-q", "export", str(tmp_path / "run"), "--output", str(tmp_path / "exp")]) == 0
    base = load_init(str(tmp_path / "run"))
    for given in (tmp_path / "exp", tmp_path / "exp" / WINNOW_FILE):
        init = load_init(str(given))
        assert init.step == base.step == 3 and init.model_config() == base.model_config()
        assert init.state["model"].keys() == base.state["model"].keys()
        assert all(torch.equal(init.state["model"][k], base.state["model"][k]) for k in base.state["model"])
        init.check(trainer.cfg.model, ByteTokenizer())
    with pytest.raises(TrainConfigError, match="is an export: it holds the weights, not the optimizer"):
        load_init(str(tmp_path / "exp"), optimizer=True)


def test_an_export_to_dot_to_a_long_name_with_a_killed_exports_leftovers_and_the_umask(tmp_path, monkeypatch):
    """`--output .` (a path with no name), a 250-byte name (the temporary folder's name stays within 255), the
    temporary folder a killed export left (its process gone: removed) beside the user's folders of such names
    (kept), files with the umask's mode (safetensors writes 0600)."""
    import os
    import stat

    _trained_run(tmp_path / "a")
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    inode = here.stat().st_ino
    assert main(["export", str(tmp_path / "a" / "run"), "--output", "."]) == 0
    assert (here / WINNOW_FILE).is_file() and here.stat().st_ino == inode  # the shell's folder filled, not replaced
    long = tmp_path / ("m" * 250)
    dead = tmp_path / f".{'m' * 100}.tmp-999999999"  # no process has this id
    dead.mkdir()
    (dead / MARKER).write_text("written by winnow export\n")
    (dead / WINNOW_FILE).write_bytes(b"x" * 10)  # cut short
    users = [
        tmp_path / f".{'m' * 100}.{kind}" for kind in ("tmp-999999998", "old-2023")
    ]  # named alike, not an export's
    for folder, name in zip(users, ("notes.txt", WINNOW_FILE)):
        folder.mkdir()
        (folder / name).write_text("the user's")
    old = os.umask(0o022)
    try:
        assert main(["export", str(tmp_path / "a" / "run"), "--output", str(long)]) == 0
    finally:
        os.umask(old)
    assert not dead.exists() and (long / WINNOW_FILE).is_file()
    assert all((folder / name).read_text() == "the user's" for folder, name in zip(users, ("notes.txt", WINNOW_FILE)))
    modes = {stat.S_IMODE(p.stat().st_mode) for p in long.rglob("*") if p.is_file()}
    assert modes == {0o644}


def test_a_users_folder_under_the_exports_temporary_name_stops_it(tmp_path, capsys):
    """The temporary folder's name, this process's, already taken by a folder an export did not write: refused,
    the folder kept."""
    import os

    _trained_run(tmp_path)
    taken = tmp_path / f".out.tmp-{os.getpid()}"
    taken.mkdir()
    (taken / "notes.txt").write_text("the user's")
    assert main(["export", str(tmp_path / "run"), "--output", str(tmp_path / "out")]) == 2
    assert "is not a folder winnow export wrote" in capsys.readouterr().err
    assert (taken / "notes.txt").read_text() == "the user's" and not (tmp_path / "out").exists()


@pytest.mark.parametrize("what", ["hf is a link", "a link in hf", "a file of the user's in hf"])
def test_export_never_replaces_a_link_or_a_file_an_export_does_not_write(tmp_path, capsys, what):
    """An earlier export is replaced whole: one holding a link, or a file of the user's in ``hf/``, is refused."""
    _trained_run(tmp_path)
    out = tmp_path / "run" / "export"
    assert main(["export", str(tmp_path / "run")]) == 0
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's")
    if what == "hf is a link":
        shutil.rmtree(out / "hf")
        (out / "hf").symlink_to(mine)
    elif what == "a link in hf":
        (out / "hf" / "notes.txt").symlink_to(mine / "notes.txt")
    else:
        (out / "hf" / "notes.txt").write_text("the user's")
    assert main(["export", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "hf" in err and ("symbolic link" in err) == ("link" in what), err
    assert (out / "hf").is_symlink() == (what == "hf is a link") and (out / "hf" / "notes.txt").exists()
    assert (mine / "notes.txt").read_text() == "the user's"


TINY = ModelConfig(dim=16, n_layers=1, n_heads=2, ffn_hidden=16, n_experts=2, top_k=1)


def _planted_run(run, model_config=None):
    """A run folder with one checkpoint of an untrained tiny model, its meta.json matching (no training: fast)."""
    import hashlib

    ckpt = run / "checkpoints" / "step-00000005"
    ckpt.mkdir(parents=True)
    config = dataclasses.asdict(TINY) if model_config is None else model_config
    state = {"model": Transformer(TINY).state_dict(), "model_config": config, "counters": {"step": 5}}
    torch.save(state, ckpt / "state.pt")
    data = (ckpt / "state.pt").read_bytes()
    meta = {"format_version": 1, "step": 5, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (ckpt / "meta.json").write_text(json.dumps(meta))
    return ckpt, state


def test_an_output_whose_name_is_not_utf8_is_written_and_the_root_is_refused_at_once(tmp_path, capsys):
    """`--output caf\\xe9` stopped with a UnicodeEncodeError; `--output /` walked the whole file system first."""
    _planted_run(tmp_path / "run")
    out = tmp_path / "caf\udce9"  # the byte 0xe9, as Python names it (os.fsdecode)
    for _ in range(2):  # written, then replaced
        assert main(["-q", "export", str(tmp_path / "run"), "--output", str(out)]) == 0
        assert load_exported(out / WINNOW_FILE)[1]["step"] == "5"
    assert os.fsencode(out.name) == b"caf\xe9"
    assert sorted(os.listdir(tmp_path)) == ["caf\udce9", "run"]  # no temporary folder left
    assert main(["-q", "export", str(tmp_path / "run"), "--output", "/"]) == 2
    assert "/ holds files an export does not write" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("model_config", "said"),
    [
        ({"future_knob": 3}, "its model has keys this version of winnow does not know (future_knob)"),
        ([1, 2], "its model_config is a list, not a table of [train.model] keys"),
    ],
    ids=["a-newer-winnows-key", "a-list"],
)
def test_a_checkpoint_whose_model_config_this_version_cannot_build_is_named_by_every_reader(
    tmp_path, capsys, model_config, said
):
    """A newer winnow's key, or a model_config that is no table: export, init_from and a teacher said TypeError."""
    from winnow.train.build import load_teacher
    from winnow.train.errors import CheckpointError
    from winnow.train.init import load_init

    cfg = TINY
    if isinstance(model_config, dict):
        model_config = {**dataclasses.asdict(cfg), **model_config}
    ckpt, state = _planted_run(tmp_path / "run", model_config)
    assert main(["export", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert f"checkpoint {ckpt}: {said}" in err and "Traceback" not in err, err
    assert not (tmp_path / "run" / "export").exists()
    with pytest.raises(CheckpointError, match=re.escape(said)):
        load_init(str(tmp_path / "run")).check(cfg, ByteTokenizer())
    with pytest.raises(CheckpointError, match=re.escape(said)):
        load_teacher(str(ckpt))
    import safetensors.torch as st  # an export a newer winnow wrote: its model_config in the file's metadata

    exported = tmp_path / WINNOW_FILE
    st.save_file(state["model"], str(exported), metadata={"format": "winnow", "model_config": json.dumps(model_config)})
    with pytest.raises(CheckpointError, match=re.escape(said)):
        load_exported(exported)
    with pytest.raises(CheckpointError, match=re.escape(said)):
        load_init(str(exported))
