"""Bad token shards and tokenizers: a clear error naming the file (or skipped and counted)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from tests.train.shards_util import make_docs, write_token_job
from winnow.train.data import Loader, LoaderConfig
from winnow.train.errors import ConfigError, ShardError
from winnow.train.tokenizer import TokenizerConfig, load_tokenizer


@pytest.fixture
def job(tmp_path):
    docs = make_docs(30)
    return write_token_job(tmp_path / "job", [docs[:10], docs[10:20], docs[20:]])


def cfg(**kw) -> LoaderConfig:
    return LoaderConfig(**{"batch_size": 2, "seq_len": 16, "num_workers": 0, "format": "tokens", **kw})


def shard_file(job: Path, index: int, suffix: str) -> Path:
    entries = [e for e in json.loads((job / "manifest.json").read_text())["shards"] if e["format"] == "tokens"]
    return job / entries[index]["path"].replace(".bin", suffix)


def truncate(path: Path, n: int = 6) -> None:
    path.write_bytes(path.read_bytes()[:-n])


def drain(loader, n=200):
    return [next(loader) for _ in range(n)]


def test_a_truncated_bin_names_the_file_and_the_sizes(job):
    path = shard_file(job, 1, ".bin")
    truncate(path)
    with pytest.raises(ShardError, match=rf"{path.name}: \d+ bytes where .*manifest.json says \d+ \(cut short"):
        Loader(cfg(), job)  # when the shards open, before the first batch
    manifest = json.loads((job / "manifest.json").read_text())
    for entry in manifest["shards"]:
        entry.pop("bytes", None)  # a manifest without sizes: the index finds it when the shard is read
    (job / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match=rf"{path.name}: \d+ bytes, its index says \d+ tokens of uint16"):
        drain(Loader(cfg(), job))


def test_a_skipped_bad_shard_is_counted_and_the_rest_is_read(job):
    path = shard_file(job, 1, ".bin")
    truncate(path)
    loader = Loader(cfg(skip_bad_shards=True), job)
    drain(loader, 100)
    assert loader.stats()["bad_shards"] >= 1


def test_a_changed_byte_is_a_checksum_mismatch_when_verifying(job):
    path = shard_file(job, 0, ".bin")
    data = bytearray(path.read_bytes())
    data[2] ^= 1  # the low byte of a uint16 id: still an id of the vocabulary
    path.write_bytes(bytes(data))
    with pytest.raises(ShardError, match=rf"{path.name}: checksum mismatch"):
        drain(Loader(cfg(), job))
    drain(Loader(cfg(verify_checksums=False), job), 20)  # same size: only the checksum can tell


def test_an_index_that_disagrees_with_the_manifest(job):
    path = shard_file(job, 2, ".idx")
    truncate(path, 8)
    with pytest.raises(ShardError, match=rf"{path.name}"):
        drain(Loader(cfg(), job))


def test_a_missing_index_names_it(job):
    path = shard_file(job, 0, ".idx")
    path.unlink()
    with pytest.raises(ShardError, match=rf"{path.name}: missing"):
        drain(Loader(cfg(), job))


def test_a_dtype_too_small_for_the_vocabulary(job):
    # rewrite shard 0 consistently as uint8: every file and the manifest agree, but 258 ids do not fit
    manifest_path = job / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    entry = [e for e in manifest["shards"] if e["format"] == "tokens"][0]
    bin_path, idx_path = job / entry["path"], shard_file(job, 0, ".idx")
    ids = np.fromfile(bin_path, np.uint16).astype(np.uint8)
    ids.tofile(bin_path)
    idx = bytearray(idx_path.read_bytes())
    idx[17] = 1  # the dtype code: uint8
    n = int.from_bytes(idx[18:26], "little")
    sizes = np.frombuffer(bytes(idx), np.int32, n, 34)
    idx[34 + 4 * n : 34 + 12 * n] = (np.concatenate([[0], np.cumsum(sizes[:-1])]).astype(np.int64)).tobytes()
    idx_path.write_bytes(bytes(idx))
    entry.update(
        dtype="uint8",
        sha256=hashlib.sha256(bin_path.read_bytes()).hexdigest(),
        bytes=bin_path.stat().st_size,
        index_sha256=hashlib.sha256(bytes(idx)).hexdigest(),
    )
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match=rf"{bin_path.stem}\.idx: dtype uint8 cannot hold the tokenizer's 258 ids"):
        drain(Loader(cfg(), job))


def test_shards_from_another_tokenizer_are_refused_or_read_as_text(job, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(
        [["abc abd " * 20]],
        trainers.BpeTrainer(
            vocab_size=280,
            special_tokens=["</s>"],
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tok.save(str(tmp_path / "tokenizer.json"))
    other = load_tokenizer(TokenizerConfig(path=str(tmp_path / "tokenizer.json")))
    with pytest.raises(ConfigError, match="written with tokenizer .*'kind': 'byte'"):
        Loader(cfg(), job, tokenizer=other)
    auto = Loader(cfg(format="auto"), job, tokenizer=other)  # falls back to tokenizing the Parquet shards
    assert type(auto._sets[0]).__name__ == "SetStream" and next(auto).tokens.max() < other.vocab_size


def test_no_token_shards_with_format_tokens(tmp_path):
    from tests.train.shards_util import write_job

    folder = write_job(tmp_path, [make_docs(5)])
    with pytest.raises(ShardError, match="lists no 'tokens' shards"):
        Loader(cfg(), folder)
    assert type(Loader(cfg(format="auto"), folder)._sets[0]).__name__ == "SetStream"


@pytest.mark.parametrize("content", [None, "{broken", '{"model": {"type": "Nope"}}'])
def test_a_tokenizer_file_that_cannot_load_names_path_and_key(tmp_path, content):
    path = tmp_path / "sub" / "tokenizer.json"
    if content is not None:
        path.parent.mkdir()
        path.write_text(content)
    with pytest.raises(ConfigError, match=r"train\.tokenizer\.path = .*sub"):
        load_tokenizer(TokenizerConfig(path=str(path.parent if content is None else path)))


def test_a_token_id_past_the_vocabulary_names_the_shard_the_id_and_its_document(job):
    """An id >= the tokenizer's vocabulary would index past the embedding (a device-side assert on a GPU)."""
    entry = [e for e in json.loads((job / "manifest.json").read_text())["shards"] if e["format"] == "tokens"][1]
    assert 0 <= entry["max_id"] < 258  # the writer records the largest id it wrote
    path = shard_file(job, 1, ".bin")
    ids = np.fromfile(path, np.uint16)
    ids[5] = 300  # the byte tokenizer has 258 ids; uint16 holds this one
    ids.tofile(path)
    with pytest.raises(
        ShardError,
        match=rf"{path.name}: token id 300 at token 5 \(document 0, row \d+ of .*\) is "
        r"outside this run's tokenizer's 258 ids",
    ):
        drain(Loader(cfg(verify_checksums=False), job))


def test_a_document_without_its_end_of_document_token_names_the_shard_and_the_document(job):
    """Megatron's preprocess_data.py writes no end-of-document token without --append-eod; the stream puts that
    token between documents in the last one's place, so such documents would run together, each a token short."""
    path, idx = shard_file(job, 1, ".bin"), shard_file(job, 1, ".idx")
    ids = np.fromfile(path, np.uint16)
    n = int.from_bytes(idx.read_bytes()[18:26], "little")
    sizes = np.frombuffer(idx.read_bytes(), np.int32, n, 34)
    assert (ids[np.cumsum(sizes) - 1] == 256).all()  # every document ends with the byte tokenizer's EOS
    ids[sizes[0] + sizes[1] - 1] = ord("x")  # document 1's
    ids.tofile(path)
    with pytest.raises(ShardError, match=rf"{path.name}: document 1 \(row \d+ of .*\) does not end with the "
                                         r"end-of-document token 256.*--append-eod"):  # fmt: skip
        drain(Loader(cfg(verify_checksums=False), job))


def test_a_float_dtype_is_refused_naming_the_index(job):
    idx_path = shard_file(job, 0, ".idx")
    idx = bytearray(idx_path.read_bytes())
    idx[17] = 7  # float32 (the index's own checksum follows, as a writer of float shards would record it)
    idx_path.write_bytes(bytes(idx))
    manifest = json.loads((job / "manifest.json").read_text())
    [e for e in manifest["shards"] if e["format"] == "tokens"][0]["index_sha256"] = hashlib.sha256(idx).hexdigest()
    (job / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match=rf"{idx_path.name}: its tokens are float32 \(dtype code 7\)"):
        drain(Loader(cfg(verify_checksums=False), job))


def test_a_token_shard_listed_twice_under_two_spellings_is_refused(job):
    manifest = json.loads((job / "manifest.json").read_text())
    entry = [e for e in manifest["shards"] if e["format"] == "tokens"][0]
    manifest["shards"].append({**entry, "path": entry["path"].replace("/train/", "/train/./")})
    (job / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match=rf"lists the token shard {entry['path']} twice"):
        Loader(cfg(), job)


@pytest.mark.parametrize("damage", ["cut", "no_index"])
@pytest.mark.parametrize("split", ["train", "val"])
def test_check_refuses_the_damaged_token_shards_training_refuses(tmp_path, damage, split):
    """``winnow check`` read the manifest alone and said ok to a cut ``.bin`` or a missing ``.idx`` that training
    refuses at once; a damaged held-out shard was a warning, training going on without its held-out losses."""
    from winnow.train.config import TrainConfig
    from winnow.train.heldout import check_data

    docs = make_docs(30)
    job = write_token_job(tmp_path / "job", [docs[:20]], val=[docs[20:]])
    entries = json.loads((job / "manifest.json").read_text())["shards"]
    path = next(job / e["path"] for e in entries if e["format"] == "tokens" and e["split"] == split)
    if damage == "cut":
        truncate(path, 2)
    else:
        path.with_suffix(".idx").unlink()
    run = TrainConfig(output=str(tmp_path / "run"), shards=str(job), data=cfg())
    with pytest.raises(ShardError, match=path.name.replace(".bin", "") if damage == "cut" else r"\.idx"):
        check_data(run)
