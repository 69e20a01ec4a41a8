"""`winnow train` on a job with token shards: it reads them, with the tokenizer they were written with."""

from __future__ import annotations

from tests.train.shards_util import make_docs, write_token_job
from tests.train.test_tokenizer_hf import make_tokenizer
from winnow.train.config import TrainConfig
from winnow.train.data import LoaderConfig
from winnow.train.model import ModelConfig


def test_training_reads_token_shards_with_their_tokenizer_and_steps(tmp_path):
    from winnow.pipelines.train import build_trainer

    make_tokenizer(tmp_path / "tokenizer.json", ["<|endoftext|>"])
    docs = make_docs(40)
    job = write_token_job(tmp_path / "job", [docs[:30]], val=[docs[30:]], tokenizer=str(tmp_path / "tokenizer.json"))
    model = ModelConfig(dim=32, n_layers=1, n_heads=2, ffn_hidden=32, n_experts=2, top_k=1, max_seq_len=32)
    cfg = TrainConfig(
        output=str(tmp_path / "run"),
        shards=str(job),
        steps=2,
        eval_every=0,
        eval_batches=1,
        model=model,
        data=LoaderConfig(batch_size=2, seq_len=16, num_workers=0),
        device="cpu",
    )
    trainer = build_trainer(cfg)
    assert trainer.data.tokenizer.kind == "hf" and trainer.model.cfg.vocab_size == trainer.data.tokenizer.vocab_size
    assert type(trainer.data._sets[0]).__name__ == "TokenStream"
    summary = trainer.fit()
    trainer.data.close()
    assert summary["step"] == 2 and trainer.data.stats()["tokens_tokenized"] == 0
