"""WebDataset tar shards parsed from bytes in memory into the row schema's Arrow columns.

A shard is read whole (the checksum needs every byte anyway), so instead of ``tarfile``'s
file-object machinery we walk the 512-byte headers of the buffer once and gather every
``.txt`` member into one contiguous UTF-8 buffer with a single numpy gather. Only the small
``.json`` members are parsed per sample (that is the format: one JSON object per row).
"""

from __future__ import annotations

import numpy as np
import orjson
import pyarrow as pa

from winnow.train.errors import ShardError

_BLOCK = 512


def _octal(field: bytes) -> int:
    field = field.rstrip(b"\0 ").lstrip(b" ")
    if field[:1] == b"\x80":  # GNU base-256 size for members over 8 GiB
        return int.from_bytes(field[1:], "big")
    return int(field or b"0", 8)


def _pax_path(data: bytes) -> str | None:
    """The ``path`` of a PAX extended header: records ``"<length> <key>=<value>\\n"``, the length in bytes counting
    the whole record, so a value may hold newlines."""
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0 or not data[pos:space].isdigit():
            return None
        end = pos + int(data[pos:space])
        if end <= space:  # a length too short to hold its own record
            return None
        key, _, value = data[space + 1 : end - 1].partition(b"=")
        if key == b"path":
            return value.decode("utf-8", "replace")
        pos = end
    return None


def tar_members(buf: bytes, where: str) -> list[tuple[str, int, int]]:
    """``(name, offset, size)`` of each regular file in a tar held in ``buf``. Zero blocks are read past, as
    ``tar --ignore-zeros`` and curation's reader do: tars joined by ``cat`` hold every archive's members."""
    out: list[tuple[str, int, int]] = []
    view = memoryview(buf)
    pos, end, long_name, ended = 0, len(buf), None, False
    while pos + _BLOCK <= end:
        header = bytes(view[pos : pos + _BLOCK])
        if header == b"\0" * _BLOCK:  # an end-of-archive marker, or padding; another archive may follow
            pos, ended = pos + _BLOCK, True
            continue
        ended = False
        stored = _octal(header[148:156])
        computed = sum(header) - sum(header[148:156]) + 8 * 32
        if stored != computed:
            raise ShardError(f"{where}: corrupt tar header at byte {pos} (checksum {stored} != {computed})")
        size, kind = _octal(header[124:136]), header[156:157]
        data_at = pos + _BLOCK
        if data_at + size > end:
            raise ShardError(f"{where}: truncated tar: member at byte {pos} needs {size} bytes, file ends at {end}")
        if kind in (b"x", b"L"):
            payload = bytes(view[data_at : data_at + size])
            long_name = _pax_path(payload) if kind == b"x" else payload.rstrip(b"\0").decode("utf-8", "replace")
        elif kind in (b"0", b"\0", b"7"):
            name = long_name
            if name is None:
                name = header[:100].split(b"\0", 1)[0].decode("utf-8", "replace")
                prefix = header[345:500].split(b"\0", 1)[0] if header[257:262] == b"ustar" else b""
                if prefix:
                    name = prefix.decode("utf-8", "replace") + "/" + name
            out.append((name, data_at, size))
            long_name = None
        pos = data_at + (size + _BLOCK - 1) // _BLOCK * _BLOCK
    if pos < end or not ended:
        raise ShardError(f"{where}: truncated tar: no end-of-archive marker after byte {pos}")
    return out


def _gather_strings(buf: bytes, starts: np.ndarray, sizes: np.ndarray) -> pa.LargeStringArray:
    """A string array of the byte ranges ``[start, start+size)`` of ``buf``, in one numpy gather."""
    offsets = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    src = np.frombuffer(buf, np.uint8)
    # position i of the output reads buf[starts[doc] + (i - offsets[doc])]
    index = np.repeat(starts - offsets[:-1], sizes) + np.arange(offsets[-1], dtype=np.int64)
    data = src[index]
    return pa.LargeStringArray.from_buffers(len(sizes), pa.py_buffer(offsets), pa.py_buffer(data))


def _string_array(values: list[str | None]) -> pa.LargeStringArray:
    """Strings to Arrow without ``pa.array``, which imports pandas (~1 s in each fresh worker)."""
    encoded = [b"" if v is None else v.encode() for v in values]
    offsets = np.zeros(len(values) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, encoded), np.int64, count=len(encoded)), out=offsets[1:])
    valid = np.fromiter((v is not None for v in values), bool, count=len(values))
    bitmap = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.LargeStringArray.from_buffers(len(values), pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded)), bitmap)


def read_tar(buf: bytes, where: str) -> pa.Table:
    """Rows of a WebDataset shard: ``id``, ``source`` and ``text`` (what training reads), in file order."""
    members = tar_members(buf, where)
    texts: dict[str, tuple[int, int]] = {}
    order: list[str] = []
    infos: dict[str, tuple[int, int]] = {}
    for name, at, size in members:
        base = name.rsplit("/", 1)[-1]
        key, dot, ext = base.partition(".")
        if not dot:
            continue
        if (ext == "txt" and key in texts) or (ext == "json" and key in infos):
            raise ShardError(f"{where}: two samples are named {key!r}; each sample of a shard needs its own key")
        if ext == "txt":
            texts[key] = (at, size)
            order.append(key)
        elif ext == "json":
            infos[key] = (at, size)
    missing = [k for k in order if k not in infos] or [k for k in infos if k not in texts]
    if missing:
        raise ShardError(f"{where}: sample {missing[0]!r} lacks its .txt or .json member; each row needs both")
    ids, sources = [], []
    for key in order:
        at, size = infos[key]
        try:
            obj = orjson.loads(buf[at : at + size])
        except orjson.JSONDecodeError as err:
            raise ShardError(f"{where}: sample {key!r} has an unreadable .json member: {err}") from err
        if not isinstance(obj, dict) or "source" not in obj:
            raise ShardError(f"{where}: sample {key!r}: .json member lacks the column 'source' (wrong columns?)")
        for field, value in (("id", obj.get("id", key)), ("source", obj["source"])):
            if value is not None and not isinstance(value, str):  # null: as a Parquet shard's null, said downstream
                what = "an id is a string: write it as one" if field == "id" else "a source is a name: write it as text"
                raise ShardError(
                    f"{where}: sample {key!r}: its .json member's {field!r} is {type(value).__name__} {value!r:.60}; "
                    f"{what}"
                )
        ids.append(obj.get("id", key))
        sources.append(obj["source"])
    spans = np.array([texts[k] for k in order], np.int64).reshape(-1, 2)
    text = _gather_strings(buf, spans[:, 0], spans[:, 1])
    try:
        text.validate(full=True)
    except pa.ArrowInvalid as err:
        raise ShardError(f"{where}: a .txt member is not valid UTF-8: {err}") from err
    return pa.Table.from_arrays([_string_array(ids), _string_array(sources), text], names=["id", "source", "text"])
