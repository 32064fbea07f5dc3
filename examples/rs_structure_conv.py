"""RS-structured filter-sparse convolution (UCF Table 2: layout R_C S_C M_U C_U).

Here the filter's zeros come in whole (r, s) taps: a tap either keeps its
entire M x C slice of weights or loses all of it.  Storing F(m,c,r,s) as
R_C S_C M_U C_U (format "CCUU:2,3,0,1": level 0 stores mode 2 = r
compressed, level 1 mode 3 = s compressed, then m and c dense) lists the
surviving taps and keeps each one as a dense M x C matrix:

    O(n,m,p,q) = I(n,c,p+r-1,q+s-1) * F(m,c,r,s)

The loop order must follow F's levels, so it is n, r, s, m, c, p, q: for
each surviving tap, a dense "1x1 convolution" of the shifted input,
accumulated into O (ucf narrows p and q to the in-image window of that
tap).  Output channels run in parallel under each tap.

    python examples/rs_structure_conv.py [--quick] [--taps 4]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # when imported from elsewhere
from _common import conv_nchw, median_time, options, report  # noqa: E402

import ucf  # noqa: E402

EXPR = "O(n,m,p,q) = I(n,c,p+r-1,q+s-1) * F(m,c,r,s)"
FORMAT = "CCUU:2,3,0,1"
SCHEDULE = "reorder(n,r,s,m,c,p,q); parallelize(m,CPUThread,NoRaces)"


def prune_taps(f: np.ndarray, keep: int) -> np.ndarray:
    """Keep the ``keep`` (r, s) taps whose M x C slices have the largest L2 norm."""
    norms = np.sqrt((f.astype(np.float64) ** 2).sum(axis=(0, 1)))  # (R, S)
    order = np.argsort(-norms, axis=None, kind="stable")[:keep]
    mask = np.zeros(norms.size, bool)
    mask[order] = True
    return f * mask.reshape(norms.shape)[None, None]


def main(argv: Sequence[str] | None = None) -> int:
    def extra(p):
        p.add_argument("--taps", type=int, default=4, help="taps kept out of 9 (default 4)")

    args = options(__doc__.splitlines()[0], argv, extra)
    n, c, h, m = (1, 16, 16, 16) if args.quick else (1, 64, 28, 64)
    rng = np.random.default_rng(args.seed)
    i = rng.standard_normal((n, c, h, h)).astype(np.float32)
    f = prune_taps(rng.standard_normal((m, c, 3, 3)).astype(np.float32), args.taps)
    ref = conv_nchw(i, f, pad=1)

    k = ucf.compile(
        EXPR, formats={"F": FORMAT}, schedule=SCHEDULE, target=args.target, dtype="float32"
    )
    ft = ucf.from_numpy(f, FORMAT)
    out = np.empty(ref.shape, np.float32)
    got = k(I=i, F=ft, out=out)
    t = median_time(lambda: k(I=i, F=ft, out=out), args.repeat)
    taps = np.argwhere(np.abs(f).sum(axis=(0, 1))).tolist()
    print(f"F {f.shape}: {len(taps)} of 9 taps kept {taps}, {ft.nnz} stored weights")
    return report(f"RS-structured conv {ref.shape}", got, ref, t)


if __name__ == "__main__":
    sys.exit(main())
