"""A fast, deterministic tar writer for WebDataset shards.

``tarfile`` builds every member's header in Python (tens of microseconds each), which made
tar output 50-100x slower than Parquet. Here the 512-byte ustar headers of a whole batch
are filled in as one numpy array (names, sizes and checksums as columns); only members
whose name does not fit ustar's 100 bytes fall back to ``tarfile``'s PAX headers.
Fixed metadata (mode 0644, uid/gid 0, mtime 0, no user names) keeps the bytes reproducible.
"""

from __future__ import annotations

import tarfile
from typing import BinaryIO

import numpy as np

_BLOCK = 512
_RECORD = 20 * _BLOCK  # tar files are padded to whole records, as tarfile does


def _template() -> np.ndarray:
    h = np.zeros(_BLOCK, np.uint8)
    for offset, value in (
        (100, b"0000644\0"),
        (108, b"0000000\0"),
        (116, b"0000000\0"),
        (136, b"00000000000\0"),
        (148, b" " * 8),
        (156, b"0"),
        (257, b"ustar\x0000"),
        (329, b"0000000\0"),
        (337, b"0000000\0"),
    ):
        h[offset : offset + len(value)] = np.frombuffer(value, np.uint8)
    return h


_TEMPLATE = _template()


class TarWriter:
    """Appends regular-file members to an open binary file; ``close`` writes the end-of-archive."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh = fh
        self.offset = 0

    def add(self, names: list[str], payloads: list[bytes]) -> None:
        """Write members ``names[i]`` with contents ``payloads[i]``, in order."""
        if not names:
            return
        encoded = [n.encode("utf-8") for n in names]
        sizes = np.fromiter((len(p) for p in payloads), np.int64, len(payloads))
        headers = self._headers(encoded, sizes)
        pads = (-sizes) % _BLOCK
        zeros = bytes(_BLOCK)
        parts: list[bytes] = []
        for i, payload in enumerate(payloads):
            parts.append(headers[i] if isinstance(headers[i], bytes) else headers[i].tobytes())
            parts.append(payload)
            parts.append(zeros[: pads[i]])
        blob = b"".join(parts)
        self.fh.write(blob)
        self.offset += len(blob)

    def close(self) -> None:
        end = 2 * _BLOCK
        end += (-(self.offset + end)) % _RECORD
        self.fh.write(bytes(end))
        self.fh.close()

    @staticmethod
    def _headers(names: list[bytes], sizes: np.ndarray) -> list:
        n = len(names)
        h = np.tile(_TEMPLATE, (n, 1))
        short = np.fromiter((len(x) <= 100 for x in names), bool, n)
        h[:, 0:100] = np.frombuffer(b"".join(x[:100].ljust(100, b"\0") for x in names), np.uint8).reshape(n, 100)
        h[:, 124:136] = np.frombuffer(b"".join(b"%011o\0" % s for s in sizes.tolist()), np.uint8).reshape(n, 12)
        checksums = h.sum(axis=1, dtype=np.int64)
        h[:, 148:156] = np.frombuffer(b"".join(b"%06o\0 " % c for c in checksums.tolist()), np.uint8).reshape(n, 8)
        out: list = list(h)
        for i in np.flatnonzero(~short):  # long names: a PAX extended header, as tarfile writes it
            info = tarfile.TarInfo(names[i].decode("utf-8"))
            info.size, info.mode, info.mtime = int(sizes[i]), 0o644, 0
            out[i] = info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
        return out
