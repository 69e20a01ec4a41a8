"""winnow's curation library.

polars allocates with its own jemalloc, which keeps freed pages resident for 10 s before it
returns them; a curation job frees a batch's text every few milliseconds, so on the long-document
benchmark about 50 MB of dead pages were resident at the peak. jemalloc reads its options once,
when polars loads, so they are set here, before any curate module imports polars: a process that
imports polars before curate keeps polars' defaults.
"""

import os as _os
import sys as _sys

if "polars" not in _sys.modules:
    _os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:0,muzzy_decay_ms:0")
