"""Tokenizers: byte-level default, BPE trained on shards, save/load round trips, the CLI command."""

from __future__ import annotations

import argparse
import pickle

import numpy as np
import pyarrow as pa
import pytest

from tests.train.shards_util import make_docs, write_job
from winnow.train.errors import ConfigError
from winnow.train.tokenizer import ByteTokenizer, load_tokenizer, train_bpe

TEXTS = ["the cat sat on the mat", "", "héllo wörld", "the dog sat on the log"] * 20


def test_byte_tokenizer_ids_are_utf8_bytes_and_specials_follow():
    tok = load_tokenizer(None)
    assert (tok.vocab_size, tok.eos_id, tok.pad_id) == (258, 256, 257)
    ids = tok.encode_batch(["hé", ""])
    assert [a.tolist() for a in ids] == [[104, 195, 169], []] and ids[0].dtype == np.int32
    assert tok.decode(np.array([104, 256, 195, 169, 257])) == "hé"


def test_byte_encode_column_reads_sliced_and_null_arrow_strings():
    arr = pa.array(["zz", "ab", None, "c"]).slice(1)
    flat, lens = ByteTokenizer().encode_column(arr)
    assert flat.tolist() == list(b"abc") and lens.tolist() == [2, 0, 1]


def test_bpe_trains_with_specials_round_trips_and_compresses():
    tok = train_bpe([TEXTS], vocab_size=300, min_frequency=1)
    assert tok.vocab_size <= 300 and {tok.eos_id, tok.pad_id} < set(range(tok.vocab_size))
    ids = tok.encode_batch(["the cat sat on the log", "héllo"])
    assert tok.decode(ids[0]) == "the cat sat on the log" and tok.decode(ids[1]) == "héllo"
    assert len(ids[0]) < len("the cat sat on the log")
    assert tok.encode_batch(["ünseen ✓ text"])[0].size > 0  # byte fallback: nothing is out of vocabulary


def test_bpe_save_load_and_pickle_give_the_same_ids(tmp_path):
    tok = train_bpe([TEXTS], vocab_size=280, min_frequency=1)
    tok.save(tmp_path / "tok")
    for other in (
        load_tokenizer(tmp_path / "tok"),
        load_tokenizer(tmp_path / "tok" / "tokenizer.json"),
        pickle.loads(pickle.dumps(tok)),
    ):
        assert [a.tolist() for a in other.encode_batch(TEXTS[:4])] == [a.tolist() for a in tok.encode_batch(TEXTS[:4])]
        assert other.name == tok.name


def test_byte_tokenizer_saves_and_reloads(tmp_path):
    ByteTokenizer().save(tmp_path)
    assert isinstance(load_tokenizer(tmp_path), ByteTokenizer)


def test_bad_tokenizer_path_and_tiny_vocab_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="tokenizer_meta.json"):
        load_tokenizer(tmp_path)
    with pytest.raises(ConfigError, match="vocab_size"):
        train_bpe([TEXTS], vocab_size=100)
    with pytest.raises(ConfigError, match=r"vocab_size must be at most 16,777,216 .* got 1,099,511,627,776"):
        train_bpe([TEXTS], vocab_size=2**40)  # the BPE trainer aborts the process, asking for terabytes


def test_cli_trains_on_job_shards_and_saves_a_loadable_tokenizer(tmp_path, capsys):
    from winnow.pipelines import tokenizer as command

    folder = write_job(tmp_path / "job", [make_docs(40)[:20], make_docs(40)[20:]])
    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["tokenizer", "train", str(folder), "--vocab-size", "300", "--output", str(tmp_path / "tok")]
    )
    args.quiet = True
    assert args.func(args) == 0
    assert f'[train.tokenizer] table, path = "{tmp_path / "tok"}"' in capsys.readouterr().out  # where the key goes
    tok = load_tokenizer(tmp_path / "tok")
    assert tok.kind == "bpe" and tok.decode(tok.encode_batch(["<web:3>xx"])[0]) == "<web:3>xx"


def test_a_vocabulary_the_texts_cannot_reach_is_warned_and_recorded(tmp_path, caplog):
    """--vocab-size 100000 on a small corpus: BPE runs out of pairs to merge; the sizes asked and reached are said
    and both land in tokenizer_meta.json."""
    import json

    from winnow.pipelines.cli import main

    folder = write_job(tmp_path / "job", [make_docs(40)])
    with caplog.at_level("WARNING"):
        assert (
            main(["-q", "tokenizer", "train", str(folder), "--vocab-size", "100000", "--output", str(tmp_path / "t")])
            == 0
        )
    tok = load_tokenizer(tmp_path / "t")
    assert tok.vocab_size < 100000
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(f"has {tok.vocab_size} tokens, not the 100000 asked" in m and "min_frequency" in m for m in warned)
    meta = json.loads((tmp_path / "t" / "tokenizer_meta.json").read_text())
    assert (meta["vocab_size"], meta["asked_vocab_size"]) == (tok.vocab_size, 100000)
    caplog.clear()
    assert train_bpe([TEXTS], vocab_size=270, min_frequency=1).asked_vocab_size is None  # reached: nothing to say
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_cli_replaces_its_own_tokenizer_but_no_one_elses(tmp_path, capsys):
    """A rerun replaces the folder this command wrote; a folder with a tokenizer.json of another tool, or a
    run folder's tokenizer_meta.json (or one linked to /dev/zero), is refused untouched; shards with no text are refused, not a 258-token BPE."""
    from winnow.pipelines.cli import main

    folder = write_job(tmp_path / "job", [make_docs(40)])
    tok = tmp_path / "tok"
    for _ in range(2):
        assert main(["-q", "tokenizer", "train", str(folder), "--vocab-size", "300", "--output", str(tok)]) == 0
    for name in ("tokenizer.json", "tokenizer_meta.json"):
        mine = tmp_path / f"mine-{name}"
        mine.mkdir()
        (mine / name).write_text('{"the user": 1}')
        (mine / "config.json").write_text("{}")
        assert main(["-q", "tokenizer", "train", str(folder), "--output", str(mine)]) == 2
        assert "winnow does not replace them" in capsys.readouterr().err
        assert (mine / name).read_text() == '{"the user": 1}'
    endless = tmp_path / "endless"  # a meta linked to /dev/zero is refused, not read until memory runs out
    endless.mkdir()
    (endless / "tokenizer_meta.json").symlink_to("/dev/zero")
    assert main(["-q", "tokenizer", "train", str(folder), "--output", str(endless)]) == 2
    assert "winnow does not replace them" in capsys.readouterr().err
    marked = write_job(tmp_path / "marked", [make_docs(10)])
    (marked / ".winnow-output").write_text("{}")  # a curation job's folder, as winnow curate marks it
    for into in (marked, marked / "shards" / "tokens"):
        assert main(["-q", "tokenizer", "train", str(folder), "--output", str(into)]) == 2
        assert "curation job folder" in capsys.readouterr().err
    assert not (marked / "tokenizer.json").exists() and not (marked / "shards" / "tokens").exists()
    empty = write_job(tmp_path / "empty", [[{**d, "text": ""} for d in make_docs(3)]])
    assert main(["-q", "tokenizer", "train", str(empty), "--output", str(tmp_path / "t2")]) == 2
    assert "hold no text" in capsys.readouterr().err


def test_a_tokenizer_that_loses_characters_is_warned_once_and_a_byte_level_one_keeps_every_one(tmp_path, caplog):
    """A tokenizer over a-z and space, without an unknown token or byte fallback, encoded "hello 😀 WORLD ünï" as
    "hello n": the run trained on other text than the shards hold, without a word."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import models, pre_tokenizers

    from winnow.train.build import run_tokenizer
    from winnow.train.config import TrainConfig

    vocab = {c: i for i, c in enumerate(" abcdefghijklmnopqrstuvwxyz")} | {"<|endoftext|>": 27}
    tok = RustTokenizer(models.BPE(vocab, merges=[], unk_token=None))  # unknown characters are dropped
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="isolated")
    tok.save(str(tmp_path / "tokenizer.json"))
    lossy = load_tokenizer(tmp_path / "tokenizer.json")
    assert {"Q", "é", "😀", "漢"} <= set(lossy.lost_characters()) and "h" not in lossy.lost_characters()
    assert train_bpe([["some words of text"] * 50], vocab_size=300).lost_characters() == []
    job = write_job(tmp_path / "job", [make_docs(4)])
    cfg = TrainConfig(output=str(tmp_path / "run"), tokenizer=str(tmp_path / "tokenizer.json"))
    for _ in range(2):
        run_tokenizer(cfg, str(job))
    said = [r for r in caplog.records if "does not give back what it encodes" in r.getMessage()]
    assert len(said) == 1 and "encodes: 'T' 'Q' 'B' 'F' ','" in said[0].getMessage()


def test_a_save_that_fails_midway_leaves_the_earlier_tokenizer_and_a_torn_pair_is_named(tmp_path, monkeypatch, capsys):
    """The files were written in place: a full disk cut tokenizer.json short (the earlier tokenizer lost) and a
    killed save left an empty tokenizer_meta.json that both `winnow train` and a new save refused."""
    import os

    from winnow.pipelines.cli import main

    folder = write_job(tmp_path / "job", [make_docs(40)])
    tok = tmp_path / "tok"
    assert main(["-q", "tokenizer", "train", str(folder), "--vocab-size", "300", "--output", str(tok)]) == 0
    before = {p.name: p.read_bytes() for p in tok.iterdir()}
    real_replace = os.replace

    def disk_full_at_the_meta(src, dst):
        if str(dst).endswith("tokenizer_meta.json"):
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", disk_full_at_the_meta)
    assert main(["-q", "tokenizer", "train", str(folder), "--vocab-size", "270", "--output", str(tok)]) == 2
    assert (
        f"writing {tok / 'tokenizer_meta.json'}: no space left on the device holding {tok}" in capsys.readouterr().err
    )
    monkeypatch.setattr(os, "replace", real_replace)
    assert sorted(p.name for p in tok.iterdir()) == sorted(before)  # no temporary file left
    assert (tok / "tokenizer_meta.json").read_bytes() == before["tokenizer_meta.json"]
    with pytest.raises(ConfigError, match="is not the tokenizer tokenizer_meta.json beside it describes"):
        load_tokenizer(tok)  # the new tokenizer.json beside the earlier meta: a torn pair, named
    (tok / ".tokenizer.json.tmp-4242").write_text("{")  # what a killed save leaves
    assert main(["-q", "tokenizer", "train", str(folder), "--vocab-size", "300", "--output", str(tok)]) == 0
    assert {p.name: p.read_bytes() for p in tok.iterdir()} == before and load_tokenizer(tok).vocab_size > 270


def test_cli_says_what_it_reads_when_the_folder_is_missing_or_holds_no_parquet(tmp_path, capsys):
    """It advised setting train.data.format, a key this command does not read (the Parquet error was lost to a
    WebDataset fallback); a job whose manifest lists tar shards only is still read from them."""
    import json

    from winnow.pipelines.cli import main

    saved = tmp_path / "saved"  # a `datasets` save_to_disk folder: Arrow files, no Parquet
    (saved / "train").mkdir(parents=True)
    (saved / "dataset_dict.json").write_text('{"splits": ["train"]}')
    (saved / "train" / "data-00000-of-00001.arrow").write_bytes(b"arrow")
    for data, said in ((tmp_path / "nosuch", "nosuch: no such folder; give a job file"), (saved, "no Parquet files")):
        assert main(["-q", "tokenizer", "train", str(data), "--output", str(tmp_path / "tok")]) == 2
        err = capsys.readouterr().err
        assert said in err and 'format = "hf"' in err and "train.data" not in err, err
    job = write_job(tmp_path / "job", [make_docs(40)])
    manifest = json.loads((job / "manifest.json").read_text())
    manifest["shards"] = [e for e in manifest["shards"] if e["format"] == "webdataset"]
    (job / "manifest.json").write_text(json.dumps(manifest))
    assert main(["-q", "tokenizer", "train", str(job), "--vocab-size", "300", "--output", str(tmp_path / "tok")]) == 0
    assert "webdataset shard(s)" in capsys.readouterr().out
