"""Submanifold sparse 2-D convolution, map-based (UCF Table 2: submanifold, neighbour maps).

Libraries such as SparseConvNet, MinkowskiEngine and spconv split a
submanifold convolution in two: build a neighbour map once per active
set, then run a gather-GEMM per layer.  Both steps are ucf kernels here.

1. Neighbour map.  Idx(n,h,w) holds 1 + the number of each active site
   (sites numbered in row-major order), stored "UUC" like the mask:

       Nb(n,p,q,r,s) = Mask(n,p,q) * Idx(n,p+r-1,q+s-1)

   Nb takes the mask's pattern with a dense 3x3 block per site ("UUCUU"):
   entry (r, s) of site i is 1 + the neighbour's number, or 0 if that
   neighbour is inactive.  (Float64 values, so site numbers are exact.)

2. Gather-GEMM.  The map becomes a 0/1 tensor Nbr(i,k,j) ("UUC": for
   output site i and tap k = 3r+s, the neighbour j), and with the active
   features X(j,c) and the filter W(k,c,m):

       O(i,m) = Nbr(i,k,j) * X(j,c) * W(k,c,m)

   Output sites i run in parallel; the inner m loop is dense.

The reference is the dense convolution read at the active sites.

    python examples/submanifold_map_based.py [--quick]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # when imported from elsewhere
from _common import conv_nhwc, median_time, options, report  # noqa: E402
from submanifold_2d import strokes  # noqa: E402

import ucf  # noqa: E402

MAP = "Nb(n,p,q,r,s) = Mask(n,p,q) * Idx(n,p+r-1,q+s-1)"
MAP_FORMATS = {"Nb": "UUCUU", "Mask": "UUC", "Idx": "UUC"}
GATHER_GEMM = "O(i,m) = Nbr(i,k,j) * X(j,c) * W(k,c,m)"
GG_FORMATS = {"Nbr": "UUC"}
SCHEDULE = "parallelize(i,CPUThread,NoRaces)"


def main(argv: Sequence[str] | None = None) -> int:
    args = options(__doc__.splitlines()[0], argv)
    size, c, m, n_strokes = (32, 8, 8, 4) if args.quick else (128, 32, 32, 12)
    rng = np.random.default_rng(args.seed)
    mask = strokes(rng, size, n_strokes, 2 * size).astype(np.float64)
    sites = np.argwhere(mask[0])  # row-major: the order of the "UUC" levels
    n_sites = len(sites)
    idx = np.zeros_like(mask)
    idx[0, sites[:, 0], sites[:, 1]] = np.arange(1, n_sites + 1)
    x = rng.standard_normal((n_sites, c)).astype(np.float32)
    f = rng.standard_normal((3, 3, c, m)).astype(np.float32)
    dense_in = np.zeros((1, size, size, c), np.float32)
    dense_in[0, sites[:, 0], sites[:, 1]] = x
    ref = conv_nhwc(dense_in, f, pad=1)[0, sites[:, 0], sites[:, 1]]

    kmap = ucf.compile(MAP, formats=MAP_FORMATS, target=args.target, dtype="float64")
    kgg = ucf.compile(
        GATHER_GEMM, formats=GG_FORMATS, schedule=SCHEDULE, target=args.target, dtype="float32"
    )
    mt = ucf.from_numpy(mask, MAP_FORMATS["Mask"])
    it = ucf.from_numpy(idx, MAP_FORMATS["Idx"])

    def build_map() -> ucf.Tensor:
        nb = kmap(Mask=mt, Idx=it)
        table = nb.vals.reshape(n_sites, 9).astype(np.int64) - 1  # -1: no neighbour
        out_site, tap = np.nonzero(table >= 0)
        coords = np.stack([out_site, tap, table[out_site, tap]], axis=1)
        return ucf.from_coo(
            coords,
            np.ones(len(coords), np.float32),
            shape=(n_sites, 9, n_sites),
            format=GG_FORMATS["Nbr"],
            dtype="float32",
        )

    status = 0
    nb = kmap(Mask=mt, Idx=it)
    want = np.lib.stride_tricks.sliding_window_view(
        np.pad(idx, ((0, 0), (1, 1), (1, 1))), (3, 3), axis=(1, 2)
    )[0, sites[:, 0], sites[:, 1]]
    status |= report("neighbour map Nb (site, r, s)", nb.vals.reshape(n_sites, 3, 3), want)
    nbr = build_map()
    w = f.reshape(9, c, m)
    out = np.empty((n_sites, m), np.float32)
    got = kgg(Nbr=nbr, X=x, W=w, out=out)
    t_map = median_time(build_map, args.repeat)
    t = median_time(lambda: kgg(Nbr=nbr, X=x, W=w, out=out), args.repeat)
    print(
        f"{n_sites} active sites of {size}x{size}, {nbr.nnz} neighbour pairs; map built in "
        f"{t_map * 1e3:.3f} ms (ucf kernel + numpy repacking)"
    )
    return status | report(f"map-based submanifold conv {ref.shape}", got, ref, t)


if __name__ == "__main__":
    sys.exit(main())
