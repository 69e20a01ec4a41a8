"""Listing input files (local paths, folders, globs, any fsspec URL) and opening them."""

from __future__ import annotations

import bisect
import logging
import os
import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import IO

import fsspec
from fsspec.core import OpenFile, split_protocol, url_to_fs
from fsspec.utils import glob_translate

from winnow.curate.config import InputConfig
from winnow.curate.errors import InputError, WinnowError
from winnow.curate.readers.utf8 import printable

log = logging.getLogger(__name__)
_GLOB_CHARS = "*?["
#: The compressions JSON Lines are read in, by the file name's ending (in any case).
CODECS = {".gz": "gzip", ".gzip": "gzip", ".zst": "zstd", ".zstd": "zstd", ".bz2": "bz2", ".xz": "xz", ".lzma": "xz"}
#: File name endings (lowercase; names are compared in any case) each format reads when a folder is given.
EXTENSIONS: dict[str, tuple[str, ...]] = {
    "jsonl": tuple(base + codec for base in (".jsonl", ".json", ".ndjson") for codec in ("", *CODECS)),
    "parquet": (".parquet",),
    "webdataset": (".tar", ".tar.gz", ".tgz"),
}  # text: every file in the folder


def codec(url: str) -> str | None:
    """The compression ``url``'s name says (None: plain)."""
    name = url.lower()
    return next((c for ending, c in CODECS.items() if name.endswith(ending)), None)


#: The first bytes of each compressed format: a file whose name says plain but whose content starts so is
#: compressed (a JSON Lines file cannot start so: its first byte is ``{``, a space or a byte-order mark).
MAGIC = {
    b"\x1f\x8b": "gzip",
    b"\x28\xb5\x2f\xfd": "zstd",
    b"BZh": "bz2",  # then the block size, a digit, and the block magic: checked in refuse_compressed
    b"\xfd7zXZ\x00": "xz",
    b"\x04\x22\x4d\x18": "lz4",
    b"\xff\x06\x00\x00sNaPpY": "snappy",
}
_ENDING = {"gzip": ".gz", "zstd": ".zst", "bz2": ".bz2", "xz": ".xz"}


def compressed_kind(head: bytes) -> str | None:
    """The compressed format whose magic number ``head`` (a file's first 10 bytes or more) starts with, or None."""
    kind = next((k for magic, k in MAGIC.items() if head.startswith(magic)), None)
    if kind == "bz2" and not (head[3:4].isdigit() and head[4:10] in (b"1AY&SY", b"\x17rE8P\x90")):
        return None
    return kind


#: Other formats' first bytes, what each is, and what to do with it: none of them is the text of JSON Lines or of a
#: plain text file, nor a Parquet file (a tar's magic, ``ustar``, is at byte 257: see ``file_kind``).
OTHER_FORMATS = {
    b"PAR1": ("a Parquet file", 'give it an [[inputs]] table with format = "parquet"'),
    b"ARROW1": ("an Arrow IPC (Feather) file", "convert it to Parquet (pyarrow.feather.read_table, write_table)"),
    b"SQLite format 3\x00": ("an SQLite database", "export its text to JSON Lines or Parquet"),
    b"PK\x03\x04": ("a zip archive", "unzip it and name the files it holds"),
    b"\x89PNG\r\n": ("a PNG image", "leave it out of the input's path"),
    b"\xff\xd8\xff": ("a JPEG image", "leave it out of the input's path"),
    b"GIF87a": ("a GIF image", "leave it out of the input's path"),
    b"GIF89a": ("a GIF image", "leave it out of the input's path"),
    b"%PDF-": ("a PDF document", "extract its text first"),
    b"\x7fELF": ("an executable (ELF)", "leave it out of the input's path"),
}
_UTF = {b"\xff\xfe\x00\x00": "UTF-32", b"\x00\x00\xfe\xff": "UTF-32", b"\xff\xfe": "UTF-16", b"\xfe\xff": "UTF-16"}


def file_kind(head: bytes, tail: bytes | None = None) -> tuple[str, str] | None:
    """``(what it is, what to do)`` when ``head``, a file's first bytes (512 or more for a tar), is a known format
    other than UTF-8 text: another table or archive format, an image, a document, or text in UTF-16 or UTF-32 (by
    its byte-order mark, or the zero bytes between ASCII characters a file without one has). ``tail``, the file's
    last bytes where known: a Parquet file ends as it starts (``PAR1``), a text that only starts so is text."""
    found = next((v for magic, v in OTHER_FORMATS.items() if head.startswith(magic)), None)
    if found is not None and not (head.startswith(b"PAR1") and tail is not None and not tail.endswith(b"PAR1")):
        return found
    if _tar_header(head[:512]):
        return "a tar archive", 'give it an [[inputs]] table with format = "webdataset"'
    bom = next((b for b in _UTF if head.startswith(b)), None)
    encoding = _UTF[bom] if bom is not None and _not_utf8_after(head[len(bom) :]) else None
    ascii_ = head[:16]
    if encoding is None and len(ascii_) == 16:
        if not any(ascii_[1::2]) and all(0x09 <= b < 0x7F for b in ascii_[0::2]):
            encoding = "UTF-16LE"
        elif not any(ascii_[0::2]) and all(0x09 <= b < 0x7F for b in ascii_[1::2]):
            encoding = "UTF-16BE"
    if encoding is not None:
        return f"{encoding} text", f"winnow reads UTF-8: convert it (iconv -f {encoding} -t UTF-8)"
    return None


def _not_utf8_after(rest: bytes) -> bool:
    """Whether the bytes after a byte-order mark read as UTF-16/32 rather than as UTF-8: zero bytes between
    characters, or bytes UTF-8 cannot decode (a BOM before plain UTF-8 is a damaged UTF-8 file, not UTF-16)."""
    if 0 in rest[:64]:
        return True
    try:
        rest[:-4].decode("utf-8")  # the cut may split the last character
    except UnicodeDecodeError:
        return True
    return False


def _tar_header(block: bytes) -> bool:
    """Whether ``block`` is a tar header: ``ustar`` at byte 257 and a checksum that adds up (text never does)."""
    if len(block) < 512 or block[257:262] != b"ustar":
        return False
    try:
        stored = int(block[148:156].rstrip(b" \0").decode("ascii") or "-1", 8)
    except ValueError:
        return False
    return stored == sum(block[:148]) + 8 * 0x20 + sum(block[156:512])


def refuse_other_format(head: bytes, url: str, label: str, *, plain: bool = True) -> None:
    """Raise ``InputError`` when ``head``, the first bytes of a JSON Lines input's file, is not JSON Lines text: a
    compressed format's under a plain name (``plain``), another file format, UTF-16/32 text, one pretty-printed JSON
    document, or lines ending in a carriage return alone (seen in ``head`` whole: give it a first record or more).
    Read as lines it would be a reject of binary bytes line after line, and a count of records that were never there."""
    if plain:
        refuse_compressed(head, url, label)
    found = file_kind(head[:1024])
    body = head.removeprefix(b"\xef\xbb\xbf").lstrip()  # a byte-order mark first: Windows tools write one
    if found is None and b"\n" in body and body.split(b"\n", 1)[0].strip() in (b"[", b"{", b"[{"):
        found = (  # json.dump(records, f, indent=2): one document over many lines, each a bad_json reject
            "one JSON document over several lines (pretty-printed)",
            "write it as one record per line (jq -c '.[]' in.json > out.jsonl), or read it with "
            'format = "hf" and hf_builder = "json"',
        )
    elif found is None and b"\n" not in head and b"\r" in head:
        found = (  # all records would be one line: one bad_json reject
            "text whose lines end in a carriage return alone (classic Mac OS)",
            "end its lines with \\n (tr '\\r' '\\n' < in.jsonl > out.jsonl)",
        )
    if found is not None:
        what, todo = found
        raise InputError(f"input {label}: {printable(url)} is {what} (its first bytes say so), not JSON Lines; {todo}")


def refuse_not_parquet(head: bytes, url: str, label: str) -> None:
    """Raise ``InputError`` when ``head``, the first bytes of a file its input reads as Parquet, is not Parquet's
    magic (``PAR1``), naming what it is where its bytes tell (a compressed JSON Lines file, Arrow, ORC, text)."""
    if not head or head.startswith(b"PAR1"):
        return  # empty: the reader's own error; PAR1: Parquet (a damaged one is a read:truncated reject)
    kind = compressed_kind(head)
    found = file_kind(head)
    if kind is not None:
        ending = _ENDING.get(kind, "")
        what, todo = (
            f"{kind}-compressed data",
            f'if it is JSON Lines, name it so (.jsonl{ending}) in an [[inputs]] table with format = "jsonl"',
        )
    elif found is not None:
        what, todo = found
    elif head.startswith(b"ORC"):
        what, todo = "an ORC file", "convert it to Parquet (pyarrow.orc.read_table, pyarrow.parquet.write_table)"
    elif head.lstrip()[:1] in (b"{", b"["):
        what, todo = "JSON text", 'give it an [[inputs]] table with format = "jsonl"'
    else:
        what, todo = "not Parquet", "give the input the format its files are in, or leave this file out of its path"
    raise InputError(
        f"input {label}: {printable(url)} is {what} (its first bytes say so), not a Parquet file "
        f"(whose first bytes are PAR1); {todo}"
    )


def refuse_compressed(head: bytes, url: str, label: str) -> None:
    """Raise ``InputError`` when ``head``, the first bytes of a file whose name says plain, is a compressed
    format's: read as text it would be every line a reject of binary bytes."""
    kind = compressed_kind(head)
    if kind is None:
        return
    name = printable(url)
    if kind in _ENDING:
        todo = f"rename it to end in {_ENDING[kind]} ({posixpath.basename(name)}{_ENDING[kind]}) and winnow decompresses it"
    else:
        todo = "decompress it first, or recompress it with zstd or gzip (winnow reads .zst, .gz, .bz2 and .xz)"
    raise InputError(
        f"input {label}: {name} is {kind}-compressed (its first bytes say so) but its name does not; {todo}"
    )


@dataclass(frozen=True, slots=True)
class InputFile:
    """One input file: its URL, its name relative to the input's root, and what we know of it."""

    url: str
    rel: str  # used in derived ids: <source>/<rel>@<byte offset>, <source>/<rel>/<row or key>
    size: int
    mtime: float | None


def list_files(cfg: InputConfig) -> list[InputFile]:
    """Every file an ``[[inputs]]`` table names, sorted, each once; errors name the pattern."""
    found: dict[str, InputFile] = {}
    for pattern in cfg.paths:
        try:
            fs, path = filesystem(pattern, cfg.storage_options)
        except (ImportError, ValueError) as err:
            raise InputError(f"input {cfg.label}: cannot open {pattern!r}: {err}") from err
        protocol = fs.protocol[0] if isinstance(fs.protocol, (tuple, list)) else fs.protocol
        prefix = "" if protocol in ("file", "local") else f"{protocol}://"
        try:
            listed = _listed(fs, path, pattern, cfg, prefix)
        except WinnowError:
            raise
        except Exception as err:  # a store's or server's own errors (credentials, the network, a missing bucket)
            if prefix == "" and isinstance(err, OSError):
                raise  # a local path: the command's one line names it
            raise InputError(
                f"input {cfg.label}: cannot list {pattern!r} ({type(err).__name__}: {err}); check the URL, the "
                "network and the credentials ([[inputs]] storage_options, or the driver's environment variables)"
            ) from err
        if not listed and len(cfg.paths) > 1:  # one pattern of a list that names nothing: a typo, read as none
            raise InputError(
                f"input {cfg.label}: the path {pattern!r} (one of {len(cfg.paths)}) matched no files; check it "
                f"and the format ({cfg.format}), or remove it from the list"
            )
        for file in listed:
            found.setdefault(file.url, file)
    if not found:
        raise InputError(
            f"input {cfg.label}: {cfg.paths} matched no files; check the path and the format ({cfg.format})"
        )
    return sorted(found.values(), key=lambda f: f.url)  # whatever order the patterns come in


def is_local(url: str) -> bool:
    """Whether ``url`` is a local path: one without a ``scheme://`` (or with ``file://``)."""
    return split_protocol(url)[0] in (None, "file", "local")


def filesystem(url: str, storage_options: dict) -> tuple[fsspec.AbstractFileSystem, str]:
    """The file system ``url`` is on and its path there. A local path is taken as written, never parsed as an fsspec
    URL, whose ``::`` chains file systems: ``docs/std::vector.txt`` would be ``docs/std``, another file."""
    if is_local(url):
        fs = fsspec.filesystem("file", **storage_options)
        return fs, fs._strip_protocol(url)
    return url_to_fs(url, **storage_options)


def _listed(fs, path: str, pattern: str, cfg: InputConfig, prefix: str) -> list[InputFile]:
    """The files one of an input's ``path`` patterns names (``list_files``)."""
    # a path that names a file or folder as written is that one, glob characters and all (data[1].jsonl)
    if any(c in path for c in _GLOB_CHARS) and not fs.exists(path):
        root = path[: min(path.find(c) for c in _GLOB_CHARS if c in path)].rsplit("/", 1)[0]
        if not prefix:
            paths = _local_glob(path, cfg, pattern)
        else:
            paths = []
            for p in fs.glob(path):
                if not fs.isdir(p):
                    paths.append(p)
                else:  # a store's key under which other keys lie is a folder to glob; if an object too, refused
                    _refuse_object_and_folder(fs, p, cfg, prefix)
    elif fs.isdir(path) and cfg.format == "hf" and not cfg.hf_builder:
        root, paths = posixpath.dirname(path.rstrip("/")), [path.rstrip("/")]  # a save_to_disk folder
    elif fs.isdir(path):
        if prefix:
            _refuse_object_and_folder(fs, path, cfg, prefix)
        root = path.rstrip("/")
        exts = EXTENSIONS.get(cfg.format)
        if prefix:
            every = _store_objects(fs.find(path, detail=True), cfg, prefix)
        else:
            every, again = _local_find(root or "/")
            _warn_again(cfg, pattern, [(a, b) for a, b in again if not _hidden(a, root)])
        # hidden files and folders (.git/, .DS_Store, an editor's .swp) are not the folder's documents
        hidden = [p for p in every if _hidden(p, root)]
        if hidden:
            log.warning(
                "input %s: %d hidden file(s) in %s are not read, their names or folders starting with '.' (%s%s); "
                "name them in path to read them",
                cfg.label, len(hidden), pattern, ", ".join(posixpath.relpath(p, root) for p in hidden[:3]),
                ", ..." if len(hidden) > 3 else "",
            )  # fmt: skip
            every = sorted(set(every) - set(hidden))
        paths = [p for p in every if exts is None or p.lower().endswith(exts)]
        if len(paths) < len(every):
            other = sorted(set(every) - set(paths))
            log.warning(
                "input %s: %d file(s) in %s are not read, their names not ending in %s (%s%s); name them in "
                "path, or give the format they are in",
                cfg.label, len(other), pattern, "/".join(exts), ", ".join(other[:3]), ", ..." if len(other) > 3 else "",
            )  # fmt: skip
    elif fs.exists(path):
        root, paths = posixpath.dirname(path), [path]
    elif prefix == "" and os.path.islink(path):
        raise InputError(
            f"input {cfg.label}: {pattern!r} is a symbolic link to nothing or into a loop "
            f"({os.readlink(path)!r}); point the path at the real file"
        )
    else:
        raise InputError(
            f"input {cfg.label}: {pattern!r} does not exist; check the path"
            + (" (relative paths are from the current folder)" if prefix == "" and not os.path.isabs(path) else "")
        )
    files = []
    for p in sorted(paths):
        info = _info(fs, p, cfg)
        if info.get("type") == "directory":
            info["size"] = sum(fs.du(p, total=False).values()) if cfg.format == "hf" else 0
        rel = printable(posixpath.relpath(p, root) if root else p)  # ids and rejects need valid UTF-8
        mtime = info.get("mtime") or info.get("LastModified") or info.get("created")
        mtime = mtime.timestamp() if hasattr(mtime, "timestamp") else (float(mtime) if mtime is not None else None)
        files.append(InputFile(prefix + p, rel, int(info.get("size") or 0), mtime))
    return files


def _hidden(path: str, root: str) -> bool:
    """Whether ``path`` is a hidden file, or in a hidden folder, below ``root``."""
    return any(part.startswith(".") for part in posixpath.relpath(path, root).split("/"))


def distinct_names(listed: list[tuple[InputConfig, list[InputFile]]]) -> list[list[InputFile]]:
    """Each input's files, renamed where two different files of one source share a name (``rel``).

    A name is relative to its own input path's root, so ``dump-2023/*.jsonl`` and ``dump-2024/*.jsonl``
    both hold a ``part-0000.jsonl``, and rows without an id would get the same derived id in both.
    Only such files are renamed, relative to the folder they share (``dump-2023/part-0000.jsonl``),
    so every other file keeps its id. An input that takes each row's source from a field
    (``source_field``) may reach any source, so its files are compared with every input's.
    """
    by_name: dict[str, dict[str | None, set[str]]] = {}  # rel -> source (None: per row) -> urls
    for cfg, files in listed:
        for f in files:
            by_name.setdefault(f.rel, {}).setdefault(cfg.source, set()).add(f.url)
    clashes: dict[str, set[str]] = {}  # rel -> the urls that share it within a source
    for rel, per_source in by_name.items():
        every = set().union(*per_source.values())
        for source, urls in per_source.items():
            reach = every if source is None else urls | per_source.get(None, set())
            if len(reach) > 1:
                clashes.setdefault(rel, set()).update(reach)
    if not clashes:
        return [files for _, files in listed]
    renamed: dict[str, str] = {}
    for group in clashes.values():
        split = {url: url.split("://", 1) if "://" in url else ["", url] for url in group}
        same_store = len({scheme for scheme, _ in split.values()}) == 1
        shared = posixpath.commonpath([path for _, path in split.values()]) if same_store else ""
        for url, (_, path) in split.items():
            renamed[url] = printable(posixpath.relpath(path, shared) if shared else url)
    return [[replace(f, rel=renamed.get(f.url, f.rel)) for f in files] for _, files in listed]


def _local_glob(path: str, cfg: InputConfig, pattern: str) -> list[str]:
    """The files the local glob ``path`` matches, as fsspec's ``glob`` matches them, linked folders followed."""
    magic = min(path.find(c) for c in _GLOB_CHARS if c in path)
    top = path[: path.rindex("/", 0, magic) + 1]  # the folder before the first glob character ("/" at least)
    segments = path[len(top) :].split("/")
    star = next((k for k, segment in enumerate(segments) if "**" in segment), None)
    heads = [re.compile(glob_translate(segment)).match for segment in segments[:star]]  # the segments before **

    def descend(level: int, name: str) -> bool:  # whether files below the folder ``name``, ``level`` down, can match
        if star is None:
            return level < len(segments) - 1 and heads[level](name) is not None
        return level >= star or heads[level](name) is not None

    match = re.compile(glob_translate(path)).match
    found, again = _local_find(top, descend)
    _warn_again(cfg, pattern, [(a, b) for a, b in again if match(a) or os.path.isdir(a)])
    return [p for p in found if match(p)]


def _local_find(
    root: str, descend: Callable[[int, str], bool] | None = None
) -> tuple[list[str], list[tuple[str, str]]]:
    """Every file below the local folder ``root``, sorted, linked folders followed; and the files and folders
    reached again, each with the path it was first reached by. ``descend(level, name)``: whether to walk the
    folder ``name`` ``level`` folders below ``root`` (0: in it).

    fsspec's ``find`` and ``glob`` list a link to a folder as a file, so the folder's files were never read. A folder
    reached again (a link to a folder above it, which would loop, or to one already walked) is walked once, and a
    file reached twice (through links) is listed once."""
    found, folders, files, again = [], {}, {}, []

    def fail(err: OSError) -> None:
        raise err  # an unreadable folder: the command's one line names it (os.walk would leave it out without a word)

    for folder, dirs, names in os.walk(root, onerror=fail, followlinks=True):
        st = os.stat(folder)
        if (st.st_dev, st.st_ino) in folders:
            again.append((folder, folders[st.st_dev, st.st_ino]))
            dirs.clear()
            continue
        folders[st.st_dev, st.st_ino] = folder
        rel = os.path.relpath(folder, root)
        level = 0 if rel == "." else rel.count("/") + 1
        # in order, so the name a folder is first reached by (its files' ids) is the same every run
        dirs[:] = sorted(d for d in dirs if descend is None or descend(level, d))
        for name in sorted(names):
            p = os.path.join(folder, name)
            try:
                st = os.stat(p)
            except OSError:  # a link to nothing or into a loop: _info names it
                found.append(p)
                continue
            if (st.st_dev, st.st_ino) in files:
                again.append((p, files[st.st_dev, st.st_ino]))
                continue
            files[st.st_dev, st.st_ino] = p
            found.append(p)
    return sorted(found), again


def _warn_again(cfg: InputConfig, pattern: str, again: list[tuple[str, str]]) -> None:
    """One warning naming the files and folders ``_local_find`` reached again, and the names they are read by."""
    if again:
        log.warning(
            "input %s: %d file(s) or folder(s) in %s are reached again through a link, and read once (%s%s)",
            cfg.label, len(again), pattern, ", ".join(f"{a} is {b}" for a, b in again[:3]),
            ", ..." if len(again) > 3 else "",
        )  # fmt: skip


def _store_objects(found: dict[str, dict], cfg: InputConfig, prefix: str) -> list[str]:
    """The keys of a store's listing (``fs.find(detail=True)``) that are files to read.

    A zero-byte key ending in ``/`` is a folder marker (what a console's "Create folder" writes), not a document:
    skipped. A key ending in ``/`` with bytes, or a key that other keys lie under (``x.jsonl`` and
    ``x.jsonl/part.jsonl``), is one the store's file system shows as a folder and reads as empty: refused, named,
    so that its rows are not lost without a word."""
    keys = sorted(found)
    out = []
    for i, key in enumerate(keys):
        if key.endswith("/"):
            size = int(found[key].get("size") or 0)
            if size:
                raise InputError(
                    f"input {cfg.label}: the object {printable(prefix + key)!r} holds {size} bytes under a key that "
                    "ends in '/', which the store's file system reads as an empty folder; copy it to a key without "
                    "the trailing '/', or narrow the input's path"
                )
            continue
        below = bisect.bisect_left(keys, key + "/")  # not keys[i + 1]: "x.jsonl-2" sorts before "x.jsonl/a"
        if below < len(keys) and keys[below].startswith(key + "/"):
            _refuse_both(prefix + key, cfg)
        out.append(key)
    return out


def _refuse_object_and_folder(fs, key: str, cfg: InputConfig, prefix: str) -> None:
    """InputError when the store holds an object at ``key``, a key other keys lie under (a folder to its file
    system, which lists it, and reads it, as an empty folder)."""
    fs.invalidate_cache(key)
    try:
        is_object = fs.info(key.rstrip("/")).get("type") == "file"  # fresh: the object's own metadata first
    except FileNotFoundError:
        return
    if is_object:
        _refuse_both(prefix + key.rstrip("/"), cfg)


def _refuse_both(url: str, cfg: InputConfig) -> None:
    raise InputError(
        f"input {cfg.label}: {printable(url)!r} is both an object and a folder on the store (other keys begin with "
        f"'{printable(url.rsplit('/', 1)[-1])}/'); its file system lists and reads it as an empty folder, and its "
        "rows would be lost: copy the object to another key, or move the keys under it"
    )


def _info(fs, path: str, cfg: InputConfig) -> dict:
    """``fs.info(path)`` for a file a reader can stream, or an error saying what the entry is instead."""
    try:
        info = fs.info(path)
    except OSError as err:  # ELOOP, EACCES, a link that points nowhere, found through a glob or a folder
        raise InputError(
            f"input {cfg.label}: cannot read {printable(path)!r}: {err.strerror or err}; "
            f"fix or remove it, or narrow the input's path"
        ) from err
    if info.get("type") not in ("file", "directory"):
        # A FIFO or a device would block or never end; only regular files are inputs.
        raise InputError(
            f"input {cfg.label}: {printable(path)!r} is not a regular file (type {info.get('type')!r}); "
            f"remove it from the input's folder or narrow the input's path"
        )
    return info


def open_binary(url: str, storage_options: dict, *, decompress: bool = True) -> IO[bytes]:
    """Open ``url`` for reading bytes, decompressing ``.gz``/``.zst``/``.bz2``/``.xz`` by extension."""
    compression = "infer" if decompress else None
    if decompress and url.endswith(".zstd"):
        compression = "zstd"
    try:
        fs, path = filesystem(url, storage_options)
        return OpenFile(fs, path, "rb", compression=compression).open()
    except (OSError, ValueError, ImportError) as err:
        raise InputError(
            f"cannot open input file {printable(url)}: {err}; check that it is a readable regular file, "
            f'or set [job] on_error = "skip" to go on without it'
        ) from err


def _segment_regex(segment: str) -> str:
    """One path segment of a glob as a regex: ``*`` and ``?`` stay within the segment, ``[...]`` is a class."""
    out, i = [], 0
    while i < len(segment):
        c = segment[i]
        end = segment.find("]", i + 2) if c == "[" else -1
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif end != -1:
            body = segment[i + 1 : end]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body).replace("\\", "\\\\") + "]")
            i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def glob_matches(pattern: str, path: str) -> bool:
    """Whether ``path`` is one of the files the glob ``pattern`` lists (fsspec's: ``**`` any depth, ``*`` and ``?``
    within one segment), both written alike (both absolute, or both URLs)."""
    segments = pattern.rstrip("/").split("/")
    regex = ""
    for k, segment in enumerate(segments):
        last = k == len(segments) - 1
        if segment == "**":
            regex += "(?:[^/]+/)*[^/]+" if last else "(?:[^/]+/)*"
        else:
            regex += _segment_regex(segment) + ("" if last else "/")
    return re.fullmatch(regex, path) is not None
