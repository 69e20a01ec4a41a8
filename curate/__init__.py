"""winnow's curation library.

polars allocates with its own jemalloc, which keeps freed pages resident for seconds before it
returns them, and Arrow with mimalloc, which waits 10 ms; a curation job frees a batch's text
every few milliseconds, so on the long-document benchmark 70-100 MB of dead pages were resident
at the peak. Both allocators read their options once, when their library loads, so they are set
here, before any curate module imports polars or pyarrow (unless already set): a process that
imports those first keeps their defaults.
"""

import os as _os
import sys as _sys

if "polars" not in _sys.modules:
    _os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:0,muzzy_decay_ms:0")
if "pyarrow" not in _sys.modules:
    _os.environ.setdefault("MIMALLOC_PURGE_DELAY", "0")
