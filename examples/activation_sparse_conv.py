"""Activation-sparse convolution (UCF Table 2: activation sparse, N_U H_U W_U C_C).

After a ReLU most activations are zero.  The input is stored NHWC with a
compressed channel level, format "UUUC" for I(n,h,w,c): for every pixel a
list of its nonzero channels.  Filter and output are dense, in the
channels-last layout F(r,s,c,m) and O(n,p,q,m):

    O(n,p,q,m) = I(n,p+r-1,q+s-1,c) * F(r,s,c,m)

The loop order n, p, q, r, s, c, m visits, for each output pixel and tap,
only the nonzero input channels c, and adds I * F(r,s,c,:) into the
output pixel's channel vector: the inner m loop is dense and contiguous in
F and O, so it vectorizes.  Out-of-image taps are skipped by narrowing the
r and s loops.  Output rows p run in parallel.

Activations change on every call, so the script times the kernel on a
pre-converted input and also the whole call on a numpy input (conversion
to "UUUC" included).

    python examples/activation_sparse_conv.py [--quick] [--sparsity 0.7]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # when imported from elsewhere
from _common import conv_nhwc, median_time, options, report, sparsity_option  # noqa: E402

import ucf  # noqa: E402

EXPR = "O(n,p,q,m) = I(n,p+r-1,q+s-1,c) * F(r,s,c,m)"
FORMAT = "UUUC"
SCHEDULE = "reorder(n,p,q,r,s,c,m); parallelize(p,CPUThread,NoRaces)"


def main(argv: Sequence[str] | None = None) -> int:
    args = options(__doc__.splitlines()[0], argv, lambda p: sparsity_option(p, 0.7))
    n, h, c, m = (1, 16, 16, 16) if args.quick else (1, 28, 64, 64)
    rng = np.random.default_rng(args.seed)
    i = np.maximum(rng.standard_normal((n, h, h, c)), 0).astype(np.float32)  # ReLU: ~50 % zeros
    i[rng.random(i.shape) < max(0.0, (args.sparsity - 0.5) / 0.5)] = 0  # thin to --sparsity
    f = rng.standard_normal((3, 3, c, m)).astype(np.float32)
    ref = conv_nhwc(i, f, pad=1)

    k = ucf.compile(
        EXPR, formats={"I": FORMAT}, schedule=SCHEDULE, target=args.target, dtype="float32"
    )
    it = ucf.from_numpy(i, FORMAT)
    out = np.empty(ref.shape, np.float32)
    got = k(I=it, F=f, out=out)
    t = median_time(lambda: k(I=it, F=f, out=out), args.repeat)
    print(f"I {i.shape}: {it.nnz} nonzeros ({100 * (1 - it.nnz / i.size):.0f}% sparse)")
    status = report(f"activation-sparse conv {ref.shape}, kernel", got, ref, t)
    got = k(I=i, F=f, out=out)
    t = median_time(lambda: k(I=i, F=f, out=out), args.repeat)
    status |= report(f"activation-sparse conv {ref.shape}, with conversion", got, ref, t)
    return status


if __name__ == "__main__":
    sys.exit(main())
