"""The pre-tokenized peers of ``bench/loader.py``: litdata and MosaicML streaming, fed winnow's token ids.

Both are prepared once per data folder from the token shards curate wrote (the same ids the
token-shard loader reads), the way their own docs prepare pretraining data:

* litdata: ``litdata.optimize`` with one generator call per token shard yielding each document's
  ids (int16, as many bytes per token as winnow's uint16), ``TokensLoader`` chunks; read with
  ``StreamingDataset(item_loader=TokensLoader(block_size=T + 1))`` and ``StreamingDataLoader``.
* MosaicML streaming: the token stream cut into ``T + 1`` windows (llm-foundry's concat-tokens
  recipe) in MDS shards of ``ndarray:uint16``; read with ``StreamingDataset`` and a ``DataLoader``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import shutil
import struct
import sys
import types
from pathlib import Path

import numpy as np
import torch


def token_docs(bin_path: str):
    """Each document's ids of one Megatron ``.bin``/``.idx`` pair (read as its format defines it)."""
    idx = Path(bin_path[: -len(".bin")] + ".idx").read_bytes()
    n = struct.unpack_from("<Q", idx, 18)[0]
    sizes = np.frombuffer(idx, np.int32, n, 34)
    ids = np.fromfile(bin_path, np.uint16).astype(np.int16)  # byte-level ids < 258 fit
    for doc in np.split(ids, np.cumsum(sizes)[:-1]):
        yield torch.from_numpy(doc)


def token_bins(folder: Path) -> list[str]:
    manifest = json.loads((folder / "manifest.json").read_text())
    return [str(folder / s["path"]) for s in manifest["shards"] if s["format"] == "tokens" and s["split"] == "train"]


# -- litdata --------------------------------------------------------------------------------------
def prepare_litdata(folder: Path, seq_len: int) -> Path | None:
    if importlib.util.find_spec("litdata") is None:
        return None
    out = folder.parent / f"{folder.name}-litdata-{seq_len}"
    if not (out / "index.json").exists():
        from litdata import TokensLoader, optimize

        shutil.rmtree(out, ignore_errors=True)
        optimize(
            fn=token_docs,
            inputs=token_bins(folder),
            output_dir=str(out),
            chunk_size=(seq_len + 1) * 512,
            item_loader=TokensLoader(),
            num_workers=1,
            reorder_files=False,
            verbose=False,
        )
    return out


def make_litdata(data: Path, args):
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

    ds = StreamingDataset(
        str(data), item_loader=TokensLoader(block_size=args.seq_len + 1), shuffle=False, drop_last=True
    )
    return iter(StreamingDataLoader(ds, batch_size=args.batch_size, num_workers=args.workers))


# -- MosaicML streaming ---------------------------------------------------------------------------
class _Stub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Empty ``transformers`` / ``torchvision`` modules: streaming imports them for datasets not used here."""

    def __init__(self, names):
        self.names = names

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = types.ModuleType(spec.name)
        mod.__path__ = []

        def attr(name):
            if name.startswith("__"):
                raise AttributeError(name)
            return type(name, (), {})

        mod.__getattr__ = attr
        return mod

    def exec_module(self, module):
        pass


def import_streaming():
    if importlib.util.find_spec("streaming") is None:
        return None
    missing = [n for n in ("transformers", "torchvision") if importlib.util.find_spec(n) is None]
    if missing:
        sys.meta_path.insert(0, _Stub(missing))
    import streaming

    return streaming


def prepare_mds(folder: Path, seq_len: int) -> Path | None:
    streaming = import_streaming()
    if streaming is None:
        return None
    out = folder.parent / f"{folder.name}-mds-{seq_len}"
    if not (out / "index.json").exists():
        shutil.rmtree(out, ignore_errors=True)
        stream = np.concatenate([np.fromfile(b, np.uint16) for b in token_bins(folder)])
        n = len(stream) // (seq_len + 1)
        windows = stream[: n * (seq_len + 1)].reshape(n, seq_len + 1)
        with streaming.MDSWriter(
            out=str(out), columns={"tokens": f"ndarray:uint16:{seq_len + 1}"}, size_limit=1 << 26
        ) as writer:
            for w in windows:
                writer.write({"tokens": w})
    return out


def _collate_tokens(samples):
    return torch.from_numpy(np.stack([x["tokens"] for x in samples]).astype(np.int64))


def make_mds(data: Path, args):
    streaming = import_streaming()
    streaming.base.util.clean_stale_shared_memory()
    ds = streaming.StreamingDataset(local=str(data), shuffle=False, batch_size=args.batch_size)
    loader = torch.utils.data.DataLoader(
        ds,
        batch_size=args.batch_size,
        num_workers=args.workers,
        collate_fn=_collate_tokens,
        multiprocessing_context="fork" if args.workers else None,
    )
    return iter(loader)
