"""Crash points: kill the process at its N-th durable write, so tests can crash a job anywhere.

Every publish of a file or folder under its final name (``curate.atomic``) is a crash
point, reached twice: just before the rename (the data is written, not yet visible) and
just after it. The crash harness (``tests/curate/test_crash_harness.py``) sets

* ``WINNOW_CRASH_AT=count:<file>`` to list the points of a whole run, one line each, and
* ``WINNOW_CRASH_AT=before:<n>`` or ``after:<n>`` to SIGKILL this process at the n-th point,
* ``WINNOW_CRASH_AT=before:<n>@<label>`` to count only the points of that label (``store:stats.json``:
  a task's marker on an object store), and ``WINNOW_CRASH_ONCE=<file>`` to fire in one process only
  (the first to get there creates the file; the Ray executor passes both to its workers),

choosing points from the job's own progress rather than from the clock. Without the
variable a crash point costs one dictionary lookup at import and one branch per write.
"""

from __future__ import annotations

import os
import signal

CRASH_ENV = "WINNOW_CRASH_AT"
ONCE_ENV = "WINNOW_CRASH_ONCE"
_SPEC = os.environ.get(CRASH_ENV, "")
_MODE, _, _ARG = _SPEC.partition(":")
_NTH, _, _LABEL = _ARG.partition("@")
_reached = 0


def crash_point(label: str, when: str) -> None:
    """Mark a point in a durable write (``when`` is ``"before"`` or ``"after"`` the rename of ``label``)."""
    global _reached
    if not _SPEC or (_LABEL and label != _LABEL and _MODE != "count"):
        return
    if when == "before":
        _reached += 1
    if _MODE == "count":
        if when == "before":
            with open(_ARG, "a") as fh:
                fh.write(f"{_reached}\t{label}\n")
    elif _MODE == when and int(_NTH) == _reached and _first():
        os.kill(os.getpid(), signal.SIGKILL)


def _first() -> bool:
    """With ``WINNOW_CRASH_ONCE``: only the first process to reach its point fires."""
    flag = os.environ.get(ONCE_ENV)
    if not flag:
        return True
    try:
        os.close(os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True
