"""bcsr(32,32) SpMM 1024^3 float32 on two threads under each plan the default may pick
for its block rows (issue 38, item 3): ucf's own kernels, compiled with the plan as
their schedule, called in turn in one process.

    python bench/block_plans.py                       # 90 % and 50 % zero blocks
    OMP_WAIT_POLICY=passive python bench/block_plans.py --repeat 61

Plans: dynamic chunks of one block row (the default's where a static split of heavy
block rows is uneven), the static split (on the llvm target ``llvm_openmp.CHUNKS_PER_THREAD`` runs
of consecutive block rows a thread from one counter; what the default keeps where the
tiles read B in place, ``ucf.schedule.block_rows``), and dynamic chunks of four block
rows. Each round calls every plan once, in turn (the order rotating), each call after a
64 MB read-and-write sweep ("cold", as after torch's matmul in block_peak.py) or right
after the same call ("warm"); the table gives the wall time (median, first quartile,
best) and the process's CPU time (median) of each plan. On a loaded machine the wall
time at two threads is meaningless; with passive waits (``OMP_WAIT_POLICY=passive``) the
CPU time is the work both threads did, spinning excluded, which the load inflates least.
Operands as block_peak.py's (the same seeds), results checked against numpy first.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import fma_peak  # noqa: E402
from spmv_spmm import fresh_kernel_cache  # noqa: E402
from tesa_formats import BLOCK, SPMM, block_sparse  # noqa: E402

import ucf  # noqa: E402
from ucf.toolchain.jit import set_whole_team  # noqa: E402

PLANS = {
    "dynamic chunks of 1 block row": "split(i_blk, i_blk_c, i_blk_r, 1); "
    "parallelize(i_blk_c, CPUThread, NoRaces)",
    "static": "parallelize(i_blk, CPUThread, NoRaces)",
    "dynamic chunks of 4 block rows": "split(i_blk, i_blk_c, i_blk_r, 4); "
    "parallelize(i_blk_c, CPUThread, NoRaces)",
}
#: The sweep before a cold call: twice this CPU's 32 MB L3.
SWEEP_BYTES = 64 << 20


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=41)
    ap.add_argument("--zero", type=float, nargs="+", default=[0.9, 0.5])
    ap.add_argument("--target", default="llvm")
    args = ap.parse_args(argv)
    ucf.set_num_threads(2)
    set_whole_team(True)  # every region on both threads: the plans, not the team, compared
    fmt = f"bcsr({BLOCK},{BLOCK})"
    kernels = {
        name: ucf.compile(SPMM, formats={"A": fmt}, dtype="float32", schedule=s, target=args.target)
        for name, s in PLANS.items()
    }
    rng = np.random.default_rng(0)  # block_peak.py's operands: B, then A at 90 %, at 50 %
    b = rng.random((1024, 1024), dtype=np.float32)
    sweep = np.zeros(SWEEP_BYTES // 4, dtype=np.float32)
    wait = os.environ.get("OMP_WAIT_POLICY", "libgomp's default")
    print(f"{fma_peak.cpu_name()}; load average at start: {os.getloadavg()[0]:.2f}")
    print(f"2 threads, target {args.target}, waits {wait}, median of {args.repeat}\n")
    print("| zero blocks | caches | plan | wall: median / q25 / best (ms) | CPU (ms) |")
    print("|---|---|---|---|---|")
    for zero in (0.9, 0.5):
        a = block_sparse(rng, 1024, BLOCK, zero)
        if not any(abs(zero - z) < 1e-9 for z in args.zero):
            continue
        t = ucf.from_numpy(a, format=fmt)
        ref = a.astype(np.float64) @ b
        for k in kernels.values():
            np.testing.assert_allclose(k(A=t, B=b).to_numpy(), ref, rtol=1e-4, atol=1e-3)
        for cold in (True, False):
            wall = {n: [] for n in kernels}
            cpu = {n: [] for n in kernels}
            names = list(kernels)
            for r in range(args.repeat):
                for n in names[r % len(names) :] + names[: r % len(names)]:
                    if cold:
                        sweep += 1.0
                    else:
                        kernels[n](A=t, B=b)
                    w0, c0 = time.perf_counter(), time.process_time()
                    kernels[n](A=t, B=b)
                    wall[n].append(time.perf_counter() - w0)
                    cpu[n].append(time.process_time() - c0)
            for n in names:
                w = np.array(wall[n]) * 1e3
                print(
                    f"| {zero:.0%} | {'cold' if cold else 'warm'} | {n} | "
                    f"{np.median(w):.3f} / {np.percentile(w, 25):.3f} / {w.min():.3f} | "
                    f"{np.median(cpu[n]) * 1e3:.3f} |"
                )
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    with fresh_kernel_cache("ucf-block-plans-"):
        sys.exit(main())
