"""The trainer is built, not patched: the model carries its own settings, the trainer closes its loader,
and a checkpoint of other sources is refused."""

import pytest
import torch

from train.config import TrainConfig
from train.data import LoaderConfig, RepeatBatch
from train.data.batch import Batch
from train.errors import CheckpointError, ConfigError
from train.model import ModelConfig, Transformer
from train.model.moe import ExpertShard
from train.parallel.expert_parallel import sharded_expert_names
from train.parallel.config import MeshDims
from train.parallel.mesh import World
from train.trainer import Trainer

MODEL = ModelConfig(vocab_size=40, dim=16, n_layers=1, n_heads=2, ffn_hidden=8, n_experts=4, top_k=1, max_seq_len=16)


class ClosingBatches(RepeatBatch):
    closed = 0

    def close(self) -> None:
        self.closed += 1


def _batch() -> Batch:
    tokens = torch.arange(16).remainder(40).view(2, 8)
    return Batch(tokens=tokens, targets=tokens.roll(-1, 1), source_ids=torch.zeros(2, 8, dtype=torch.long),
                 loss_mask=torch.ones(2, 8, dtype=torch.bool), doc_ids=torch.zeros(2, 8, dtype=torch.int32))


def _trainer(tmp_path, sources, *, checkpointing=False, model=None, data=None) -> Trainer:
    cfg = TrainConfig(output=str(tmp_path), model=MODEL, steps=1, eval_every=0, activation_checkpointing=checkpointing,
                      data=LoaderConfig(batch_size=2, seq_len=8, num_workers=0))
    model = model or Transformer(MODEL, activation_checkpointing=checkpointing)
    return Trainer(cfg, model=model, data=data or ClosingBatches(_batch()), sources=sources, run_dir=tmp_path,
                   device=torch.device("cpu"))


def test_trainer_as_context_manager_closes_its_loader(tmp_path):
    data = ClosingBatches(_batch())
    with _trainer(tmp_path, ["a"], data=data) as trainer:
        trainer.train_step()
        assert data.closed == 0
    assert data.closed == 1


def test_activation_checkpointing_comes_with_the_model_not_set_on_it(tmp_path):
    trainer = _trainer(tmp_path / "on", ["a"], checkpointing=True)
    assert trainer.model.activation_checkpointing
    with pytest.raises(ConfigError, match=r"train.activation_checkpointing = True but the model was built with False"):
        _trainer(tmp_path / "off", ["a"], checkpointing=True, model=Transformer(MODEL))


def test_checkpoint_of_other_sources_is_refused(tmp_path):
    state = _trainer(tmp_path / "ab", ["a", "b"]).state_dict()
    _trainer(tmp_path / "same", ["a", "b"]).load_state_dict(state)
    with pytest.raises(CheckpointError, match=r"trained on sources \['a', 'b'\], this run has \['b', 'a'\]"):
        _trainer(tmp_path / "ba", ["b", "a"]).load_state_dict(state)


def test_expert_parallel_refuses_a_model_built_without_its_shard():
    world = World(rank=1, size=2, local_rank=1, device=torch.device("cpu"), dims=MeshDims(dp_replicate=2, ep=2))
    with pytest.raises(ConfigError, match=r"ep = 2: the model's MoE layer 'blocks.0.ffn' was not built"):
        sharded_expert_names(Transformer(MODEL), world)


def test_a_sharded_model_starts_from_its_slice_of_the_unsharded_weights():
    world = World(rank=1, size=2, local_rank=1, device=torch.device("cpu"), dims=MeshDims(dp_replicate=2, ep=2))
    torch.manual_seed(0)
    full = Transformer(MODEL)
    torch.manual_seed(0)
    sharded = Transformer(MODEL, experts=ExpertShard(rank=1, size=2, dispatch=lambda x, counts, compute: compute(x, counts)))
    assert sharded_expert_names(sharded, world) == ["blocks.0.ffn.w13_ED2F", "blocks.0.ffn.w2_EFD"]
    torch.testing.assert_close(sharded.blocks[0].ffn.w13_ED2F, full.blocks[0].ffn.w13_ED2F[2:4])
    torch.testing.assert_close(sharded.blocks[0].ffn.w2_EFD, full.blocks[0].ffn.w2_EFD[2:4])
    torch.testing.assert_close(sharded.blocks[0].attn.wq.weight, full.blocks[0].attn.wq.weight)
