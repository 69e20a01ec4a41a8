"""Mixed precision and activation checkpointing, tested by what they are for.

Under bf16 autocast the range-sensitive parts (router scores, RMSNorm, the loss) must run in fp32
while the matmuls run in bf16; activation checkpointing must keep fewer tensors for backward
(counted with saved-tensor hooks) and still give the same gradients.
"""

import torch

from winnow.train.model import ModelConfig, Transformer
from winnow.train.model.layers import RMSNorm
from winnow.train.model.loss import cross_entropy_per_token
from winnow.train.model.moe import Router
from winnow.train.parallel.parallelize import apply_activation_checkpointing

TINY = {"vocab_size": 50, "dim": 32, "n_heads": 4, "ffn_hidden": 16, "n_experts": 4, "top_k": 2, "max_seq_len": 32}
B, L = 2, 10


def _model(n_layers: int = 2, *, activation_checkpointing: bool = False) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**TINY, n_layers=n_layers))
    if activation_checkpointing:
        apply_activation_checkpointing(model)
    return model.train()


def _saved_for_backward(model: Transformer, tokens: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    """Bytes of each tensor autograd saves during one forward, and the gradients of the backward after it."""
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(tokens)
    (out.logits_BLV.float().pow(2).mean() + out.router_loss).backward()
    return saved, torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_activation_checkpointing_keeps_only_each_blocks_input_and_gives_the_same_gradients():
    tokens = torch.randint(0, 50, (B, L))
    plain2, grads_plain = _saved_for_backward(_model(2), tokens)
    ckpt2, grads_ckpt = _saved_for_backward(_model(2, activation_checkpointing=True), tokens)
    plain3, _ = _saved_for_backward(_model(3), tokens)
    ckpt3, _ = _saved_for_backward(_model(3, activation_checkpointing=True), tokens)
    torch.testing.assert_close(grads_plain, grads_ckpt)
    assert sum(ckpt2) * 5 < sum(plain2)
    # one more layer: without checkpointing every intermediate of the block is kept; with it, only
    # the block's input (B, L, D) in fp32, recomputed from in backward
    assert len(ckpt3) - len(ckpt2) == 1 and sum(ckpt3) - sum(ckpt2) == B * L * TINY["dim"] * 4
    assert len(plain3) - len(plain2) > 20


def test_under_bf16_autocast_router_norms_and_loss_run_in_fp32_while_matmuls_run_in_bf16():
    model = _model(2)
    dtypes: dict[str, list[torch.dtype]] = {"router": [], "norm": [], "linear": []}

    def record(kind):
        def hook(module, args, out):
            outs = out if isinstance(out, tuple) else (out,)
            dtypes[kind] += [t.dtype for t in outs if isinstance(t, torch.Tensor) and t.is_floating_point()]

        return hook

    gates = {id(m.gate) for m in model.modules() if isinstance(m, Router)}  # the router's own fp32 matmul
    for module in model.modules():
        if isinstance(module, Router):
            module.register_forward_hook(record("router"))
        elif isinstance(module, RMSNorm):
            module.register_forward_hook(record("norm"))
        elif isinstance(module, torch.nn.Linear) and id(module) not in gates:
            module.register_forward_hook(record("linear"))
    tokens = torch.randint(0, 50, (B, L))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(tokens)
        loss_BL = cross_entropy_per_token(out.logits_BLV, tokens)
    assert dtypes["linear"] and set(dtypes["linear"]) == {torch.bfloat16}  # autocast is really on
    assert out.logits_BLV.dtype == torch.bfloat16
    assert dtypes["router"] and set(dtypes["router"]) == {torch.float32}  # weights, probabilities, logits
    assert dtypes["norm"] and set(dtypes["norm"]) == {torch.float32}  # the fp32 residual stream stays fp32
    assert loss_BL.dtype == torch.float32 and out.router_loss.dtype == torch.float32
    assert all(s.z_loss.dtype == torch.float32 and s.aux_loss.dtype == torch.float32 for s in out.moe)


def test_rmsnorm_computes_in_fp32_even_on_a_bf16_input():
    torch.manual_seed(0)
    norm = RMSNorm(32, eps=1e-6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = (torch.randn(4, 32) * 30).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = norm(x)
    x32 = x.float()
    fp32 = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight).bfloat16()
    bf16 = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight.bfloat16()  # rounds differently
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, fp32, atol=0, rtol=0)
    assert not torch.equal(bf16, fp32)  # so the exact match above distinguishes the two
