"""Splitting one large input file into read tasks of about ``[job] task_bytes`` each.

Every split is decided from the file as stored, at plan time, so a task is a pure
function of the file and ``task_bytes``, and every record belongs to exactly one task:

- JSON Lines, uncompressed: byte ranges ``[a, b)``. A range after the first skips through
  the first newline at or after ``a`` and reads through the first newline at or after
  ``b``, so it owns the bytes between those two newlines: whole lines, each exactly once,
  found without reading the byte before ``a``. A file whose first bytes are a compressed
  format's (its name says plain) is one task, which its reader refuses (``files.refuse_compressed``).
- JSON Lines in a multi-frame zstd file: ranges of whole frames, when every frame's header
  records its decompressed size (``zstd`` writes it whenever it knows the input's size), so
  each range knows the uncompressed offset it starts at; the line rule above then applies
  in uncompressed bytes, reading on into the next frames for the last line. A frame
  without its size, gzip, bz2 and xz streams cannot be split: such a file is one task.
- Parquet: ranges of row groups (the rows of one group are never split).
- WebDataset, uncompressed ``.tar``: ranges of members, cut only where the sample key
  changes, so a sample's members stay together. A tar in which a sample's members are not
  consecutive is one task, which its reader refuses, as it would at any size.

Ids derived from a file never depend on where a task starts: JSONL rows are numbered by
the uncompressed byte offset of their line, Parquet rows by their index in the file, tar
samples by their key. Plain text inputs (one document per file) are grouped, never split.
"""

from __future__ import annotations

import logging
import tarfile
from dataclasses import dataclass

import pyarrow.parquet as pq

from winnow.curate.errors import InputError
from winnow.curate.readers.files import InputFile, compressed_kind, open_binary
from winnow.curate.readers.utf8 import printable

log = logging.getLogger(__name__)

_ZSTD_MAGIC = 0xFD2FB528
_ZSTD_SKIPPABLE = range(0x184D2A50, 0x184D2A60)
_PLAIN_JSONL = (".jsonl", ".json", ".ndjson")
_ZSTD = (".zst", ".zstd")


@dataclass(frozen=True, slots=True)
class Span:
    """Part of one file: ``[start, stop)`` in the unit its format splits by; ``base`` where the unit needs one.

    JSONL: bytes of the file (``stop`` -1: to the end). zstd JSONL (unit ``frames``): compressed
    offsets of the first frame and of the frame after the last, ``base`` the uncompressed offset
    at ``start`` and ``base_stop`` at ``stop``. Parquet: row-group indices, ``base`` the first row's index.
    Tar: offsets of member headers.
    """

    start: int
    stop: int
    base: int = 0
    base_stop: int = -1
    unit: str = "bytes"

    def __str__(self) -> str:
        return f"{self.unit} {self.start}-{'end' if self.stop < 0 else self.stop}"


def split_file(fmt: str, file: InputFile, task_bytes: int, storage_options: dict) -> list[Span | None]:
    """The spans one file is read as (``[None]``: the whole file, one task)."""
    if file.size <= task_bytes:
        return [None]
    url = file.url.lower()
    if fmt == "jsonl" and url.endswith(_PLAIN_JSONL):
        if _compressed_head(file, storage_options):  # one task: its reader refuses the file (or skips it whole)
            return [None]
        edges = list(range(0, file.size, task_bytes))
        return [Span(a, b) for a, b in zip(edges, edges[1:] + [-1])]
    if fmt == "jsonl" and url.endswith(_ZSTD):
        return _zstd_spans(file, task_bytes, storage_options)
    if fmt == "parquet":
        return _parquet_spans(file, task_bytes, storage_options)
    if fmt == "webdataset" and url.endswith(".tar"):
        if _compressed_head(file, storage_options):  # a compressed tar named .tar: one stream, read whole
            return [None]
        return _tar_spans(file, task_bytes, storage_options)
    log.info(
        "%s: %d bytes in one task (a %s stream cannot be split)", printable(file.url), file.size, url.rsplit(".", 1)[-1]
    )
    return [None]


def _group(sizes: list[int], task_bytes: int) -> list[tuple[int, int]]:
    """Consecutive items ``[i, j)`` of about ``task_bytes`` each (an item larger than that is a group alone)."""
    groups, start, total = [], 0, 0
    for i, size in enumerate(sizes):
        if i > start and total + size > task_bytes:
            groups.append((start, i))
            start, total = i, 0
        total += size
    groups.append((start, len(sizes)))
    return groups


# -- zstd ---------------------------------------------------------------------------------------------


def zstd_frames(fh, size: int) -> list[tuple[int, int]] | None:
    """``(compressed offset, decompressed size)`` of each frame, walking headers only; None if a size is missing.

    Skippable frames (metadata, a seek table) are stepped over. The walk reads 3 bytes per
    block (blocks hold at most 128 KiB), never the compressed data itself.
    """
    frames, pos = [], 0
    while pos < size:
        fh.seek(pos)
        head = fh.read(18)  # magic (4) + the longest frame header (14)
        if len(head) < 8:
            raise InputError(f"zstd frame at byte {pos} is cut short")
        magic = int.from_bytes(head[:4], "little")
        if magic in _ZSTD_SKIPPABLE:
            pos += 8 + int.from_bytes(head[4:8], "little")
            continue
        if magic != _ZSTD_MAGIC:
            raise InputError(f"byte {pos} does not start a zstd frame (magic {magic:#x})")
        descriptor = head[4]
        fcs_flag, single, checksum, did_flag = (
            descriptor >> 6,
            (descriptor >> 5) & 1,
            (descriptor >> 2) & 1,
            descriptor & 3,
        )
        fcs_bytes = (1 if single else 0, 2, 4, 8)[fcs_flag]
        if fcs_bytes == 0:
            return None  # this frame does not say how much it decompresses to
        at = 5 + (0 if single else 1) + (0, 1, 2, 4)[did_flag]
        content = int.from_bytes(head[at : at + fcs_bytes], "little") + (256 if fcs_bytes == 2 else 0)
        block = pos + at + fcs_bytes
        while True:
            fh.seek(block)
            raw = fh.read(3)
            if len(raw) < 3:
                raise InputError(f"zstd frame at byte {pos} is cut short (a block header at byte {block})")
            header = int.from_bytes(raw, "little")
            kind, length = (header >> 1) & 3, header >> 3
            block += 3 + (1 if kind == 1 else length)  # an RLE block stores one byte
            if header & 1:
                break
        frames.append((pos, content))
        pos = block + (4 if checksum else 0)
    return frames


def _zstd_spans(file: InputFile, task_bytes: int, storage_options: dict) -> list[Span | None]:
    with open_binary(file.url, storage_options, decompress=False) as fh:
        try:
            frames = zstd_frames(fh, file.size)
        except InputError as err:
            log.warning("%s: %s; read as one task", printable(file.url), err)
            return [None]
    if not frames or len(frames) == 1:
        if frames is None:
            log.info("%s: a zstd frame without its decompressed size; read as one task", printable(file.url))
        return [None]
    edges = [off for off, _ in frames] + [file.size]
    bases = [0]
    for _, content in frames:
        bases.append(bases[-1] + content)
    spans = []
    for i, j in _group([edges[k + 1] - edges[k] for k in range(len(frames))], task_bytes):
        last = j == len(frames)
        spans.append(Span(edges[i], -1 if last else edges[j], bases[i], -1 if last else bases[j], unit="frames"))
    return spans


# -- Parquet ------------------------------------------------------------------------------------------


def _parquet_spans(file: InputFile, task_bytes: int, storage_options: dict) -> list[Span | None]:
    with open_binary(file.url, storage_options, decompress=False) as fh:
        try:
            meta = pq.ParquetFile(fh).metadata
        except Exception:  # unreadable: one task, whose reader turns the damage into a reject
            return [None]
        groups = [meta.row_group(i) for i in range(meta.num_row_groups)]
    if len(groups) < 2:
        return [None]
    sizes = [sum(g.column(c).total_compressed_size for c in range(g.num_columns)) for g in groups]
    first_rows = [0]
    for g in groups:
        first_rows.append(first_rows[-1] + g.num_rows)
    return [Span(i, j, first_rows[i], unit="row groups") for i, j in _group(sizes, task_bytes)]


def _compressed_head(file: InputFile, storage_options: dict) -> bool:
    """Whether a file named as plain (JSON Lines, a tar) starts as a compressed format does (``files.MAGIC``)."""
    try:
        with open_binary(file.url, storage_options, decompress=False) as fh:
            return compressed_kind(fh.read(16)) is not None
    except (OSError, InputError):
        return False  # unreadable: its reader reports it


# -- tar ----------------------------------------------------------------------------------------------


def _tar_spans(file: InputFile, task_bytes: int, storage_options: dict) -> list[Span | None]:
    """Spans of whole samples; the whole file where a sample's members are not consecutive: read whole, the file is
    refused naming the sample (``webdataset._refuse_scattered``), where cut between its members each span would
    read its part as a sample of its own (the text without its id and meta)."""
    from winnow.curate.readers.webdataset import SampleKeys, split_key

    cuts, next_cut, key, file_key = [0], task_bytes, None, None
    seen = SampleKeys()
    with open_binary(file.url, storage_options, decompress=False) as fh:
        try:
            with tarfile.open(fileobj=fh, mode="r:", ignore_zeros=True) as tar:  # as the reader: past end markers
                for member in tar:  # headers only: the reader seeks over each member's data
                    member_key, ext = split_key(printable(member.name))
                    if member.isfile():  # as the reader, which reads only files' keys
                        if seen.scattered(member_key, ext, file_key):
                            log.info(
                                "%s: a sample's members are not consecutive; read as one task", printable(file.url)
                            )
                            return [None]
                        file_key = member_key
                    if member.offset >= next_cut and member_key != key:
                        cuts.append(member.offset)
                        next_cut = member.offset + task_bytes
                    key = member_key
        except (tarfile.TarError, EOFError, OSError):
            pass  # damage: the spans found so far stand; the last one's reader reports it
    return [Span(a, b) for a, b in zip(cuts, cuts[1:] + [-1])]
