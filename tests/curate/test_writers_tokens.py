"""The tokens output format: Megatron-Core's indexed dataset plus winnow's per-document array."""

from __future__ import annotations

import hashlib
import json
import struct
import warnings

import numpy as np
import polars as pl
import pytest

from winnow.curate.config import OutputConfig, TokensConfig
from winnow.curate.errors import ConfigError
from winnow.curate.tokenize import BYTE_EOS, ShardTokenizer, token_dtype
from winnow.curate.writers.shards import ShardWriter


def rows(n: int) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "id": [f"s/{i}" for i in range(n)],
            "source": ["web" if i % 3 else "code" for i in range(n)],
            "text": [("héllo " * (i % 5)) + f"doc {i}" if i != 4 else "" for i in range(n)],
            "meta": [None] * n,
        }
    )


def write(folder, df: pl.DataFrame, **tokens) -> list[dict]:
    writer = ShardWriter(
        folder,
        "part-00000",
        OutputConfig(formats=["parquet", "tokens"], shard_rows=8, tokens=TokensConfig(**tokens)),
        split="train",
    )
    for chunk in df.iter_slices(5):
        writer.write(chunk)
    return writer.close()


def read_idx(path):
    """The .idx as Megatron-Core's _IndexReader defines it: header, sizes, pointers, document indices."""
    buf = path.read_bytes()
    assert buf[:9] == b"MMIDIDX\x00\x00"
    version, code, n_seq, n_doc = struct.unpack_from("<QBQQ", buf, 9)
    off = 9 + 8 + 1 + 8 + 8
    sizes = np.frombuffer(buf, np.int32, n_seq, off)
    pointers = np.frombuffer(buf, np.int64, n_seq, off + 4 * n_seq)
    docs = np.frombuffer(buf, np.int64, n_doc, off + 12 * n_seq)
    assert len(buf) == off + 12 * n_seq + 8 * n_doc
    return version, code, sizes, pointers, docs


def gpt2_style_tokenizer(path, texts):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([texts], trainer=trainer)
    tok.save(str(path))
    return tok


def test_byte_token_shards_hold_each_rows_utf8_bytes_and_one_eos(tmp_path):
    df = rows(19)
    entries = write(tmp_path, df)
    tokens = [e for e in entries if e["format"] == "tokens"]
    assert [e["rows"] for e in tokens] == [8, 8, 3] and tokens[0]["dtype"] == "uint16"
    texts, start = df["text"].to_list(), 0
    for e in tokens:
        version, code, sizes, pointers, docs = read_idx(e["path"].with_suffix(".idx"))
        assert (version, code) == (1, 8)  # uint16
        ids = np.fromfile(e["path"], np.uint16)
        expected = [list(t.encode()) + [BYTE_EOS] for t in texts[start : start + e["rows"]]]
        assert sizes.tolist() == [len(x) for x in expected] and docs.tolist() == list(range(e["rows"] + 1))
        assert pointers.tolist() == (np.cumsum([0] + sizes.tolist()[:-1]) * 2).tolist()
        assert ids.tolist() == [i for x in expected for i in x]
        doc = np.load(str(e["path"]).replace(".bin", ".doc.npy"))
        names = e["source_names"]
        assert [names[c] for c in doc["source"]] == df["source"][start : start + e["rows"]].to_list()
        assert doc["row"].tolist() == list(range(e["rows"]))  # row j of the Parquet shard of the same name
        assert e["tokens"] == len(ids) == sum(e["tokens_by_source"].values())
        assert e["sha256"] == hashlib.sha256(e["path"].read_bytes()).hexdigest()
        start += e["rows"]
    assert not list(tmp_path.rglob(".*.tmp"))


def test_hf_tokenizer_json_ids_match_the_tokenizers_library(tmp_path):
    df = rows(12)
    tok = gpt2_style_tokenizer(tmp_path / "tokenizer.json", df["text"].to_list())
    entries = [e for e in write(tmp_path, df, tokenizer=str(tmp_path / "tokenizer.json")) if e["format"] == "tokens"]
    eos = tok.token_to_id("<|endoftext|>")
    got = np.concatenate([np.fromfile(e["path"], np.uint16) for e in entries]).tolist()
    assert got == [i for t in df["text"].to_list() for i in tok.encode(t, add_special_tokens=False).ids + [eos]]
    assert entries[0]["tokenizer"]["kind"] == "hf" and entries[0]["tokenizer"]["eos_id"] == eos
    copy = tmp_path / "shards" / "tokens" / "tokenizer.json"  # the job folder keeps the tokenizer
    assert hashlib.sha256(copy.read_bytes()).hexdigest() == entries[0]["tokenizer"]["sha256"]


def test_a_special_tokens_text_inside_a_document_is_text_not_the_end_of_document_id(tmp_path):
    """A README holding "<|endoftext|>" must not end its document early: the token shards (and the loader's
    tokenizer, and the mix's count) encode the string's pieces; the one EOS per document is the writer's."""
    from winnow.train.tokenizer import load_tokenizer

    df = rows(6).with_columns(pl.Series("text", [f"row {i} says <|endoftext|> mid-way" for i in range(6)]))
    tok = gpt2_style_tokenizer(tmp_path / "tokenizer.json", df["text"].to_list())
    eos = tok.token_to_id("<|endoftext|>")
    entries = [e for e in write(tmp_path, df, tokenizer=str(tmp_path / "tokenizer.json")) if e["format"] == "tokens"]
    ids = np.concatenate([np.fromfile(e["path"], np.uint16) for e in entries])
    assert int((ids == eos).sum()) == 6 and ids[-1] == eos  # one per document, at its end
    flat, lens = load_tokenizer(tmp_path / "tokenizer.json").encode_column(df["text"].to_arrow())
    assert eos not in flat.tolist() and lens.sum() + 6 == len(ids)
    assert tok.decode(flat[: lens[0]].tolist()) == df["text"][0]


def test_megatron_cores_own_indexed_dataset_reads_winnows_files(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    df = rows(10)
    entry = [e for e in write(tmp_path, df) if e["format"] == "tokens"][0]
    prefix = str(entry["path"])[: -len(".bin")]
    ds = indexed.IndexedDataset(prefix)
    assert len(ds) == entry["rows"]
    for i, text in enumerate(df["text"].to_list()[: entry["rows"]]):
        assert ds[i].tolist() == list(text.encode()) + [BYTE_EOS]
    # and Megatron's own builder writes the same index bytes for the same documents
    builder = indexed.IndexedDatasetBuilder(str(tmp_path / "mc.bin"), dtype=np.uint16)
    for i in range(len(ds)):
        builder.add_document(ds[i].tolist(), [len(ds[i])])
    builder.finalize(str(tmp_path / "mc.idx"))
    assert (tmp_path / "mc.idx").read_bytes() == (tmp_path / f"{prefix}.idx").read_bytes()
    assert (tmp_path / "mc.bin").read_bytes() == entry["path"].read_bytes()


def test_dtype_is_the_smallest_megatron_has_a_code_for():
    assert [token_dtype(v).name for v in (200, 256, 258, 50257, 65536, 128256)] == [
        "uint8",
        "uint8",
        "uint16",
        "uint16",
        "uint16",
        "int32",
    ]


@pytest.mark.parametrize("content", [None, "{not json", '{"model": {"type": "Nope"}}'])
def test_a_tokenizer_that_cannot_load_names_path_and_key(tmp_path, content):
    path = tmp_path / "tok.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=r"output\.tokens\.tokenizer\b.*tok\.json"):
        TokensConfig(tokenizer=str(path))


def test_missing_eos_token_is_a_config_error_naming_the_key(tmp_path):
    gpt2_style_tokenizer(tmp_path / "tokenizer.json", ["some text here"])
    with pytest.raises(ConfigError, match="eos_token"):
        ShardTokenizer(str(tmp_path / "tokenizer.json"), eos_token="</s>")
    with pytest.raises(ConfigError, match="output.tokens.eos_token = '' names no token"):
        TokensConfig(tokenizer=str(tmp_path / "tokenizer.json"), eos_token="")  # it said "none of the usual tokens"


def test_a_tokenizer_that_cannot_encode_unseen_text_is_a_config_error_before_any_shard(tmp_path):
    """A WordLevel model whose unk_token is not in its vocabulary raised from the writers: a traceback mid-job."""
    from tokenizers import Tokenizer, models

    tok = Tokenizer(models.WordLevel({"hello": 0, "<|endoftext|>": 1}, unk_token="[UNK]"))
    tok.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ConfigError, match=r"tokenizer\.json' cannot encode text: WordLevel error: Missing \[UNK\]"):
        ShardTokenizer(str(tmp_path / "tokenizer.json"))


def test_a_tokenizer_whose_ids_skip_numbers_sizes_the_shards_by_its_largest_id(tmp_path):
    """3 tokens with ids up to 1000: uint8, picked from the count, stopped the writer mid-job (OverflowError); the
    training side's vocabulary covers the same ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from winnow.train.tokenizer import TokenizerConfig, load_tokenizer

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "the": 1, "</s>": 1000}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    shard_tok = ShardTokenizer(str(tmp_path / "tokenizer.json"), eos_token="</s>")
    assert shard_tok.vocab_size == 1001 and shard_tok.dtype == np.uint16
    train_tok = load_tokenizer(TokenizerConfig(path=str(tmp_path / "tokenizer.json"), eos_token="</s>"))
    assert train_tok.vocab_size == 1001 and train_tok.eos_id == 1000
    out = OutputConfig(
        formats=["tokens"], tokens=TokensConfig(tokenizer=str(tmp_path / "tokenizer.json"), eos_token="</s>")
    )
    writer = ShardWriter(tmp_path / "shards", "part-00000", out, split="train")
    writer.write(pl.DataFrame({"id": ["a"], "source": ["s"], "text": ["the the"], "meta": [None]}))
    (entry,) = writer.close()
    ids = np.fromfile(entry["path"], np.uint16)
    assert ids.tolist() == [1, 1, 1000] and entry["max_id"] == 1000


def test_an_end_of_document_token_that_is_an_ordinary_token_is_said(tmp_path, caplog):
    """Its text in a document encodes to the end-of-document id: one document would read as two."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "the": 1, "</s>": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tokenizer.json"))
    with caplog.at_level("WARNING"):
        ShardTokenizer(str(tmp_path / "tokenizer.json"), eos_token="</s>")
    assert "its end-of-document token '</s>' is an ordinary token" in caplog.text
    caplog.clear()
    gpt2_style_tokenizer(tmp_path / "special.json", ["some text here"])  # <|endoftext|> is special there
    with caplog.at_level("WARNING"):
        ShardTokenizer(str(tmp_path / "special.json"))
    assert "ordinary token" not in caplog.text


def test_job_file_output_tokens_table(tmp_path):
    from winnow.pipelines.jobfile import job_from_dict

    raw = {
        "job": {"name": "t", "output": str(tmp_path / "out")},
        "inputs": [{"source": "a", "path": "x.jsonl"}],
        "output": {"formats": ["parquet", "tokens"], "tokens": {"tokenizer": "byte"}},
    }
    assert job_from_dict(raw).output.tokens.tokenizer == "byte"
    raw["output"]["tokens"] = {"tokenizer": str(tmp_path / "missing.json")}
    with pytest.raises(ConfigError, match=r"\[output\].*tokens.*missing\.json"):
        job_from_dict(raw)
    raw["output"]["tokens"] = {"tokeniser": "byte"}
    with pytest.raises(ConfigError, match="did you mean 'tokenizer'"):
        job_from_dict(raw)
    assert json.dumps(job_from_dict({**raw, "output": {"formats": ["tokens"]}}).output.formats) == '["tokens"]'


def test_a_job_writing_a_hf_tokenizers_copy_runs_again_and_afresh(tmp_path):
    """The copy in shards/tokens/ is winnow's own: a re-run refused it as a user's file, so such a job could not be
    curated twice (nor an interrupted `winnow run` resumed)."""
    from winnow.curate.pipeline import run_job
    from winnow.pipelines.jobfile import load_job

    df = rows(12)
    gpt2_style_tokenizer(tmp_path / "tokenizer.json", df["text"].to_list())
    df.select("text").write_ndjson(tmp_path / "d.jsonl")
    path = tmp_path / "job.toml"
    path.write_text(
        f'[job]\nname = "t"\noutput = "{tmp_path / "out"}"\n[[inputs]]\nsource = "s"\npath = "{tmp_path / "d.jsonl"}"\n'
        f'[output]\nformats = ["parquet", "tokens"]\n[output.tokens]\ntokenizer = "{tmp_path / "tokenizer.json"}"\n'
    )
    written = run_job(load_job(path), progress=False)["totals"]["rows_written"]
    assert run_job(load_job(path), progress=False)["totals"]["rows_written"] == written == 12
    path.write_text(path.read_text().replace('name = "t"', 'name = "t2"'))  # another job: a fresh run clears
    assert run_job(load_job(path), progress=False, overwrite=True)["totals"]["rows_written"] == written
    assert (tmp_path / "out" / "shards" / "tokens" / "tokenizer.json").is_file()
