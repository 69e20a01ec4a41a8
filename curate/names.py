"""Names as path components: one safe, injective encoding for every folder or file named after a user's name.

Source names (from a job file or from a column of the data), job, run, variant and stage names
end up as folder names. A name is data, so it may be ``..``, ``/etc``, ``a/b``, a NUL byte or
300 characters long; ``path_name`` turns any name into one path component that stays where it is
put, on a local disk and on an object store alike:

* ASCII letters, digits, ``-``, ``_`` and ``.`` are kept, so ordinary names read as themselves
  (``web``, ``wiki_en``, ``code-python``, ``v1.2``);
* every other byte of the name's UTF-8 is ``%XX`` (``%`` itself is ``%25``), as in a URL;
* a leading ``.`` is ``%2E``, so no name is ``.``, ``..`` or a hidden file;
* a component longer than ``MAX_COMPONENT`` bytes keeps its first part and ends in ``%~`` and
  a SHA-256 prefix of the whole name (``%~`` appears in no other encoding).

Distinct names give distinct components (the encoding is reversible, ``name_from_path``, except
for the hashed long form), so two sources never share a folder. Messages, manifests and reports
show names as given; only paths use this form.
"""

from __future__ import annotations

import hashlib
import re

MAX_COMPONENT = 200  # bytes: file systems allow 255; room for a suffix such as ".tmp-<hex>"
_KEEP = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.")
_ESCAPE = re.compile(r"%([0-9A-F]{2})")


def path_name(name: str) -> str:
    """``name`` as one safe path component (see the module docstring); ``name`` must be a non-empty string."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a name used as a path must be a non-empty string, got {name!r}")
    data = name.encode("utf-8", errors="surrogatepass")
    out = "".join(chr(b) if b in _KEEP and not (i == 0 and b == 0x2E) else f"%{b:02X}" for i, b in enumerate(data))
    if len(out) > MAX_COMPONENT:
        digest = hashlib.sha256(data).hexdigest()[:32]
        head = out[: MAX_COMPONENT - len(digest) - 2]
        head = head[: head.rfind("%")] if "%" in head[-2:] else head  # never cut an escape in two
        out = f"{head}%~{digest}"
    return out


def name_from_path(component: str) -> str | None:
    """The name ``path_name`` encoded as ``component``; None for the hashed form of a long name."""
    if "%~" in component:
        return None
    data = bytearray()
    i = 0
    while i < len(component):
        match = _ESCAPE.match(component, i)
        if match:
            data.append(int(match.group(1), 16))
            i = match.end()
        else:
            data += component[i].encode()
            i += 1
    return data.decode("utf-8", errors="surrogatepass")
