"""Filter-sparse convolution (UCF Table 2: filter sparse, M_U (CRS)_C).

A pruned filter is stored per output channel as a compressed list of its
(c, r, s) nonzeros: format "UCCC" gives F(m,c,r,s) the levels m:U, c:C,
r:C, s:C, a CSF tree under a dense output-channel level.  The input and
output stay dense NCHW:

    O(n,m,p,q) = I(n,c,p+r-1,q+s-1) * F(m,c,r,s)

With the loop order n, m, c, r, s, p, q each stored weight F(m,c,r,s)
scales a whole shifted input plane into output plane m: ucf narrows the
p and q loops to the rows and columns where p+r-1 and q+s-1 fall inside
the image, so the padding costs no tests in the inner loop, which
vectorizes over q.  Output channels run in parallel.  The filter is
converted once, outside the timed call.

    python examples/filter_sparse_conv.py [--quick] [--sparsity 0.9]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # when imported from elsewhere
from _common import conv_nchw, median_time, options, prune, report, sparsity_option  # noqa: E402

import ucf  # noqa: E402

EXPR = "O(n,m,p,q) = I(n,c,p+r-1,q+s-1) * F(m,c,r,s)"
SCHEDULE = "reorder(n,m,c,r,s,p,q); parallelize(m,CPUThread,NoRaces)"


def main(argv: Sequence[str] | None = None) -> int:
    args = options(__doc__.splitlines()[0], argv, sparsity_option)
    n, c, h, m = (1, 16, 16, 16) if args.quick else (1, 64, 28, 64)
    rng = np.random.default_rng(args.seed)
    i = rng.standard_normal((n, c, h, h)).astype(np.float32)
    f = prune(rng.standard_normal((m, c, 3, 3)).astype(np.float32), args.sparsity)
    ref = conv_nchw(i, f, pad=1)

    k = ucf.compile(
        EXPR, formats={"F": "UCCC"}, schedule=SCHEDULE, target=args.target, dtype="float32"
    )
    ft = ucf.from_numpy(f, "UCCC")  # once: the pruned weights do not change between calls
    out = np.empty(ref.shape, np.float32)
    got = k(I=i, F=ft, out=out)
    t = median_time(lambda: k(I=i, F=ft, out=out), args.repeat)
    print(f"F {f.shape}: {ft.nnz} stored weights ({100 * (1 - ft.nnz / f.size):.0f}% sparse)")
    return report(f"filter-sparse conv {ref.shape}", got, ref, t)


if __name__ == "__main__":
    sys.exit(main())
