"""Dual-sparse convolution (UCF Table 2: both activations and filter sparse).

Input and filter are both sparse, channels last.  I(n,h,w,c) is stored
"UUUC" (each pixel's nonzero channels) and the pruned filter F(r,s,c,m)
"UUCC" (for each tap, the input channels with any weight left, and under
each of them the output channels that kept their weight):

    O(n,p,q,m) = I(n,p+r-1,q+s-1,c) * F(r,s,c,m)

With the loop order n, p, q, r, s, c, m both operands store c at the same
depth, so ucf co-iterates them: a merge of the pixel's channel list with
the tap's channel list visits only channels nonzero in both, and then
scatters I * F into the output pixel's nonzero output channels.  Output
rows p run in parallel.

    python examples/dual_sparse_conv.py [--quick] [--sparsity 0.8] [--act-sparsity 0.7]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # when imported from elsewhere
from _common import (  # noqa: E402
    conv_nhwc,
    median_time,
    options,
    prune,
    report,
    sparsity_option,
)

import ucf  # noqa: E402

EXPR = "O(n,p,q,m) = I(n,p+r-1,q+s-1,c) * F(r,s,c,m)"
FORMATS = {"I": "UUUC", "F": "UUCC"}
SCHEDULE = "reorder(n,p,q,r,s,c,m); parallelize(p,CPUThread,NoRaces)"


def main(argv: Sequence[str] | None = None) -> int:
    def extra(p):
        sparsity_option(p, 0.8)
        p.add_argument("--act-sparsity", type=float, default=0.7, help="input zeros (0.7)")

    args = options(__doc__.splitlines()[0], argv, extra)
    n, h, c, m = (1, 16, 16, 16) if args.quick else (1, 28, 64, 64)
    rng = np.random.default_rng(args.seed)
    i = rng.standard_normal((n, h, h, c)).astype(np.float32)
    i[rng.random(i.shape) < args.act_sparsity] = 0
    f = prune(rng.standard_normal((3, 3, c, m)).astype(np.float32), args.sparsity)
    ref = conv_nhwc(i, f, pad=1)

    k = ucf.compile(EXPR, formats=FORMATS, schedule=SCHEDULE, target=args.target, dtype="float32")
    it = ucf.from_numpy(i, FORMATS["I"])
    ft = ucf.from_numpy(f, FORMATS["F"])
    out = np.empty(ref.shape, np.float32)
    got = k(I=it, F=ft, out=out)
    t = median_time(lambda: k(I=it, F=ft, out=out), args.repeat)
    print(f"I {i.shape}: {it.nnz} nonzeros; F {f.shape}: {ft.nnz} nonzeros")
    return report(f"dual-sparse conv {ref.shape}", got, ref, t)


if __name__ == "__main__":
    sys.exit(main())
