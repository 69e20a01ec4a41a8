"""``njit`` for the dedup kernels, with numba imported so that it loads no library they do not use.

numba's first compile (or cache load) in a process imports two modules that pull in libraries no
winnow kernel needs, each time, in every process:

- ``numba.np.arraymath`` imports ``scipy.linalg`` when scipy is installed, only to learn whether
  ``np.correlate`` / ``np.convolve`` inside a kernel may use BLAS for their inner product (about
  0.25 s of CPU and 15 MB). Imported here with ``scipy.linalg.cython_blas`` hidden, those two
  functions use numba's own loop; numba's ``np.linalg`` support still imports scipy when a kernel
  uses it.
- ``numba.core.typing.cffi_utils`` builds a ``cffi.FFI``, which imports cffi's C parser
  (pycparser), so that kernels may call cffi functions (about 40 ms, serial: numba's first
  dispatch holds its compiler lock). Imported here with ``cffi`` hidden, numba treats cffi
  functions as if cffi were not installed, in this process; cffi itself stays importable.

Each module is imported this way only when nothing imported it before.

``set_up`` does numba's one-time setup of a process ahead of the first kernel call (see there).
"""

from __future__ import annotations

import functools
import importlib
import sys

from numba import njit


def _import_without(module: str, hidden: str) -> None:
    """Import ``module`` (if not yet imported) as if ``hidden`` were not installed."""
    if module in sys.modules:
        return
    hide = hidden not in sys.modules
    if hide:
        sys.modules[hidden] = None  # type: ignore[assignment]  # import -> ImportError
    try:
        importlib.import_module(module)
    finally:
        if hide:
            del sys.modules[hidden]


_import_without("numba.np.arraymath", "scipy.linalg.cython_blas")
_import_without("numba.core.typing.cffi_utils", "cffi")


@functools.cache
def set_up() -> None:
    """numba's one-time setup in this process, done now: its extension entry points, its CPU target's typing
    and lowering registries, and the typing of an array (which imports ``numpy.ma``).

    The first kernel call in a process (a compile or a cache load) does this first: about 0.1 s of
    Python, under numba's compiler lock, so that every thread calling a kernel meanwhile waits for it.
    A caller with nothing else to do (the thread that handed tasks to worker threads) can do it while
    the workers read their first batches. Later calls return at once.
    """
    import numpy as np
    from numba import typeof
    from numba.core import entrypoints
    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.registry import cpu_target

    with global_compiler_lock:
        entrypoints.init_all()
        cpu_target.target_context.refresh()
    typeof(np.zeros(1, dtype=np.uint8))


__all__ = ["njit", "set_up"]
