"""Crash points: kill the process at its N-th durable write, so tests can crash a job anywhere.

Every publish of a file or folder under its final name (``curate.atomic``) is a crash
point, reached twice: just before the rename (the data is written, not yet visible) and
just after it. The crash harness (``tests/curate/test_crash_harness.py``) sets

* ``WINNOW_CRASH_AT=count:<file>`` to list the points of a whole run, one line each, and
* ``WINNOW_CRASH_AT=before:<n>`` or ``after:<n>`` to SIGKILL this process at the n-th point,

choosing points from the job's own progress rather than from the clock. Without the
variable a crash point costs one dictionary lookup at import and one branch per write.
"""

from __future__ import annotations

import os
import signal

CRASH_ENV = "WINNOW_CRASH_AT"
_SPEC = os.environ.get(CRASH_ENV, "")
_MODE, _, _ARG = _SPEC.partition(":")
_reached = 0


def crash_point(label: str, when: str) -> None:
    """Mark a point in a durable write (``when`` is ``"before"`` or ``"after"`` the rename of ``label``)."""
    global _reached
    if not _SPEC:
        return
    if when == "before":
        _reached += 1
    if _MODE == "count":
        if when == "before":
            with open(_ARG, "a") as fh:
                fh.write(f"{_reached}\t{label}\n")
    elif _MODE == when and int(_ARG) == _reached:
        os.kill(os.getpid(), signal.SIGKILL)
