"""The transformer: causality, document masking, activation checkpointing, parameter counts, config errors, and
that it is plain PyTorch."""

from pathlib import Path

import pytest
import torch

from winnow.train.errors import ConfigError
from winnow.train.model import ModelConfig, Transformer
from winnow.train.parallel.parallelize import apply_activation_checkpointing

TINY = dict(vocab_size=50, dim=32, n_layers=2, n_heads=4, ffn_hidden=16, n_experts=4, top_k=2, max_seq_len=32)


def _model(*, activation_checkpointing: bool = False, **kw) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**{**TINY, **kw}))
    if activation_checkpointing:
        apply_activation_checkpointing(model)
    return model.eval()


def test_future_tokens_do_not_change_past_logits():
    model = _model()
    tokens = torch.randint(0, 50, (1, 12))
    changed = tokens.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % 50
    a, b = model(tokens).logits_BLV, model(changed).logits_BLV
    torch.testing.assert_close(a[:, :8], b[:, :8])
    assert not torch.allclose(a[:, 8:], b[:, 8:])


def test_document_mask_isolates_packed_documents():
    model = _model(doc_mask=True)
    tokens = torch.randint(0, 50, (1, 12))
    doc_ids = torch.tensor([[0] * 5 + [1] * 7], dtype=torch.int32)
    changed = tokens.clone()
    changed[0, :5] = (changed[0, :5] + 7) % 50  # rewrite the first document only
    a, b = model(tokens, doc_ids).logits_BLV, model(changed, doc_ids).logits_BLV
    torch.testing.assert_close(a[:, 5:], b[:, 5:])
    plain = _model(doc_mask=False)
    assert not torch.allclose(plain(tokens).logits_BLV[:, 5:], plain(changed).logits_BLV[:, 5:])


def test_activation_checkpointing_gives_identical_gradients():
    tokens = torch.randint(0, 50, (2, 10))
    grads = []
    for ckpt in (False, True):
        model = _model(activation_checkpointing=ckpt).train()
        out = model(tokens)
        (out.logits_BLV.float().pow(2).mean() + out.router_loss).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    torch.testing.assert_close(grads[0], grads[1])


@pytest.mark.parametrize(
    "extra",
    [{}, {"n_dense_layers": 1, "n_shared_experts": 1}, {"n_experts": 0}, {"tie_embeddings": True, "n_kv_heads": 2}],
)
def test_param_counts_from_config_match_the_built_model(extra):
    model = _model(**extra)
    assert model.cfg.param_counts() == model.num_params()


def test_router_loss_is_weighted_sum_over_moe_layers():
    model = _model(aux_loss_coef=0.5, z_loss_coef=0.25)
    out = model(torch.randint(0, 50, (1, 8)))
    expected = sum(0.5 * s.aux_loss + 0.25 * s.z_loss for s in out.moe)
    assert len(out.moe) == 2
    torch.testing.assert_close(out.router_loss, expected)


def test_config_error_names_key_value_and_allowed():
    with pytest.raises(ConfigError, match=r"train\.model\.top_k = 9 .*1\.\.n_experts"):
        ModelConfig(n_experts=4, top_k=9)
    with pytest.raises(ConfigError, match="n_kv_heads"):
        ModelConfig(n_heads=4, n_kv_heads=3)
    with pytest.raises(ConfigError, match="n_kv_heads = 0"):  # it was read as "no key": as many as n_heads
        ModelConfig(n_heads=4, n_kv_heads=0)
    with pytest.raises(ConfigError, match=r"max_seq_len = 100000000 .*at most 1,048,576"):
        ModelConfig(max_seq_len=10**8)  # its rotary tables alone took 20 GB
    for theta in (0.0, -1.0):
        with pytest.raises(ConfigError, match="rope_theta"):
            ModelConfig(rope_theta=theta)  # 0: every step's loss was NaN


def test_the_model_package_imports_no_parallel_or_attribution_code():
    from winnow import train

    for path in Path(train.model.__file__).parent.glob("*.py"):
        imports = [
            line.strip() for line in path.read_text().splitlines() if line.strip().startswith(("import ", "from "))
        ]
        found = [
            line
            for line in imports
            if any(name in line for name in ("winnow.train.parallel", "winnow.train.attribution", "torch.distributed"))
        ]
        assert not found, f"{path.name}: {found}"
