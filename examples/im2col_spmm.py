"""im2col + SpMM (UCF Table 2: im2col-based sparse convolution).

Two ucf kernels.  The first unfolds the input: each output pixel's 3x3
window becomes a column of a dense matrix (zeros where the window hangs
over the padding):

    Col(n,c,r,s,p,q) = I(n,c,p+r-1,q+s-1)

Viewed as Col(n, k, x) with k = (c, r, s) and x = (p, q) (a free numpy
reshape of the contiguous result), the convolution is then a sparse-dense
matrix product with the pruned filter F(m, k) in CSR (format "UC"):

    O(n,m,x) = F(m,k) * Col(n,k,x)

The loop order n, m, k, x streams one row of Col per stored weight, with
the contiguous x loop innermost.  Both kernels run a parallel loop (input
channels c for the unfold, output channels m for the product).

    python examples/im2col_spmm.py [--quick] [--sparsity 0.9]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # when imported from elsewhere
from _common import (  # noqa: E402
    conv_nchw,
    median_time,
    options,
    prune,
    report,
    sparsity_option,
)

import ucf  # noqa: E402

IM2COL = "Col(n,c,r,s,p,q) = I(n,c,p+r-1,q+s-1)"
IM2COL_SCHEDULE = "parallelize(c,CPUThread,NoRaces)"
SPMM = "O(n,m,x) = F(m,k) * Col(n,k,x)"
SPMM_SCHEDULE = "reorder(n,m,k,x); parallelize(m,CPUThread,NoRaces)"


def main(argv: Sequence[str] | None = None) -> int:
    args = options(__doc__.splitlines()[0], argv, sparsity_option)
    n, c, h, m = (1, 16, 16, 16) if args.quick else (1, 64, 28, 64)
    rng = np.random.default_rng(args.seed)
    i = rng.standard_normal((n, c, h, h)).astype(np.float32)
    f = prune(rng.standard_normal((m, c, 3, 3)).astype(np.float32), args.sparsity)
    ref = conv_nchw(i, f, pad=1)
    p, q = ref.shape[2:]

    unfold = ucf.compile(IM2COL, schedule=IM2COL_SCHEDULE, target=args.target, dtype="float32")
    spmm = ucf.compile(
        SPMM, formats={"F": "UC"}, schedule=SPMM_SCHEDULE, target=args.target, dtype="float32"
    )
    ft = ucf.from_numpy(f.reshape(m, c * 9), "UC")  # CSR over k = (c, r, s), converted once
    col = np.empty((n, c, 3, 3, p, q), np.float32)  # out= fixes the r, s extents too
    out = np.empty((n, m, p * q), np.float32)

    def conv() -> np.ndarray:
        unfold(I=i, out=col)
        spmm(F=ft, Col=col.reshape(n, c * 9, p * q), out=out)
        return out.reshape(ref.shape)

    status = report("im2col Col(n,c,r,s,p,q)", unfold(I=i, out=col), im2col_ref(i))
    got = conv()
    t = median_time(conv, args.repeat)
    t_unfold = median_time(lambda: unfold(I=i, out=col), args.repeat)
    print(f"F as CSR {ft.shape}: {ft.nnz} stored weights; unfold alone {t_unfold * 1e3:.3f} ms")
    return status | report(f"im2col + SpMM conv {ref.shape}", got, ref, t)


def im2col_ref(i: np.ndarray) -> np.ndarray:
    win = np.lib.stride_tricks.sliding_window_view(
        np.pad(i, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), axis=(2, 3)
    )
    return win.transpose(0, 1, 4, 5, 2, 3)  # (n, c, p, q, r, s) -> (n, c, r, s, p, q)


if __name__ == "__main__":
    sys.exit(main())
