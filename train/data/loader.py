"""The prefetching loader: shards of job folders to packed ``Batch``es, resumable and elastic.

The *global order* is the documents of each shard set in manifest (curriculum) order,
tokenized into one stream per set and cut into sequences step by step (see ``packing``);
with several sets, ``mixing`` decides which set each global sequence comes from. Global
sequence ``i`` of a step goes to rank ``i % world_size``; every rank reads every stream, so
the order depends only on the data, the seed, the weights and the sequence lengths, never on
the number of ranks or workers. The state is each stream's position ``(epoch, shard,
offset)``, the mixing counts and the step: the same on every rank, so a run resumed with any
number of ranks or workers continues the same global order.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

import numpy as np
import torch

from winnow.train.data.batch import Batch
from winnow.train.data.config import LoaderConfig
from winnow.train.data.mixing import MixSchedule
from winnow.train.data.packing import SourceIds
from winnow.train.data.shards import open_shards
from winnow.train.data.stream import SetStream
from winnow.train.data.tokenshards import open_token_shards
from winnow.train.data.tokenstream import TokenStream
from winnow.train.errors import CheckpointError, ConfigError, ShardError
from winnow.train.tokenizer import ByteTokenizer, Tokenizer

log = logging.getLogger(__name__)
STATE_VERSION = 1
_KEYS = ("tokens", "targets", "source_ids", "loss_mask", "doc_ids", "origin_shard", "origin_row")
_SAID: set[str] = set()  # the warnings this process has given about a folder's token shards


class Loader:
    """Iterate to get this rank's ``Batch``es: forever over epochs for ``train``, one pass for ``val``.

    ``data`` is a job output folder (local path or fsspec URL) or, for load-time mixing of the
    ``train`` split, a list of them weighted by ``config.mix_weights``.
    """

    def __init__(
        self,
        config: LoaderConfig,
        data: str | Path | list[str | Path],
        *,
        split: str = "train",
        tokenizer: Tokenizer | None = None,
        rank: int = 0,
        world_size: int = 1,
        sources: list[str] | None = None,
    ) -> None:
        if not (isinstance(world_size, int) and world_size >= 1 and 0 <= rank < world_size):
            raise ConfigError(
                f"rank={rank!r}, world_size={world_size!r} is invalid; need world_size >= 1 and 0 <= rank < world_size"
            )
        folders = [data] if isinstance(data, (str, Path)) else list(data)
        if split != "train" and len(folders) > 1:
            raise ConfigError(f"split {split!r}: load-time mixing is for the train split; load each val set on its own")
        weights = config.mix_weights or [1.0] * len(folders)
        if len(weights) != len(folders):
            raise ConfigError(
                f"train.data.mix_weights = {config.mix_weights!r} is invalid; allowed: one weight per data set ({len(folders)})"
            )
        self.config, self.split, self.rank, self.world_size = config, split, rank, world_size
        self.tokenizer = tokenizer or ByteTokenizer()
        self._ids = SourceIds(sources)
        self._sets: list[SetStream | TokenStream] = [self._open_set(str(folder), split) for folder in folders]
        self._warn_shared_sources(folders)
        self._mix = MixSchedule(weights)
        self._pin = torch.cuda.is_available() if config.pin_memory is None else config.pin_memory
        self._step = 0
        self.wait_seconds = 0.0
        self._counters = {"batches": 0, "tokens": 0, "wait_seconds": 0.0}

    def _warn_shared_sources(self, folders: list) -> None:
        """Say so when two data sets hold a source of one name: their rows count as one source from then on."""
        seen: dict[str, str] = {}
        for folder, names in zip(folders, self.set_sources, strict=True):
            for name in names:
                if seen.setdefault(name, str(folder)) != str(folder) and self.rank == 0:
                    log.warning(
                        "data sets %s and %s both hold a source named %r: its losses, counts and attribution are "
                        "one source's; name one differently ([[inputs]] source) to tell them apart",
                        seen[name],
                        folder,
                        name,
                    )

    def _open_set(self, folder: str, split: str) -> SetStream | TokenStream:
        """Token shards when the folder has them (``format`` "auto" or "tokens"), else text shards tokenized on the fly."""
        cfg, finite = self.config, split != "train"
        missing = "warn" if cfg.skip_bad_shards else "raise"  # a listed shard that is not there: now, not when reached
        if cfg.format in ("auto", "tokens"):
            try:
                tokens = open_token_shards(
                    folder,
                    split=split,
                    tokenizer=self.tokenizer.describe(),
                    storage_options=cfg.storage_options,
                    missing=missing,
                )
            except ConfigError as err:
                if cfg.format == "tokens":
                    raise
                if str(err) not in _SAID:  # held-out loaders are made again for every evaluation: said once
                    _SAID.add(str(err))
                    log.warning("%s; reading the Parquet shards and tokenizing on the fly instead", err)
                tokens = None
            if tokens is not None:
                self._ids.extend(tokens.sources)
                return TokenStream(tokens, config=cfg, tokenizer=self.tokenizer, ids=self._ids, finite=finite)
            if cfg.format == "tokens":
                raise ShardError(
                    f"{folder}/manifest.json lists no 'tokens' shards for split {split!r}; curate with "
                    '[output] formats = [..., "tokens"] or set train.data.format = "parquet"'
                )
        text_cfg = cfg if cfg.format in ("parquet", "webdataset") else dataclasses.replace(cfg, format="parquet")
        shards = open_shards(
            folder, split=split, fmt=text_cfg.format, storage_options=cfg.storage_options, missing=missing
        )
        self._ids.extend(shards.sources)
        return SetStream(shards, config=text_cfg, tokenizer=self.tokenizer, ids=self._ids, finite=finite)

    @property
    def sources(self) -> list[str]:
        """Source id -> name; names first seen in the data are appended, so ids never change."""
        return list(self._ids.names)

    @property
    def views(self) -> list[dict | None]:
        """Per data set: the view made of a folder without manifest.json (``foreign.folder_view``), else None."""
        return [stream.shards.view for stream in self._sets]

    @property
    def fingerprints(self) -> list[str]:
        """Per data set: the fingerprint of the shards it reads (``shards.shard_digest``, or its view's)."""
        return [stream.shards.fingerprint for stream in self._sets]

    @property
    def set_sources(self) -> list[list[str]]:
        """The sources each training set holds, in set order."""
        return [list(stream.shards.sources) for stream in self._sets]

    @property
    def mix_weights(self) -> list[float]:
        return self._mix.weights.tolist()

    def reweight(self, weights: list[float]) -> None:
        """Draw the sequences of the next steps by ``weights``, one per set (adaptive mixing; same on every rank)."""
        self._mix.reweight(weights)

    @property
    def epoch(self) -> int:
        """Completed passes over the training set passed over most (a small set mixed with a large one repeats first)."""
        return max(stream.position[0] for stream in self._sets)

    @property
    def most_repeated(self) -> str:
        """The training set ``epoch`` counts, in words: its folder and its sources."""
        stream = max(self._sets, key=lambda s: s.position[0])  # of equals, the first
        return f"{stream.shards.root} (sources: {', '.join(stream.shards.sources) or 'none'})"

    def __iter__(self) -> Loader:
        return self

    def __next__(self) -> Batch:
        t0 = time.perf_counter()
        cfg = self.config
        seq_len, n_seqs = cfg.seq_len_at(self._step), cfg.batch_size * self.world_size
        assigned = self._mix.assign(n_seqs)  # set of each global sequence of this step
        parts, order = [], []
        for s, stream in enumerate(self._sets):
            members = np.flatnonzero(assigned == s)
            if not len(members):
                continue
            if not stream.fill(seq_len, len(members)):
                self._end_of_pass()
                raise StopIteration
            local = np.flatnonzero(
                members % self.world_size == self.rank
            )  # which of the set's sequences are this rank's
            parts.append((s, stream.take(seq_len, len(members), local, boundary=cfg.boundary_mask)))
            order.append(members[local])
        self._mix.advance(assigned)
        self._step += 1
        if len(parts) == 1:  # one set: its rows are already in this rank's order
            arrays, set_of_row = parts[0][1], np.full(cfg.batch_size, parts[0][0])
        else:
            rank_order = np.argsort(np.concatenate(order), kind="stable")
            arrays = {k: np.concatenate([a[k] for _, a in parts])[rank_order] for k in _KEYS}
            set_of_row = np.concatenate([np.full(len(a["tokens"]), s) for s, a in parts])[rank_order]
        origins = [
            self._origin(int(s), int(k), int(r))
            for s, k, r in zip(set_of_row, arrays["origin_shard"], arrays["origin_row"])
        ]
        batch = Batch.from_numpy(arrays, origins, pin=self._pin)
        self.wait_seconds = time.perf_counter() - t0
        self._counters["batches"] += 1
        self._counters["tokens"] += int(arrays["loss_mask"].sum())
        self._counters["wait_seconds"] += self.wait_seconds
        return batch

    def _origin(self, s: int, shard: int, row: int) -> tuple[str, int]:
        if shard < 0:
            return "", -1
        path = self._sets[s].shards.shards[shard].path
        return (path if len(self._sets) == 1 else f"{self._sets[s].shards.root}/{path}"), row

    def _end_of_pass(self) -> None:
        """A finite pass is over: the next iteration starts a fresh one."""
        self.close()
        for stream in self._sets:
            stream.position = (0, 0, 0)
        self._mix = MixSchedule(list(self._mix.weights))
        self._step = 0

    def state_dict(self) -> dict:
        """Position of the next global step (identical on every rank; save it from any one)."""
        return {
            "version": STATE_VERSION,
            "epoch": self.epoch,
            "step": self._step,
            "sets": [dict(zip(("epoch", "shard", "offset"), s.position)) for s in self._sets],
            "mix": self._mix.state_dict(),
            "sources": self.sources,
            "data": self.fingerprints,
            "tokenizer": self.tokenizer.name,
            "split": self.split,
            "stats": self.stats(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``'s position; the next batch is the one the saved run would have yielded."""
        if state.get("version") != STATE_VERSION:
            raise CheckpointError(f"loader state version {state.get('version')!r} is not {STATE_VERSION}")
        for key, mine in (("data", self.fingerprints), ("tokenizer", self.tokenizer.name)):
            if state.get(key) != mine:
                saved = state.get(key)
                if key == "data" and isinstance(saved, list) and len(saved) == len(mine):  # name the set that moved
                    what = "; ".join(
                        f"the shards of {stream.shards.root} are not the ones the run trained on (fingerprint {was}, "
                        f"now {now})"
                        for stream, was, now in zip(self._sets, saved, mine)
                        if was != now
                    )
                else:
                    what = f"loader state was saved with {key} {saved!r}, this run has {mine!r}"
                raise CheckpointError(
                    f"{what}; "
                    "resume needs the same shards and tokenizer (re-curated shards, or another tokenizer, are other "
                    "data): give the run the ones it was trained on, or start a run of its own with a new "
                    "train.output or [train.checkpoint] resume = false (the earlier run is moved to previous-<k>/)"
                )
        self.close()
        for stream, pos in zip(self._sets, state["sets"]):
            stream.position = (int(pos["epoch"]), int(pos["shard"]), int(pos["offset"]))
        self._mix.load_state_dict(state["mix"])
        self._step = int(state["step"])
        self._ids.restore(state["sources"])
        saved = state.get("stats", {})
        self._counters.update({k: saved[k] for k in self._counters if k in saved})

    def stats(self) -> dict:
        """Counters for the metrics: batches, loss tokens, bad shards skipped, total wait seconds, epoch, step.

        Plus this process's data-path work since it started: ``tokens_read`` and ``bytes_read`` (ids read
        from token shards, or every shard's bytes for text shards), ``bytes_hashed`` (checksums) and
        ``tokens_tokenized`` (text tokenized on the fly, in this rank's workers).
        """
        io = {
            k: sum(s.counters[k] for s in self._sets)
            for k in ("tokens_read", "bytes_read", "bytes_hashed", "tokens_tokenized")
        }
        return {
            **self._counters,
            "bad_shards": sum(s.bad_shards for s in self._sets),
            "epoch": self.epoch,
            "step": self._step,
            **io,
        }

    def close(self) -> None:
        """Stop the worker processes (iteration restarts them from the current position)."""
        for stream in self._sets:
            stream.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown; nothing left to report to
            pass
