"""Format conversions (``Tensor.convert``) against scipy's, on a uniform random matrix.

Run from the repository root:

    python bench/convert.py                    # the issue's size: 200,000 x 200,000, 10 a row
    python bench/convert.py --rows 20000       # a smoke test

Every conversion is checked against the dense-free reference first (scipy's own
conversion of the same matrix), then ucf's and scipy's are timed in turns, round
after round, by the calling thread's CPU time (neither starts a thread, so other
processes' time slices on a shared machine do not count); medians are printed.

Targets (issue 34): each conversion with a scipy equivalent within 1.5x of it;
csr -> dcsr, dcsc and bcsc(4,4) within 2x of scipy's csr -> csc; the transpose
kernel ``C(j,i) = A(i,j)`` (csr -> csr) within 1.5x of ``A.T.tocsr()``.

Two peers flatter scipy: ``A.tocoo()`` shares CSR's arrays and only expands indptr
(ucf's COO target shares them too but also drops stored zeros, a pass scipy skips),
and ``A.tobsr`` leaves each row's blocks in the order it met them, where ucf's
``bcsr`` keeps them sorted (``tobsr`` and ``sort_indices`` together take several times
``tobsr``'s time). On this matrix nearly every nonzero is a block of its own, so a
4x4-blocked result holds 16 values per nonzero (256 MB), which bounds how close
``bcsc(4,4)`` can come to CSC.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
for path in (str(ROOT.parent), str(ROOT)):
    if path not in sys.path:
        sys.path.insert(0, path)

from sparse_add import timed  # noqa: E402
from spmv_spmm import uniform  # noqa: E402

import ucf  # noqa: E402

ROWS = [
    ("csr -> coo", "csr", "coo", lambda a: a.tocoo(), 1.5, "peer"),
    ("coo -> csr", "coo", "csr", "tocsr", 1.5, "peer"),
    ("csr -> csc", "csr", "csc", lambda a: a.tocsc(), 1.5, "peer"),
    ("csc -> csr", "csc", "csr", "tocsr", 1.5, "peer"),
    ("csr -> dcsr", "csr", "dcsr", None, 2.0, "csc"),
    ("csr -> dcsc", "csr", "dcsc", None, 2.0, "csc"),
    ("csr -> bcsr(4,4)", "csr", "bcsr(4,4)", lambda a: a.tobsr((4, 4)), 1.5, "peer"),
    ("csr -> bcsc(4,4)", "csr", "bcsc(4,4)", None, 2.0, "csc"),
    ("C(j,i) = A(i,j) csr", "csr", None, lambda a: a.T.tocsr(), 1.5, "peer"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--per-row", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    ucf.set_num_threads(1)
    a = uniform(args.rows, args.per_row, np.random.default_rng(1)).tocsr()
    csr = ucf.from_scipy(a)
    sources = {"csr": csr, "coo": csr.convert("coo"), "csc": csr.convert("csc")}
    kernel = ucf.compile("C(j,i) = A(i,j)", formats={"A": "csr", "C": "csr"})
    csc_time = timed({"scipy": lambda: a.tocsc()}, time.thread_time, args.repeats)["scipy"]
    peers = {"coo": a.tocoo(), "csc": a.tocsc()}
    print(f"{args.rows} x {args.rows}, {a.nnz} nonzeros; CPU ms, medians of {args.repeats}")
    print(f"{'conversion':22} {'ucf':>9} {'scipy':>9} {'ratio':>7} {'target':>16}  met")
    all_met = True
    for name, src, dst, peer, bound, relative in ROWS:
        t = sources[src]
        if dst is None:
            ucf_call = lambda t=t: kernel(A=t)  # noqa: E731
            got = ucf_call().to_scipy()
            want = a.T.tocsr()
        else:
            ucf_call = lambda t=t, dst=dst: t.convert(dst)  # noqa: E731
            got = ucf_call().convert("csr").to_scipy()
            want = a
        if (got != want).nnz or got.nnz != want.nnz:
            raise SystemExit(f"{name}: ucf's result differs from scipy's")
        calls = {"ucf": ucf_call}
        if peer is not None:  # scipy converts from its own matrix in the same layout
            m = peers.get(src, a)
            calls["scipy"] = (lambda m=m: m.tocsr()) if src != "csr" else (lambda p=peer: p(a))
        times = timed(calls, time.thread_time, args.repeats)
        base = times["scipy"] if relative == "peer" else csc_time
        ratio = times["ucf"] / base
        met = ratio <= bound
        all_met &= met
        scipy_ms = f"{times['scipy'] * 1e3:9.1f}" if "scipy" in times else f"{'':9}"
        target = f"<= {bound}x {'scipy' if relative == 'peer' else 'scipy csc'}"
        print(
            f"{name:22} {times['ucf'] * 1e3:9.1f} {scipy_ms} {ratio:6.2f}x {target:>16}  "
            f"{'met' if met else 'NOT met'}"
        )
    print("all targets met" if all_met else "some targets NOT met")


if __name__ == "__main__":
    main()
