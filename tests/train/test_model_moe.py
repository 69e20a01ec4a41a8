"""The MoE block: routing, batched experts against a per-token reference, balancing losses, capacity."""

import math

import pytest
import torch

from winnow.train.model import ModelConfig, MoE
from winnow.train.model import moe as moe_module


def _moe(**kw) -> MoE:
    torch.manual_seed(0)
    cfg = ModelConfig(**{"dim": 16, "n_heads": 2, "ffn_hidden": 8, "n_experts": 4, "top_k": 2, **kw})
    block = MoE(cfg)
    torch.nn.init.normal_(block.experts.w13_ED2F, 0, 0.3)
    torch.nn.init.normal_(block.experts.w2_EFD, 0, 0.3)
    return block


def _reference(block: MoE, x_TD: torch.Tensor) -> torch.Tensor:
    """Token by token, expert by expert: the definition the batched path must match."""
    weights_TK, experts_TK, _, _ = block.router(x_TD)
    F_ = block.cfg.ffn_hidden
    out = torch.zeros_like(x_TD)
    for t in range(x_TD.shape[0]):
        for k in range(experts_TK.shape[1]):
            e = experts_TK[t, k]
            h = x_TD[t] @ block.experts.w13_ED2F[e]
            y = (torch.nn.functional.silu(h[:F_]) * h[F_:]) @ block.experts.w2_EFD[e]
            out[t] += weights_TK[t, k] * y
    return out


@pytest.mark.parametrize("grouped", [True, False])
def test_batched_experts_match_per_token_reference(monkeypatch, grouped):
    if not grouped:
        monkeypatch.setattr(moe_module, "_grouped_mm_ok", lambda x, w: False)
    block = _moe()
    x_BLD = torch.randn(2, 5, 16)
    out_BLD, stats = block(x_BLD)
    torch.testing.assert_close(out_BLD.view(-1, 16), _reference(block, x_BLD.view(-1, 16)), rtol=1e-5, atol=1e-5)
    assert stats.load_E.sum() == 10 * 2 and stats.dropped == 0


def test_aux_loss_and_z_loss_match_hand_computed_values():
    block = MoE(ModelConfig(dim=2, n_heads=1, ffn_hidden=4, n_experts=2, top_k=1))
    with torch.no_grad():
        block.router.gate.weight.copy_(torch.eye(2))  # logits = x
    ln3 = math.log(3.0)
    x = torch.tensor([[[ln3, 0.0], [ln3, 0.0], [0.0, ln3]]])
    _, stats = block(x)
    # probs: [.75,.25], [.75,.25], [.25,.75]; fraction routed f = [2/3, 1/3]; mean prob P = [7/12, 5/12]
    assert stats.aux_loss.item() == pytest.approx(2 * (2 / 3 * 7 / 12 + 1 / 3 * 5 / 12))
    assert stats.z_loss.item() == pytest.approx(math.log(4.0) ** 2)  # logsumexp([ln3, 0]) = ln 4
    assert stats.load_E.tolist() == [2.0, 1.0]


def test_topk_weights_are_renormalized():
    block = _moe(top_k=2)
    weights_TK, experts_TK, probs_TE, _ = block.router(torch.randn(6, 16))
    torch.testing.assert_close(weights_TK.sum(-1), torch.ones(6))
    assert (probs_TE.gather(1, experts_TK)[:, 0] >= probs_TE.gather(1, experts_TK)[:, 1]).all()


def test_sigmoid_router_scores_are_bounded_and_renormalized():
    block = _moe(score_func="sigmoid")
    weights_TK, _, probs_TE, _ = block.router(torch.randn(6, 16))
    torch.testing.assert_close(weights_TK.sum(-1), torch.ones(6))
    torch.testing.assert_close(probs_TE.sum(-1), torch.ones(6))


def test_capacity_factor_drops_and_counts_overflow():
    block = _moe(n_experts=2, top_k=1, capacity_factor=1.0)
    with torch.no_grad():
        block.router.gate.weight.copy_(torch.zeros(2, 16))
        block.router.gate.weight[0, 0] = 10.0  # every token with x[0] > 0 prefers expert 0
    x = torch.randn(1, 8, 16)
    x[..., 0] = 1.0
    out, stats = block(x)
    # capacity = ceil(1.0 * 8 * 1 / 2) = 4: the first four tokens are served, the last four dropped
    assert stats.dropped.item() == 4 and stats.load_E.tolist() == [8.0, 0.0]
    assert out[0, 4:].abs().sum() == 0 and out[0, :4].abs().sum() > 0


def test_expert_bias_steers_selection_but_not_weights():
    block = _moe(load_balance="bias", bias_update_rate=0.5, n_experts=2, top_k=1)
    block.router.update_bias(torch.tensor([10.0, 0.0]))
    assert block.router.expert_bias_E.tolist() == [-0.5, 0.5]
    x = torch.randn(32, 16)
    _, experts_TK, probs_TE, _ = block.router(x)
    weights_TK, _, _, _ = block.router(x)
    assert (experts_TK == 1).float().mean() > (probs_TE.argmax(-1) == 1).float().mean() or (experts_TK == 1).all()
    torch.testing.assert_close(weights_TK, probs_TE.gather(1, experts_TK))


def test_shared_expert_adds_to_routed_output():
    block = _moe(n_shared_experts=1)
    x = torch.randn(1, 4, 16)
    with_shared, _ = block(x)
    routed = _reference(block, x.view(-1, 16)).view_as(x)
    torch.testing.assert_close(with_shared, routed + block.shared(x.view(-1, 16)).view_as(x), rtol=1e-5, atol=1e-5)
