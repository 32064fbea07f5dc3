"""Submanifold sparse 3-D convolution, direct approach (UCF Table 2: submanifold, 3-D).

The 3-D form of ``submanifold_2d.py`` on a voxelized point cloud: outputs
only at active voxels, inputs only from active voxels, 3x3x3 taps:

    O(n,x,y,z,m) = Mask(n,x,y,z) * I(n,x+r-1,y+s-1,z+t-1,c) * F(r,s,t,c,m)

Mask is stored "UUUC" (for each (x, y) column the active heights z), the
features I "UUUCU" (the same pattern with a dense channel vector per
voxel), F dense and O "UUUCU", the mask's pattern.  For each active voxel
and each of the 9 (r, s) columns around it, ucf binary-searches the
column's active heights for the window z-1 .. z+1 and adds
I(neighbour,:) x F(r,s,t,:,:) into the voxel's channel vector.  Slices x
run in parallel.

The scene is LiDAR-like: a ground surface and the walls of a few boxes,
sampled sparsely; the reference is the dense 3-D convolution masked to
the active voxels.

    python examples/submanifold_3d.py [--quick]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # when imported from elsewhere
from _common import conv_nhwc_3d, median_time, options, report  # noqa: E402

import ucf  # noqa: E402

EXPR = "O(n,x,y,z,m) = Mask(n,x,y,z) * I(n,x+r-1,y+s-1,z+t-1,c) * F(r,s,t,c,m)"
FORMATS = {"O": "UUUCU", "Mask": "UUUC", "I": "UUUCU"}
SCHEDULE = "parallelize(x,CPUThread,NoRaces)"


def scene(rng: np.random.Generator, xy: int, z: int, boxes: int, keep: float) -> np.ndarray:
    """Active-voxel mask (1, xy, xy, z): a wavy ground and box walls, each voxel kept w.p. keep."""
    occ = np.zeros((xy, xy, z), bool)
    gx, gy = np.meshgrid(np.arange(xy), np.arange(xy), indexing="ij")
    ground = (1 + np.sin(gx / 7.0) + np.cos(gy / 5.0)).astype(int).clip(0, z - 1)
    occ[gx, gy, ground] = True
    for _ in range(boxes):
        x0, y0 = rng.integers(0, xy - 8, 2)
        w, d = rng.integers(3, 8, 2)
        hgt = int(rng.integers(2, z))
        zs = np.arange(hgt)
        for x in range(x0, x0 + w):
            occ[x, y0, zs] = occ[x, y0 + d - 1, zs] = True
        for y in range(y0, y0 + d):
            occ[x0, y, zs] = occ[x0 + w - 1, y, zs] = True
    occ &= rng.random(occ.shape) < keep
    return occ[None].astype(np.float32)


def main(argv: Sequence[str] | None = None) -> int:
    args = options(__doc__.splitlines()[0], argv)
    xy, z, c, m, boxes = (24, 8, 8, 8, 3) if args.quick else (64, 16, 16, 16, 12)
    rng = np.random.default_rng(args.seed)
    mask = scene(rng, xy, z, boxes, keep=0.8)
    i = rng.standard_normal((*mask.shape, c)).astype(np.float32) * mask[..., None]
    f = rng.standard_normal((3, 3, 3, c, m)).astype(np.float32)
    ref = conv_nhwc_3d(i, f, pad=1) * mask[..., None]

    # M bound at compile time keeps each site's M outputs in vector registers (about 2x).
    schedule = f"{SCHEDULE}; bound(m,mb,{m},MaxExact)"
    k = ucf.compile(EXPR, formats=FORMATS, schedule=schedule, target=args.target, dtype="float32")
    mt = ucf.from_numpy(mask, FORMATS["Mask"])
    it = ucf.from_numpy(i, FORMATS["I"])
    got = k(Mask=mt, I=it, F=f)
    t = median_time(lambda: k(Mask=mt, I=it, F=f), args.repeat)
    voxels = int(mask.sum())
    print(
        f"{voxels} active voxels of {xy}x{xy}x{z} ({100 * voxels / mask.size:.1f}%), C={c}, M={m}"
    )
    status = 0
    if got.format != ucf.parse_format(FORMATS["O"]) or got.nnz != voxels * m:
        print(
            f"FAIL: output format {got.format} with {got.nnz} stored values, expected "
            f"{FORMATS['O']} with {voxels * m}"
        )
        status = 1
    return status | report(f"submanifold 3-D conv {ref.shape}", got, ref, t)


if __name__ == "__main__":
    sys.exit(main())
