"""``winnow export``: the single-file model round-trips, and the Mixtral folder gives winnow's logits in transformers."""

import dataclasses
import json

import pytest
import torch

from pipelines.cli import main
from tests.train.test_trainer_loop import make_trainer, tiny_config
from train.export import WINNOW_FILE, export_model, hf_blockers, load_exported
from train.model import ModelConfig, Transformer


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


@pytest.mark.parametrize("model", [{}, {"n_kv_heads": 1, "tie_embeddings": True, "rope_theta": 500.0, "top_k": 3},
                                   {"n_experts": 0, "dense_hidden": 48}], ids=["moe", "gqa-tied-rope-top3", "dense"])
def test_export_command_writes_a_mixtral_whose_logits_match(tmp_path, model, capsys):
    trainer = _trained_run(tmp_path, **model)
    assert main(["export", str(tmp_path / "run")]) == 0
    out = tmp_path / "run" / "export"
    assert str(out / "hf") in capsys.readouterr().out
    tokens = _tokens()
    with torch.no_grad():
        expected = trainer.model.eval()(tokens).logits_BLV
    hf = _hf_logits(out / "hf", tokens)
    assert hf.shape == expected.shape
    assert (hf - expected).abs().max().item() < 1e-4
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


@pytest.mark.parametrize(("key", "value"), [("n_dense_layers", 1), ("score_func", "sigmoid"), ("capacity_factor", 1.0),
                                            ("top_k", 1)])
def test_each_feature_mixtral_lacks_is_named(key, value):
    cfg = ModelConfig(vocab_size=40, dim=16, n_layers=2, n_heads=2, ffn_hidden=16, n_experts=4, **{key: value})
    assert [line.split(" =")[0] for line in hf_blockers(cfg)] == [f"train.model.{key}"]


def test_export_without_a_checkpoint_says_what_to_give(tmp_path, capsys):
    assert main(["export", str(tmp_path)]) == 2
    assert "no valid checkpoint" in capsys.readouterr().err


def test_export_refuses_a_state_without_model(tmp_path):
    from train.errors import CheckpointError

    with pytest.raises(CheckpointError, match="model_config"):
        export_model({"model": Transformer(ModelConfig()).state_dict()}, tmp_path)
