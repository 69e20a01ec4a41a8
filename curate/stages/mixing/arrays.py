"""Exact sums for the plans' reports, whatever pieces the rows arrive in."""

from __future__ import annotations

from fractions import Fraction

import numpy as np


class ExactSum:
    """The sum of float64 values, exact whatever the order and grouping they are added in.

    A value is ``m * 2**(e - 53)`` with an integer mantissa ``m``; mantissas are split in
    halves of at most 27 bits and summed per exponent in float64 (exact below 2**53, so at
    most 2**25 values per call), then combined as a Python integer. A plan that reads its rows
    in pieces thus reports the same means whatever its memory budget.
    """

    _CHUNK = 1 << 25
    _BIAS = 1100  # frexp exponents of float64 lie in [-1073, 1024]

    def __init__(self) -> None:
        self.total = 0  # the sum, times 2**(_BIAS + 53)
        self.count = 0

    def add(self, values: np.ndarray) -> None:
        for a in range(0, len(values), self._CHUNK):
            self._add(values[a : a + self._CHUNK])

    def _add(self, values: np.ndarray) -> None:
        mant, exp = np.frexp(values)
        m = (mant * 2.0**53).astype(np.int64)
        hi = m >> 26
        lo = m - (hi << 26)
        idx = exp.astype(np.int64) + self._BIAS
        size = 2 * self._BIAS
        his = np.bincount(idx, weights=hi.astype(np.float64), minlength=size)
        los = np.bincount(idx, weights=lo.astype(np.float64), minlength=size)
        for b in np.flatnonzero((his != 0) | (los != 0)):
            self.total += ((int(his[b]) << 26) + int(los[b])) << int(b)
        self.count += len(values)

    def mean(self) -> float | None:
        return float(Fraction(self.total, self.count << (self._BIAS + 53))) if self.count else None
