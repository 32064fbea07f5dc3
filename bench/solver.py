"""scipy's conjugate gradient with ucf's SpMV as its operator (issue 34).

Run from the repository root:

    python bench/solver.py              # about a minute
    python bench/solver.py --quick      # a 300x300 grid, one round

The matrix is the 2-D Poisson problem (the 5-point Laplacian) on a 700 x 700 grid:
490,000 rows, CSR with int32 indices. ``scipy.sparse.linalg.cg`` runs 300 iterations
(the tolerance is out of reach, so every run does the same work) four ways, in
turns, round after round: with the scipy matrix itself (``A @ x``), and with a
``LinearOperator`` whose matvec is ucf's default SpMV writing into a buffer of its
own (``k(A=A, x=v, out=y)``), at ``ucf.set_num_threads(1)`` and at 2, at 1 with
the scipy matrix itself as ``A`` (checked on every call, ``ucf.exec.scipy_operands``),
and at 2 with
every parallel region on both threads (``ucf.toolchain.jit.set_whole_team``: what
the adaptive team would have got had it never shrunk). Nothing in the
environment is set: numpy's BLAS keeps its own threads, as a user's would, and
they run between the SpMV calls (the dot products of each iteration). The three
solutions are checked to agree.

It also reports what a kernel call into a given ``out=`` costs over the compiled
function it ends in (the same SpMV on a 4 x 4 grid, so the work is nothing), as
``bench/overhead.py`` does for another statement.

Targets (issue 34): ucf on 1 thread no slower than scipy (median ratio <= 1.0),
on 2 threads faster (< 1.0).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import LinearOperator, cg

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from spmv_spmm import fresh_kernel_cache  # noqa: E402

import ucf  # noqa: E402
from ucf.toolchain.jit import set_whole_team, team_counters  # noqa: E402

SPMV = "y(i) = A(i,j) * x(j)"
#: The 1-thread run whose operator passes the scipy matrix itself, not a ucf.Tensor.
SCIPY_IN = "ucf, 1t, scipy A"
#: The 2-thread run with every region on both threads (``ucf.toolchain.jit.set_whole_team``):
#: beside the adaptive team's, it says whether the regions the team judged lost were.
WHOLE = "ucf, 2t whole team"
ITERATIONS = 300


def poisson(n: int) -> sp.csr_matrix:
    """The 5-point Laplacian on an n x n grid, CSR with sorted int32 indices."""
    t = sp.diags([-1.0, 4.0, -1.0], [-1, 0, 1], shape=(n, n))
    s = sp.diags([-1.0, -1.0], [-1, 1], shape=(n, n))
    a = (sp.kron(sp.identity(n), t) + sp.kron(s, sp.identity(n))).tocsr()
    a.sort_indices()
    a.indices, a.indptr = a.indices.astype(np.int32), a.indptr.astype(np.int32)
    return a


def operator(k: ucf.Kernel, a: ucf.Tensor | sp.csr_matrix, n: int) -> LinearOperator:
    """ucf's SpMV as a LinearOperator, writing into two buffers in turn (cg reads one
    matvec's result before it asks for the next; the second buffer makes sure)."""
    buffers = [np.empty(n), np.empty(n)]
    turn = [0]

    def matvec(v: np.ndarray) -> np.ndarray:
        y = buffers[turn[0]]
        turn[0] ^= 1
        k(A=a, x=v, out=y)
        return y

    return LinearOperator((n, n), matvec=matvec, dtype=np.float64)


def solve(op, b: np.ndarray) -> tuple[float, np.ndarray]:
    start = time.perf_counter()
    x, _ = cg(op, b, rtol=1e-30, atol=0.0, maxiter=ITERATIONS)
    return time.perf_counter() - start, x


def call_overhead(k: ucf.Kernel, number: int = 5000, repeat: int = 7) -> tuple[float, float]:
    """µs per call of ``k(A=, x=, out=y)`` on a 4 x 4 grid, and of the compiled function
    it ends in, called through ctypes with its arguments built once (the floor)."""
    small = poisson(4)
    a = ucf.from_scipy(small, format="csr")
    x, y = np.ones(16), np.zeros(16)
    k(A=a, x=x, out=y)
    fn = k.llir[-1]
    compiled = k._functions[fn.name]
    sizes = {"n_i": 16, "n_j": 16, "A_dim0": 16, "A_dim1": 16, "x_dim0": 16, "y_dim0": 16}
    arrays = {"A1_pos": a.levels[1]["pos"], "A1_crd": a.levels[1]["crd"], "A_vals": a.vals}
    arrays |= {"x_vals": x, "y_vals": y}
    args = [sizes[p.name] if p.name in sizes else arrays[p.name].ctypes.data for p in fn.params]
    cases = {"raw": lambda: compiled(*args), "out": lambda: k(A=a, x=x, out=y)}
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(repeat):
        for label, call in cases.items():
            start = time.perf_counter()
            for _ in range(number):
                call()
            best[label] = min(best[label], (time.perf_counter() - start) / number * 1e6)
    return best["out"], best["raw"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=None, help="solves of each kind (default 3)")
    args = ap.parse_args(argv)
    grid = 300 if args.quick else 700
    rounds = args.rounds or (1 if args.quick else 3)
    a = poisson(grid)
    n = a.shape[0]
    b = np.random.default_rng(34).random(n)
    with fresh_kernel_cache("ucf-solver-"):
        k = ucf.compile(SPMV, formats={"A": "csr"})
        at = ucf.from_scipy(a, format="csr")
        np.testing.assert_allclose(k(A=at, x=b).to_numpy(), a @ b)
        op = operator(k, at, n)
        runs = {
            "scipy A @ x": (None, a),
            "ucf, 1 thread": (1, op),
            "ucf, 2 threads": (2, op),
            SCIPY_IN: (1, operator(k, a, n)),  # what a user passes: checked every call
            WHOLE: (2, op),  # every region on both threads: is the adaptive team right?
        }
        times: dict[str, list[float]] = {label: [] for label in runs}
        solutions = {}
        load = [os.getloadavg()]
        for r in range(rounds):
            order = list(runs)[r % len(runs) :] + list(runs)[: r % len(runs)]
            for label in order:
                threads, operand = runs[label]
                if threads is not None:
                    ucf.set_num_threads(threads)
                set_whole_team(label == WHOLE)
                seconds, solutions[label] = solve(operand, b)
                set_whole_team(False)
                times[label].append(seconds)
        load.append(os.getloadavg())
        out_us, raw_us = call_overhead(k)
    reference = solutions["scipy A @ x"]
    for label, x in solutions.items():
        if not np.allclose(x, reference, rtol=1e-8, atol=1e-10 * np.abs(reference).max()):
            raise SystemExit(f"{label}: the solution differs from scipy's")
    print(f"cg, 2-D Poisson {grid}x{grid} ({n} rows, {a.nnz} nonzeros), {ITERATIONS} iterations,")
    print(
        f"{rounds} rounds in turns; load average {load[0][0]:.2f} -> {load[1][0]:.2f}; "
        f"ucf's regions timed {team_counters()['timed']}, lost {team_counters()['lost']}"
    )
    base = statistics.median(times["scipy A @ x"])
    print(f"{'operator':<20}{'median s':>10}{'min .. max s':>18}{'/ scipy':>9}")
    for label, ts in times.items():
        med = statistics.median(ts)
        print(f"{label:<20}{med:>10.3f}{min(ts):>9.3f} .. {max(ts):.3f}{med / base:>9.2f}")
    print(
        f"\nk(A=, x=, out=y) on a 16-row matrix: {out_us:.2f} µs per call, "
        f"{out_us - raw_us:.2f} µs over the compiled function's {raw_us:.2f} µs"
    )
    print("\ntargets (issue 34):")
    one = statistics.median(times["ucf, 1 thread"]) / base
    two = statistics.median(times["ucf, 2 threads"]) / base
    print(
        f"  ucf on 1 thread no slower than scipy ({one:.2f}x): {'met' if one <= 1.0 else 'NOT met'}"
    )
    print(f"  ucf on 2 threads faster than scipy ({two:.2f}x): {'met' if two < 1.0 else 'NOT met'}")
    scipy_in = statistics.median(times[SCIPY_IN]) / statistics.median(times["ucf, 1 thread"])
    print(f"  (the scipy matrix as A, checked every call: {scipy_in:.2f}x the Tensor's time)")
    whole = statistics.median(times[WHOLE]) / base
    print(
        f"  (for reference: 2 threads with every region on both, {whole:.2f}x; the adaptive "
        f"team {'chose well' if two <= whole * 1.02 else 'lost to it'})"
    )
    if load[0][0] > 0.5:
        print(f"  (measured at load {load[0][0]:.1f}: rerun on a quiet machine)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
