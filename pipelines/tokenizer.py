"""``winnow tokenizer train JOB_OR_SHARDS_DIR``: train a BPE tokenizer on a job's training shards."""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Iterator
from pathlib import Path

from winnow.curate.progress import PhaseProgress
from winnow.curate.workdir import local_output
from winnow.train.data.shards import ShardSet, open_shards, read_shard
from winnow.train.data.tokenshards import read_manifest
from winnow.train.errors import ConfigError, ShardError
from winnow.train.paths import JSON_BYTES, read_capped, replace_leftover
from winnow.train.tokenizer import BPE_FILE, META_FILE, train_bpe

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tokenizer", help="tokenizer tools")
    tsub = p.add_subparsers(dest="tokenizer_command", required=True, metavar="ACTION")
    t = tsub.add_parser("train", help="train a byte-level BPE on a job's training shards")
    t.add_argument("data", help="a job file (TOML) or a job output folder holding manifest.json (local or s3://)")
    t.add_argument(
        "--vocab-size", type=int, default=8192, help="vocabulary size, special tokens included (default 8192)"
    )
    t.add_argument("--output", required=True, help="a local folder to write tokenizer.json and tokenizer_meta.json to")
    t.add_argument("--split", default="train", help="which split's shards to read (default train)")
    t.add_argument("--max-docs", type=_positive, default=None, help="train on at most this many documents")
    t.set_defaults(func=run)


def _positive(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number of documents")
    return n


def _check_output(out: Path) -> None:
    """Refuse an ``--output`` that is a file, or a folder holding tokenizer files another tool or a winnow run wrote.

    A folder of a tokenizer this command trained (its two files and nothing else) is replaced.
    """
    if out.exists() and not out.is_dir() or any(p.is_file() for p in out.parents if p != Path(".")):
        raise ConfigError(f"--output {out} is a file or lies under one; give a folder for the tokenizer")
    from winnow.curate.outdir import MARKER

    job = next((p for p in (out, *out.resolve().parents) if (p / MARKER).is_file()), None)
    if job is not None:  # its files are the job's: a re-run of the job clears what it does not list
        raise ConfigError(
            f"--output {out} is {'a curation job folder' if job == out else f'inside the curation job folder {job}'}; "
            "give the tokenizer a folder of its own (e.g. beside the job's)"
        )
    ours = {BPE_FILE, META_FILE}
    found = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    # a save killed before its renames left its temporary files: removed
    leftovers = [name for name in found if replace_leftover(name, ours)]
    entries = [name for name in found if name not in leftovers]
    if not ours & set(entries):
        _remove(out, leftovers)
        return
    import fsspec

    try:  # capped: a meta linked to /dev/zero is not an endless read
        raw = read_capped(fsspec.filesystem("file"), str(out / META_FILE), limit=JSON_BYTES, what="", error=ValueError)
        meta = json.loads(raw)
    except (OSError, ValueError):
        meta = None
    if set(entries) <= ours and isinstance(meta, dict) and meta.get("kind") == "bpe":
        _remove(out, leftovers)
        return
    raise ConfigError(
        f"--output {out} already holds {' and '.join(sorted(ours & set(entries)))}, not of a tokenizer this command "
        "trained alone (a run folder, or another tool's tokenizer): winnow does not replace them; give a new folder"
    )


def _remove(folder: Path, names: list[str]) -> None:
    for name in names:
        (folder / name).unlink(missing_ok=True)


def job_folder(data: str) -> str:
    """The job output folder of ``data``: itself, or the ``[job] output`` of a job file."""
    if data.endswith(".toml"):
        from winnow.pipelines.jobfile import load_job

        return load_job(data).job.output
    return data


def open_any_format(folder: str, split: str) -> tuple[ShardSet, str]:
    """The split's shards: Parquet, or WebDataset where the job's manifest lists tar shards only for it. A folder
    without a manifest is read as Parquet files."""
    fs, root, manifest = read_manifest(folder)
    if not manifest:
        if not fs.isdir(root):
            raise ConfigError(f"{folder}: no such folder; {_READS}")
        try:
            return open_shards(folder, split=split, fmt="parquet"), "parquet"
        except ShardError as err:  # the shards' own message (a train key's advice is no use to this command)
            raise ShardError(f"{err}; {_READS}") from None
    listed = {e.get("format") for e in manifest.get("shards") or [] if e.get("split", "train") == split}
    fmt = "webdataset" if "webdataset" in listed and "parquet" not in listed else "parquet"
    return open_shards(folder, split=split, fmt=fmt), fmt


_READS = (
    "give a job file (TOML), a job folder `winnow curate` wrote (it holds manifest.json), or a folder of Parquet "
    "files with a 'text' column; curate other data first (a `datasets` save_to_disk folder is an [[inputs]] "
    'format = "hf")'
)


def shard_texts(
    shards: ShardSet, fmt: str, *, max_docs: int | None, progress: bool = True, batch_rows: int = 1000
) -> Iterator[list[str]]:
    """Batches of texts of every shard in manifest order, up to ``max_docs`` documents."""
    left = max_docs if max_docs is not None else 1 << 62
    with PhaseProgress("tokenizer: read shards", len(shards.shards), enabled=progress, unit="shard") as bar:
        for index in range(len(shards.shards)):
            text = read_shard(shards, index, fmt=fmt, verify=True).column("text")
            text = text.slice(0, min(left, len(text)))
            for lo in range(0, len(text), batch_rows):
                yield [t for t in text.slice(lo, batch_rows).to_pylist() if t]
            left -= len(text)
            bar.update()
            if left <= 0:
                return


def run(args: argparse.Namespace) -> int:
    args.output = local_output(args.output, "--output")
    _check_output(args.output)
    folder = job_folder(args.data)
    shards, fmt = open_any_format(folder, args.split)
    seen = 0

    def counted(batches: Iterator[list[str]]) -> Iterator[list[str]]:
        nonlocal seen
        for batch in batches:
            seen += len(batch)
            yield batch

    tok = train_bpe(
        counted(shard_texts(shards, fmt, max_docs=args.max_docs, progress=not args.quiet)), vocab_size=args.vocab_size
    )
    if not seen:
        raise ConfigError(
            f"the {args.split} shards of {folder} hold no text to train a tokenizer on; curate text into them first"
        )
    out = tok.save(args.output)
    print(f"tokenizer: {tok.name} trained on {len(shards.shards)} {fmt} shard(s) of {folder}")
    print(f"saved to:  {out}")
    print(f"train with it: in the job file's [train.tokenizer] table, path = {json.dumps(str(out))}")
    return 0
