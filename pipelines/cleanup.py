"""A run folder that a failed command leaves as it found it.

``winnow train`` and ``winnow run`` create the run folder (config, provenance, tokenizer) before
the first step. When they fail before any step is recorded (a bad tokenizer path, shards that
cannot be read), ``removed_on_failure`` removes what the command created: the folder, when it did
not exist before, and the parent folders made for it, if they are still empty. A run that recorded
a step (``metrics.jsonl``) or a checkpoint is kept, to be resumed or read.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from winnow.curate.errors import FolderInUseError

log = logging.getLogger(__name__)

#: What makes a run folder worth keeping after a failure.
RESULTS = ("metrics.jsonl", "checkpoints")


@contextlib.contextmanager
def removed_on_failure(folder: str | Path) -> Iterator[None]:
    """Run the body; if it raises and ``folder`` (which it did not find) holds no results, remove what it made."""
    if "://" in str(folder):  # an object store: nothing is created there before the first write
        yield
        return
    folder = Path(folder)
    created = []  # the folder and each missing parent, deepest first
    for path in (folder, *folder.parents):
        if path.exists():
            break
        created.append(path)
    try:
        yield
    except FolderInUseError:
        raise  # another run holds the folder: what is there is its, even when it made the folder a moment ago
    except BaseException:
        if created and _is_rank_zero() and folder.is_dir() and not any((folder / name).exists() for name in RESULTS):
            shutil.rmtree(folder, ignore_errors=True)
            for parent in created[1:]:
                with contextlib.suppress(OSError):  # not empty: something else is in it now
                    parent.rmdir()
            log.info("removed %s: the command failed before its first step", folder)
        raise


def _is_rank_zero() -> bool:
    """One process removes (under torchrun every rank runs the command)."""
    return os.environ.get("RANK", "0") == "0"
