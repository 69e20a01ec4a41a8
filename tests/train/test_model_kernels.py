"""The model's hand-written fast paths against their plain definitions: rotary rotation, padded/grouped experts."""

import pytest
import torch
import torch.nn.functional as F

from winnow.train.model import moe as moe_module
from winnow.train.model.layers import RMSNorm, Rotary


def _rotary_reference(x_BLHC: torch.Tensor, theta: float) -> torch.Tensor:
    """The half-split rotary embedding written out with autograd ops (GPT-NeoX / Llama layout)."""
    L, C = x_BLHC.shape[1], x_BLHC.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, C, 2, dtype=torch.float64) / C)
    angles = torch.outer(torch.arange(L, dtype=torch.float64), inv_freq)[:, None]  # (L, 1, C/2)
    cos, sin = angles.cos().to(x_BLHC.dtype), angles.sin().to(x_BLHC.dtype)
    x1, x2 = x_BLHC.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def test_rotary_matches_reference_values_and_gradients():
    torch.manual_seed(0)
    x = torch.randn(2, 7, 3, 8, requires_grad=True)
    grad = torch.randn(2, 7, 3, 8)
    out = Rotary(8, 16, 10000.0)(x)
    (gx,) = torch.autograd.grad(out, x, grad)
    ref = _rotary_reference(x, 10000.0)
    (gx_ref,) = torch.autograd.grad(ref, x, grad)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gx, gx_ref, rtol=1e-5, atol=1e-6)


def test_rotary_preserves_norms_and_position_zero():
    x = torch.randn(1, 5, 2, 6)
    out = Rotary(6, 8, 100.0)(x)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))  # a rotation
    torch.testing.assert_close(out[:, 0], x[:, 0])  # angle 0 at the first position


def _experts_reference(x_AD, w13_ED2F, w2_EFD, counts_E):
    """Expert by expert over the contiguous slices: the definition every kernel path must match."""
    out, start = [], 0
    for e, n in enumerate(counts_E.tolist()):
        gate, up = (x_AD[start : start + n] @ w13_ED2F[e]).chunk(2, dim=-1)
        out.append((F.silu(gate) * up) @ w2_EFD[e])
        start += n
    return torch.cat(out)


@pytest.mark.parametrize("path", ["padded", "grouped"])
@pytest.mark.parametrize("counts", [[5, 0, 9, 2], [40, 1, 0, 0], [0, 0, 0, 0]])
def test_expert_ffn_paths_match_per_expert_reference(monkeypatch, path, counts):
    if path == "padded":
        monkeypatch.setattr(moe_module, "_grouped_mm_ok", lambda x, w: False)
    torch.manual_seed(0)
    counts_E = torch.tensor(counts)
    x = torch.randn(int(counts_E.sum()), 8, requires_grad=True)
    w13 = (0.3 * torch.randn(4, 8, 16)).requires_grad_()  # F = 8: 32-byte rows, as the grouped kernel needs
    w2 = (0.3 * torch.randn(4, 8, 8)).requires_grad_()
    grad = torch.randn(x.shape[0], 8)
    out = moe_module.expert_ffn(x, w13, w2, counts_E)
    ref = _experts_reference(x, w13, w2, counts_E)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    if x.shape[0]:
        got = torch.autograd.grad(out, (x, w13, w2), grad)
        want = torch.autograd.grad(ref, (x, w13, w2), grad)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_padded_rows_start_each_expert_at_a_multiple_of_capacity():
    rows = moe_module._padded_rows(torch.tensor([2, 0, 3]), 4, 5)
    assert rows.tolist() == [0, 1, 8, 9, 10]


def test_rmsnorm_matches_autograd_definition_values_and_gradients():
    torch.manual_seed(0)
    x = torch.randn(3, 5, 16, requires_grad=True)
    norm = RMSNorm(16, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(16))
    grad = torch.randn(3, 5, 16)
    out = norm(x)
    got = torch.autograd.grad(out, (x, norm.weight), grad)
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight
    want = torch.autograd.grad(ref, (x, norm.weight), grad)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
