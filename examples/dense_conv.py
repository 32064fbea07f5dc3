"""Dense 2-D convolution (UCF Table 2: dense conv): every tensor dense, NCHW.

    O(n,m,p,q) = I(n,c,p+r-1,q+s-1) * F(m,c,r,s)          3x3, padding 1, stride 1
    O(n,m,p,q) = I(n,c,2*p+r-1,2*q+s-1) * F(m,c,r,s)      3x3, padding 1, stride 2

The constant -1 is one ring of zero padding; the coefficient 2 is the
stride.  ucf infers the output extents (P = H, and P = H/2) from the
index expressions.  The schedule puts the output row q innermost, so the
inner loop walks I and O contiguously, and runs output channels m in
parallel.

    python examples/dense_conv.py [--quick] [--target c]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # when imported from elsewhere
from _common import conv_nchw, median_time, options, report  # noqa: E402

import ucf  # noqa: E402

SCHEDULE = "reorder(n,m,c,r,s,p,q); parallelize(m,CPUThread,NoRaces)"


def main(argv: Sequence[str] | None = None) -> int:
    args = options(__doc__.splitlines()[0], argv)
    n, c, h, m = (1, 16, 16, 16) if args.quick else (2, 32, 32, 32)
    rng = np.random.default_rng(args.seed)
    i = rng.standard_normal((n, c, h, h)).astype(np.float32)
    f = rng.standard_normal((m, c, 3, 3)).astype(np.float32)
    status = 0
    for stride in (1, 2):
        idx = "p+r-1,q+s-1" if stride == 1 else f"{stride}*p+r-1,{stride}*q+s-1"
        expr = f"O(n,m,p,q) = I(n,c,{idx}) * F(m,c,r,s)"
        k = ucf.compile(expr, schedule=SCHEDULE, target=args.target, dtype="float32")
        ref = conv_nchw(i, f, stride=stride, pad=1)
        out = np.empty(ref.shape, np.float32)
        got = k(I=i, F=f, out=out)
        t = median_time(lambda k=k, out=out: k(I=i, F=f, out=out), args.repeat)
        status |= report(f"dense conv stride {stride} {ref.shape}", got, ref, t)
    return status


if __name__ == "__main__":
    sys.exit(main())
