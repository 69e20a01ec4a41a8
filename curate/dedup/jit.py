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
"""

from __future__ import annotations

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

__all__ = ["njit"]
