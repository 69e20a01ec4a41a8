"""The pipeline's pieces in one process: layer split, stage forward, the router-loss gradient, refusals."""

import pytest
import torch

from tests.train.test_trainer_loop import tiny_config
from winnow.train.errors import ConfigError
from winnow.train.model import ModelConfig, Transformer
from winnow.train.parallel.comm import CommTimer
from winnow.train.parallel.pipeline import Pipeline, StageModule, _RouterLossGrad, check_pipeline_run, stage_layers


def test_layers_split_contiguously_earlier_stages_take_the_remainder():
    assert stage_layers(4, 2) == [range(0, 2), range(2, 4)]
    assert stage_layers(5, 2) == [range(0, 3), range(3, 5)]
    assert stage_layers(4, 4) == [range(k, k + 1) for k in range(4)]
    with pytest.raises(ConfigError, match="n_layers = 2 is fewer than the pipeline's 3 stages"):
        stage_layers(2, 3)


def _model(**kw) -> Transformer:
    torch.manual_seed(0)
    return Transformer(
        ModelConfig(
            vocab_size=40,
            dim=32,
            n_layers=3,
            n_heads=2,
            ffn_hidden=32,
            n_experts=4,
            max_seq_len=32,
            doc_mask=True,
            **kw,
        )
    )


def test_stages_in_sequence_give_the_models_logits_and_router_loss_gradient():
    model = _model()
    tokens = torch.randint(0, 40, (2, 16))
    doc_ids = (torch.arange(16) >= 5).int().expand(2, 16)
    src, mask = torch.zeros(2, 16, dtype=torch.long), torch.ones(2, 16, dtype=torch.bool)
    seen = []
    stages = [
        StageModule(model, r, first=i == 0, last=i == 1, router_scale=0.5) for i, r in enumerate(stage_layers(3, 2))
    ]
    for stage in stages:
        stage.record = lambda first, stats, s, m: seen.append((first, len(stats)))
    h = tokens
    for stage in stages:
        h = stage(h, doc_ids, src, mask)
    out = model(tokens, doc_ids)
    torch.testing.assert_close(h, out.logits_BLV)
    assert seen == [(0, 2), (2, 1)]  # each stage reports its MoE layers under their global index
    # the router loss joins the backward with weight router_scale, as if 0.5 * router_loss were added to the loss
    h.sum().backward()
    staged = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    (out.logits_BLV.sum() + 0.5 * out.router_loss).backward()
    for got, want in zip(staged, (p.grad for p in model.parameters()), strict=True):
        torch.testing.assert_close(got, want)


def test_router_loss_grad_is_the_identity_on_activations():
    x, loss = torch.randn(3, requires_grad=True), torch.tensor(2.0, requires_grad=True)
    y = _RouterLossGrad.apply(x, loss, 0.25)
    (y * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    assert torch.equal(y, x) and x.grad.tolist() == [1.0, 2.0, 3.0] and loss.grad.item() == 0.25


def test_a_stage_keeps_only_its_own_modules():
    model = _model()
    Pipeline(
        model,
        rank=1,
        size=2,
        group=None,
        schedule="1f1b",
        n_microbatches=2,
        device=torch.device("cpu"),
        timer=CommTimer(),
    )
    assert model.embed is None and model.blocks[0] is None and model.blocks[1] is None and model.blocks[2] is not None
    assert model.head is not None
    assert all(name.startswith(("blocks.2.", "norm.", "head.")) for name, _ in model.named_parameters())


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"schedule": "1f1b", "n_microbatches": 1}, "grad_accum = 1 is fewer than train.parallel.pp = 2"),
        ({"schedule": "interleaved_1f1b", "n_microbatches": 2}, "pp_stages_per_rank = 1"),
        ({"schedule": "interleaved_1f1b", "n_microbatches": 3, "stages_per_rank": 2}, "multiple of"),
        ({"schedule": "gpipe", "n_microbatches": 2, "tie": True}, "tie_embeddings"),
    ],
)
def test_impossible_pipelines_are_config_errors(kw, match):
    model = _model(tie_embeddings=kw.pop("tie", False))
    with pytest.raises(ConfigError, match=match):
        Pipeline(model, rank=0, size=2, group=None, device=torch.device("cpu"), timer=CommTimer(), **kw)


def test_runs_a_pipeline_offers_pass_the_check(tmp_path):
    from winnow.train.adaptive import MixingConfig
    from winnow.train.data.config import LoaderConfig

    # a teacher and a mixing reference run whole on the last stage, on the inputs the schedule's target carries
    check_pipeline_run(
        tiny_config(tmp_path, mixing=MixingConfig(adaptive="doremi", reference="run")), attribution=False
    )
    check_pipeline_run(tiny_config(tmp_path, precision="fp16"), attribution=False)  # an agreed scaler
    cfg = tiny_config(tmp_path)  # a schedule per micro-batch shape
    cfg.data = LoaderConfig(num_workers=0, batch_size=4, seq_len=16, seq_len_warmup_steps=5, seq_len_warmup_start=8)
    check_pipeline_run(cfg, attribution=False)


def test_attribution_under_a_pipeline_refuses_only_what_cannot_cross_the_stages(tmp_path):
    from winnow.train.attribution import AttributionConfig as A

    check_pipeline_run(tiny_config(tmp_path, attribution=A(every=2)), attribution=True)
    with pytest.raises(ConfigError, match=r"train.attribution.split = 'losses'.*use split = 'tokens'"):
        check_pipeline_run(tiny_config(tmp_path, attribution=A(every=2, split="losses")), attribution=True)
    with pytest.raises(ConfigError, match=r"train.attribution with train.activation_checkpointing"):
        check_pipeline_run(
            tiny_config(tmp_path, attribution=A(every=2), activation_checkpointing=True), attribution=True
        )
