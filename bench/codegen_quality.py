"""Does a parallel loop body compile as well as the serial one?  Both at one thread.

Run from the repository root:

    python bench/codegen_quality.py              # 50k rows, N = 64 and 128 (~1 minute)
    python bench/codegen_quality.py --quick      # small sizes, a smoke test

A loop body outlined for OpenMP can lose what made the serial loop fast: the
arrays' no-alias promise (``noalias`` in LLVM, ``restrict`` in C).  Without it
the compiler must reload every pointer and cannot keep a row of the output in
registers.  Run both kernels with one thread, so the only difference is the
code the compiler made of the body; the ratio parallel/serial should be ~1.

The kernel is SpMM ``C(i,k) = A(i,j) * B(j,k)`` with A in CSR (rows x 1024,
uniform random, 16 nonzeros a row) and B, C dense, on the llvm and c targets.  Times
are medians of ``--repeat`` interleaved runs of ``C(i,k) += ...`` into a given
output, so neither allocating nor zeroing C is timed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
for _p in (str(HERE.parent), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import scipy.sparse as sp  # noqa: E402
import spmv_spmm as base  # noqa: E402

import ucf  # noqa: E402

# B has COLS rows, so it stays in cache: the body is bound by arithmetic, not by DRAM,
# and the code the compiler made of it shows.
COLS, PER_ROW = 1024, 16
# '+=' into a given output: no zeroing of C is timed, only the kernel and its binding.
SPMM = "C(i,k) += A(i,j) * B(j,k)"

PAR = "parallelize(i,CPUThread,NoRaces)"


def schedules(n: int) -> dict[str, tuple[str, str]]:
    """(serial, parallel) pairs (an empty schedule is serial, unlike none, the default):
    the plain loops, and with k bound to N, which makes the
    row of C a fixed-width vector that the compiler can keep in registers across j."""
    bound = f"bound(k,kb,{n},MaxExact)"
    return {"plain": ("", PAR), "bound N": (bound, f"{bound}; {PAR}")}


def case(rows: int, n: int, target: str, schedules: tuple, repeat: int) -> tuple[float, float]:
    rng = np.random.default_rng(0)
    a = sp.random(rows, COLS, density=PER_ROW / COLS, format="csr", random_state=rng)
    b = rng.random((COLS, n))
    ref = a @ b
    A = ucf.from_scipy(a, format="csr")
    fns = {}
    for label, schedule in zip(("serial", "parallel"), schedules, strict=True):
        k = ucf.compile(SPMM, formats={"A": "csr"}, schedule=schedule, target=target)
        out = np.zeros((rows, n))
        k(A=A, B=b, out=out)
        np.testing.assert_allclose(out, ref, rtol=1e-12)
        fns[label] = lambda k=k, out=out: k(A=A, B=b, out=out)
    t = {k: statistics.median(v) for k, v in base.timings(fns, repeat).items()}
    return t["serial"], t["parallel"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, 3 runs")
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--targets", default="llvm,c")
    args = ap.parse_args(argv)
    rows, repeat = (5_000, 3) if args.quick else (args.rows, args.repeat)
    ucf.set_num_threads(1)
    print(
        f"SpMM C(i,k)=A(i,j)*B(j,k), A csr {rows} x {COLS} with {PER_ROW} nnz a row, "
        f"1 thread, median of {repeat}"
    )
    head = f"{'target':<7}{'N':>5}  {'schedule':<9}{'serial ms':>11}{'parallel ms':>13}"
    print(head + f"{'par/serial':>12}")
    for target in args.targets.split(","):
        for n in (64, 128):
            for label, pair in schedules(n).items():
                s, p = case(rows, n, target, pair, repeat)
                row = f"{target:<7}{n:>5}  {label:<9}{s * 1e3:>11.2f}{p * 1e3:>13.2f}"
                print(row + f"{p / s:>12.2f}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    raise SystemExit(main())
