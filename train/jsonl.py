"""One record per line of strict JSON, for the run folder's ``metrics.jsonl`` and ``alerts.jsonl``.

Python's ``json`` writes a non-finite float as ``NaN`` or ``Infinity``, which RFC 8259 does not allow and
jq, DuckDB, JavaScript and most JSON readers refuse, so one skipped step would make a whole file
unreadable to them. Here such a value is written as ``null`` and the record's ``nonfinite`` table names
it by its key path (nested keys joined by ``/``, as the trackers join them) with its value as text.
"""

from __future__ import annotations

import json
import math
from typing import Any


def json_line(record: dict, **dumps: Any) -> str:
    """``record`` as one line of strict JSON (with its newline); ``dumps`` go to ``json.dumps``."""
    found: dict[str, str] = {}

    def finite(x: Any, path: str) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            found[path] = str(x)  # "nan", "inf", "-inf"
            return None
        if isinstance(x, dict):
            return {k: finite(v, f"{path}/{k}" if path else str(k)) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [finite(v, f"{path}/{i}") for i, v in enumerate(x)]
        return x

    out = finite(record, "")
    if found:
        out["nonfinite"] = found
    return json.dumps(out, allow_nan=False, **dumps) + "\n"
