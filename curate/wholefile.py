"""Files winnow reads whole (tokenizers, job files, manifests, a user's README) are read under a size cap.

A path a user gives may be a link to ``/dev/zero``, a FIFO, or simply the wrong, huge file: read
whole, it runs until the kernel's OOM killer ends the process. ``read_whole`` refuses anything but
a regular file (or an object) and anything over its cap, with a message naming the file, the cap and
what to do, and never reads more than the cap plus one byte, even from a file that grows.
"""

from __future__ import annotations

import fsspec

from winnow.curate.errors import InputError, WinnowError

MiB = 1 << 20
TOKENIZER_BYTES = 256 * MiB  # the largest tokenizer.json files in use (256k vocabularies) are ~35 MB
JOB_FILE_BYTES = 16 * MiB
MANIFEST_BYTES = 1024 * MiB  # a manifest lists every shard with its per-source counts
README_BYTES = 16 * MiB


def read_whole(
    url: str, *, limit: int, what: str, storage_options: dict | None = None, error: type[WinnowError] = InputError
) -> bytes:
    """The bytes of ``url`` (a path or any fsspec URL), at most ``limit`` of them; ``error`` names ``what`` otherwise."""
    try:
        fs, path = fsspec.core.url_to_fs(str(url), **(storage_options or {}))
        info = fs.info(path)
        kind, size = info.get("type"), info.get("size")
        if kind != "file":
            raise error(
                f"{what} {url} is a folder; give the path of the file itself"
                if kind == "directory"
                else f"{what} {url} is not a regular file (a device, a FIFO or a socket reads forever); give the path "
                "of the file itself"
            )
        if size is not None and size > limit:
            raise error(
                f"{what} {url} is {size} bytes, over winnow's cap of {limit} for such a file; is it the right file?"
            )
        with fs.open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except FileNotFoundError as err:
        raise error(f"{what} {url} does not exist") from err
    except OSError as err:
        raise error(f"{what} {url} cannot be read: {err.strerror or err}") from err
    if len(data) > limit:
        raise error(
            f"{what} {url} holds more than winnow's cap of {limit} bytes for such a file; is it the right file?"
        )
    return data
