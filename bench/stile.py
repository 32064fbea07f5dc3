"""STile (issue 16, Performance): building the index of a mask's nonzero micro-tiles.

Run from the repository root:

    python bench/stile.py              # 4096 x 4096 mask, 2 threads
    python bench/stile.py --quick      # 512 x 512: seconds

Every call gets a fresh random mask (made before the clock starts), as dynamic
sparsity does. ``ucf.stile_index(mask, (32, 1))`` on the llvm and c targets is
timed against ``scipy.sparse.csr_array(mask)`` (the CSR a static format would
build every call), best of ``--repeat`` runs; the target is a ratio of at least
5. The index is checked against numpy's tile reduction first.  The rows of the
issue that need gathering kernels (index build + compute against torch and ucf
CSR SpMM, MoE) are printed as not built.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import ucf  # noqa: E402


def best(fn, masks) -> float:
    times = []
    for m in masks:
        t0 = time.perf_counter()
        fn(m)
        times.append(time.perf_counter() - t0)
    return min(times)


def check(mask: np.ndarray, tile: tuple[int, int], target: str) -> None:
    bh, bw = tile
    m, k = mask.shape
    t = ucf.stile_index(mask, tile, target=target)
    want = mask.reshape(m // bh, bh, k // bw, bw).any(axis=(1, 3))
    if not np.array_equal(t.to_numpy() != 0, want):
        raise SystemExit(f"stile_index on {target} lists the wrong tiles")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a 512 x 512 mask")
    ap.add_argument("--repeat", type=int, default=7, help="timed calls per case (best kept)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    os.environ.setdefault("UCF_CACHE_DIR", tempfile.mkdtemp(prefix="ucf-bench-stile-"))
    ucf.set_num_threads(args.threads)
    n = 512 if args.quick else 4096
    tile = (32, 1)
    rng = np.random.default_rng(0)
    print(f"index build, {n}x{n} mask, {tile[0]}x{tile[1]} tiles, {args.threads} threads")
    print(f"{'density':>8} {'scipy ms':>9} {'llvm ms':>8} {'c ms':>8} {'llvm x':>7} {'c x':>7}")
    for density in (0.1, 0.5):
        masks = [rng.random((n, n)) < density for _ in range(args.repeat)]
        for target in ("llvm", "c"):
            check(masks[0], tile, target)
        scipy_t = best(sp.csr_array, masks)
        ours = {
            t: best(lambda m, t=t: ucf.stile_index(m, tile, target=t), masks) for t in ("llvm", "c")
        }
        verdict = "PASS" if min(ours.values()) * 5 <= scipy_t else "FAIL"
        print(
            f"{density:>8.0%} {scipy_t * 1e3:>9.2f} {ours['llvm'] * 1e3:>8.2f} "
            f"{ours['c'] * 1e3:>8.2f} {scipy_t / ours['llvm']:>7.1f} {scipy_t / ours['c']:>7.1f}"
            f"  target >= 5x: {verdict}"
        )
    for row in (
        "index build + compute, 32x1 at 90% vs torch dense matmul",
        "index build + compute, 32x1 at 90% vs ucf CSR SpMM with the CSR built each call",
        "index build + compute, 32x1 at 50% vs torch dense matmul",
        "MoE, 8 experts, top-2 routing vs the per-expert torch loop",
    ):
        print(f"{row}: not measured (gathering kernels are not built yet)")


if __name__ == "__main__":
    main()
