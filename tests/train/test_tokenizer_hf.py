"""Any Hugging Face tokenizer.json: end-of-document and padding tokens chosen, given, or by id."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from tests.train.shards_util import make_docs, write_token_job
from winnow.train.data import Loader, LoaderConfig
from winnow.train.errors import ConfigError
from winnow.train.tokenizer import ByteTokenizer, HFTokenizer, TokenizerConfig, load_tokenizer

TEXTS = ["the quick brown fox jumps over the lazy dog", "def f(x):\n    return x + 1", "héllo wörld"] * 20


def make_tokenizer(path, specials):
    """A GPT-2-style byte-level BPE (no winnow <|pad|>) saved as a plain tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        [TEXTS],
        trainers.BpeTrainer(
            vocab_size=320,
            special_tokens=specials,
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tok.save(str(path))
    return tok


def test_gpt2_style_tokenizer_json_loads_with_eos_found_and_eos_padding(tmp_path):
    rust = make_tokenizer(tmp_path / "tokenizer.json", ["<|endoftext|>"])
    tok = load_tokenizer(str(tmp_path / "tokenizer.json"))
    assert isinstance(tok, HFTokenizer) and tok.kind == "hf"
    assert tok.eos_id == tok.pad_id == rust.token_to_id("<|endoftext|>")
    assert tok.encode_batch(["héllo wörld"])[0].tolist() == rust.encode("héllo wörld", add_special_tokens=False).ids
    assert tok.decode(tok.encode_batch(["héllo wörld"])[0]) == "héllo wörld"


def test_eos_and_pad_given_by_name_or_id(tmp_path):
    rust = make_tokenizer(tmp_path / "tokenizer.json", ["<s>", "</s>", "<pad>"])
    path = str(tmp_path / "tokenizer.json")
    assert load_tokenizer(path).eos_id == rust.token_to_id("</s>")  # Llama-2/Mistral style, found by default
    tok = load_tokenizer(TokenizerConfig(path=path, eos_token="<s>", pad_token="<pad>"))
    assert (tok.eos_id, tok.pad_id) == (rust.token_to_id("<s>"), rust.token_to_id("<pad>"))
    assert load_tokenizer(TokenizerConfig(path=path, pad_id=7)).pad_id == 7
    other = pickle.loads(pickle.dumps(tok))
    assert (other.eos_id, other.pad_id, other.name) == (tok.eos_id, tok.pad_id, tok.name)
    tok.save(tmp_path / "run")  # a run folder reloads with the same special tokens
    again = load_tokenizer(tmp_path / "run")
    assert (again.eos_id, again.pad_id, again.describe()) == (tok.eos_id, tok.pad_id, tok.describe())


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(eos_token="<|im_end|>"), "eos_token"),
        (dict(pad_token="<nope>"), "pad_token"),
        (dict(pad_id=10_000), "pad_id"),
    ],
)
def test_bad_special_tokens_name_the_key(tmp_path, kw, match):
    make_tokenizer(tmp_path / "tokenizer.json", ["<|endoftext|>"])
    with pytest.raises(ConfigError, match=rf"train\.tokenizer.*{match}"):
        load_tokenizer(TokenizerConfig(path=str(tmp_path / "tokenizer.json"), **kw))


def test_no_end_of_document_token_asks_for_eos_token(tmp_path):
    make_tokenizer(tmp_path / "tokenizer.json", ["[CLS]"])
    with pytest.raises(ConfigError, match="set train.tokenizer.eos_token"):
        load_tokenizer(str(tmp_path / "tokenizer.json"))


def test_config_refuses_both_pad_forms_and_specials_for_byte():
    with pytest.raises(ConfigError, match="pad_token or pad_id"):
        TokenizerConfig(path="x.json", pad_token="<pad>", pad_id=0)
    with pytest.raises(ConfigError, match="byte"):
        TokenizerConfig(eos_token="</s>")
    assert isinstance(load_tokenizer(TokenizerConfig()), ByteTokenizer)


@pytest.mark.parametrize("kind", ["byte", "hf"])
def test_training_tokenizer_gives_the_ids_curation_wrote(tmp_path, kind):
    """The token shards' ids are what train's tokenizer makes of the Parquet text: batches agree."""
    docs = make_docs(40)
    spec = "byte"
    if kind == "hf":
        make_tokenizer(tmp_path / "tokenizer.json", ["<|endoftext|>"])
        spec = str(tmp_path / "tokenizer.json")
    job = write_token_job(tmp_path / "job", [docs[:15], docs[15:]], tokenizer=spec)
    tok = load_tokenizer(spec)
    cfg = dict(batch_size=2, seq_len=12, num_workers=0)
    with (
        Loader(LoaderConfig(format="parquet", **cfg), job, tokenizer=tok) as text,
        Loader(LoaderConfig(format="tokens", **cfg), job, tokenizer=tok) as tokens,
    ):
        for _ in range(60):
            a, b = next(text), next(tokens)
            assert np.array_equal(a.tokens.numpy(), b.tokens.numpy()) and np.array_equal(
                a.loss_mask.numpy(), b.loss_mask.numpy()
            )


def test_a_job_folder_names_the_tokenizer_its_token_shards_were_written_with(tmp_path):
    from tests.train.shards_util import write_job
    from winnow.train.data.tokenshards import shards_tokenizer

    docs = make_docs(6)
    assert shards_tokenizer(str(write_job(tmp_path / "text", [docs]))) is None  # no token shards: caller's default
    assert shards_tokenizer(str(write_token_job(tmp_path / "byte", [docs]))) == "byte"
    make_tokenizer(tmp_path / "tokenizer.json", ["<|endoftext|>"])
    hf = write_token_job(tmp_path / "hf", [docs], tokenizer=str(tmp_path / "tokenizer.json"))
    path = shards_tokenizer(str(hf))
    assert path.endswith("shards/tokens/tokenizer.json")
    assert load_tokenizer(path).describe() == load_tokenizer(str(tmp_path / "tokenizer.json")).describe()
