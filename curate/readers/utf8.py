"""Keeping every string that enters winnow valid UTF-8, whatever the input holds.

polars strings must be valid UTF-8: invalid bytes reaching ``pl.from_arrow`` either panic
(``PanicException``) or pass into shards that polars and ``datasets`` then cannot open. Arrow
readers (Parquet, the Arrow JSON parser) do not validate on read, so readers check here
first: Arrow's own validation runs at several GB/s, and only a batch that fails it pays for
the per-row search. Names that come from the file system or a tar header may hold bytes
Python decoded with ``surrogateescape``; ``printable`` turns those into ``\\xNN`` escapes.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def valid_utf8(data: bytes) -> bool:
    """Whether ``data`` is valid UTF-8, checked by Arrow without copying it."""
    # Offsets from numpy: ``pa.array`` of a Python list imports pandas (~0.5 s and ~50 MB per process).
    offsets = pa.py_buffer(np.array([0, len(data)], dtype=np.int64))
    arr = pa.Array.from_buffers(pa.large_string(), 1, [None, offsets, pa.py_buffer(data)])
    try:
        arr.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def first_bad_byte(data: bytes) -> tuple[int, str]:
    """Offset of the first byte that is not valid UTF-8 in ``data`` (known to be invalid), and why."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as err:
        return err.start, err.reason
    return len(data), "valid"


def invalid_rows(table: pa.Table | pa.RecordBatch) -> list[int]:
    """Positions of the rows of ``table`` holding a string that is not valid UTF-8 (usually none).

    Validation covers every column, nested ones included. The per-row search runs only when
    the whole batch fails, one slice at a time.
    """
    try:
        table.validate(full=True)
        return []
    except pa.ArrowInvalid:
        pass
    bad = []
    for i in range(table.num_rows):
        try:
            table.slice(i, 1).validate(full=True)
        except pa.ArrowInvalid:
            bad.append(i)
    return bad


def printable(s: str) -> str:
    """``s`` if it is valid UTF-8 text, else with its undecodable bytes or lone surrogates as ``\\x``/``\\u`` escapes."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        pass
    try:  # bytes Python decoded with surrogateescape (file names, tar members): show the bytes
        return s.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # real lone surrogates
        return s.encode("utf-8", "backslashreplace").decode("utf-8")


def cell_text(value: object) -> str:
    """A value of an invalid row, as text a reject can hold (bytes decoded with replacement)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return printable(str(value))
