"""``njit`` for the dedup kernels, with numba imported so that it does not load ``scipy.linalg``.

numba's first compile (or cache load) in a process imports ``numba.np.arraymath``, which imports
``scipy.linalg`` when scipy is installed, only to learn whether ``np.correlate`` / ``np.convolve``
inside a kernel may use BLAS for their inner product. That import costs each process about
0.25 s of CPU and 15 MB, and no winnow kernel calls either function. So ``numba.np.arraymath`` is
imported here once with ``scipy.linalg.cython_blas`` hidden: those two functions then use numba's
own loop, and everything else is unchanged (numba's ``np.linalg`` support still imports scipy
when a kernel uses it).
"""

from __future__ import annotations

import sys

from numba import njit

if "numba.np.arraymath" not in sys.modules:
    _BLAS = "scipy.linalg.cython_blas"
    _hidden = _BLAS not in sys.modules
    if _hidden:
        sys.modules[_BLAS] = None  # type: ignore[assignment]  # import -> ImportError
    try:
        import numba.np.arraymath  # noqa: F401
    finally:
        if _hidden:
            del sys.modules[_BLAS]

__all__ = ["njit"]
