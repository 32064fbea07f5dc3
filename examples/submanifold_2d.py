"""Submanifold sparse 2-D convolution, direct approach (UCF Table 2: submanifold).

A submanifold convolution computes outputs only at the active sites of
the input (the mask) and reads inputs only at active sites, so the
active set never dilates from layer to layer.  In ucf it is one statement
with the mask as a third factor:

    O(n,p,q,m) = Mask(n,p,q) * I(n,p+r-1,q+s-1,c) * F(r,s,c,m)

Mask(n,p,q) is stored "UUC" (rows of active columns), the features
I(n,h,w,c) "UUCU" (the same pattern, with a dense channel vector per
site), F dense, and the output "UUCU": it takes the mask's pattern.  For
each active output site and each tap, ucf finds the neighbour among the
active sites of row p+r-1 by searching the window q-1 .. q+1 of that row,
and adds I(neighbour,:) x F(r,s,:,:) into the site's channel vector.
Output rows p run in parallel (each row's sites are placed by an assemble
pass, so rows can be written independently).

The point cloud is a few random strokes on a 2-D grid, like handwriting
in a sparse image; the reference is the dense convolution masked to the
active sites.

    python examples/submanifold_2d.py [--quick]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # when imported from elsewhere
from _common import conv_nhwc, median_time, options, report  # noqa: E402

import ucf  # noqa: E402

EXPR = "O(n,p,q,m) = Mask(n,p,q) * I(n,p+r-1,q+s-1,c) * F(r,s,c,m)"
FORMATS = {"O": "UUCU", "Mask": "UUC", "I": "UUCU"}
SCHEDULE = "parallelize(p,CPUThread,NoRaces)"


def strokes(rng: np.random.Generator, size: int, n_strokes: int, length: int) -> np.ndarray:
    """Active-site mask (1, size, size): random walks with momentum, one pixel wide."""
    mask = np.zeros((1, size, size), np.float32)
    for _ in range(n_strokes):
        pos = rng.uniform(0, size, 2)
        angle = rng.uniform(0, 2 * np.pi)
        for _ in range(length):
            angle += rng.normal(0, 0.3)
            pos = np.clip(pos + (np.cos(angle), np.sin(angle)), 0, size - 1)
            mask[0, int(pos[0]), int(pos[1])] = 1
    return mask


def main(argv: Sequence[str] | None = None) -> int:
    args = options(__doc__.splitlines()[0], argv)
    size, c, m, n_strokes = (32, 8, 8, 4) if args.quick else (128, 32, 32, 12)
    rng = np.random.default_rng(args.seed)
    mask = strokes(rng, size, n_strokes, 2 * size)
    i = rng.standard_normal((1, size, size, c)).astype(np.float32) * mask[..., None]
    f = rng.standard_normal((3, 3, c, m)).astype(np.float32)
    ref = conv_nhwc(i, f, pad=1) * mask[..., None]

    # M bound at compile time keeps each site's M outputs in vector registers (about 2x).
    schedule = f"{SCHEDULE}; bound(m,mb,{m},MaxExact)"
    k = ucf.compile(EXPR, formats=FORMATS, schedule=schedule, target=args.target, dtype="float32")
    mt = ucf.from_numpy(mask, FORMATS["Mask"])
    it = ucf.from_numpy(i, FORMATS["I"])
    got = k(Mask=mt, I=it, F=f)
    t = median_time(lambda: k(Mask=mt, I=it, F=f), args.repeat)
    sites = int(mask.sum())
    print(f"{sites} active sites of {size}x{size} ({100 * sites / size**2:.1f}%), C={c}, M={m}")
    status = 0
    if got.format != ucf.parse_format(FORMATS["O"]) or got.nnz != sites * m:
        print(
            f"FAIL: output format {got.format} with {got.nnz} stored values, expected "
            f"{FORMATS['O']} with {sites * m}"
        )
        status = 1
    return status | report(f"submanifold 2-D conv {ref.shape}", got, ref, t)


if __name__ == "__main__":
    sys.exit(main())
