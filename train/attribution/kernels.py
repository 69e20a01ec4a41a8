"""One fused pass per parameter for the per-source AdamW split on CPU (``split.MomentSplit.after_step``).

The split's per-step work is memory-bound: per element it reads each source's gradient, first
moment and displacement and writes the last two back, S times the optimizer's own traffic. Done
as torch ops that is six to eight passes over (S, n) tensors plus temporaries (the denominator,
the sources' sum, the router part); here it is one pass in blocks that stay in L1, every inner
loop over contiguous elements so LLVM vectorizes it. Arithmetic in float32, as torch's.
numba is imported on first use: only runs that attribute on CPU pay for it.
Shape legend: S sources, n elements of the parameter (flattened).
"""

from __future__ import annotations

import numpy as np

_BLOCK = 2048  # elements per block: the block's denominator and sum (2 x 8 kB) stay in L1 next to the streams
_KERNEL = None


def _build():
    import numba as nb

    @nb.njit(cache=True, nogil=True, fastmath=True, error_model="numpy")
    def adam_parts(g, m, disp, v, grad, m_r, disp_r, m_b, disp_b, beta1, one_minus, clip, clip_ranks, inv_ranks,
                   scale, root2_eps, tiny, before):
        """Advance each source's first moment ``m`` (S, n) by its gradient ``g`` (S, n) and add its displacement
        ``-scale·m/d`` to ``disp``, ``d = sqrt(max(v, tiny)) + root2_eps``; the router part
        ``(grad - clip_ranks·Σ_s g_s)·inv_ranks`` and the momentum from before the stretches (``m_b``) likewise."""
        S, n = m.shape
        step = np.empty(_BLOCK, dtype=np.float32)
        total = np.empty(_BLOCK, dtype=np.float32)
        neg = np.float32(-scale)
        gain = one_minus * clip
        for lo in range(0, n, _BLOCK):
            hi = min(lo + _BLOCK, n)
            w = hi - lo
            vb, st, tt = v[lo:hi], step[:w], total[:w]  # slices, not offsets: LLVM vectorizes these loops
            for k in range(w):
                st[k] = neg / (np.sqrt(max(vb[k], tiny)) + root2_eps)
                tt[k] = 0
            for s in range(S):
                ms, ds, gs = m[s, lo:hi], disp[s, lo:hi], g[s, lo:hi]
                for k in range(w):
                    x = gs[k]
                    tt[k] += x
                    mk = beta1 * ms[k] + gain * x
                    ms[k] = mk
                    ds[k] += mk * st[k]
            mr, dr, gr = m_r[lo:hi], disp_r[lo:hi], grad[lo:hi]
            for k in range(w):
                mk = beta1 * mr[k] + one_minus * ((gr[k] - clip_ranks * tt[k]) * inv_ranks)
                mr[k] = mk
                dr[k] += mk * st[k]
            if before:
                mb, db = m_b[lo:hi], disp_b[lo:hi]
                for k in range(w):
                    mk = beta1 * mb[k]
                    mb[k] = mk
                    db[k] += mk * st[k]

    return adam_parts


def adam_parts(g, m, disp, v, grad, m_r, disp_r, m_b, disp_b, *, beta1: float, clip: float, ranks: int,
               scale: float, root2_eps: float, tiny: float, before: bool) -> None:
    """The fused step on contiguous float32 numpy views, (S, n) per source and (n,) for the rest. ``g`` /
    ``grad`` None: no source's tokens reached the parameter / it has no gradient; ``clip``: the step's
    clipping factor; ``ranks``: the data ranks whose partial sums the router part is (``split.py``)."""
    global _KERNEL
    if _KERNEL is None:
        _KERNEL = _build()
    f32 = np.float32
    # rare (no token reached the parameter / it has no gradient): zeros give the same steps as the moments' decay
    g = np.zeros(m.shape, dtype=np.float32) if g is None else g
    grad = np.zeros(m.shape[1], dtype=np.float32) if grad is None else grad
    empty = np.zeros(0, dtype=np.float32)
    _KERNEL(g, m, disp, v, grad, m_r, disp_r, m_b if before else empty, disp_b if before else empty, f32(beta1),
            f32(1 - beta1), f32(clip), f32(clip * ranks), f32(1.0 / ranks), f32(scale), f32(root2_eps), f32(tiny),
            before)
